"""SIGTERM and Ctrl-C before the first step boundary, as an exception (no torch imported here:
`vantage train` uses it while the trainer's heavy modules load)."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class Interrupted(BaseException):
    """SIGTERM or Ctrl-C during set-up (loading, the SFT warm start): no step boundary to stop
    at, nothing to checkpoint yet. ``signum``: the signal's number. A BaseException, as
    KeyboardInterrupt is: raised inside an import that catches ``Exception`` (some of torch's
    and transformers' optional imports do), it was swallowed and the run trained on (a CI run
    timed out waiting for it)."""

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
    """While open, SIGTERM and SIGINT raise Interrupted (SIGTERM killed the process without a
    word during the warm start, Ctrl-C printed KeyboardInterrupt's traceback: a trial). Only in
    the main thread, where signals can be caught."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        if _in_finalizer(frame):
            # Python prints and drops an exception raised in a __del__ ("Exception ignored
            # in"), so a Ctrl-C that landed in one (regex's, during the imports) was lost and
            # loading went on (a CI run): send the signal again once the finalizer is done.
            threading.Timer(0.05, os.kill, (os.getpid(), signum)).start()
            return
        raise Interrupted(signum)

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, action in previous.items():
            signal.signal(sig, action)
