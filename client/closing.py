"""The end of a Monitor: the status an unclosed run ends with at interpreter exit, and what
close says when the server does not have everything yet (and how to send it later).
"""

from __future__ import annotations

import logging
import shlex
import sys

from .worker import Worker

__all__ = ["uncaught_error", "warn_unsent"]

log = logging.getLogger("vantage.client")


def uncaught_error() -> BaseException | None:
    """The exception that is ending the program, as Python keeps it for an uncaught one
    (``sys.last_exc``, ``sys.last_value`` before 3.12) until the exit handlers have run; None
    in an interactive session, where it may be any earlier mistake the session went on after.
    A ``sys.exit(n)`` leaves nothing there: its status cannot be seen from an exit handler."""
    if hasattr(sys, "ps1") or sys.flags.interactive or _in_ipython():
        return None
    return getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)


def _in_ipython() -> bool:
    """Whether an IPython shell or Jupyter kernel runs this process (a library may import
    IPython in a plain script: tqdm.auto does)."""
    ipython = sys.modules.get("IPython")
    try:
        return ipython is not None and ipython.get_ipython() is not None
    except Exception:  # noqa: BLE001 - an IPython too old or half imported: a plain script
        return False


def warn_unsent(worker: Worker, timeout: float) -> None:
    """Say at close how many groups the server has not confirmed, where they are (the spool;
    the queue, which the worker goes on spooling while the process lives) and why; or, when it
    has every group, that the run's end has not reached it."""
    try:
        spooled = worker.spool.pending_groups
    except Exception:  # noqa: BLE001 - the spool may already be closed by the worker
        spooled = 0
    queued = worker.queued
    if not spooled and not queued:
        _warn_end_unsent(worker, timeout)
        return
    where = f"{spooled} in the spool {worker.spool.path}"
    if queued:  # a close(timeout=0) leaves most of them here
        where += f", {queued} still queued in memory, spooled before the process ends"
    meanwhile = "the sender goes on while this process lives; " if worker.thread.is_alive() else ""
    log.warning(
        "vantage: %d group(s) are not on the server yet (%s): %s; %swhat is left when the "
        "process ends can be uploaded with: vantage sync %s --server %s --api-key KEY",
        spooled + queued,
        where,
        _why_unsent(worker, timeout),
        meanwhile,
        shlex.quote(str(worker.spool.path)),  # this run's file, not the shared folder
        _server_to_name(worker),
    )


def _warn_end_unsent(worker: Worker, timeout: float) -> None:
    """Say at close that the run's end has not reached the server though every group has:
    else close is silent, and the run stays `running` (then stale) on the server."""
    status = worker.finish_status
    alive = worker.thread.is_alive()
    if status is None or worker.finish_sent or not (alive or worker.spool.pending_finish):
        return
    meanwhile = "the sender goes on while this process lives; " if alive else ""
    try:
        dropped = worker.dropped_groups
    except Exception:  # noqa: BLE001 - the spool may already be closed by the worker
        dropped = 0
    # with drops, the server may never have been reached: not "every group is on the server"
    sent = (
        f"no group is left to send ({dropped:,} were dropped, as said above)"
        if dropped
        else "every group is on the server"
    )
    log.warning(
        "vantage: %s, but the run's end (%s) is not on the server yet: %s; "
        "%sit is kept in the spool %s, and vantage sync %s --server %s --api-key KEY sends it",
        sent,
        status,
        _why_unsent(worker, timeout).replace("confirmed them", "confirmed it"),
        meanwhile,
        worker.spool.path,
        shlex.quote(str(worker.spool.path)),
        _server_to_name(worker),
    )


def _server_to_name(worker: Worker) -> str:
    return shlex.quote(worker.server) if worker.server and not worker.unusable else "URL"


def _why_unsent(worker: Worker, timeout: float) -> str:
    """Why groups stay in the spool at close: the server refused the run (a wrong key, say),
    or did not confirm them within close's ``timeout`` (seconds; with its last error, which may
    be older than the close), or no server."""
    server, delivery = worker.server, worker.delivery
    if not server:
        return "no server"
    if worker.unusable:
        return worker.unusable
    if delivery.refused is not None:
        return f"server {server} refused the run: {delivery.refused}"
    if delivery.key_refused is not None:
        return f"server {server} refuses the API key: {delivery.key_refused}"
    said = f"server {server} had not confirmed them when close's timeout ({timeout:g} s) passed"
    if not worker.last_error:  # nothing failed: close's time ran out (a timeout of 0, say)
        return said
    return f"{said}; its last error: {worker.last_error}"
