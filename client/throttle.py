"""Warnings a training loop may repeat thousands of times, logged without flooding its log.

The Monitor (a bad call) and its worker (a batch the server answered oddly) share one
``Throttle``, so each kind of warning is counted once across both threads.
"""

from __future__ import annotations

import logging
import re
from typing import Any

__all__ = ["Throttle", "error_kind"]

log = logging.getLogger("vantage.client")
_DIGITS = re.compile(r"\d+")


class Throttle:
    """Logs a warning of each kind: the first 5, then every 1,000th."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def warn(self, kind: str, message: str, *args: Any) -> None:
        """Log ``message % args`` when the throttle lets this ``kind`` through, with how many
        warnings of the kind there were so far."""
        n = self.counts[kind] = self.counts.get(kind, 0) + 1
        if n <= 5 or n % 1000 == 0:
            quiet = "; from now on only every 1,000th of this kind is logged" if n == 5 else ""
            log.warning(f"{message} [warning %s of this kind{quiet}]", *args, f"{n:,}")


def error_kind(where: str, exc: Exception) -> str:
    """A warning's kind: where, and the error's type and message with its numbers aside, so
    that a loop repeating one mistake is throttled and a different mistake is still said."""
    return f"{where}:{type(exc).__name__}:{_DIGITS.sub('N', str(exc))[:80]}"
