"""Step ingest: classify groups, store them once, and maintain the per-step rows
(docs/design.md §3–§4).

One batch is one transaction: a validation error (422) stores nothing. Within an attempt a
group's key ``(run, attempt, step, split, rank, group_id)`` is immutable: the first write wins, an
identical re-send is a duplicate, a different one a conflict. The newest attempt that has sent a
(step, split) owns it; older attempts' groups are kept but not counted.

Modules: `groups` (classify and store a batch's groups), `steps` (their step rows and the run's
latest state), `transaction` (`ingest_batch`: the one transaction of a batch, and its redos).
"""

from __future__ import annotations

from .groups import GroupsExist, IngestError, UnknownAttemptError, forget_run
from .transaction import IngestBusy, RunNotFound, ingest_batch

__all__ = [
    "GroupsExist",
    "IngestBusy",
    "IngestError",
    "RunNotFound",
    "UnknownAttemptError",
    "forget_run",
    "ingest_batch",
]
