"""Group blocks: PostgreSQL compresses their packed columns with lz4 instead of pglz.

A block of 500 groups holds about 28 KB (``data``, ``hashes``, ``group_ids``; ``prompt_ids``
when sent), past PostgreSQL's 2 KB TOAST threshold, so each insert compressed it with the
default pglz. With lz4 the database spent about a quarter less CPU per stored group (2.8 against
2.1 us) and ingest over HTTP ran about 4% faster, measured in alternating rounds on one server.
Rows stored before keep their compression; both read the same. Only where the server supports
lz4 (PostgreSQL 14 and later built with it, as Debian's packages and the official images are);
elsewhere, and on SQLite, this changes nothing.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-05 07:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = ("data", "hashes", "group_ids", "prompt_ids")


def _lz4_available() -> bool:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return False
    allowed = bind.execute(
        sa.text("SELECT enumvals FROM pg_settings WHERE name = 'default_toast_compression'")
    ).scalar()  # absent before PostgreSQL 14; lists lz4 when the server was built with it
    return allowed is not None and "lz4" in allowed


def _compress_with(method: str) -> None:
    for column in COLUMNS:
        op.execute(f"ALTER TABLE group_blocks ALTER COLUMN {column} SET COMPRESSION {method}")


def upgrade() -> None:
    if _lz4_available():
        _compress_with("lz4")


def downgrade() -> None:
    if _lz4_available():
        _compress_with("default")
