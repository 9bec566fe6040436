"""Launches: when each began, by the client's clock (``started_at``, unix seconds).

A new launch of a known run that began before the run's newest attempt is refused, instead of
becoming the newest attempt whose old steps replace newer ones (`vantage sync` of a spool written
while the server was down, run after a relaunch had registered). Launches registered before this
migration have none; their ``created_at`` stands in.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03 04:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("launches") as batch:
        batch.add_column(sa.Column("started_at", sa.Double(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("launches") as batch:
        batch.drop_column("started_at")
