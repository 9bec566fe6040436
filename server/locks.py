"""The per-run write lock: every transaction that writes a run's steps or alert state (ingest,
alert evaluation), or registers a launch of it, takes it first, so replicas and threads never
interleave on one run and step rows need no locks of their own (DESIGN.md §6: several server
processes on one database never double-fire)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from sqlalchemy import exists, select, update
from sqlalchemy.orm import Session

from .commands import OPEN_STATES
from .models import Command, Run

_SQLITE_LOCK = threading.RLock()


@dataclass(frozen=True, slots=True)
class LockedRun:
    """The run as read under its lock (None if it does not exist), and whether it has open
    commands then (so that ingest reads the command table only when there is something)."""

    run: Run | None
    has_open_commands: bool


@contextmanager
def run_lock(session: Session, run_id: str) -> Iterator[LockedRun]:
    """Hold the run's lock until the caller's transaction ends; commit inside the block.

    PostgreSQL: the run row's lock (``SELECT ... FOR UPDATE``), which also reads the row as
    it is now, in the same statement. SQLite: a process lock plus SQLite's own write lock, taken
    at once by a no-op write, so that processes sharing one file also take turns."""
    has_open = exists().where(Command.run_id == Run.id, Command.status.in_(OPEN_STATES))
    query = (
        select(Run, has_open.label("has_open"))
        .where(Run.id == run_id)
        .execution_options(populate_existing=True)
    )
    if session.get_bind().dialect.name == "postgresql":
        row = session.execute(query.with_for_update(of=Run)).one_or_none()
        yield LockedRun(row[0], bool(row[1])) if row else LockedRun(None, False)
        return
    with _SQLITE_LOCK:
        runs = Run.__table__  # Core: no ORM bookkeeping for a statement that changes nothing
        session.execute(update(runs).where(runs.c.id == run_id).values(attempt=runs.c.attempt))
        row = session.execute(query).one_or_none()
        yield LockedRun(row[0], bool(row[1])) if row else LockedRun(None, False)
