"""The cost of collapse: the rollouts that taught nothing, as a share, as completions, and as
GPU-hours when the trainer says what it runs on (docs/design.md §9, "Cost of collapse").

Over a run's training steps (split ``train``, the newest attempt's view):

- ``wasted_rollouts`` = Σ_t wasted_t, the completions in collapsed groups (every completion got
  the same reward, so plain GRPO gives them no gradient);
- ``completions`` = Σ_t n_t, the completions in valid groups (steps stored before they carried
  the count are left out of both sums of the share);
- ``wasted_share`` = Σ wasted_t / Σ n_t;
- ``wasted_gpu_hours`` = gpus × Σ_t step_s_t × wasted_t / n_t / 3600: each step's time charged
  in proportion to its wasted completions. ``gpus`` is the run config's ``gpus`` (a number > 0)
  and ``step_s`` the step's scalar of that name (seconds per training step, which the bundled
  trainer logs); null when either is missing.

The figures are raw: under AVSPO collapsed groups get a gradient from virtual rewards, so they
are what plain GRPO would have wasted; DAPO discards them, so their generation was spent.
"""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy import and_, case, func, select
from sqlalchemy.orm import Session

from .models import Run, Step

STEP_TIME_SCALAR = "step_s"
# A step time at or above this (s) is not believed (a NaN or infinity sent as text also fails
# the test, on both databases).
MAX_STEP_S = 1e7


def run_gpus(config: Any) -> float | None:
    """The ``gpus`` of a run config: a finite number > 0, else None."""
    gpus = config.get("gpus") if isinstance(config, dict) else None
    if isinstance(gpus, bool) or not isinstance(gpus, int | float):
        return None
    return float(gpus) if math.isfinite(gpus) and gpus > 0 else None


def _sums(session: Session, where: Any) -> list[tuple]:
    """(run_id, project, config, Σ wasted, Σ wasted of counted steps, Σ completions,
    Σ step_s × wasted / n) per run matching ``where``."""
    completions = Step.acc["n_completions"].as_float()
    step_s = Step.scalars[STEP_TIME_SCALAR].as_float()
    counted = completions > 0
    timed = and_(counted, step_s > 0, step_s < MAX_STEP_S)
    per_run = (
        select(
            Step.run_id,
            func.sum(Step.wasted_rollouts).label("wasted"),
            func.sum(case((counted, Step.wasted_rollouts), else_=0)).label("counted"),
            func.sum(func.coalesce(completions, 0)).label("completions"),
            func.sum(case((timed, step_s * Step.wasted_rollouts / completions), else_=None)).label(
                "weighted"
            ),
        )
        .join(Run, Run.id == Step.run_id)
        .where(Step.split == "train", where)
        .group_by(Step.run_id)
        .subquery()
    )
    q = select(
        Run.id,
        Run.project,
        Run.config,
        per_run.c.wasted,
        per_run.c.counted,
        per_run.c.completions,
        per_run.c.weighted,
    ).join(per_run, per_run.c.run_id == Run.id)
    return session.execute(q).all()


def _cost(config: Any, wasted: Any, wasted_counted: Any, total: Any, weighted: Any) -> dict:
    gpus = run_gpus(config)
    total = int(total or 0)
    return {
        "wasted_rollouts": int(wasted or 0),
        "completions": total or None,
        "wasted_share": (int(wasted_counted or 0) / total) if total else None,
        "gpus": gpus,
        "wasted_gpu_hours": gpus * float(weighted) / 3600
        if gpus and weighted is not None
        else None,
    }


def run_costs(session: Session, run_ids: list[str]) -> dict[str, dict[str, Any]]:
    """Per run of ``run_ids``: ``{wasted_rollouts, completions, wasted_share, gpus,
    wasted_gpu_hours}`` (the module's formulas; a run without steps has 0 wasted and nulls)."""
    empty = _cost(None, 0, 0, 0, None)
    out = {rid: dict(empty) for rid in run_ids}
    if run_ids:
        for rid, _project, config, *sums in _sums(session, Run.id.in_(run_ids)):
            out[rid] = _cost(config, *sums)
    return out


def project_costs(session: Session, projects: list[str | None]) -> dict[str | None, dict]:
    """The same figures summed over every run of each of ``projects`` (None: runs without a
    project): ``{wasted_rollouts, completions, wasted_share, wasted_gpu_hours, runs,
    runs_with_gpus}``. GPU-hours sum over the runs that report ``gpus`` and a step time."""
    named = [p for p in projects if p is not None]
    where = Run.project.in_(named)
    if None in projects:
        where = where | Run.project.is_(None)
    out: dict[str | None, dict] = {}
    for _rid, project, config, *sums in _sums(session, where):
        cost = _cost(config, *sums)
        agg = out.setdefault(
            project,
            {"wasted_rollouts": 0, "counted": 0, "completions": 0, "wasted_gpu_hours": None,
             "runs": 0, "runs_with_gpus": 0},
        )  # fmt: skip
        agg["runs"] += 1
        agg["wasted_rollouts"] += cost["wasted_rollouts"]
        agg["counted"] += int(sums[1] or 0)
        agg["completions"] += cost["completions"] or 0
        if cost["wasted_gpu_hours"] is not None:
            agg["wasted_gpu_hours"] = (agg["wasted_gpu_hours"] or 0.0) + cost["wasted_gpu_hours"]
            agg["runs_with_gpus"] += 1
    for agg in out.values():
        counted = agg.pop("counted")
        agg["wasted_share"] = counted / agg["completions"] if agg["completions"] else None
    return out
