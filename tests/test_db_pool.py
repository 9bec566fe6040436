"""The PostgreSQL pool checks a connection that sat idle before handing it out, so a database
that dropped its connections (a restart, an idle timeout) costs no request."""

from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import OperationalError
from vantage.server import db

from tests.helpers.postgres import PG_ADMIN_URL

BACKEND = text("SELECT pg_backend_pid()")


@pytest.fixture
def dropped(postgres_url: str) -> Iterator[tuple[Engine, int]]:
    """An engine whose one pooled connection the database has just terminated, and its pid."""
    engine = db.make_engine(postgres_url)
    try:
        with engine.connect() as conn:
            pid = conn.execute(BACKEND).scalar()
        _terminate(postgres_url, pid)
        yield engine, pid
    finally:
        engine.dispose()


@pytest.fixture(autouse=True)
def _short_idle(monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setattr(db, "PING_AFTER_IDLE_S", 0.2)


def test_idle_connections_dropped_by_the_database_are_replaced(dropped):
    engine, pid = dropped
    time.sleep(0.3)  # idle longer than the threshold: checked before use
    with engine.connect() as conn:
        assert conn.execute(BACKEND).scalar() != pid


def test_a_connection_in_steady_use_is_not_pinged(dropped, monkeypatch):
    """Without the check (not idle long enough) a dropped connection fails that one use; the
    pool then replaces its connections, and the next use works."""
    monkeypatch.setattr(db, "PING_AFTER_IDLE_S", 60.0)
    engine, pid = dropped
    with pytest.raises(OperationalError), engine.connect() as conn:
        conn.execute(text("SELECT 1"))
    with engine.connect() as conn:
        assert conn.execute(BACKEND).scalar() != pid


def _terminate(url: str, pid: int) -> None:
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid = %s",
            (url.rsplit("/", 1)[1], pid),
        )
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # terminate only signals: wait until it is gone
            alive = "SELECT 1 FROM pg_stat_activity WHERE pid = %s"
            if not admin.execute(alive, (pid,)).fetchone():
                return
            time.sleep(0.02)


PROBE = text("SELECT 42 AS vantage_prepared_probe")
PREPARED = text(
    "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE '%vantage_prepared_probe%'"
)


def test_sessions_that_end_normally_keep_the_connections_prepared_statements(postgres_url):
    """psycopg prepares a statement at its fifth execution on a connection and forgets every
    prepared statement at a ROLLBACK: a session closed after a read must end in COMMIT, or the
    next ingest on that pooled connection plans its statements again. The pool's idle check
    ends its own transaction the same way."""
    engine = db.make_engine(postgres_url)
    factory = db.session_factory(engine)
    try:
        for _ in range(6):  # one pooled connection, a session each time
            with factory() as session:
                session.execute(PROBE)
        time.sleep(0.3)  # idle past the threshold: the next checkout runs the check
        with factory() as session:
            assert session.execute(PREPARED).scalar() == 1
    finally:
        engine.dispose()


def test_a_session_whose_block_raises_rolls_back(database_url):
    """Only a block that returns commits: what a raising block wrote is discarded."""
    engine = db.make_engine(database_url)
    factory = db.session_factory(engine)
    table = f"t_{int(time.time() * 1e6)}"
    try:
        with factory() as session:
            session.execute(text(f"CREATE TABLE {table} (x integer)"))
        with pytest.raises(RuntimeError), factory() as session:
            session.execute(text(f"INSERT INTO {table} VALUES (1)"))
            raise RuntimeError("stop")
        with factory() as session:
            session.execute(text(f"INSERT INTO {table} VALUES (2)"))
        with factory() as session:
            assert session.execute(text(f"SELECT x FROM {table}")).scalars().all() == [2]
            session.execute(text(f"DROP TABLE {table}"))
    finally:
        engine.dispose()


def test_a_database_that_cannot_come_is_not_waited_for(postgres_url, tmp_path):
    """`vantage db upgrade` waits up to 60 s for a database that does not answer yet (a
    refused connection), but fails at once, naming why, for one that never will: a SQLite
    file in a missing folder, a PostgreSQL database or role that does not exist."""
    from tests.helpers.cli import run_cli
    from tests.helpers.server import free_port

    base = postgres_url.rsplit("/", 1)[0]
    lasting = [
        (f"sqlite:///{tmp_path / 'missing' / 'x.db'}", "unable to open database file"),
        (f"{base}/no_such_database_here", 'database "no_such_database_here" does not exist'),
        (postgres_url.replace("postgres@", "no_such_role@"), 'role "no_such_role"'),
    ]
    for url, why in lasting:
        t0 = time.monotonic()
        proc = run_cli("db", "upgrade", "--database-url", url, check=False)
        assert proc.returncode == 1 and why in proc.stderr, proc.stderr
        assert "waiting" not in proc.stderr and time.monotonic() - t0 < 15
    engine = db.make_engine(f"postgresql://postgres@127.0.0.1:{free_port()}/x")
    try:
        with pytest.raises(OperationalError) as refused, engine.connect():
            pass
        assert db._may_pass(refused.value)  # nobody listening yet: worth waiting for
    finally:
        engine.dispose()
