"""The Advantage Collapse Rate engine: group classification, step metrics and window metrics.

Everything here is pure (no I/O, no globals) and follows docs/design.md §3, which is normative.

GRPO (Shao et al. 2024, "DeepSeekMath", eq. 3) normalises each reward against its group,
``A_i = (r_i - mean(r)) / (std(r) + eps)``; a group whose rewards are all equal has ``A_i = 0`` for
every completion and contributes no gradient. The share of such groups in a step is the ACR.

Numerics: float64, two-pass mean and variance over values divided by ``s = max|r_i|`` so that no
finite input can overflow; any output that is still not finite is reported as ``None``.
"""

from __future__ import annotations

import builtins
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from . import moments

__all__ = [
    "ACRSettings",
    "GroupClass",
    "GroupSummary",
    "StepAccumulator",
    "STEP_METRIC_FIELDS",
    "WINDOW_METRIC_FIELDS",
    "summarize_rewards",
    "summarize_stats",
    "step_metrics",
    "summarize_step",
    "window_metrics",
    "InconsistentStatsError",
    "collapsed_side",
]


class GroupClass(StrEnum):
    """The five classes of docs/design.md §3; only the last three enter the ACR denominator."""

    INVALID = "invalid"
    DEGENERATE = "degenerate"
    COLLAPSED = "collapsed"
    NEAR_COLLAPSED = "near_collapsed"
    LIVE = "live"


VALID_CLASSES = frozenset({GroupClass.COLLAPSED, GroupClass.NEAR_COLLAPSED, GroupClass.LIVE})


class InconsistentStatsError(ValueError):
    """Compact group statistics that no list of rewards could have produced."""


@dataclass(frozen=True, slots=True)
class ACRSettings:
    """Per-run constants of the classification.

    reward_min, reward_max: the bounds that name a collapsed group's side (all_fail, all_pass).
    trainer_eps: the eps of the trainer's advantage denominator (TRL and our ``grpo``: 1e-4).
    tol: a group is near-collapsed when every |A_i| is below this.
    """

    reward_min: float = 0.0
    reward_max: float = 1.0
    trainer_eps: float = 1e-4
    tol: float = 1e-3


@dataclass(frozen=True, slots=True)
class GroupSummary:
    """One group after masking, classified.

    n: completions that remain after the mask. mean/std (sample std, n-1)/min/max: None when not
    finite or undefined. n_pass: completions equal to reward_max if the group is binary, else None.
    """

    cls: GroupClass
    side: str | None
    n: int
    mean: float | None
    std: float | None
    min: float | None
    max: float | None
    n_pass: int | None

    @property
    def valid(self) -> bool:
        return self.cls in VALID_CLASSES


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


def collapsed_side(value: float, settings: ACRSettings) -> str:
    """The side of a collapsed group whose rewards all equal ``value`` (docs/design.md §3)."""
    if value == settings.reward_max:
        return "all_pass"
    if value == settings.reward_min:
        return "all_fail"
    return "constant"


def _classify(
    n: int, lo: float, hi: float, mean_x: float, std_x: float, s: float, settings: ACRSettings
) -> tuple[GroupClass, str | None]:
    """Class and side of a valid-size group from scaled statistics (x = r / s)."""
    if hi == lo:
        return GroupClass.COLLAPSED, collapsed_side(lo, settings)
    # max_i |r_i - mean| is attained at min or max; divide by s on both sides of the ratio so
    # nothing overflows: |r - mean| / (std + eps) == |x - mean_x| / (std_x + eps / s).
    max_dev_x = max(hi / s - mean_x, mean_x - lo / s)
    ratio = max_dev_x / (std_x + settings.trainer_eps / s)
    if ratio < settings.tol:
        return GroupClass.NEAR_COLLAPSED, None
    return GroupClass.LIVE, None


def _binary_passes(values: Sequence[float], n: int, settings: ACRSettings) -> int | None:
    """Completions equal to reward_max when every value is reward_min or reward_max, else None."""
    n_pass = values.count(settings.reward_max)  # type: ignore[attr-defined]
    if n_pass + values.count(settings.reward_min) == n:  # type: ignore[attr-defined]
        return n_pass
    return None


def summarize_rewards(
    rewards: Sequence[float | None],
    mask: Sequence[int | bool] | None = None,
    settings: ACRSettings = ACRSettings(),
) -> GroupSummary:
    """Classify one group of G rewards (docs/design.md §3).

    rewards: length G, float or None (None, NaN and ±inf are non-finite). mask: length G, 0 drops a
    completion. Raises ValueError when mask and rewards differ in length.
    """
    if mask is not None:
        if len(mask) != len(rewards):
            raise ValueError(f"mask has {len(mask)} entries for {len(rewards)} rewards")
        rewards = [r for r, m in zip(rewards, mask, strict=True) if m]
    n = len(rewards)
    # One fsum checks every value at C speed: None raises TypeError, ±inf or NaN give a
    # non-finite total (inf + -inf raises ValueError), and only finite values too large to add
    # raise OverflowError.
    try:
        total = math.fsum(rewards)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return GroupSummary(GroupClass.INVALID, None, n, None, None, None, None, None)
    except OverflowError:  # finite values too large to add, or a null/non-finite value after them
        if any(r is None or not math.isfinite(r) for r in rewards):
            return GroupSummary(GroupClass.INVALID, None, n, None, None, None, None, None)
        total = 0.0  # finite but huge: the scaled path below does not use it
    else:
        if not math.isfinite(total):
            return GroupSummary(GroupClass.INVALID, None, n, None, None, None, None, None)
    values = rewards if isinstance(rewards, list | tuple) else list(rewards)
    if n < 2:
        v = float(values[0]) if values else None
        return GroupSummary(GroupClass.DEGENERATE, None, n, v, None, v, v, None)
    lo, hi = float(min(values)), float(max(values))
    n_pass = _binary_passes(values, n, settings)
    if lo == hi:
        return GroupSummary(
            GroupClass.COLLAPSED, collapsed_side(lo, settings), n, lo, 0.0, lo, hi, n_pass
        )
    s = max(abs(lo), abs(hi))
    # (d * d, not d ** 2: the server's vectorised twin must reproduce every operation exactly)
    if s == 1.0:  # rewards in [-1, 1], the common case: no scaling needed
        mean_x = total / n
        std_x = math.sqrt(math.fsum([(x - mean_x) * (x - mean_x) for x in values]) / (n - 1))
    else:
        xs = [x / s for x in values]
        mean_x = math.fsum(xs) / n
        std_x = math.sqrt(math.fsum([(x - mean_x) * (x - mean_x) for x in xs]) / (n - 1))
    # Round-off can put the mean a hair outside [min, max] for near-constant groups.
    mean_x = min(max(mean_x, lo / s), hi / s)
    cls, side = _classify(n, lo, hi, mean_x, std_x, s, settings)
    return GroupSummary(
        cls, side, n, _finite_or_none(mean_x * s), _finite_or_none(std_x * s), lo, hi, n_pass
    )


def _check_stats_bounds(
    n: int, mean: float | None, std: float | None, lo: float | None, hi: float | None
) -> None:
    """Whether n values with this min and max could have this mean and std; raises
    InconsistentStatsError naming the bound broken. All in units of s = max(|min|, |max|), with
    a slack of 1e-9 for rounding (no computation can overflow):

    - min and max are both taken, so the other n − 2 values lie between them: the mean lies in
      [min + (max − min)/n, max − (max − min)/n] (for n = 2, exactly the midpoint);
    - the std is at most √((max − mean)(mean − min) · n/(n − 1)) (the Bhatia–Davis bound on
      the variance, Bhatia & Davis 2000, as a sample std), and at least (max − min)/√(2n) (two
      values at the ends, the rest at their mean, taken as a population std so that a client
      sending numpy's default passes)."""
    if n == 0:
        if any(v is not None for v in (mean, std, lo, hi)):
            raise InconsistentStatsError("n is 0 but statistics were sent")
        return
    if mean is None or lo is None or hi is None:
        return
    s = builtins.max(abs(lo), abs(hi)) or 1.0
    low, high, m = lo / s, hi / s, mean / s
    tol = 1e-9 + 4 * math.ulp(0.0) / s  # subnormal values round by whole ulps
    if not low - tol <= m <= high + tol:
        raise InconsistentStatsError(f"mean {mean} is outside [min {lo}, max {hi}]")
    if n < 2 or hi == lo:
        return
    edge = (high - low) / n
    if not low + edge - tol <= m <= high - edge + tol:
        raise InconsistentStatsError(
            f"mean {mean} is impossible for {n} values whose min is {lo} and max is {hi}: it "
            f"lies within [{(low + edge) * s!r}, {(high - edge) * s!r}]"
        )
    if std is None:
        return
    widest = math.sqrt(builtins.max(high - m, 0.0) * builtins.max(m - low, 0.0) * n / (n - 1))
    if std / s > widest * (1 + 1e-9) + tol:
        raise InconsistentStatsError(
            f"std {std} exceeds {widest * s!r}, the largest possible for {n} values in "
            f"[{lo}, {hi}] with mean {mean}"
        )
    narrowest = (high / 2 - low / 2) * math.sqrt(2 / n)
    if std / s < narrowest * (1 - 1e-9) - tol:
        raise InconsistentStatsError(
            f"std {std} is below {narrowest * s!r}, the smallest possible for {n} values "
            f"spanning [{lo}, {hi}]"
        )


def _check_n_pass(
    n: int, mean: float, std: float | None, lo: float, hi: float, n_pass: int, r: ACRSettings
) -> None:
    """A group that carries n_pass is binary (docs/design.md §3): every reward is reward_min or
    reward_max, n_pass of them reward_max. Its min, max, mean and std follow from n_pass and n;
    raises InconsistentStatsError when they do not (std as a sample or a population std)."""
    want_lo = r.reward_max if n_pass == n else r.reward_min
    want_hi = r.reward_min if n_pass == 0 else r.reward_max
    if (lo, hi) != (want_lo, want_hi):
        raise InconsistentStatsError(
            f"n_pass {n_pass} of n {n} says the rewards are {want_lo} to {want_hi} (binary: "
            f"each reward_min {r.reward_min} or reward_max {r.reward_max}), but min is {lo} and "
            f"max is {hi}"
        )
    s = builtins.max(abs(r.reward_min), abs(r.reward_max))
    low, high, p = r.reward_min / s, r.reward_max / s, n_pass / n
    expected = low + (high - low) * p
    if abs(mean / s - expected) > 1e-9 * (1 + abs(expected)):
        raise InconsistentStatsError(
            f"mean {mean} does not match n_pass {n_pass} of n {n} binary rewards "
            f"({expected * s:.6g})"
        )
    if std is None or n < 2:
        return
    population = (high - low) * math.sqrt(p * (1 - p))
    sample = population * math.sqrt(n / (n - 1))
    if not population * (1 - 1e-9) - 1e-9 <= std / s <= sample * (1 + 1e-9) + 1e-9:
        raise InconsistentStatsError(
            f"std {std} does not match n_pass {n_pass} of n {n} binary rewards "
            f"({sample * s:.6g} as a sample std)"
        )


def _implied_n_pass(n: int, min: float, max: float, settings: ACRSettings) -> int | None:  # noqa: A002
    """The n_pass that stats without one still fix, so that they are binary exactly when the
    same rewards sent as a list would be: every value at one bound (min == max == reward_max
    or reward_min), or two values, one at each bound. None otherwise."""
    lo, hi = settings.reward_min, settings.reward_max
    if min == max:
        return n if min == hi else 0 if min == lo else None
    if n == 2 and min == lo and max == hi:
        return 1
    return None


def summarize_stats(
    n: int,
    mean: float | None,
    std: float | None,
    min: float | None,  # noqa: A002 - the wire field's name
    max: float | None,  # noqa: A002
    n_pass: int | None = None,
    settings: ACRSettings = ACRSettings(),
) -> GroupSummary:
    """Classify a group sent as compact statistics (n, mean, sample std, min, max, n_pass?).

    Raises InconsistentStatsError for min > max, std < 0, std > 0 with min == max (beyond
    1e-9·|min|, which rounding in a client's std can give, and is read as 0), n < 0, an
    n_pass outside [0, n], a mean or std that no n values with this min and max could have
    (`_check_stats_bounds`), or an n_pass that the other statistics contradict (`_check_n_pass`).
    """
    if n < 0:
        raise InconsistentStatsError(f"n is {n}; it must be >= 0")
    if n_pass is not None and not 0 <= n_pass <= n:
        raise InconsistentStatsError(f"n_pass {n_pass} is outside [0, n={n}]")
    if n > 0 and any(v is None or not math.isfinite(v) for v in (mean, min, max)):
        return GroupSummary(GroupClass.INVALID, None, n, None, None, None, None, None)
    if n >= 2 and (std is None or not math.isfinite(std)):
        return GroupSummary(GroupClass.INVALID, None, n, None, None, None, None, None)
    if min is not None and max is not None and min > max:
        raise InconsistentStatsError(f"min {min} > max {max}")
    if std is not None and std < 0:
        raise InconsistentStatsError(f"std {std} < 0")
    if std is not None and std > 0 and min == max:
        # numpy's std of equal values can be a few ulps above 0 (its mean is rounded): allowed
        if std > 1e-9 * (abs(min) or 1.0):  # type: ignore[arg-type]
            raise InconsistentStatsError(f"std {std} > 0 but min == max == {min}")
        std = 0.0
    _check_stats_bounds(n, mean, std, min, max)
    if min is not None and min == max:
        mean = min  # within rounding of it (checked): all n values are min
    if n_pass is not None and n > 0:
        assert mean is not None and min is not None and max is not None
        _check_n_pass(n, mean, std, min, max, n_pass, settings)
    if n < 2:
        return GroupSummary(GroupClass.DEGENERATE, None, n, mean, None, min, max, None)
    assert mean is not None and std is not None and min is not None and max is not None
    if n_pass is None:
        n_pass = _implied_n_pass(n, min, max, settings)
    s = abs(min) if abs(min) >= abs(max) else abs(max)
    s = s or 1.0
    cls, side = _classify(n, min, max, mean / s, std / s, s, settings)
    return GroupSummary(cls, side, n, mean, std, min, max, n_pass)


# --------------------------------------------------------------------------- step metrics

STEP_METRIC_FIELDS: tuple[str, ...] = (
    "n_groups",
    "n_valid",
    "n_collapsed",
    "n_near_collapsed",
    "n_invalid",
    "n_degenerate",
    "acr",
    "acr_eps",
    "acr_all_pass",
    "acr_all_fail",
    "acr_constant",
    "acr_effective",
    "wasted_rollouts",
    "pass_rate",
    "expected_acr",
    "excess_acr",
    "reward_mean",
    "n_out_of_range",
    "reward_std",
    "reward_bimodality",
)


def _ratio(num: float, den: float) -> float | None:
    if den == 0:
        return None
    return _finite_or_none(num / den)


@dataclass(slots=True)
class StepAccumulator:
    """Mergeable counts behind one (step, split)'s metrics; ranks and batches add into one.

    The server stores these fields per step, so metrics never need the stored groups again.
    ``group_sizes`` maps a valid group's size G_j to how many valid groups have it (for
    expected_acr); ``n_nonbinary`` counts valid groups that are not binary.
    """

    n_groups: int = 0
    n_valid: int = 0
    n_collapsed: int = 0
    n_near_collapsed: int = 0
    n_invalid: int = 0
    n_degenerate: int = 0
    n_all_pass: int = 0
    n_all_fail: int = 0
    n_constant: int = 0
    wasted_rollouts: int = 0
    n_completions: int = 0  # completions of valid groups
    # Σ n_j·mean_j over valid groups, exactly, in units of 2^-1074 (the smallest double), so that
    # reward_mean does not depend on the order groups and ranks arrive in.
    reward_sum: int = 0
    n_pass: int = 0  # completions equal to reward_max, binary valid groups
    n_nonbinary: int = 0
    group_sizes: dict[int, int] = field(default_factory=dict)
    eff_n_valid: int = 0
    eff_n_zero_advantage: int = 0
    eff_reports: int = 0
    # Rewards outside [reward_min, reward_max] (any group; a stats group: those its min and max
    # show, all n when min == max), and the scaled central moments of the rewards of the
    # completions of valid groups (`add_shape`, `vantage.client.moments`): `shape_n` completions,
    # kept in units of `shape_scale`; `shape_m` of them (groups sent as lists) have their 3rd
    # and 4th moments in `shape_m3`, `shape_m4` (meaningless unless shape_m == shape_n).
    n_out_of_range: int = 0
    shape_n: int = 0
    shape_scale: float = 0.0
    shape_mean: float = 0.0
    shape_m2: float = 0.0
    shape_m3: float = 0.0
    shape_m4: float = 0.0
    shape_m: int = 0

    def add(self, g: GroupSummary) -> None:
        """Count one classified group."""
        self.n_groups += 1
        if g.cls is GroupClass.INVALID:
            self.n_invalid += 1
            return
        if g.cls is GroupClass.DEGENERATE:
            self.n_degenerate += 1
            return
        self.n_valid += 1
        self.n_completions += g.n
        if g.mean is not None:
            num, den = g.mean.as_integer_ratio()  # den is a power of two, at most 2^1074
            self.reward_sum += (num * g.n) << (EXACT_SHIFT - den.bit_length() + 1)
        self.group_sizes[g.n] = self.group_sizes.get(g.n, 0) + 1
        if g.n_pass is None:
            self.n_nonbinary += 1
        else:
            self.n_pass += g.n_pass
        if g.cls is GroupClass.COLLAPSED:
            self.n_collapsed += 1
            self.wasted_rollouts += g.n
            if g.side == "all_pass":
                self.n_all_pass += 1
            elif g.side == "all_fail":
                self.n_all_fail += 1
            else:
                self.n_constant += 1
        elif g.cls is GroupClass.NEAR_COLLAPSED:
            self.n_near_collapsed += 1

    def add_many(
        self,
        classes: Sequence[GroupClass],
        sides: Sequence[str | None],
        sizes: Sequence[int],
        means: Sequence[float | None],
        n_passes: Sequence[int | None],
    ) -> None:
        """`add` for many classified groups given as columns (one entry per group): the same
        counts, with the exact reward sum taken once per distinct (mean, size)."""
        counts = Counter(classes)
        self.n_groups += len(classes)
        self.n_invalid += counts[GroupClass.INVALID]
        self.n_degenerate += counts[GroupClass.DEGENERATE]
        self.n_collapsed += counts[GroupClass.COLLAPSED]
        self.n_near_collapsed += counts[GroupClass.NEAR_COLLAPSED]
        valid = [i for i, c in enumerate(classes) if c in VALID_CLASSES]
        self.n_valid += len(valid)
        sizes_v = [sizes[i] for i in valid]
        self.n_completions += sum(sizes_v)
        for size, count in Counter(sizes_v).items():
            self.group_sizes[size] = self.group_sizes.get(size, 0) + count
        for (mean, size), count in Counter((means[i], sizes[i]) for i in valid).items():
            if mean is not None:
                num, den = mean.as_integer_ratio()
                self.reward_sum += (num * size * count) << (EXACT_SHIFT - den.bit_length() + 1)
        passes = [n_passes[i] for i in valid]
        self.n_nonbinary += passes.count(None)
        self.n_pass += sum(p for p in passes if p is not None)
        collapsed = [i for i in valid if classes[i] is GroupClass.COLLAPSED]
        self.wasted_rollouts += sum(sizes[i] for i in collapsed)
        by_side = Counter(sides[i] for i in collapsed)
        self.n_all_pass += by_side["all_pass"]
        self.n_all_fail += by_side["all_fail"]
        self.n_constant += len(collapsed) - by_side["all_pass"] - by_side["all_fail"]

    def add_shape(self, n_out_of_range: int, part: moments.Moments, higher: bool) -> None:
        """Count rewards outside the bounds and merge ``part``, the moments of rewards of
        completions of valid groups (`vantage.client.moments`); ``higher``: its 3rd and 4th
        moments are known (a group sent as statistics knows only n, mean and std)."""
        self.n_out_of_range += n_out_of_range
        self._merge_shape(part, part[0] if higher else 0)

    def _shape(self) -> moments.Moments:
        return (
            self.shape_n,
            self.shape_scale,
            self.shape_mean,
            self.shape_m2,
            self.shape_m3,
            self.shape_m4,
        )

    def _merge_shape(self, part: moments.Moments, higher_n: int) -> None:
        merged = moments.merge(self._shape(), part)
        self.shape_n, self.shape_scale, self.shape_mean = merged[:3]
        self.shape_m2, self.shape_m3, self.shape_m4 = merged[3:]
        self.shape_m += higher_n

    def add_effective(self, n_valid: int, n_zero_advantage: int) -> None:
        """Count one rank's effective statistics, reported by the trainer after mitigation."""
        self.eff_n_valid += n_valid
        self.eff_n_zero_advantage += n_zero_advantage
        self.eff_reports += 1

    def merge(self, other: StepAccumulator) -> None:
        """Add another accumulator of the same (step, split) into this one."""
        self._merge_shape(other._shape(), other.shape_m)
        for name in self.__slots__:  # type: ignore[attr-defined]
            if name in _SHAPE_FIELDS:
                continue
            if name == "group_sizes":
                for size, count in other.group_sizes.items():
                    self.group_sizes[size] = self.group_sizes.get(size, 0) + count
            else:
                setattr(self, name, getattr(self, name) + getattr(other, name))

    def metrics(self) -> dict[str, float | int | None]:
        """Every step metric of docs/design.md §3 by name; ratios are None on a 0 denominator."""
        return step_metrics(self)


_SHAPE_FIELDS = frozenset(
    ("shape_n", "shape_scale", "shape_mean", "shape_m2", "shape_m3", "shape_m4", "shape_m")
)


def step_metrics(acc: StepAccumulator) -> dict[str, float | int | None]:
    """Step metrics from an accumulator (docs/design.md §3 'Step metrics'); no value is NaN
    or inf."""
    valid = acc.n_valid
    binary = valid > 0 and acc.n_nonbinary == 0
    pass_rate = _ratio(acc.n_pass, acc.n_completions) if binary else None
    expected = None
    if pass_rate is not None:
        p = pass_rate
        total = math.fsum(
            count * (p**size + (1.0 - p) ** size) for size, count in acc.group_sizes.items()
        )
        expected = _ratio(total, valid)
    acr = _ratio(acc.n_collapsed, valid)
    return {
        "n_groups": acc.n_groups,
        "n_valid": valid,
        "n_collapsed": acc.n_collapsed,
        "n_near_collapsed": acc.n_near_collapsed,
        "n_invalid": acc.n_invalid,
        "n_degenerate": acc.n_degenerate,
        "acr": acr,
        "acr_eps": _ratio(acc.n_collapsed + acc.n_near_collapsed, valid),
        "acr_all_pass": _ratio(acc.n_all_pass, valid),
        "acr_all_fail": _ratio(acc.n_all_fail, valid),
        "acr_constant": _ratio(acc.n_constant, valid),
        "acr_effective": (
            _ratio(acc.eff_n_zero_advantage, acc.eff_n_valid) if acc.eff_reports else None
        ),
        "wasted_rollouts": acc.wasted_rollouts,
        "pass_rate": pass_rate,
        "expected_acr": expected,
        "excess_acr": (
            _finite_or_none(acr - expected) if acr is not None and expected is not None else None
        ),
        "reward_mean": _exact_mean(acc.reward_sum, acc.n_completions),
        "n_out_of_range": acc.n_out_of_range,
        **reward_shape(acc, binary),
    }


def reward_shape(acc: StepAccumulator, binary: bool) -> dict[str, float | None]:
    """The spread and shape of a step's rewards over the completions of its valid groups, from
    their merged central moments (`vantage.client.moments`: float64, scaled, exact in where
    the rewards lie; order-dependent in the last bits):

    - ``reward_std``: the sample std of every completion's reward, pooled over groups (a stats
      group adds its n, mean and std); None below 2 completions, or above the largest float.
    - ``reward_bimodality``: Sarle's bimodality coefficient with the sample-size correction,
      BC = (G1² + 1) / (G2 + 3(n−1)²/((n−2)(n−3))), G1 and G2 the adjusted sample skewness
      and excess kurtosis (SAS's and Excel's). About 1/3 for a normal distribution, 5/9 for
      a uniform one, near 1 for two separated clusters; above 5/9 suggests two modes
      (Pfister et al. 2013, Front. Psychol. 4:700). None for binary steps (two values are two
      clusters by construction), when a stats group hides its completions' higher moments,
      below 4 completions, or for a spread of 0."""
    n = acc.shape_n
    out: dict[str, float | None] = {"reward_std": None, "reward_bimodality": None}
    if n < 2:
        return out
    # population central moments in units of shape_scale (scale-free ratios below)
    m2 = max(acc.shape_m2, 0.0) / n
    out["reward_std"] = _finite_or_none(math.sqrt(m2 * n / (n - 1)) * acc.shape_scale)
    if binary or acc.shape_m != n or n < 4 or not m2 > 0 or not math.isfinite(m2):
        return out
    m3, m4 = acc.shape_m3 / n, acc.shape_m4 / n
    g1 = m3 / m2**1.5 * math.sqrt(n * (n - 1)) / (n - 2)
    g2 = ((n + 1) * (m4 / (m2 * m2) - 3) + 6) * (n - 1) / ((n - 2) * (n - 3))
    denominator = g2 + 3 * (n - 1) ** 2 / ((n - 2) * (n - 3))
    if not denominator > 0:
        return out
    out["reward_bimodality"] = _finite_or_none((g1 * g1 + 1) / denominator)
    return out


EXACT_SHIFT = 1074


def _exact_mean(total: int, n: int) -> float | None:
    if n == 0:
        return None
    try:
        # int / int is correctly rounded; + 0.0 turns the -0.0 of a tiny negative sum into 0.0
        return _finite_or_none(total / (n << EXACT_SHIFT) + 0.0)
    except OverflowError:
        return None


def summarize_step(
    groups: Iterable[GroupSummary],
) -> dict[str, float | int | None]:
    """Step metrics of one list of classified groups (each group weighs 1)."""
    acc = StepAccumulator()
    for g in groups:
        acc.add(g)
    return acc.metrics()


# --------------------------------------------------------------------------- window metrics

WINDOW_METRIC_FIELDS: tuple[str, ...] = (
    "acr_pooled",
    "acr_100",
    "acr_ema",
    "acr_volatility",
    "acr_streak",
)

EMA_ALPHA = 1.0 - 2.0 ** (-1.0 / 20.0)  # half-life of 20 steps
DEFAULT_STREAK_THRESHOLD = 0.35


def window_metrics(
    steps: Iterable[Mapping[str, float | int | None]],
    streak_threshold: float = DEFAULT_STREAK_THRESHOLD,
) -> dict[str, float | int | None]:
    """Window metrics over steps ordered by step (docs/design.md §3 'Window metrics').

    steps: mappings with ``acr``, ``n_collapsed`` and ``n_valid``; steps whose acr is None are
    skipped. acr_pooled: Σ collapsed / Σ valid. acr_100: mean acr of the first 100 steps (None
    until 100 exist). acr_ema: EMA with α = 1 − 2^(−1/20) starting at the first acr.
    acr_volatility: sample std of the last 25 acrs (None before 25). acr_streak: how many of the
    latest consecutive steps have acr > streak_threshold (0 when the latest one does not).
    """
    collapsed = valid = 0
    first: list[float] = []
    ema: float | None = None
    last25: list[float] = []
    streak = 0
    for row in steps:
        acr = row.get("acr")
        if acr is None:
            continue
        acr = float(acr)
        collapsed += int(row.get("n_collapsed") or 0)
        valid += int(row.get("n_valid") or 0)
        if len(first) < 100:
            first.append(acr)
        ema = acr if ema is None else ema + EMA_ALPHA * (acr - ema)
        last25.append(acr)
        if len(last25) > 25:
            last25.pop(0)
        streak = streak + 1 if acr > streak_threshold else 0
    return {
        "acr_pooled": _ratio(collapsed, valid),
        "acr_100": math.fsum(first) / 100 if len(first) == 100 else None,
        "acr_ema": ema,
        "acr_volatility": sample_std(last25) if len(last25) == 25 else None,
        "acr_streak": streak,
    }


def sample_std(xs: Sequence[float]) -> float:
    """Sample standard deviation (n − 1) of at least 2 floats in [0, 1] (step ACRs), two-pass;
    exactly 0.0 when every value is the same (the rounded mean can differ from them by an ulp,
    which left a residue of about 1e-16). Used by `window_metrics` and the server's alerts."""
    if min(xs) == max(xs):
        return 0.0
    m = math.fsum(xs) / len(xs)
    return math.sqrt(math.fsum((x - m) ** 2 for x in xs) / (len(xs) - 1))
