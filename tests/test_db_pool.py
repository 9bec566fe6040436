"""The PostgreSQL pool checks a connection that sat idle before handing it out, so a database
that dropped its connections (a restart, an idle timeout) costs no request."""

from __future__ import annotations

import time

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError
from vantage.server import db

from tests.conftest import PG_ADMIN_URL


def test_idle_connections_dropped_by_the_database_are_replaced(postgres_url, monkeypatch):
    monkeypatch.setattr(db, "PING_AFTER_IDLE_S", 0.2)
    engine = db.make_engine(postgres_url)
    try:
        with engine.connect() as conn:
            pid = conn.execute(text("SELECT pg_backend_pid()")).scalar()
        _terminate(postgres_url, pid)
        time.sleep(0.3)  # idle longer than the threshold: checked before use
        with engine.connect() as conn:
            assert conn.execute(text("SELECT 1")).scalar() == 1
            assert conn.execute(text("SELECT pg_backend_pid()")).scalar() != pid
    finally:
        engine.dispose()


def test_a_connection_in_steady_use_is_not_pinged(postgres_url, monkeypatch):
    """Without the check (not idle long enough) a dropped connection fails that one use; the
    pool then replaces its connections, and the next use works."""
    monkeypatch.setattr(db, "PING_AFTER_IDLE_S", 60.0)
    engine = db.make_engine(postgres_url)
    try:
        with engine.connect() as conn:
            pid = conn.execute(text("SELECT pg_backend_pid()")).scalar()
        _terminate(postgres_url, pid)
        with pytest.raises(OperationalError), engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        with engine.connect() as conn:
            assert conn.execute(text("SELECT pg_backend_pid()")).scalar() != pid
    finally:
        engine.dispose()


def _terminate(url: str, pid: int) -> None:
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid = %s",
            (url.rsplit("/", 1)[1], pid),
        )
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # terminate only signals: wait until it is gone
            if not admin.execute(
                "SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)
            ).fetchone():
                return
            time.sleep(0.02)
