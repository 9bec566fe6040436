"""``vantage sync``: upload spool files that a Monitor could not send (docs/design.md §5).

Each file is replayed in order under its own run and launch, with the same steps the live
Monitor's worker drives: create the run, send the acks, the batches, the rank's final health and
the run's kept final status.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from .spool import SPOOL_SUFFIX, Spool, SpoolInUse
from .transport import Backoff, Reply, Transport, create_run, send_acks, send_finish, send_head

__all__ = ["replay_spool", "sync"]


def _send_health(
    spool: Spool, transport: Transport, run_id: str, attempt: int, deadline: float
) -> None:
    """Report the spool's rank as having nothing left to send (and its drops and refusals), so
    that the run's client health stops showing what its live Monitor last reported before the
    server went away. Best effort: a spool without its rank (older files) sends nothing."""
    rank = spool.get_meta("rank")
    if rank is None or deadline - time.monotonic() <= 0.1:
        return
    body = {
        "attempt": attempt,
        "rank": rank,
        "spooled_groups": 0,
        "dropped_groups": spool.dropped_groups,
        "dead_letter_batches": spool.dead_letter_batches,
    }
    reply = transport.post(
        f"/runs/{run_id}/heartbeat", orjson.dumps(body), timeout=deadline - time.monotonic()
    )
    if reply.kind == "ok":
        spool.note_reported(body["dropped_groups"])


def _send_kept_finish(
    spool: Spool, transport: Transport, run_id: str, attempt: int, deadline: float, result: dict
) -> None:
    """Send the final status the spool keeps (`Spool.keep_finish`), and forget it once the
    server has it or refused it (a run deleted since)."""
    if spool.pending_finish is None:
        return
    reply = send_finish(
        transport, run_id, spool.pending_finish, deadline - time.monotonic(), attempt
    )
    if reply.kind == "retry":
        result["error"] = f"final status not sent: {reply.error}"
    else:
        spool.keep_finish(None)


def replay_spool(
    spool: Spool,
    transport: Transport,
    deadline: float,
    stop: threading.Event | None = None,
) -> dict[str, Any]:
    """Upload one spool file in order until it is empty or ``deadline`` (monotonic) passes.
    Used by ``vantage sync``; the live Monitor drives the same steps from its sender thread."""
    result: dict[str, Any] = {"sent_batches": 0, "sent_groups": 0, "duplicates": 0, "conflicts": 0}
    run_body = spool.get_meta("run")
    if not run_body:
        result["error"] = "no run description in the spool file"
        return result
    result["run_id"] = run_body["run_id"]
    backoff = Backoff()

    def wait(reply: Reply) -> bool:
        delay = backoff.next_delay(reply.retry_after)
        remaining = deadline - time.monotonic()
        if remaining <= delay:
            result["error"] = f"gave up: {reply.error}"
            return False
        if stop is not None:
            return not stop.wait(delay)
        time.sleep(delay)
        return True

    attempt = None
    while attempt is None:
        reply = create_run(transport, run_body, timeout=deadline - time.monotonic())
        if reply.kind == "ok":
            attempt = int(reply.data["attempt"])
        elif reply.kind == "refused" or not wait(reply):
            result.setdefault("error", f"run refused: {reply.error}")
            return result
    result["attempt"] = attempt
    backoff.reset()
    recreated = 0
    while True:
        failed = send_acks(
            spool, transport, run_body["run_id"], timeout=deadline - time.monotonic()
        )
        if failed is not None:
            if not wait(failed):
                return result
            continue
        row_groups = spool.head().n_groups if spool.pending_batches else 0
        outcome, reply = send_head(
            spool, transport, run_body["run_id"], attempt, timeout=deadline - time.monotonic()
        )
        if outcome == "empty":
            _send_health(spool, transport, run_body["run_id"], attempt, deadline)
            _send_kept_finish(spool, transport, run_body["run_id"], attempt, deadline, result)
            return result
        if outcome == "retry":
            assert reply is not None
            if not wait(reply):
                return result
            continue
        if outcome == "unknown_run":
            assert reply is not None
            recreated += 1
            again = create_run(transport, run_body, timeout=deadline - time.monotonic())
            if again.kind != "ok" or recreated > 3:
                result["error"] = f"run refused: {reply.error}"
                return result
            attempt = result["attempt"] = int(again.data["attempt"])
            continue
        backoff.reset()
        if outcome == "sent":
            assert reply is not None
            result["sent_batches"] += 1
            result["sent_groups"] += row_groups
            result["duplicates"] += int(reply.data.get("duplicates") or 0)
            result["conflicts"] += int(reply.data.get("conflicts") or 0)


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
            except Exception as exc:  # noqa: BLE001 - a batch that cannot be read, say
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
        # a file named in `errors` stays, as the answer says (an empty or foreign file after
        # "no run description" or "not tried" included)
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
