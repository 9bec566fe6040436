"""Alembic environment: migrations are the only code that creates or alters tables."""

from __future__ import annotations

from alembic import context
from sqlalchemy import text
from vantage.server.alerts import models as alert_models  # noqa: F401  (joins the metadata)
from vantage.server.db import is_sqlite, make_engine
from vantage.server.models import Base

config = context.config
target_metadata = Base.metadata
ADVISORY_LOCK_ID = 0x56414E54  # "VANT": serialises simultaneous upgrades of replicas


def run_migrations_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    url = config.get_main_option("sqlalchemy.url")
    engine = make_engine(url)
    with engine.connect() as connection:
        sqlite = is_sqlite(url)
        if sqlite:
            # Batch operations rebuild a SQLite table (copy, drop, rename); with foreign keys on,
            # dropping the old `runs` would cascade-delete every row that references it.
            connection.exec_driver_sql("PRAGMA foreign_keys=OFF")
            connection.commit()
        else:
            connection.execute(text("SELECT pg_advisory_lock(:k)"), {"k": ADVISORY_LOCK_ID})
            connection.commit()
        try:
            context.configure(
                connection=connection,
                target_metadata=target_metadata,
                render_as_batch=sqlite,
                compare_type=True,
            )
            with context.begin_transaction():
                context.run_migrations()
        finally:
            if not sqlite:
                connection.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": ADVISORY_LOCK_ID})
                connection.commit()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
