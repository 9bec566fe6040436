"""The on-disk spool of the client hook (DESIGN.md §5): an SQLite file in WAL mode.

Every batch the background sender builds is written here first and deleted once the server has
acknowledged it, so batches survive outages of any length (within ``max_bytes``), a server
restart and a crashed trainer. Rows are replayed strictly in order (``ord``); a batch the server
refuses with a non-retryable 4xx moves to the ``dead_letter`` table and is counted. A spool file
describes itself: the ``meta`` table holds the run-creation body (``run_id``, ``launch_id``, ...),
so ``vantage sync SPOOL_DIR`` (``sync`` below) can upload it later from any machine.

The sender thread (or ``sync``) uses a ``Spool``; every method holds the spool's lock, so that
``Monitor.close`` can still move the in-memory queue to disk while the sender is stuck in a
request. Its counters are plain ints that other threads may read.
"""

from __future__ import annotations

import functools
import logging
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import orjson

__all__ = ["Spool", "SpoolInUse", "SpoolRow", "sync", "SPOOL_SUFFIX"]

log = logging.getLogger("vantage.client")

SPOOL_SUFFIX = ".vantage-spool"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS batches (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ord REAL NOT NULL,
    created REAL NOT NULL,
    n_groups INTEGER NOT NULL,
    body BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS batches_by_ord ON batches (ord);
CREATE TABLE IF NOT EXISTS dead_letter (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    created REAL NOT NULL,
    n_groups INTEGER NOT NULL,
    status INTEGER NOT NULL,
    error TEXT NOT NULL,
    body BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS acks (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    command_id TEXT NOT NULL,
    body BLOB NOT NULL
);
"""


class SpoolInUse(RuntimeError):
    """Another open `Spool` (a live Monitor's, or a running `vantage sync`) holds the file."""


def _hold(path: Path) -> int | None:
    """Take an exclusive lock on the spool file for as long as the returned descriptor stays
    open (``flock``: released when the process ends, however it ends), so that `vantage sync`
    never replays, and deletes, a spool that a live Monitor is still writing (a trial lost the
    rest of a run that way). Raises SpoolInUse when another holder has it. Where ``fcntl`` is
    missing (Windows) nothing is locked and None is returned."""
    try:
        import fcntl  # noqa: PLC0415 - POSIX only
    except ImportError:
        return None
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # an empty file is a new SQLite database
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise SpoolInUse(f"{path} is in use by another process") from None
    except OSError:  # a file system without flock: go on unlocked, as on Windows
        pass
    return fd


def _locked(method):  # noqa: ANN001, ANN202
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        with self._lock:
            return method(self, *args, **kwargs)

    return wrapper


class SpoolRow:
    """One spooled batch: ``body`` is the JSON array of step records (no ``attempt``; the sender
    adds the attempt of the launch when it sends)."""

    __slots__ = ("id", "ord", "n_groups", "body")

    def __init__(self, id: int, ord: float, n_groups: int, body: bytes) -> None:
        self.id, self.ord, self.n_groups, self.body = id, ord, n_groups, body


class Spool:
    """A bounded, ordered, durable queue of batches for one (run, launch, rank).

    ``max_bytes`` caps the bodies held; a batch that would pass the cap is dropped and its groups
    are counted in ``dropped_groups`` (kept in the file, reported in heartbeats).
    """

    def __init__(self, path: str | Path, max_bytes: int = 1 << 30) -> None:
        """Open (or create) the spool file at ``path`` and hold it until `close` (`_hold`).
        Raises SpoolInUse when another open Spool holds it, OSError when it cannot be made."""
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.max_bytes = int(max_bytes)
        self._lock = threading.RLock()
        self.closed = False
        self._holder = _hold(self.path)
        try:
            self._open()
        except BaseException:
            if hasattr(self, "_db"):
                self._db.close()
            self._release()
            raise

    def _release(self) -> None:
        if self._holder is not None:
            os.close(self._holder)
            self._holder = None

    def _open(self) -> None:
        # isolation_level=None: autocommit; explicit BEGIN where several statements must be atomic.
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(_SCHEMA)
        row = self._db.execute(
            "SELECT COUNT(*), COALESCE(SUM(n_groups), 0), COALESCE(SUM(LENGTH(body)), 0) "
            "FROM batches"
        ).fetchone()
        self.pending_batches, self.pending_groups, self.pending_bytes = (int(v) for v in row)
        self.dead_letter_batches = int(
            self._db.execute("SELECT COUNT(*) FROM dead_letter").fetchone()[0]
        )
        self.dropped_groups = int(self.get_meta("dropped_groups", 0))
        self.reported_dropped = int(self.get_meta("reported_dropped", 0))
        self.pending_acks = int(self._db.execute("SELECT COUNT(*) FROM acks").fetchone()[0])
        self.pending_finish: str | None = self.get_meta("finish")

    # -- meta -------------------------------------------------------------------------------
    @_locked
    def get_meta(self, key: str, default: Any = None) -> Any:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return default if row is None else orjson.loads(row[0])

    @_locked
    def set_meta(self, key: str, value: Any) -> None:
        self._db.execute(
            "INSERT INTO meta (key, value) VALUES (?, ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (key, orjson.dumps(value)),
        )

    # -- batches ----------------------------------------------------------------------------
    @_locked
    def append(self, body: bytes, n_groups: int) -> bool:
        """Append a batch at the tail; False (and the groups counted as dropped) when full."""
        if self.pending_bytes + len(body) > self.max_bytes:
            self.count_dropped(n_groups)
            return False
        self._db.execute(
            "INSERT INTO batches (ord, created, n_groups, body) "
            "VALUES ((SELECT COALESCE(MAX(ord), 0) + 1 FROM batches), ?, ?, ?)",
            (time.time(), n_groups, body),
        )
        self.pending_batches += 1
        self.pending_groups += n_groups
        self.pending_bytes += len(body)
        return True

    @_locked
    def count_dropped(self, n_groups: int) -> None:
        if n_groups:
            self.dropped_groups += n_groups
            self.set_meta("dropped_groups", self.dropped_groups)

    @_locked
    def note_reported(self, dropped_groups: int) -> None:
        """The server has confirmed a heartbeat that counted ``dropped_groups`` (this file's
        drops included): a file holding nothing but those drops need not be kept for them."""
        self.reported_dropped = max(self.reported_dropped, dropped_groups)
        self.set_meta("reported_dropped", self.reported_dropped)

    @_locked
    def head(self) -> SpoolRow | None:
        row = self._db.execute(
            "SELECT id, ord, n_groups, body FROM batches ORDER BY ord LIMIT 1"
        ).fetchone()
        return None if row is None else SpoolRow(*row)

    @_locked
    def delete(self, row: SpoolRow) -> None:
        self._db.execute("DELETE FROM batches WHERE id = ?", (row.id,))
        self.pending_batches -= 1
        self.pending_groups -= row.n_groups
        self.pending_bytes -= len(row.body)

    @_locked
    def replace_head(self, row: SpoolRow, parts: list[tuple[bytes, int]]) -> None:
        """Replace the head row by several rows that keep its place in the order (used to
        bisect a batch the server refused, so one bad record does not take good ones with it)."""
        self._db.execute("BEGIN")
        try:
            self._db.execute("DELETE FROM batches WHERE id = ?", (row.id,))
            # The head has the smallest ord, so anything below it stays ahead of every other row.
            n = len(parts)
            for i, (body, n_groups) in enumerate(parts):
                self._db.execute(
                    "INSERT INTO batches (ord, created, n_groups, body) VALUES (?, ?, ?, ?)",
                    (row.ord - (n - i), time.time(), n_groups, body),
                )
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self.pending_batches += n - 1
        self.pending_bytes += sum(len(b) for b, _ in parts) - len(row.body)

    @_locked
    def dead_letter(self, row: SpoolRow, status: int, error: str) -> None:
        """Move a refused batch out of the queue into the dead-letter table."""
        self._db.execute("BEGIN")
        try:
            self._db.execute(
                "INSERT INTO dead_letter (created, n_groups, status, error, body) "
                "VALUES (?, ?, ?, ?, ?)",
                (time.time(), row.n_groups, status, error[:4000], row.body),
            )
            self._db.execute("DELETE FROM batches WHERE id = ?", (row.id,))
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self.pending_batches -= 1
        self.pending_groups -= row.n_groups
        self.pending_bytes -= len(row.body)
        self.dead_letter_batches += 1

    @_locked
    def dead_letters(self) -> list[dict[str, Any]]:
        rows = self._db.execute(
            "SELECT id, created, n_groups, status, error, body FROM dead_letter ORDER BY id"
        ).fetchall()
        return [
            {
                "id": i,
                "created": c,
                "n_groups": n,
                "status": s,
                "error": e,
                "records": orjson.loads(b),
            }
            for i, c, n, s, e, b in rows
        ]

    # -- command acknowledgements -----------------------------------------------------------
    @_locked
    def add_ack(self, command_id: str, body: dict[str, Any]) -> None:
        self._db.execute(
            "INSERT INTO acks (command_id, body) VALUES (?, ?)", (command_id, orjson.dumps(body))
        )
        self.pending_acks += 1

    @_locked
    def acks(self) -> list[tuple[int, str, bytes]]:
        if not self.pending_acks:
            return []
        return self._db.execute("SELECT id, command_id, body FROM acks ORDER BY id").fetchall()

    @_locked
    def delete_ack(self, ack_id: int) -> None:
        self._db.execute("DELETE FROM acks WHERE id = ?", (ack_id,))
        self.pending_acks -= 1

    # -- lifecycle --------------------------------------------------------------------------
    @property
    def empty(self) -> bool:
        return self.pending_batches == 0 and self.pending_acks == 0

    def keep_finish(self, status: str | None) -> None:
        """Keep the run's final status (``finished``/``failed``) until the server has it (then
        None): rank 0 keeps it at close, so that `vantage sync` sends it after the batches when
        the Monitor could not (`pending_finish`)."""
        self.set_meta("finish", status)
        self.pending_finish = status

    @_locked
    def close(self, remove_if_clean: bool = False) -> bool:
        """Close the file; with ``remove_if_clean``, delete it when nothing in it is worth keeping
        (no pending batch, ack or final status, no dead letter, no drop the server has not been
        told of: a file kept for reported drops alone piled up, re-reported by every sync, a
        trial). Returns True when it was removed."""
        clean = (
            remove_if_clean
            and self.empty
            and self.pending_finish is None
            and self.dead_letter_batches == 0
            and self.dropped_groups <= self.reported_dropped
        )
        if self.closed:
            return False
        self.closed = True
        self._db.close()
        if clean:
            for suffix in ("", "-wal", "-shm"):
                Path(str(self.path) + suffix).unlink(missing_ok=True)
        self._release()  # after the unlink: no other process opens a file being removed
        return clean


def sync(
    spool_dir: str | Path, server: str, api_key: str | None = None, timeout: float = 60.0
) -> dict:
    """Upload every spool file in ``spool_dir`` to ``server`` (``vantage sync SPOOL_DIR``), or
    the one file ``spool_dir`` names.

    Each file is replayed in order under its own run and launch: the run is created (or found)
    with the file's ``run_id`` and ``launch_id``, so the batches join the attempt they were
    recorded for when the server still has it. Refused batches go to the file's dead-letter
    table. A file left with nothing worth keeping is deleted.

    Returns ``{"server", "files", "runs", "sent_batches", "sent_groups", "duplicates", "conflicts",
    "dead_letter_batches", "remaining_groups", "dropped_groups", "errors", "in_use", "failed"}``;
    ``errors`` lists ``"FILE: reason"`` for files that could not be finished (server
    unreachable, run refused); ``in_use`` names files a live process holds (a running Monitor,
    another sync), left alone and not a failure; ``failed`` is true when any file could not be
    finished or groups remain.
    """
    from .sender import Transport  # noqa: PLC0415 (sender imports this module)

    totals: dict[str, Any] = {
        "server": server,
        "files": 0,
        "runs": [],
        "sent_batches": 0,
        "sent_groups": 0,
        "duplicates": 0,
        "conflicts": 0,
        "dead_letter_batches": 0,
        "remaining_groups": 0,
        "dropped_groups": 0,
        "errors": [],
        "in_use": [],
    }
    where = Path(spool_dir)
    if where.is_file():  # one spool file (the one a Monitor's close warning names)
        paths = [where]
    else:
        paths = sorted(where.glob(f"*{SPOOL_SUFFIX}"), key=lambda p: p.stat().st_mtime)
    unreachable = None  # once a file got no answer in its whole timeout, the rest are not tried
    with Transport(server, api_key) as transport:
        for path in paths:
            totals["files"] += 1
            try:
                unreachable = _sync_file(path, transport, timeout, totals, unreachable)
            except SpoolInUse:  # not a failure: its process sends it (a cron sync exits 0)
                totals["in_use"].append(path.name)
            except sqlite3.DatabaseError as exc:  # not SQLite, or cut short: the others go on
                totals["errors"].append(
                    f"{path.name}: not a readable spool file ({exc}); left as it is"
                )
            except Exception as exc:  # noqa: BLE001 - a batch that cannot be read, say (a trial)
                totals["errors"].append(
                    f"{path.name}: could not be replayed ({type(exc).__name__}: {exc}); "
                    "left as it is"
                )
    totals["failed"] = bool(totals["errors"]) or totals["remaining_groups"] > 0
    return totals


def _sync_file(
    path: Path, transport: Any, timeout: float, totals: dict[str, Any], unreachable: str | None
) -> str | None:
    """Replay one spool file into the `sync` totals, unless an earlier file found the server
    ``unreachable``; returns why the server is unreachable, if it now is. A file named in
    ``errors`` is kept. Raises sqlite3.DatabaseError for a file that is not a readable spool,
    and whatever reading a damaged batch raises."""
    from .sender import replay_spool  # noqa: PLC0415 (sender imports this module)

    errors = len(totals["errors"])
    done = False
    spool = Spool(path, max_bytes=1 << 62)
    try:
        if unreachable:
            totals["errors"].append(f"{path.name}: not tried ({unreachable})")
        else:
            result = replay_spool(spool, transport, deadline=time.monotonic() + timeout)
            _add_result(totals, result, path.name)
            if str(result.get("error", "")).startswith("gave up") and not (
                result["sent_batches"] or result.get("attempt")
            ):
                unreachable = f"the server did not answer in {timeout:g} s"
        totals["dead_letter_batches"] += spool.dead_letter_batches
        totals["remaining_groups"] += spool.pending_groups
        totals["dropped_groups"] += spool.dropped_groups
        done = len(totals["errors"]) == errors
    finally:
        # a file named in `errors` stays, as the answer says (an empty or foreign file was
        # deleted after "no run description" or "not tried": a trial)
        spool.close(remove_if_clean=done)
    return unreachable


def _add_result(totals: dict[str, Any], result: dict[str, Any], name: str) -> None:
    """Add one file's `replay_spool` result to the `sync` totals."""
    for key in ("sent_batches", "sent_groups", "duplicates", "conflicts"):
        totals[key] += result[key]
    if result.get("run_id"):
        totals["runs"].append(
            {"run_id": result["run_id"], "attempt": result.get("attempt"), "file": name}
        )
    if result.get("error"):
        totals["errors"].append(f"{name}: {result['error']}")
