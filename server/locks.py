"""The per-run write lock: every transaction that writes a run's steps or alert state (ingest,
alert evaluation) takes it first, so replicas and threads never interleave on one run and row
locks are never needed (DESIGN.md §6: several server processes on one database never
double-fire)."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import text, update
from sqlalchemy.orm import Session

from .models import Run

LOCK_NAMESPACE = 0x56414C54  # "VALT"
_SQLITE_LOCK = threading.RLock()


def run_lock_key(run_id: str) -> int:
    """The run's 32-bit advisory lock key (a stable digest of its id)."""
    return int.from_bytes(
        hashlib.blake2b(run_id.encode(), digest_size=4).digest(), "big", signed=True
    )


@contextmanager
def run_lock(session: Session, run_id: str) -> Iterator[None]:
    """Hold the run's lock until the caller's transaction ends; commit inside the block.

    PostgreSQL: a transaction-scoped advisory lock, shared by every process on the database.
    SQLite: a process lock plus SQLite's own write lock, taken at once by a no-op write, so that
    processes sharing one file also take turns and every read below is current."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(
            text("SELECT pg_advisory_xact_lock(:ns, :key)"),
            {"ns": LOCK_NAMESPACE, "key": run_lock_key(run_id)},
        )
        yield
        return
    with _SQLITE_LOCK:
        runs = Run.__table__  # Core: no ORM bookkeeping for a statement that changes nothing
        session.execute(update(runs).where(runs.c.id == run_id).values(attempt=runs.c.attempt))
        yield
