"""An index for the runs listing's pages (`GET /api/v1/runs`, the dashboard's runs page): newest
first, read by walking the index to the page's end (`vantage.server.run_listing.runs_page`)
instead of sorting every run.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-07 21:50:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_runs_created", "runs", ["created_at", "id"])


def downgrade() -> None:
    op.drop_index("ix_runs_created", table_name="runs")
