"""The values a rule can watch (DESIGN.md §6): step metrics, window metrics, `reward_drop`,
`scalars.NAME` and `stale`.

Window values for a batch of evaluated steps are computed incrementally: the state before the
batch's first step comes from a few bounded queries (first 100 ACRs, last 25 ACRs, last 25
rewards, a sum), then the rows of the batch's step range are walked once. Evaluating one step of
a long run reads about 150 rows, and a batch of 2,000 steps reads each of its rows once.
"""

from __future__ import annotations

import math
from collections import deque
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, literal, select, union_all
from sqlalchemy.orm import Session
from vantage.client.acr import (
    DEFAULT_STREAK_THRESHOLD,
    EMA_ALPHA,
    STEP_METRIC_FIELDS,
    WINDOW_METRIC_FIELDS,
)

from .models import Run, Step

STEP_METRICS = frozenset(STEP_METRIC_FIELDS)
WINDOW_METRICS = frozenset(WINDOW_METRIC_FIELDS)
SERIES_METRICS = WINDOW_METRICS | {"reward_drop"}
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


def finite(x: Any) -> float | None:
    if x is None or isinstance(x, bool):
        return None
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def step_value(row: Step, metric: str, series: dict[int, dict[str, float | None]]) -> float | None:
    """A rule's value at one step; ``series`` holds the step's window values (`series_values`)."""
    if metric in STEP_METRICS:
        return finite(getattr(row, metric))
    if metric.startswith(SCALAR_PREFIX):
        return finite((row.scalars or {}).get(metric[len(SCALAR_PREFIX) :]))
    if metric in SERIES_METRICS:
        return series.get(row.step, {}).get(metric)
    return None  # `stale` is not a step metric: the periodic pass evaluates it


def reward_drop(rewards: list[float], reward_min: float) -> float | None:
    """How much of its height above `reward_min` the reward has lost, over rewards oldest first
    (the latest 25 at most): with m5 the mean of the latest 5 and best the highest 5-step mean
    ending in the 20 steps before, (best − m5) / (best − reward_min). 0.5 is §6's 'falls to
    reward_min + 0.5·(best − reward_min)'. None until one earlier 5-step mean exists, or when
    best is not above reward_min (nothing to drop from)."""
    if len(rewards) < REWARD_WINDOW + 1:
        return None
    means = [
        math.fsum(rewards[i - REWARD_WINDOW : i]) / REWARD_WINDOW
        for i in range(REWARD_WINDOW, len(rewards) + 1)
    ]
    best = max(means[:-1])
    if not best > reward_min:
        return None
    out = (best - means[-1]) / (best - reward_min)
    return out if math.isfinite(out) else None


def _sample_std(xs: list[float]) -> float:
    mean = math.fsum(xs) / len(xs)
    return math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (len(xs) - 1))


def series_values(
    session: Session, run: Run, split: str, steps: list[int], needs: set[str]
) -> dict[int, dict[str, float | None]]:
    """Window metrics (DESIGN.md §3, newest-attempt view, steps with a null acr skipped) and
    `reward_drop` at each of ``steps``, for the metrics named in ``needs``."""
    needs = needs & SERIES_METRICS
    if not needs or not steps:
        return {}
    lo, hi = min(steps), max(steps)
    base = (Step.run_id == run.id, Step.split == split)
    has_acr = Step.acr.is_not(None)
    before = (*base, Step.step < lo)
    # One read covers the batch and the 60 steps before it; on a short run that is everything,
    # and the bounded queries below are only needed for what it does not cover.
    limit = (hi - lo + 1) + 60
    fetched, first = _recent_and_first(session, base, hi, limit, "acr_100" in needs)
    whole = len(fetched) < limit  # the run's whole history up to hi
    head = [r for r in fetched if r[0] < lo]
    rows = [r for r in fetched if r[0] >= lo]
    head_acr = [r for r in head if r[1] is not None]

    collapsed = valid = 0
    if "acr_pooled" in needs:
        if whole:
            collapsed = sum(int(r[2] or 0) for r in head_acr)
            valid = sum(int(r[3] or 0) for r in head_acr)
        else:
            c, v = session.execute(
                select(func.sum(Step.n_collapsed), func.sum(Step.n_valid)).where(*before, has_acr)
            ).one()
            collapsed, valid = int(c or 0), int(v or 0)
    last25: deque[float] = deque((r[1] for r in head_acr), maxlen=25)
    if "acr_volatility" in needs and len(last25) < 25 and not whole:
        q = select(Step.acr).where(*before, has_acr).order_by(Step.step.desc()).limit(25)
        last25 = deque(reversed(list(session.scalars(q))), maxlen=25)
    streak = 0
    if "acr_streak" in needs:
        for r in reversed(head_acr):
            if r[1] <= DEFAULT_STREAK_THRESHOLD:
                break
            streak += 1
        else:
            if not whole:  # the streak may go back further than the read
                streak = _streak_before(session, before, has_acr)
    ema = None
    if "acr_ema" in needs:
        source = (
            (r[1] for r in head_acr)
            if whole
            else session.scalars(select(Step.acr).where(*before, has_acr).order_by(Step.step))
        )
        for a in source:
            ema = a if ema is None else ema + EMA_ALPHA * (a - ema)
    n_rewards = REWARD_WINDOW + REWARD_LOOKBACK
    rewards: deque[float] = deque(
        (r[4] for r in head if r[4] is not None and math.isfinite(r[4])), maxlen=n_rewards
    )
    if "reward_drop" in needs and len(rewards) < n_rewards and not whole:
        q = (
            select(Step.reward_mean)
            .where(*before, Step.reward_mean.is_not(None))
            .order_by(Step.step.desc())
            .limit(n_rewards)
        )
        values = reversed(list(session.scalars(q)))
        rewards = deque((v for v in values if math.isfinite(v)), maxlen=n_rewards)

    wanted = set(steps)
    out: dict[int, dict[str, float | None]] = {}
    n_first = 0
    for step, acr, n_col, n_val, reward in rows:
        if acr is not None:
            collapsed += int(n_col or 0)
            valid += int(n_val or 0)
            last25.append(acr)
            streak = streak + 1 if acr > DEFAULT_STREAK_THRESHOLD else 0
            ema = acr if ema is None else ema + EMA_ALPHA * (acr - ema)
        if reward is not None and math.isfinite(reward):
            rewards.append(reward)
        if step not in wanted:
            continue
        while n_first < len(first) and first[n_first][0] <= step:
            n_first += 1
        values: dict[str, float | None] = {}
        if "acr_pooled" in needs:
            values["acr_pooled"] = collapsed / valid if valid else None
        if "acr_100" in needs:
            values["acr_100"] = math.fsum(a for _, a in first) / 100 if n_first == 100 else None
        if "acr_volatility" in needs:
            values["acr_volatility"] = _sample_std(list(last25)) if len(last25) == 25 else None
        if "acr_streak" in needs:
            values["acr_streak"] = float(streak)
        if "acr_ema" in needs:
            values["acr_ema"] = ema
        if "reward_drop" in needs:
            values["reward_drop"] = reward_drop(list(rewards), run.reward_min)
        out[step] = values
    return out


def _recent_and_first(
    session: Session, base: tuple, hi: int, limit: int, with_first: bool
) -> tuple[list[Any], list[tuple[int, float]]]:
    """The newest ``limit`` steps up to ``hi`` (oldest first) and, ``with_first``, the first
    100 steps that have an acr (for acr_100): one round trip."""
    cols = (Step.step, Step.acr, Step.n_collapsed, Step.n_valid, Step.reward_mean)
    recent = select(*cols, literal(0).label("part"))
    recent = recent.where(*base, Step.step <= hi).order_by(Step.step.desc()).limit(limit)
    query = recent
    if with_first:
        first = select(*cols, literal(1).label("part"))
        first = first.where(*base, Step.acr.is_not(None)).order_by(Step.step).limit(100)
        query = union_all(select(recent.subquery()), select(first.subquery()))
    rows = session.execute(query).all()
    fetched = sorted((tuple(r[:5]) for r in rows if r[5] == 0), key=lambda r: r[0])
    return fetched, sorted((r[0], r[1]) for r in rows if r[5] == 1)


def _streak_before(session: Session, before: tuple, has_acr: Any) -> int:
    """How many of the latest ACRs before the batch are above the streak threshold."""
    streak, offset, chunk = 0, 0, 200
    while True:
        q = select(Step.acr).where(*before, has_acr).order_by(Step.step.desc())
        values = list(session.scalars(q.offset(offset).limit(chunk)))
        for v in values:
            if v <= DEFAULT_STREAK_THRESHOLD:
                return streak
            streak += 1
        if len(values) < chunk:
            return streak
        offset += chunk


def stale_value(run: Run, now: datetime) -> float:
    """Heartbeat periods since the run last sent a heartbeat or data (0 once it has finished)."""
    if run.status != "running":
        return 0.0
    seen = run.last_seen_at if run.last_seen_at.tzinfo else run.last_seen_at.replace(tzinfo=UTC)
    period = run.heartbeat_s if run.heartbeat_s and run.heartbeat_s > 0 else 10.0
    return max(0.0, (now - seen).total_seconds() / period)
