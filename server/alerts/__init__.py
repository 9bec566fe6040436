"""Alerts (docs/design.md §6): rules over evaluated steps, episodes, webhook notifications and
automatic mitigation.

Ingest stores a batch, then calls `Evaluator.after_ingest` in the same transaction, before the
commit, and `Evaluator.committed` after it (if evaluation raises, ingest redoes the transaction
without it: the batch is stored and the periodic pass evaluates later). It evaluates — in step
order, on the newest-attempt view — the steps of that run that became evaluable: every rank of
its `world_size` reported it or a later step (ranks send in step order, so a rank that moved on
will not send it), or its first record is older than `step_complete_after_s` (the periodic
pass). Each step is evaluated once (`steps.evaluated`; a newer attempt taking a step over resets
it).

Replicas: every writer of a run's steps and alert state holds the run's lock
(`vantage.server.locks.run_lock`) for its whole transaction, so two processes ingesting one run
never both see a step unevaluated, and the per-(rule, run) `alert_states` row holds the one open
episode. Transitions, their outbox messages and their commands commit with the batch.

Modules: `models` (tables), `metrics` (the values a rule watches), `rule_bodies` and `rules`,
`silences`, `steps` (which steps are evaluable), `states` (rules and states per run),
`evaluation` (the entry point), `episodes` (the state machine), `mitigation`, `messages` and
`outbox` (webhooks), `listing` (`GET /alerts`), `periodic` and `worker` (background passes).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .episodes import end_run_episodes
    from .evaluation import EvaluationFailed, Evaluator, Outcome
    from .listing import list_alerts
    from .worker import AlertWorker

# The public names, each with its module. They load on first use, not with the package: modules
# the alerts build on (commands, queries) import `alerts.models` or `alerts.listing`, which must
# not pull in evaluation (and through it those very modules) half-initialised.
_EXPORTS = {
    "AlertWorker": "worker",
    "EvaluationFailed": "evaluation",
    "Evaluator": "evaluation",
    "Outcome": "evaluation",
    "end_run_episodes": "episodes",
    "list_alerts": "listing",
}
__all__ = [
    "AlertWorker",
    "EvaluationFailed",
    "Evaluator",
    "Outcome",
    "end_run_episodes",
    "list_alerts",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
