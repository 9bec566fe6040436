"""The values a rule can watch (DESIGN.md §6): step metrics, window metrics, `reward_drop`,
`scalars.NAME` and `stale`. Window values read only the rows they need (at most 100, or the
`acr` column for `acr_ema`), so evaluating a step stays cheap on long runs."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session
from vantage.client.acr import DEFAULT_STREAK_THRESHOLD, EMA_ALPHA, WINDOW_METRIC_FIELDS

from .ingest import STEP_ANSWER_FIELDS
from .models import Run, Step

STEP_METRICS = frozenset(STEP_ANSWER_FIELDS)
WINDOW_METRICS = frozenset(WINDOW_METRIC_FIELDS)
SPECIAL_METRICS = frozenset({"reward_drop", "stale"})
SCALAR_PREFIX = "scalars."
# reward_drop: the mean reward_mean of the latest REWARD_WINDOW steps against the best such mean
# ending in the REWARD_LOOKBACK steps before.
REWARD_WINDOW = 5
REWARD_LOOKBACK = 20


def check_metric(metric: str) -> str:
    """The metric name, or ValueError naming what a rule may watch."""
    if metric in STEP_METRICS or metric in WINDOW_METRICS or metric in SPECIAL_METRICS:
        return metric
    if metric.startswith(SCALAR_PREFIX) and len(metric) > len(SCALAR_PREFIX):
        return metric
    raise ValueError(
        f"unknown metric '{metric}': use a step metric ({', '.join(sorted(STEP_METRICS))}), a "
        f"window metric ({', '.join(WINDOW_METRIC_FIELDS)}), reward_drop, stale or scalars.NAME"
    )


def _finite(x: Any) -> float | None:
    if x is None or isinstance(x, bool):
        return None
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


class StepValues:
    """Metric values at one evaluated step, computed lazily and at most once each."""

    def __init__(self, session: Session, run: Run, row: Step) -> None:
        self.session, self.run, self.row = session, run, row
        self._cache: dict[str, float | None] = {}

    def get(self, metric: str) -> float | None:
        if metric not in self._cache:
            self._cache[metric] = self._compute(metric)
        return self._cache[metric]

    def _compute(self, metric: str) -> float | None:
        if metric in STEP_METRICS:
            return _finite(getattr(self.row, metric))
        if metric.startswith(SCALAR_PREFIX):
            return _finite((self.row.scalars or {}).get(metric[len(SCALAR_PREFIX) :]))
        if metric == "reward_drop":
            return reward_drop(self.session, self.run, self.row.split, self.row.step)
        if metric in WINDOW_METRICS:
            return window_value(self.session, self.run.id, self.row.split, self.row.step, metric)
        return None  # `stale` is not a step metric: the periodic pass evaluates it


def _acr_query(run_id: str, split: str, to_step: int):  # noqa: ANN202
    return select(Step.acr).where(
        Step.run_id == run_id, Step.split == split, Step.step <= to_step, Step.acr.is_not(None)
    )


def window_value(
    session: Session, run_id: str, split: str, to_step: int, name: str
) -> float | None:
    """One window metric (DESIGN.md §3) over the newest-attempt steps up to ``to_step``."""
    if name == "acr_pooled":
        collapsed, valid = session.execute(
            select(func.sum(Step.n_collapsed), func.sum(Step.n_valid)).where(
                Step.run_id == run_id,
                Step.split == split,
                Step.step <= to_step,
                Step.acr.is_not(None),
            )
        ).one()
        return None if not valid else int(collapsed or 0) / int(valid)
    if name == "acr_100":
        first = session.scalars(_acr_query(run_id, split, to_step).order_by(Step.step).limit(100))
        values = list(first)
        return math.fsum(values) / 100 if len(values) == 100 else None
    if name == "acr_volatility":
        last = list(
            session.scalars(_acr_query(run_id, split, to_step).order_by(Step.step.desc()).limit(25))
        )
        if len(last) < 25:
            return None
        mean = math.fsum(last) / 25
        return math.sqrt(math.fsum((x - mean) ** 2 for x in last) / 24)
    if name == "acr_streak":
        streak, offset, chunk = 0, 0, 200
        while True:
            q = _acr_query(run_id, split, to_step).order_by(Step.step.desc())
            values = list(session.scalars(q.offset(offset).limit(chunk)))
            for v in values:
                if v <= DEFAULT_STREAK_THRESHOLD:
                    return float(streak)
                streak += 1
            if len(values) < chunk:
                return float(streak)
            offset += chunk
    if name == "acr_ema":
        ema = None
        for v in session.scalars(_acr_query(run_id, split, to_step).order_by(Step.step)):
            ema = v if ema is None else ema + EMA_ALPHA * (v - ema)
        return ema
    raise ValueError(f"not a window metric: {name}")


def reward_drop(session: Session, run: Run, split: str, to_step: int) -> float | None:
    """How much of its height above `reward_min` the reward has lost: with m5 the mean
    `reward_mean` of the latest 5 steps and best the highest such 5-step mean ending in the 20
    steps before, (best − m5) / (best − reward_min). 0.5 is §6's 'falls to reward_min +
    0.5·(best − reward_min)'. None until one earlier 5-step mean exists, or when best is not
    above reward_min (nothing to drop from)."""
    q = (
        select(Step.reward_mean)
        .where(
            Step.run_id == run.id,
            Step.split == split,
            Step.step <= to_step,
            Step.reward_mean.is_not(None),
        )
        .order_by(Step.step.desc())
        .limit(REWARD_WINDOW + REWARD_LOOKBACK)
    )
    values = [v for v in session.scalars(q) if math.isfinite(v)][::-1]  # oldest first
    if len(values) < REWARD_WINDOW + 1:
        return None
    means = [
        math.fsum(values[i - REWARD_WINDOW : i]) / REWARD_WINDOW
        for i in range(REWARD_WINDOW, len(values) + 1)
    ]
    current, previous = means[-1], means[:-1]
    best = max(previous)
    floor = run.reward_min
    if not best > floor:
        return None
    out = (best - current) / (best - floor)
    return out if math.isfinite(out) else None


def stale_value(run: Run, now: datetime) -> float:
    """Heartbeat periods since the run last sent a heartbeat or data (0 once it has finished)."""
    if run.status != "running":
        return 0.0
    seen = run.last_seen_at if run.last_seen_at.tzinfo else run.last_seen_at.replace(tzinfo=UTC)
    period = run.heartbeat_s if run.heartbeat_s and run.heartbeat_s > 0 else 10.0
    return max(0.0, (now - seen).total_seconds() / period)
