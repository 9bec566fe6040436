"""Totals over runs' training steps that the compare page sets side by side (docs/design.md §9,
"Compare"): how many steps, and the effective ACR pooled over the run. Wasted rollouts come from
`vantage.server.cost`; window metrics from `queries.run_window`."""

from __future__ import annotations

from typing import Any

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from .models import Step


def run_totals(session: Session, run_ids: list[str]) -> dict[str, dict[str, Any]]:
    """Per run of ``run_ids``, over its ``train`` steps (the newest attempt's view):
    ``steps`` (how many) and ``acr_effective_pooled``, the steps' effective ACRs weighted by
    their valid groups, Σ acr_effective_t · n_valid_t / Σ n_valid_t over the steps that have
    one (None when none has: the trainer sent no effective statistics). One query."""
    out: dict[str, dict[str, Any]] = {
        rid: {"steps": 0, "acr_effective_pooled": None} for rid in run_ids
    }
    if not run_ids:
        return out
    has = Step.acr_effective.is_not(None)
    q = (
        select(
            Step.run_id,
            func.count(),
            func.sum(case((has, Step.acr_effective * Step.n_valid), else_=None)),
            func.sum(case((has, Step.n_valid), else_=None)),
        )
        .where(Step.run_id.in_(run_ids), Step.split == "train")
        .group_by(Step.run_id)
    )
    for rid, steps, weighted, valid in session.execute(q):
        pooled = float(weighted) / valid if valid else None
        out[rid] = {"steps": int(steps), "acr_effective_pooled": pooled}
    return out
