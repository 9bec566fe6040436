"""The on-disk spool of the client hook (docs/design.md §5): an SQLite file in WAL mode.

Every batch the background sender builds is written here first and deleted once the server has
acknowledged it, so batches survive outages of any length (within ``max_bytes``), a server
restart and a crashed trainer. Rows are replayed strictly in order (``ord``); a batch the server
refuses with a non-retryable 4xx moves to the ``dead_letter`` table and is counted. A spool file
describes itself: the ``meta`` table holds the run-creation body (``run_id``, ``launch_id``, ...),
so ``vantage sync SPOOL_DIR`` (`vantage.client.sync`) can upload it later from any machine.

The Monitor's worker thread (or ``sync``) uses a ``Spool``; every method holds the spool's lock,
so that ``Monitor.close`` can still move the in-memory queue to disk while the worker is stuck in
a request. Its counters are plain ints that other threads may read.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import sqlite3
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import orjson

__all__ = ["SPOOL_SUFFIX", "Spool", "SpoolInUse", "SpoolRow", "open_spool"]

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
    never replays, and deletes, a spool that a live Monitor is still writing. Raises
    SpoolInUse when another holder has it. Where ``fcntl`` is missing (Windows) nothing is
    locked and None is returned."""
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
        told of; one kept for reported drops alone would pile up, re-reported by every sync).
        Returns True when it was removed."""
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


def open_spool(
    spool_dir: str | os.PathLike[str] | None, run_id: str, launch_id: str, rank: int, max_bytes: int
) -> Spool:
    """Open the spool file of a Monitor's (run, launch, rank) in ``spool_dir`` (None:
    ``VANTAGE_SPOOL_DIR``, else a user cache folder). When another Monitor (or a sync) holds it,
    a file of its own beside it is used; when the folder cannot be used, the same name in the
    temporary folder: a spool problem must never stop training."""
    folder = Path(spool_dir) if spool_dir is not None else _default_spool_dir()
    name = f"{_safe(run_id, 64)}.{_safe(launch_id)}.r{rank}{SPOOL_SUFFIX}"
    try:
        try:
            return Spool(folder / name, max_bytes=max_bytes)
        except SpoolInUse:  # another Monitor of this run, launch and rank, or a sync of it
            alone = f"{name[: -len(SPOOL_SUFFIX)]}.{uuid.uuid4().hex[:8]}{SPOOL_SUFFIX}"
            log.warning(
                "vantage: spool %s is in use by another Monitor of this run, launch and "
                "rank; using %s. If both send the same steps, the first write wins and the "
                "other's groups are refused as conflicts: give each process its own rank or "
                "launch_id",
                folder / name,
                alone,
            )
            name = alone
            return Spool(folder / name, max_bytes=max_bytes)
    except Exception as exc:  # noqa: BLE001 - an unwritable folder must not stop training
        fallback = Path(tempfile.gettempdir()) / "vantage-spool"
        log.warning("vantage: cannot use spool folder %s (%s); using %s", folder, exc, fallback)
        return Spool(fallback / name, max_bytes=max_bytes)


def _default_spool_dir() -> Path:
    env = os.environ.get("VANTAGE_SPOOL_DIR")
    if env:
        return Path(env)
    import platformdirs  # noqa: PLC0415 (only needed here)

    return Path(platformdirs.user_cache_dir("vantage")) / "spool"


def _safe(text: str, limit: int = 40) -> str:
    """``text`` as part of a file name: letters, digits, ``_.-`` and at most ``limit`` of them."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:limit]
