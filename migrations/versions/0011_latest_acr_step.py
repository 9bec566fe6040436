"""Runs: the training step their latest ACR is from (``latest_acr_step``).

``latest_acr`` is the ACR of the run's newest training step that has one. Ingest compared a
batch's steps with ``last_step``, which a step of scalars only also advances, so a late rank's
groups for the step the ACR came from no longer updated it. Runs that have a latest ACR take
their ``last_step`` as its step, which is what ingest compared with until now.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05 11:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("latest_acr_step", sa.BigInteger(), nullable=True))
    op.execute("UPDATE runs SET latest_acr_step = last_step WHERE latest_acr IS NOT NULL")


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("latest_acr_step")
