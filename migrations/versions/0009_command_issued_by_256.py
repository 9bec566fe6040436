"""Commands: ``issued_by`` holds up to 256 characters.

It names who issued a command: ``key:``, ``alert:`` or ``dashboard:`` and a name of up to 200
characters, so 200 characters were too few: a rule or key whose name was near the limit could
not issue a command (the insert failed, and with it the alert pass of every run the rule covers).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03 07:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("commands") as batch:
        batch.alter_column("issued_by", type_=sa.String(256), existing_type=sa.String(200))


def downgrade() -> None:
    with op.batch_alter_table("commands") as batch:
        batch.alter_column("issued_by", type_=sa.String(200), existing_type=sa.String(256))
