"""The values a rule can watch (docs/design.md §6): step metrics, window metrics, `reward_drop`,
`scalars.NAME` and `stale`.

Window values are computed incrementally (`Window`). Alert evaluation keeps the window as of
the step the rules last took with the run's progress, so the common case, the next steps in
order, reads nothing. When that window is missing or stale (a late rank or a resumed run changed
an earlier step), it is rebuilt from a few bounded queries (first 100 ACRs, last 25 ACRs, last
25 rewards, sums) and the rows of the batch's step range are walked once.
"""

from __future__ import annotations

import math
from collections import deque
from datetime import datetime
from typing import Any

from sqlalchemy import func, literal, select, union_all
from sqlalchemy.orm import Session
from vantage.client.acr import (
    DEFAULT_STREAK_THRESHOLD,
    EMA_ALPHA,
    STEP_METRIC_FIELDS,
    WINDOW_METRIC_FIELDS,
    sample_std,
)
from vantage.client.schema import MAX_ID_CHARS

from ..locks import RunState
from ..models import EMA_TAIL, Run, Step, as_utc

STEP_METRICS = frozenset(STEP_METRIC_FIELDS)
WINDOW_METRICS = frozenset(WINDOW_METRIC_FIELDS)
SERIES_METRICS = WINDOW_METRICS | {"reward_drop"}
# acr_trained, non_finite_loss and reward_spread: `vantage.server.alerts.detectors`.
DETECTOR_METRICS = frozenset({"acr_trained", "non_finite_loss", "reward_spread"})
SPECIAL_METRICS = frozenset({"reward_drop", "stale", *DETECTOR_METRICS})
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
        name = metric[len(SCALAR_PREFIX) :]
        if len(name) > MAX_ID_CHARS:  # no record may carry it: the rule could never fire
            raise ValueError(
                f"scalar names have at most {MAX_ID_CHARS} characters; this one has {len(name)}"
            )
        return metric
    raise ValueError(
        f"unknown metric '{metric}': use a step metric ({', '.join(sorted(STEP_METRICS))}), a "
        f"window metric ({', '.join(WINDOW_METRIC_FIELDS)}), reward_drop, stale, "
        f"{', '.join(sorted(DETECTOR_METRICS))} or scalars.NAME"
    )


# The range each bounded metric lies in (shares, counts); a rule's condition outside it can
# never hold, or always does (`condition_warning`).
SHARES = frozenset({"acr", "acr_trained", "acr_eps", "acr_all_pass", "acr_all_fail", "acr_constant",
                    "acr_effective", "pass_rate", "expected_acr", "acr_pooled", "acr_100",
                    "acr_ema"})  # fmt: skip
NON_NEGATIVE = frozenset({*(m for m in STEP_METRICS if m.startswith("n_")), "wasted_rollouts",
                          "acr_streak", "acr_volatility", "stale", "reward_std",
                          "non_finite_loss", "reward_spread", "scalars.entropy",
                          "scalars.grad_norm"})  # fmt: skip
METRIC_RANGES: dict[str, tuple[float, float]] = {
    **{m: (0.0, 1.0) for m in SHARES},
    **{m: (0.0, math.inf) for m in NON_NEGATIVE},
    "excess_acr": (-1.0, 1.0),
}


def condition_warning(
    metric: str, op: str, threshold: float, comparison: str = "absolute"
) -> str | None:
    """What to say of a rule whose condition its metric's range decides: it never fires
    (``acr > 7``, ``stale < -1``) or fires at every evaluated step (``acr > -5``); None
    otherwise. Such rules were taken without a word; they stay allowed, as a rule
    may be kept at hand with an impossible threshold. A `relative` rule compares the metric
    over its early-run level, a mean above 0: of a metric that is never negative, a ratio at
    0 or more (``scalars.entropy < -0.5`` never holds); a `zscore` has no range."""
    if metric not in METRIC_RANGES or comparison == "zscore":
        return None
    lo, hi = METRIC_RANGES[metric]
    if comparison == "relative":
        if lo < 0:
            return None
        lo, hi, metric = 0.0, math.inf, f"{metric} / its early-run level"
    never = {">": threshold >= hi, ">=": threshold > hi, "<": threshold <= lo,
             "<=": threshold < lo}[op]  # fmt: skip
    always = {">": threshold < lo, ">=": threshold <= lo, "<": threshold > hi,
              "<=": threshold >= hi}[op]  # fmt: skip
    span = f"[{lo:g}, {hi:g}]" if math.isfinite(hi) else f"{lo:g} or more"
    said = f"{metric} lies in {span}: {metric} {op} {threshold:g}"
    if never:
        return f"{said} never holds, so this rule never fires"
    if always:
        return f"{said} always holds, so this rule fires at every step of every run it covers"
    return None


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
    return None  # `stale`: the periodic pass; DETECTOR_METRICS: `detectors.rule_value`


# reward_drop needs the best 5-step mean this far above reward_min, as a share of the reward
# range: a reward hovering just above its floor (0.03 to 0.06 of a 0-1 range) "lost half its
# height" every few steps, and the built-in rule flapped.
REWARD_DROP_MIN_HEIGHT = 0.1


def reward_drop(rewards: list[float], bounds: tuple[float, float]) -> float | None:
    """How much of its height above `reward_min` the reward has lost, over rewards oldest first
    (the latest 25 at most): with m5 the mean of the latest 5 and best the highest 5-step mean
    ending in the 20 steps before, (best − m5) / (best − reward_min). 0.5 is §6's 'falls to
    reward_min + 0.5·(best − reward_min)'. ``bounds``: (reward_min, reward_max). None until one
    earlier 5-step mean exists, or while best is less than `REWARD_DROP_MIN_HEIGHT` of the
    range above reward_min (too little height to lose)."""
    reward_min, reward_max = bounds
    if len(rewards) < REWARD_WINDOW + 1:
        return None
    means = [_mean(rewards[i - REWARD_WINDOW : i]) for i in range(REWARD_WINDOW, len(rewards) + 1)]
    best = max(means[:-1])
    if not best > reward_min:
        return None
    span = reward_max - reward_min
    if math.isfinite(span) and span > 0:
        low = _unit(best, reward_min, reward_max)  # no overflow in the differences
        if (best / low - reward_min / low) < REWARD_DROP_MIN_HEIGHT * (span / low):
            return None
    scale = _unit(best, means[-1], reward_min)  # so that no difference overflows
    out = (best / scale - means[-1] / scale) / (best / scale - reward_min / scale)
    return out if math.isfinite(out) else None


def _unit(*xs: float) -> float:
    """A power of two within a factor 2 of max|x| (finite xs): dividing by it is exact and
    leaves every |x| below 2, so sums and differences of a few of them cannot overflow."""
    return math.ldexp(1.0, math.frexp(max(map(abs, xs)))[1] - 1)


def _mean(xs: list[float]) -> float:
    """The mean of finite floats, rounded like ``fsum(xs) / n`` but never overflowing: five
    rewards of 1e308 have the mean 1e308 instead of fsum's OverflowError (docs/design.md §3's
    overflow rule)."""
    scale = _unit(*xs)
    return math.fsum(x / scale for x in xs) / len(xs) * scale


class Window:
    """The running state of the window metrics over a split's steps, walked in step order
    (docs/design.md §3 "Window metrics": newest-attempt view, steps with a null acr
    skipped) plus the recent `reward_mean`s for `reward_drop`. Alert evaluation keeps it with the
    run's progress (`runs.eval_progress`), so evaluating the next steps in order reads nothing;
    `dump`/`load` are its JSON form (exact: floats round-trip, counts are integers)."""

    __slots__ = ("acr_100", "collapsed", "ema", "first", "last25", "rewards", "streak", "valid")

    def __init__(self) -> None:
        self.collapsed = self.valid = 0  # Σ n_collapsed, Σ n_valid over steps with an acr
        self.first: list[float] = []  # the first acrs, until there are 100 ...
        self.acr_100: float | None = None  # ... then their mean
        self.last25: deque[float] = deque(maxlen=25)
        self.streak = 0
        self.ema: float | None = None
        self.rewards: deque[float] = deque(maxlen=REWARD_WINDOW + REWARD_LOOKBACK)

    def add(
        self, acr: float | None, n_collapsed: int | None, n_valid: int | None, reward: float | None
    ) -> None:
        """Walk one step (the next in step order)."""
        if acr is not None:
            self.collapsed += int(n_collapsed or 0)
            self.valid += int(n_valid or 0)
            self._add_acr(acr)
        if reward is not None and math.isfinite(reward):
            self.rewards.append(reward)

    def _add_acr(self, acr: float) -> None:
        if self.acr_100 is None:
            self.first.append(acr)
            if len(self.first) == 100:
                self.acr_100, self.first = math.fsum(self.first) / 100, []
        self.last25.append(acr)
        self.streak = self.streak + 1 if acr > DEFAULT_STREAK_THRESHOLD else 0
        self.ema = acr if self.ema is None else self.ema + EMA_ALPHA * (acr - self.ema)

    def walk(
        self, rows: list[Any], needs: set[str], bounds: tuple[float, float]
    ) -> dict[int, dict[str, float | None]]:
        """Walk on over ``rows``, the step rows right after the window's last step (objects with
        `step`, `acr`, `n_collapsed`, `n_valid`, `reward_mean`); the values of ``needs`` at
        each. Reads nothing."""
        out = {}
        for r in sorted(rows, key=lambda r: r.step):
            self.add(r.acr, r.n_collapsed, r.n_valid, r.reward_mean)
            out[r.step] = self.values(needs, bounds)
        return out

    def values(self, needs: set[str], bounds: tuple[float, float]) -> dict[str, float | None]:
        """The metrics named in ``needs`` at the step walked last (``bounds``: the run's
        reward_min and reward_max)."""
        out: dict[str, float | None] = {}
        if "acr_pooled" in needs:
            out["acr_pooled"] = self.collapsed / self.valid if self.valid else None
        if "acr_100" in needs:
            out["acr_100"] = self.acr_100
        if "acr_volatility" in needs:
            full = len(self.last25) == 25
            out["acr_volatility"] = sample_std(list(self.last25)) if full else None
        if "acr_streak" in needs:
            out["acr_streak"] = float(self.streak)
        if "acr_ema" in needs:
            out["acr_ema"] = self.ema
        if "reward_drop" in needs:
            out["reward_drop"] = reward_drop(list(self.rewards), bounds)
        return out

    def dump(self) -> dict[str, Any]:
        return {
            "collapsed": self.collapsed,
            "valid": self.valid,
            "first": self.first,
            "acr_100": self.acr_100,
            "last25": list(self.last25),
            "streak": self.streak,
            "ema": self.ema,
            "rewards": list(self.rewards),
        }

    @classmethod
    def load(cls, data: Any) -> Window | None:
        """The window `dump` wrote, or None for anything else (then the caller reads it from
        the database)."""
        if not isinstance(data, dict):
            return None
        w = cls()
        try:
            w.collapsed, w.valid = int(data["collapsed"]), int(data["valid"])
            w.first = [float(a) for a in data["first"]]
            w.acr_100 = None if data["acr_100"] is None else float(data["acr_100"])
            w.last25.extend(float(a) for a in data["last25"])
            w.streak = int(data["streak"])
            w.ema = None if data["ema"] is None else float(data["ema"])
            w.rewards.extend(float(r) for r in data["rewards"])
        except (KeyError, TypeError, ValueError):
            return None
        return w


def drop_stale_windows(progress: dict[str, Any] | None, keys: list[tuple[str, int]]) -> Any:
    """``progress`` (`runs.eval_progress`) without the windows that data just written to
    ``keys`` (split, step) made stale: those kept at or after one of its steps. Returns the same
    object when nothing changes."""
    if not progress:
        return progress
    out = None
    for split, step in keys:
        entry = progress.get(split)
        if entry is not None and len(entry) > 3 and step <= entry[0]:
            out = out if out is not None else dict(progress)
            out[split] = entry[:3]
    return progress if out is None else out


def series_values(
    session: Session, run: Run | RunState, split: str, steps: list[int], needs: set[str]
) -> tuple[dict[int, dict[str, float | None]], Window]:
    """Window metrics and `reward_drop` at each of ``steps``, for the metrics named in
    ``needs``, read from the database; and the window after the last of them (to walk on
    from with `Window.walk`)."""
    needs = needs & SERIES_METRICS
    lo, hi = min(steps), max(steps)
    fetched, window = _window_before(session, run, split, lo, hi)
    wanted, out = set(steps), {}
    for step, acr, n_col, n_val, reward in fetched:
        window.add(acr, n_col, n_val, reward)
        if step in wanted:
            out[step] = window.values(needs, (run.reward_min, run.reward_max))
    return out, window


def _window_before(
    session: Session, run: RunState, split: str, lo: int, hi: int
) -> tuple[list[Any], Window]:
    """The window just before step ``lo``, and the step rows from ``lo`` to ``hi``, read with
    as few queries as the run's length allows: one read covers the range and the 60 steps
    before it (on a short run, everything); bounded queries fill in what it does not."""
    base = (Step.run_id == run.id, Step.split == split)
    has_acr = Step.acr.is_not(None)
    before = (*base, Step.step < lo)
    limit = (hi - lo + 1) + 60
    fetched, first = _recent_and_first(session, base, hi, limit)
    whole = len(fetched) < limit  # the run's whole history up to hi
    head = [r for r in fetched if r[0] < lo]
    window = Window()
    if whole:
        for r in head:
            window.add(*r[1:])
        return [r for r in fetched if r[0] >= lo], window
    c, v = session.execute(
        select(func.sum(Step.n_collapsed), func.sum(Step.n_valid)).where(*before, has_acr)
    ).one()
    window.collapsed, window.valid = int(c or 0), int(v or 0)
    first_acrs = [a for s, a in first if s < lo]
    if len(first_acrs) == 100:
        window.acr_100 = math.fsum(first_acrs) / 100
    else:
        window.first = first_acrs
    # The EMA from the latest EMA_TAIL ACRs (older ones no longer move a float64 EMA; the
    # summary's window metrics read the same tail), which also hold the last 25 and the streak.
    q = select(Step.acr).where(*before, has_acr).order_by(Step.step.desc()).limit(EMA_TAIL)
    tail = list(session.scalars(q))[::-1]
    for a in tail:
        window.ema = a if window.ema is None else window.ema + EMA_ALPHA * (a - window.ema)
    window.last25.extend(tail[-25:])
    streak = 0
    for a in reversed(tail):
        if a <= DEFAULT_STREAK_THRESHOLD:
            break
        streak += 1
    else:  # the streak may go back further than the tail
        if len(tail) == EMA_TAIL:
            streak = _streak_before(session, before, has_acr)
    window.streak = streak
    q = (
        select(Step.reward_mean)
        .where(*before, Step.reward_mean.is_not(None))
        .order_by(Step.step.desc())
        .limit(REWARD_WINDOW + REWARD_LOOKBACK)
    )
    window.rewards.extend(v for v in reversed(list(session.scalars(q))) if math.isfinite(v))
    return [r for r in fetched if r[0] >= lo], window


def _recent_and_first(
    session: Session, base: tuple, hi: int, limit: int
) -> tuple[list[Any], list[tuple[int, float]]]:
    """The newest ``limit`` steps up to ``hi`` (oldest first) and the first 100 steps that have
    an acr (for acr_100): one round trip."""
    cols = (Step.step, Step.acr, Step.n_collapsed, Step.n_valid, Step.reward_mean)
    recent = select(*cols, literal(0).label("part"))
    recent = recent.where(*base, Step.step <= hi).order_by(Step.step.desc()).limit(limit)
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


def stale_value(run: Run | RunState, now: datetime) -> float:
    """Heartbeat periods since the run last sent a heartbeat or data (0 once it has finished)."""
    if run.status != "running":
        return 0.0
    seen = as_utc(run.last_seen_at)
    period = run.heartbeat_s if run.heartbeat_s and run.heartbeat_s > 0 else 10.0
    return max(0.0, (now - seen).total_seconds() / period)
