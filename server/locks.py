"""The per-run write lock: every transaction that writes a run's steps or alert state (ingest,
alert evaluation), or registers a launch of it, takes it first, so replicas and threads never
interleave on one run and step rows need no locks of their own (docs/design.md §6: several server
processes on one database never double-fire)."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from sqlalchemy import JSON, Executable, Row, bindparam, exists, func, select, text, true, update
from sqlalchemy.orm import Session

from .models import OPEN_STATES, Command, Run

_SQLITE_LOCK = threading.RLock()


RUNS = Run.__table__
RunState = SimpleNamespace
"""A run as `run_lock` reads it: its `STATE_COLUMNS` as attributes."""

# What ingest and alert evaluation read of a run under its lock: not its config, tags or notes,
# which can be large. Read and written with Core: the ORM's bookkeeping for one row cost about
# as much as the rest of the lock (measured per request, benchmarks/ingest.py).
STATE_COLUMNS = (
    "id",
    "key",
    "name",
    "project",
    "reward_min",
    "reward_max",
    "trainer_eps",
    "world_size",
    "heartbeat_s",
    "mitigation_mode",
    "status",
    "attempt",
    "last_seen_at",
    "last_step",
    "latest_acr",
    "latest_acr_step",
    "mitigation_reported",
    "eval_progress",
    "newest_steps",
    "has_unevaluated",
    "alert_epoch",
)
# The columns of those that ingest and alert evaluation change (`save_run_state`).
CHANGED_COLUMNS = (
    "last_seen_at",
    "last_step",
    "latest_acr",
    "latest_acr_step",
    "mitigation_reported",
    "eval_progress",
    "newest_steps",
    "has_unevaluated",
)


@dataclass(frozen=True, slots=True)
class LockedRun:
    """The run as read under its lock (None if it does not exist): a plain object with the
    `STATE_COLUMNS` as attributes; and whether it has open commands then (so that ingest reads
    the command table only when there is something)."""

    run: RunState | None
    has_open_commands: bool


def _null_as_null(column_type: Any) -> Any:
    """A JSON column's type that writes None as SQL NULL (as the ORM did), not JSON null."""
    return JSON(none_as_null=True) if isinstance(column_type, JSON) else column_type


# Built once: a statement object memoizes its cache key, which SQLAlchemy otherwise computes
# again on every execution (a measurable part of a small request's CPU).
_READ = select(
    *(RUNS.c[c] for c in STATE_COLUMNS),
    exists().where(Command.run_id == RUNS.c.id, Command.status.in_(OPEN_STATES)).label("has_open"),
).where(RUNS.c.id == bindparam("run_id"))
# pg_advisory_xact_lock's key for writes of alert rules (any 64-bit number no other lock uses)
RULE_WRITES_KEY = 0x7661_6E74_7275_6C65  # "vantrule"
# PostgreSQL: the run row's lock joined to a shared hold of the rule writers' lock. The join's
# inputs run below the row lock (LockRows), so the rule lock is always taken first.
_HOLD_RULES = func.pg_advisory_xact_lock_shared(RULE_WRITES_KEY).label("held")


def _read_pg(*also: Any) -> Any:
    """`_READ` joined to a one-row subquery that holds the rule lock (and computes ``also``)."""
    return _READ.select_from(RUNS.join(select(_HOLD_RULES, *also).subquery(), true()))


_READ_FOR_UPDATE = _read_pg().with_for_update(of=RUNS)
_READ_FOR_UPDATE_NOWAIT = _read_pg().with_for_update(of=RUNS, nowait=True)
# The same, and this transaction's COMMIT does not wait for its WAL to reach the disk (SET LOCAL
# synchronous_commit, in the same statement): its caller makes the commit durable after the
# run's lock is released (`wait_until_durable`) and answers only then.
_ASYNC_COMMIT = func.set_config("synchronous_commit", "off", True).label("commit")
_READ_FOR_UPDATE_ASYNC = _read_pg(_ASYNC_COMMIT).with_for_update(of=RUNS)
# A transaction of its own whose commit waits for the WAL to be flushed past its commit record,
# and so past every commit before it (the WAL is written in order). PostgreSQL flushes at
# commit only for a transaction that has a transaction id AND wrote WAL: a transactional
# logical message (a few bytes, no table, no lock, allowed to any role) gives it both. A
# transaction id alone commits without a flush: an `immediate` restart lost batches already
# answered 200 (benchmarks/soak.py; tests/test_ingest_durability.py).
_FLUSH = text("SELECT pg_logical_emit_message(true, 'vantage', '')")
_TOUCH = update(RUNS).where(RUNS.c.id == bindparam("run_id")).values(attempt=RUNS.c.attempt)
SAVE_RUN_STATE = (
    update(RUNS)
    .where(RUNS.c.id == bindparam("run_id"))
    .values({c: bindparam(c, type_=_null_as_null(RUNS.c[c].type)) for c in CHANGED_COLUMNS})
    .returning(RUNS.c.alert_epoch)
)


@contextmanager
def run_lock(
    session: Session, run_id: str, nowait: bool = False, commit_async: bool = False
) -> Iterator[LockedRun]:
    """Hold the run's lock until the caller's transaction ends; commit inside the block, after
    `save_run_state` if the run's state changed. ``nowait``: on PostgreSQL, a lock another
    transaction holds raises (SQLSTATE 55P03, `db.must_redo`) instead of waiting, for a
    transaction that has written already and could otherwise close a circle of waits.

    PostgreSQL: the run row's lock (``SELECT ... FOR UPDATE``), which also reads the row as
    it is now, in the same statement, after a shared hold of `rule_writes_lock`: a rule
    changes while no transaction that may evaluate it holds a run. Without it, an ingest that
    read a rule as enabled fired it after the rule's disabling had looked for its open episodes
    and committed: a disabled rule kept a firing alert for ever (a CI run of the race test). A
    ``nowait`` lock is taken by a transaction that holds the rule lock already. SQLite: a
    process lock plus SQLite's own write lock, taken at once by a no-op write, so that
    processes sharing one file also take turns."""
    conn = session.connection()
    params = {"run_id": run_id}
    if conn.dialect.name == "postgresql":
        statement = _READ_FOR_UPDATE_NOWAIT if nowait else _READ_FOR_UPDATE
        if commit_async:  # only ingest, which never asks for nowait
            statement = _READ_FOR_UPDATE_ASYNC
        yield _locked(conn.execute(statement, params).one_or_none())
        return
    with _SQLITE_LOCK:
        conn.execute(_TOUCH, params)
        yield _locked(conn.execute(_READ, params).one_or_none())


def wait_until_durable(session: Session) -> None:
    """After a commit made under ``run_lock(..., commit_async=True)``: return once that commit
    is on disk (PostgreSQL; SQLite commits durably at once). Raises the database's error if it
    cannot tell, so that the caller answers an error and the client sends the batch again."""
    if session.get_bind().dialect.name != "postgresql":
        return
    conn = session.connection(execution_options={"isolation_level": "AUTOCOMMIT"})
    conn.execute(_FLUSH)


@contextmanager
def lock_runs(session: Session, run_ids: Iterable[str]) -> Iterator[None]:
    """Hold several runs' locks until the caller's transaction ends; commit inside the block.
    Taken in id order before the caller writes anything, so that two such callers never wait
    on each other in a circle, and an ingest (which holds one run's lock) never waits on one
    (PostgreSQL found deadlocks, and SQLite "database is locked", when a rule's change locked
    its runs one by one between writes). SQLite: the process lock for the whole
    block, and SQLite's write lock at once."""
    with ExitStack() as held:
        if session.connection().dialect.name != "postgresql":
            held.enter_context(_SQLITE_LOCK)  # even with no run: the caller writes under it
        for run_id in sorted(set(run_ids)):
            held.enter_context(run_lock(session, run_id))
        yield


@contextmanager
def rule_writes_lock(session: Session) -> Iterator[None]:
    """Take turns with other writers of alert rules until the caller's transaction ends (commit
    inside the block): a rule's name is unique in its scope, and two requests that each found
    the name free stored it twice on PostgreSQL (5 of 16 parallel creates). It also
    waits until no run is locked (`run_lock` holds it shared), so no evaluation reads a rule
    the change is about to alter. Taken before any run lock, and never while one is held, so it
    joins no lock cycle. PostgreSQL: a transaction-scoped advisory lock, which every server
    process shares; SQLite: the process lock `lock_runs` takes (re-entrant)."""
    if session.connection().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": RULE_WRITES_KEY})
        yield
        return
    with _SQLITE_LOCK:
        yield


def _locked(row: Row | None) -> LockedRun:
    if row is None:
        return LockedRun(None, False)
    fields = row._asdict()
    has_open = bool(fields.pop("has_open"))
    return LockedRun(SimpleNamespace(**fields), has_open)


def save_run_state(
    session: Session,
    run: RunState,
    statement: Executable = SAVE_RUN_STATE,
    params: dict[str, Any] | None = None,
) -> None:
    """Write the `CHANGED_COLUMNS` of a run read by `run_lock` (the caller holds the lock),
    and read back its `alert_epoch`, which the transaction's writes of alert states moved on.
    ``statement``: `SAVE_RUN_STATE`, or it with more work that takes ``params``."""
    state = {"run_id": run.id, **{c: getattr(run, c) for c in CHANGED_COLUMNS}}
    epoch = session.connection().execute(statement, state | (params or {})).scalar()
    if epoch is not None:
        run.alert_epoch = epoch
