"""Waiting for something another process or thread does (a webhook, a command, a flush)."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(predicate: Callable[[], object], timeout: float = 10.0, every: float = 0.05) -> bool:
    """True as soon as ``predicate()`` is truthy, False when ``timeout`` seconds pass first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every)
    return False
