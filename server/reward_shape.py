"""The reward shape of a record's stored groups (docs/detectors.md): how many rewards lie outside
the run's ``[reward_min, reward_max]`` and the central moments behind a step's `reward_std` and
`reward_bimodality` (`vantage.client.moments`, `vantage.client.acr.reward_shape`), merged into
the step's accumulator.

Kept apart from classification (`vantage.server.classify`), which it reads: it is only counting,
and a record classified in one vectorised pass is counted from the same ``[P, G]`` array.
"""

from __future__ import annotations

import math

import numpy as np
from vantage.client import moments
from vantage.client.acr import ACRSettings, StepAccumulator
from vantage.client.schema import GroupsForm

from .classify import COLLAPSED, GroupColumns


def add_reward_shape(
    acc: StepAccumulator,
    record: GroupsForm,
    cols: GroupColumns,
    indices: list[int] | None,
    settings: ACRSettings,
) -> None:
    """Count the shape of the record's groups at ``indices`` (None: all) into ``acc``: rewards
    outside the bounds over every group (masked completions dropped; a non-finite reward is
    never out of range, it is invalid), the scaled central moments of the rewards of the
    completions of valid groups (`StepAccumulator.add_shape`)."""
    arrays = cols.arrays
    if arrays is not None and arrays.x is not None:
        x = arrays.x if indices is None else arrays.x[indices]
        code = arrays.code if indices is None else arrays.code[indices]
        _add_array(acc, x, code >= COLLAPSED, settings)
        return
    groups = record.normal_groups()
    for i in range(len(groups)) if indices is None else indices:
        g, valid = groups[i], cols.cls[i] >= COLLAPSED
        if g.stats is not None:
            _add_stats(acc, g.stats, valid, settings)
            continue
        rewards = g.rewards or []
        if g.mask is not None:
            rewards = [r for r, m in zip(rewards, g.mask, strict=True) if m]
        if not rewards:
            continue
        x = np.array([np.nan if r is None else r for r in rewards], dtype=np.float64)
        _add_array(acc, x[None, :], np.array([valid]), settings)


def _add_array(
    acc: StepAccumulator, x: np.ndarray, valid: np.ndarray, settings: ACRSettings
) -> None:
    """``x``: [P, G] rewards (NaN for null), ``valid``: [P] whether each group is valid."""
    with np.errstate(all="ignore"):
        out = int(((x < settings.reward_min) | (x > settings.reward_max)).sum())
    acc.add_shape(out, _moments(x[valid]), higher=True)


def _moments(values: np.ndarray) -> moments.Moments:
    """`vantage.client.moments.from_values` for the (finite) rewards of valid groups, numpy."""
    if not values.size:
        return moments.EMPTY
    lo, hi = float(values.min()), float(values.max())
    scale = moments.scale_for(max(abs(lo), abs(hi)))
    if scale == 0.0 or lo == hi:  # exactly no spread, not the round-off of a mean
        return (int(values.size), scale, lo / scale if scale else 0.0, 0.0, 0.0, 0.0)
    u = values / scale  # a power of two: exact, and every |u| < 1
    mean = float(u.mean())
    d = u - mean
    d2 = d * d
    return (
        int(u.size),
        scale,
        mean,
        float(d2.sum()),
        float((d2 * d).sum()),
        float((d2 * d2).sum()),
    )


def _add_stats(acc: StepAccumulator, stats, valid: bool, settings: ACRSettings) -> None:  # noqa: ANN001
    """A group sent as statistics: its min and max show how many rewards at least lie out of
    range (all n when min == max); its n, mean and std give its mean and 2nd moment, not the
    higher ones."""
    lo, hi, n = stats.min, stats.max, stats.n
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return
    below, above = lo < settings.reward_min, hi > settings.reward_max
    out = n if lo == hi and (below or above) else int(below) + int(above)
    if not valid or stats.mean is None or stats.std is None:
        acc.add_shape(out, moments.EMPTY, higher=False)
        return
    scale = moments.scale_for(max(abs(lo), abs(hi)))
    if scale == 0.0:
        acc.add_shape(out, (n, 0.0, 0.0, 0.0, 0.0, 0.0), higher=False)
        return
    # the sample std of values within [lo, hi] is below 2·scale: its square cannot overflow
    std = stats.std / scale
    part = (n, scale, stats.mean / scale, (n - 1) * std * std, 0.0, 0.0)
    acc.add_shape(out, part, higher=False)
