"""Training-health detectors (docs/detectors.md): the value a rule compares when it has a
warmup or compares against a baseline, and the metrics that exist for the built-in detectors.

A rule's `comparison` says what its condition compares with the threshold:

- ``absolute``: the metric itself (every rule before migration 0014);
- ``zscore``: how many standard deviations the metric lies above the mean of its rolling
  baseline, the rule's latest `baseline_steps` values on the run before this step;
- ``relative``: the metric divided by its early-run level, the mean of the rule's first
  `baseline_steps` values on the run.

`warmup_steps`: the run's steps from the first that has a value up to ``first + warmup_steps``
(exclusive) feed the baseline and never fire. The baselines live in the run's evaluation
progress (`runs.eval_progress`, under `BASELINES`), which ingest reads with the run under its
lock and writes back with the run's state in any case: evaluating the next step reads and
writes nothing more. A newer attempt that replays steps (a resumed run) walks on from the
baseline as it stands: the replayed values enter it again, a small bias that a rolling
baseline soon forgets.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from vantage.client.schema import NON_FINITE_TOKENS

from .metrics import DETECTOR_METRICS, finite, step_value
from .states import RuleRow

COMPARISONS = ("absolute", "zscore", "relative")
# A z-score needs this many baseline values (fewer give a std too noisy to divide by).
MIN_BASELINE = 10
# ... and a baseline whose most common value fills more than this share of it has no spread to
# measure a change in: the exact zeros a fully collapsed GRPO step logs for loss, grad_norm and
# kl (or a constant clip) made the first change after them, even the next step of a ramp up from
# 0, fire with a z-score of thousands. Such a baseline gives no z-score: the rule cannot fire.
MAX_REPEATED_SHARE = 0.5
# The std a z-score divides by is at least this share of the baseline's |mean|: a metric that
# held perfectly still (a constant grad_norm clip) would otherwise make any change infinite.
STD_FLOOR_SHARE = 0.01
TINY = 1e-12
# A value enters a z-score baseline clipped to this many standard deviations of it: a spike
# entering as it is made the baseline's std so wide that the next step's z-score fell below
# the threshold (a fault two steps long could not fire a rule of for_steps 2), while a lasting
# shift still moves the baseline, by up to 3 standard deviations a step, and is absorbed.
WINSOR_Z = 3.0


TRAINING_SCALARS = ("loss", "grad_norm")


def detector_value(row: Any, metric: str) -> float | None:
    """A detector metric's value at a step row (None: the step says nothing of it):

    - ``acr_trained``: the share of valid groups that trained on nothing: `acr_effective`
      when the trainer reported its statistics after mitigation, else `acr`;
    - ``non_finite_loss``: how many of the scalars `loss` and `grad_norm` are non-finite
      (None when the step carries neither);
    - ``reward_spread``: `reward_std` (a `zscore` rule adds `reward_bimodality`:
      `vantage.server.alerts.detectors.components`).
    """
    if metric == "acr_trained":
        effective = finite(row.acr_effective)
        return effective if effective is not None else finite(row.acr)
    if metric == "non_finite_loss":
        scalars = row.scalars or {}
        present = [scalars[k] for k in TRAINING_SCALARS if k in scalars]
        if not present:
            return None
        return float(sum(_non_finite(v) for v in present))
    if metric == "reward_spread":
        return finite(row.reward_std)
    return None


def _non_finite(value: Any) -> bool:
    """Scalars are stored with NaN and ±Infinity as their strings (`storable_scalar`)."""
    if value in NON_FINITE_TOKENS:
        return True
    return isinstance(value, float) and not math.isfinite(value)


def rule_value(row: Any, metric: str, series: dict[int, dict[str, float | None]]) -> float | None:
    """A rule's value at a step row before its comparison: `step_value`, or for the metrics
    made for the detectors `detector_value`."""
    if metric in DETECTOR_METRICS:
        return detector_value(row, metric)
    return step_value(row, metric, series)


def uses_detector(rule: RuleRow) -> bool:
    """Whether the rule's value goes through `detect` (a plain rule's does not: no state)."""
    return rule.comparison != "absolute" or bool(rule.warmup_steps)


def components(row: Any, metric: str, value: float | None) -> tuple[float | None, ...]:
    """The series a rule's baseline keeps for ``metric`` at a step whose value is ``value``:
    ``reward_spread`` keeps the reward std and the bimodality coefficient (a z-score of
    either fires it), every other metric its value."""
    if metric == "reward_spread":
        return (value, finite(row.reward_bimodality))
    return (value,)


BASELINES = "#baselines"
"""The key of `runs.eval_progress` under which the detectors' baselines live (a split name
cannot hold ``#``): ``{baseline_key(rule): [first step, early values, recent values]}``."""


def baseline_key(rule: RuleRow) -> str:
    """A rule's baseline is that of its series: a rule that comes to watch another metric,
    split or comparison starts a new one."""
    return f"{rule.id}:{rule.split}:{rule.comparison}:{rule.metric}"


def detect(
    baseline: Any, rule: RuleRow, step: int, parts: tuple[float | None, ...]
) -> tuple[float | None, Any]:
    """The value the rule compares at ``step`` (`comparison`), None during its warmup or while
    its baseline is too short; and its ``baseline`` (None: none yet; JSON lists or tuples,
    [first step, early values, recent values per component]) walked on by this step.
    ``parts``: the step's `components` (all None: the step has no value, nothing changes)."""
    if all(p is None for p in parts):
        return None, baseline
    try:
        first, early, recent = baseline
        first = int(first)
    except (TypeError, ValueError):  # none yet, or not one this module wrote: start again
        first, early, recent = step, (), ()
    size = max(1, rule.baseline_steps or 1)
    value = None
    if rule.comparison == "zscore":
        value, recent = _zscore(parts, recent, size)
    elif rule.comparison == "relative":
        if len(early) >= size:
            value = _relative(parts[0], early)
        elif parts[0] is not None:
            early = (*early, parts[0])
    else:
        value = parts[0]
    if step < first + (rule.warmup_steps or 0):
        value = None
    return value, (first, early, recent)


def _zscore(
    parts: tuple[float | None, ...], recent: tuple[tuple[float, ...], ...], size: int
) -> tuple[float | None, tuple[tuple[float, ...], ...]]:
    """The largest z-score among the components that have a value and `MIN_BASELINE` values
    in their baseline, not most of them equal (`_spread`), (x − mean) / max(sample std,
    `STD_FLOOR_SHARE`·|mean|, `TINY`); and
    the baselines walked on (``recent``: per component its latest values, at most ``size``),
    each value entering within `WINSOR_Z` standard deviations of its baseline."""
    best = None
    walked = list(recent) + [()] * (len(parts) - len(recent))
    for k, x in enumerate(parts):
        if x is None:
            continue
        history = walked[k]
        n = len(history)
        if n >= MIN_BASELINE and _spread(history):
            mean = math.fsum(history) / n
            var = math.fsum([(h - mean) * (h - mean) for h in history]) / (n - 1)
            std = max(math.sqrt(var), STD_FLOOR_SHARE * abs(mean), TINY)
            z = (x - mean) / std
            if not math.isfinite(z):
                continue
            best = z if best is None else max(best, z)
            x = min(max(x, mean - WINSOR_Z * std), mean + WINSOR_Z * std)
        walked[k] = (*history[1 - size if n >= size else 0 :], x) if size > 1 else (x,)
    return best, tuple(walked)


def _spread(history: tuple[float, ...]) -> bool:
    """Whether a baseline's values vary enough to divide by their std: its most common value
    fills at most `MAX_REPEATED_SHARE` of it."""
    return max(Counter(history).values()) <= MAX_REPEATED_SHARE * len(history)


def _relative(x: float | None, early: tuple[float, ...]) -> float | None:
    """``x`` over the mean of the early values; None unless that mean is above 0 (a ratio to
    a level at or below 0 says nothing of "far below")."""
    if x is None:
        return None
    level = math.fsum(early) / len(early)
    if not level > 0:
        return None
    out = x / level
    return out if math.isfinite(out) else None
