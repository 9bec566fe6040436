"""Engine and session factory; the wait for the database at start-up."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any, TypeVar

import orjson
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session, sessionmaker
from tenacity import (
    RetryCallState,
    Retrying,
    retry,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
    wait_random,
)

from .database_url import check_url, normalize_url
from .settings import hide_passwords

# What a database that cannot be reached, or is too busy, raises: refused or lost connections, an
# exhausted pool, a lock or deadlock (the API answers them 503 with Retry-After).
UNAVAILABLE = (OperationalError, InterfaceError, PoolTimeout, DisconnectionError)
UNAVAILABLE_RETRY_AFTER_S = 5  # the Retry-After of those 503s (API and dashboard)


def first_line(exc: BaseException) -> str:
    """An error's first line of text, or its type's name when it has none (for one-line logs)."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


log = logging.getLogger("vantage.db")


def is_sqlite(url: str) -> bool:
    return make_url(normalize_url(url)).get_backend_name() == "sqlite"


def make_engine(url: str) -> Engine:
    """An engine for a SQLAlchemy URL; SQLite gets WAL and foreign keys. Raises ValueError for
    a URL `check_url` refuses."""
    backend = check_url(url)
    url = normalize_url(url)
    if backend == "sqlite":
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 30},
            json_serializer=_dumps,
            json_deserializer=orjson.loads,
        )

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn, _record) -> None:  # noqa: ANN001
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    engine = create_engine(
        url,
        pool_size=10,
        max_overflow=20,
        json_serializer=_dumps,
        json_deserializer=orjson.loads,
    )
    _ping_when_idle(engine)
    return engine


PING_AFTER_IDLE_S = 1.0


def _ping_when_idle(engine: Engine) -> None:
    """Check a pooled connection before use when it sat idle in the pool for more than
    PING_AFTER_IDLE_S (SQLAlchemy's pessimistic disconnect handling, applied to idle connections
    only): a connection in steady use skips the round trip, which was about 8% of an ingest
    request's CPU with ``pool_pre_ping``. A connection that the database dropped while in use
    fails that one request, and SQLAlchemy then replaces the pool's connections (the client
    retries a 5xx answer, so no batch is lost)."""

    @event.listens_for(engine, "checkin")
    def _checked_in(_dbapi_conn, record) -> None:  # noqa: ANN001
        record.info["checked_in_at"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checked_out(dbapi_conn, record, _proxy) -> None:  # noqa: ANN001
        idle = time.monotonic() - record.info.get("checked_in_at", -math.inf)
        if idle <= PING_AFTER_IDLE_S:
            return
        try:
            with dbapi_conn.cursor() as cur:
                cur.execute("SELECT 1")
            # hand the connection over outside a transaction; COMMIT, as a ROLLBACK would
            # make psycopg forget the connection's prepared statements (`CommittingSession`)
            dbapi_conn.commit()
        except Exception as exc:  # noqa: BLE001 - any failure means the connection is gone
            raise DisconnectionError(f"pooled connection failed its check: {exc}") from exc


def _dumps(value: object) -> str:
    # orjson writes NaN and ±inf as null, so JSON columns never hold a non-finite number.
    return orjson.dumps(value).decode()


class CommittingSession(Session):
    """A session whose ``with`` block ends in COMMIT when it returns and in ROLLBACK only
    when it raises, as ``sessionmaker.begin()`` does; a block may still commit or roll back
    on its own before it ends.

    Why not SQLAlchemy's plain close, which rolls back: psycopg forgets a connection's prepared
    statements at every ROLLBACK (psycopg 3.3, ``Connection.rollback``), so each read that
    ended that way (the outbox poll every 0.25 s, the key check of every request with auth on,
    dashboard reads) made the pooled connection it used parse and plan ingest's statements
    afresh for their next five executions (psycopg prepares a statement at its fifth
    execution on a connection). Measured side by side under ingest load: PostgreSQL's CPU per
    500-group request 4.45 ms before, 3.48 ms after (5.48 and 4.38 ms with auth on)."""

    def __exit__(self, type_: Any, value: Any, traceback: Any) -> None:
        try:
            if type_ is None:
                self.commit()
        finally:
            super().__exit__(type_, value, traceback)


def session_factory(engine: Engine) -> Callable[[], Session]:
    """Sessions for ``with factory() as session:`` blocks (`CommittingSession`)."""
    return sessionmaker(engine, class_=CommittingSession, expire_on_commit=False)


def safe_url(url: str) -> str:
    """The URL with its password hidden, for messages."""
    try:
        return hide_passwords(make_url(normalize_url(url)).render_as_string(hide_password=True))
    except Exception:  # noqa: BLE001 - a URL that does not parse has nothing to hide yet
        return "<a URL that does not parse>"


def _say_waiting(state: RetryCallState) -> None:
    if state.attempt_number == 1:
        engine = state.args[0]
        log.warning("waiting up to 60 s for the database at %s", safe_url(str(engine.url)))


# PostgreSQL's refusals that waiting does not change, as its FATAL message words them (psycopg
# gives a failed connection no SQLSTATE): no such database or role, a refused password.
_LASTING_REFUSALS = ("does not exist", "password authentication failed", "no pg_hba.conf entry")


def _may_pass(exc: BaseException) -> bool:
    """Whether waiting for the database may help: not for SQLite, whose file opens now or
    never, nor for PostgreSQL's refusal of the database, role or password."""
    orig = getattr(exc, "orig", exc)
    if type(orig).__module__ == "sqlite3":
        return False
    return not any(refusal in str(orig) for refusal in _LASTING_REFUSALS)


@retry(
    retry=retry_if_exception(_may_pass),
    stop=stop_after_delay(60),
    wait=wait_exponential(multiplier=0.2, max=3),
    reraise=True,
    before_sleep=_say_waiting,
)
def wait_for_database(engine: Engine) -> None:
    """Block until the database answers (up to 60 s), as the pre-start step of the template;
    a database that cannot come to answer (`_may_pass`) fails at once."""
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))


T = TypeVar("T")


def must_redo(exc: BaseException) -> bool:
    """Whether PostgreSQL ended this transaction as a deadlock's victim (SQLSTATE 40P01) or
    refused it a lock it would not wait for (55P03, ``NOWAIT``): it is rolled back whole, so
    doing it again is safe."""
    return getattr(getattr(exc, "orig", None), "sqlstate", None) in ("40P01", "55P03")


def redo_on_lock_conflict(session: Session, work: Callable[[], T], tries: int = 10) -> T:
    """``work()`` (a transaction that commits), done again up to ``tries`` times in all when
    PostgreSQL ends it as a deadlock's victim or refuses it a lock it asked for without
    waiting (`must_redo`; rare: a transaction that must lock a run it did not foresee). Other
    errors, and the last such refusal, are raised."""

    def once() -> T:
        try:
            return work()
        except Exception:
            session.rollback()
            raise

    retrying = Retrying(
        retry=retry_if_exception(must_redo),
        stop=stop_after_attempt(tries),
        wait=wait_random(0.01, 0.1),
        reraise=True,
    )
    return retrying(once)
