"""Run the Alembic upgrade programmatically (`vantage serve`, `vantage db upgrade`)."""

from __future__ import annotations

from pathlib import Path

import vantage.migrations
from alembic import command
from alembic.config import Config

from .db import make_engine, normalize_url, wait_for_database


def alembic_config(database_url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(vantage.migrations.__file__).parent))
    cfg.set_main_option("sqlalchemy.url", normalize_url(database_url).replace("%", "%%"))
    return cfg


def upgrade(database_url: str) -> None:
    """Wait for the database, then upgrade it to the newest schema (idempotent)."""
    engine = make_engine(database_url)
    try:
        wait_for_database(engine)
    finally:
        engine.dispose()
    command.upgrade(alembic_config(database_url), "head")
