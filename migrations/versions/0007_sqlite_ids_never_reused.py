"""SQLite: ids of alert rules, alerts and silences are never reused (AUTOINCREMENT).

Without AUTOINCREMENT, SQLite gives a new row the highest id in the table plus one, so deleting
the newest silence and creating another gave the new one the old id: a client that still held
the old id (a script, a second browser tab) would then delete or change the wrong object. The
three tables are rebuilt with AUTOINCREMENT; ids already used and deleted before this migration
cannot be known. PostgreSQL's sequences never reuse ids: nothing changes there.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02 09:40:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("alert_rules", "alert_episodes", "silences")


def _rebuild(autoincrement: bool) -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    for table in TABLES:  # migrations/env.py turns foreign keys off, so nothing cascades
        with op.batch_alter_table(
            table, recreate="always", table_kwargs={"sqlite_autoincrement": autoincrement}
        ):
            pass


def upgrade() -> None:
    _rebuild(True)


def downgrade() -> None:
    _rebuild(False)
