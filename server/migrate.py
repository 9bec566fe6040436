"""Run the Alembic upgrade programmatically (`vantage serve`, `vantage db upgrade`)."""

from __future__ import annotations

from pathlib import Path

import vantage.migrations
from alembic import command
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory

from .db import make_engine, normalize_url, wait_for_database


def alembic_config(database_url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(vantage.migrations.__file__).parent))
    cfg.set_main_option("sqlalchemy.url", normalize_url(database_url).replace("%", "%%"))
    return cfg


def upgrade(database_url: str) -> tuple[str | None, str | None]:
    """Wait for the database, then upgrade it to the newest schema (idempotent). Returns the
    schema revision before and after (before is None for a database without Vantage's schema)."""
    engine = make_engine(database_url)
    try:
        wait_for_database(engine)
        before = _revision(engine)
        command.upgrade(alembic_config(database_url), "head")
        return before, _revision(engine)
    finally:
        engine.dispose()


def _revision(engine) -> str | None:  # noqa: ANN001
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def revisions(database_url: str) -> tuple[str | None, str | None]:
    """The database's schema revision (None without Vantage's schema) and the newest one this
    code has; the database must exist."""
    head = ScriptDirectory.from_config(alembic_config(database_url)).get_current_head()
    engine = make_engine(database_url)
    try:
        return _revision(engine), head
    finally:
        engine.dispose()
