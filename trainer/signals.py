"""SIGTERM and Ctrl-C: before the first step boundary as an exception, during training as a stop
at the next boundary. No torch imported here: `vantage train` uses it while the trainer's heavy
modules load."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

__all__ = ["Interrupted", "interrupt_on_signals", "stop_on_signals"]

log = logging.getLogger(__name__)


class Interrupted(BaseException):
    """SIGTERM or Ctrl-C during set-up (loading, the SFT warm start): no step boundary to stop
    at, nothing to checkpoint yet. ``signum``: the signal's number. A BaseException, as
    KeyboardInterrupt is, so that an import that catches ``Exception`` (some of torch's and
    transformers' optional imports do) cannot swallow it and let the run train on."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _in_finalizer(frame: Any) -> bool:
    """Whether ``frame`` (a signal handler's) or a caller of it runs an object's ``__del__``."""
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


@contextmanager
def interrupt_on_signals() -> Iterator[None]:
    """While open, SIGTERM and SIGINT raise Interrupted, so that the caller can say in one line
    what was cut short. Only in the main thread, where signals can be caught."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        if _in_finalizer(frame):
            # Python prints and drops an exception raised in a __del__ ("Exception ignored
            # in"), so a Ctrl-C that lands in one (regex's, during the imports) would be lost:
            # send the signal again once the finalizer is done.
            threading.Timer(0.05, os.kill, (os.getpid(), signum)).start()
            return
        raise Interrupted(signum)

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, action in previous.items():
            signal.signal(sig, action)


class _Stoppable(Protocol):
    """What a signal stops: the trainer's stop flag and its local command queue."""

    stop_signal: int | None

    @property
    def dist(self) -> Any: ...

    def submit_command(
        self,
        type: str,  # noqa: A002
        params: dict[str, Any] | None = None,
        source: str = "local",
    ) -> None: ...


@contextmanager
def stop_on_signals(trainer: _Stoppable) -> Iterator[None]:
    """While it is open, SIGTERM (a scheduler's preemption, ``kill``) and SIGINT (Ctrl-C) stop
    training at the next step boundary as a ``stop`` command does (rank 0 queues one, which
    every rank applies at the same step): a checkpoint, the Monitor closed with the run marked
    failed, exit status 128 + the signal (143, 130). A second one quits now, the Monitor still
    closed (within the run's SIGNAL_CLOSE_S) with the run marked failed: SIGTERM raises
    SystemExit(143), Ctrl-C KeyboardInterrupt, so that the run never reads "running" until it
    goes stale. Outside the main thread signals cannot be caught, and keep their default action."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    second = {signal.SIGTERM: _quit_now, signal.SIGINT: signal.default_int_handler}

    def on_signal(signum: int, _frame: Any) -> None:
        for sig, action in second.items():
            signal.signal(sig, action)
        if trainer.stop_signal is None:
            trainer.stop_signal = signum
            name = signal.Signals(signum).name
            # at the next step boundary: after the step under way, or before the first one
            # (the evaluation before it is cut short)
            log.warning("%s: stopping at the next step boundary with a checkpoint (again to "
                        "quit now)", name)  # fmt: skip
            if trainer.dist.is_main:
                trainer.submit_command("stop", source=name)

    previous = {sig: signal.signal(sig, on_signal) for sig in second}
    try:
        yield
    finally:
        for sig, action in previous.items():
            signal.signal(sig, action)


def _quit_now(signum: int, _frame: Any) -> None:
    """A second SIGTERM's handler: unwind (closing the Monitor) and exit with 128 + signum."""
    raise SystemExit(128 + signum)
