"""Fresh PostgreSQL databases for the tests, all made on one maintenance database.

``VANTAGE_TEST_POSTGRES_URL`` (default ``postgresql://postgres@127.0.0.1:5432/postgres``) names the
maintenance database on which databases are created and dropped. When it is unreachable the
PostgreSQL tests skip, unless ``VANTAGE_REQUIRE_POSTGRES=1`` (set by .ci/run), where they fail.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable

import pytest

PG_ADMIN_URL = os.environ.get(
    "VANTAGE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
REQUIRE_POSTGRES = os.environ.get("VANTAGE_REQUIRE_POSTGRES") == "1"


def _execute_on_admin(sql: str) -> None:
    import psycopg  # the server extra's driver: only the PostgreSQL tests need it

    with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=3) as admin:
        admin.execute(sql)


def require_postgres() -> None:
    """Skip the calling test when PostgreSQL is not reachable (fail it under
    ``VANTAGE_REQUIRE_POSTGRES=1``)."""
    try:
        _execute_on_admin("SELECT 1")
    except Exception as exc:  # noqa: BLE001 - any failure to connect means "not here"
        if REQUIRE_POSTGRES:
            pytest.fail(f"PostgreSQL is required (VANTAGE_REQUIRE_POSTGRES=1) but: {exc}")
        pytest.skip(f"PostgreSQL not reachable at {PG_ADMIN_URL}: {exc}")


def new_postgres_database(prefix: str = "vantage_test") -> tuple[str, Callable[[], None]]:
    """Create an empty database with a unique name; returns its URL and a function that drops
    it (disconnecting whoever is still connected; dropping twice is harmless)."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    _execute_on_admin(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        _execute_on_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    return f"{PG_ADMIN_URL.rsplit('/', 1)[0]}/{name}", drop


def database_for(kind: str, folder) -> tuple[str, Callable[[], None] | None]:  # noqa: ANN001
    """An empty database of ``kind`` ("sqlite": a file in ``folder``; "postgres": a new database,
    skipped or failed as `require_postgres` does): its URL and its drop function (None for
    SQLite)."""
    if kind == "sqlite":
        return f"sqlite:///{folder / 'vantage.db'}", None
    try:
        return new_postgres_database()
    except Exception as exc:  # noqa: BLE001 - any failure to connect means "not here"
        if REQUIRE_POSTGRES:
            pytest.fail(f"PostgreSQL is required but: {exc}")
        pytest.skip(f"PostgreSQL not reachable: {exc}")
