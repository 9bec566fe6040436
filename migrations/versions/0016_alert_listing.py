"""Indexes for the alerts listing's pages (`GET /api/v1/alerts`, the dashboard's alerts page):
newest first, and firing episodes first, each read by walking an index to the page's end
(`vantage.server.alerts.listing.alert_page`) instead of sorting every episode.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-07 21:45:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_alert_episodes_state_created", "alert_episodes", ["state", "created_at", "id"]
    )
    op.create_index("ix_alert_episodes_created", "alert_episodes", ["created_at", "id"])


def downgrade() -> None:
    op.drop_index("ix_alert_episodes_created", table_name="alert_episodes")
    op.drop_index("ix_alert_episodes_state_created", table_name="alert_episodes")
