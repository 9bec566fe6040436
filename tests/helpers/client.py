"""Shared by the client tests."""

from __future__ import annotations

import time
from typing import Any

from vantage.client.items import Scalars


def queue_refused_record(mon: Any, step: int) -> None:
    """Queue a record for ``step`` that the server refuses (422), past the checks of the log_*
    calls, which catch all that this version of the server refuses: a stand-in for what a newer,
    stricter server may refuse."""
    mon._worker.put(Scalars(step, "not a split", 0, time.time(), {"loss": 1.0}))
