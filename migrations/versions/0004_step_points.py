"""step points: each step row keeps its metrics answer as JSON (`steps.point`), written by
ingest with the row, so that `GET /metrics` sends stored text instead of decoding and encoding
every field of thousands of rows. Rows written before this have none; readers build theirs from
the columns.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 23:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("steps") as batch_op:
        batch_op.add_column(sa.Column("point", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("steps") as batch_op:
        batch_op.drop_column("point")
