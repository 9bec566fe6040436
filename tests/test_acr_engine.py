"""The ACR engine against docs/design.md §3's examples and its invariants (hypothesis)."""

from __future__ import annotations

import math
import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from vantage.client.acr import (
    ACRSettings,
    GroupClass,
    InconsistentStatsError,
    StepAccumulator,
    summarize_rewards,
    summarize_stats,
    summarize_step,
    window_metrics,
)

NAN, INF = float("nan"), float("inf")


def metrics(groups, **kw):
    s = ACRSettings(**kw)
    return summarize_step([summarize_rewards(g, settings=s) for g in groups])


def f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def test_sides_and_acr():
    m = metrics([[0, 0, 0, 0], [1, 1, 1, 1], [0.5] * 4, [0, 0, 0, 1]])
    assert m["acr"] == 0.75
    assert (m["acr_all_fail"], m["acr_all_pass"], m["acr_constant"]) == (0.25, 0.25, 0.25)
    assert m["wasted_rollouts"] == 12
    assert m["pass_rate"] is None  # the 0.5 group is not binary


def test_degenerate_groups_leave_acr_null():
    m = metrics([[0.3], [0.9], [0.1]])
    assert m["acr"] is None and m["n_degenerate"] == 3 and m["n_valid"] == 0
    assert m["acr_eps"] is None and m["reward_mean"] is None
    m = metrics([[1.0], [1, 0]])
    assert m["acr"] == 0.0 and m["n_valid"] == 1


@pytest.mark.parametrize("rounding", [lambda x: x, f32])
def test_constant_group_also_float32_rounded(rounding):
    m = metrics([[0] + [0.95] * 7, [rounding(0.35)] * 8])
    assert m["acr"] == 0.5


def test_non_finite_groups_are_invalid_and_output_finite():
    m = metrics([[1, 0, None, 1], [0, 0, 0, 0], [1, NAN, 1, 1]])
    assert m["n_invalid"] == 2 and m["acr"] == 1.0 and m["n_valid"] == 1
    assert all(v is None or math.isfinite(v) for v in m.values())


def test_expected_and_excess_acr():
    m = metrics([[1, 1], [0, 0], [0, 1], [0, 0], [0, 0]])
    assert m["acr"] == pytest.approx(0.8)
    assert m["pass_rate"] == pytest.approx(0.3)
    assert m["expected_acr"] == pytest.approx(0.58)  # 0.3² + 0.7²
    assert m["excess_acr"] == pytest.approx(0.22)


def test_ranks_pool_groups_not_ratios():
    acc = StepAccumulator()
    for rank_groups in ([[1, 1], [0, 1], [1, 0]], [[0, 0]]):
        part = StepAccumulator()
        for g in rank_groups:
            part.add(summarize_rewards(g))
        acc.merge(part)
    assert acc.metrics()["acr"] == 0.5  # 2 of 4, not the mean of 1/3 and 1


def test_mask_drops_completions():
    g = summarize_rewards([1, 0, 1, 1], mask=[1, 0, 1, 1])
    assert g.cls is GroupClass.COLLAPSED and g.side == "all_pass" and g.n == 3
    assert summarize_rewards([1, None], mask=[1, 0]).cls is GroupClass.DEGENERATE


def test_near_collapsed_uses_trainer_eps():
    # spread 1e-9 around 0.5: |A| = 0.5e-9 / (std + 1e-4) ≈ 5e-6 < tol
    g = summarize_rewards([0.5, 0.5 + 1e-9, 0.5, 0.5])
    assert g.cls is GroupClass.NEAR_COLLAPSED
    m = metrics([[0.5, 0.5 + 1e-9, 0.5, 0.5], [0, 1, 0, 1]])
    assert m["acr"] == 0.0 and m["acr_eps"] == 0.5
    assert summarize_rewards([0, 1e-3]).cls is GroupClass.LIVE


def test_overflow_free_for_huge_finite_rewards():
    g = summarize_rewards([-1.7e308, 1.7e308, 1.7e308])
    assert g.cls is GroupClass.LIVE
    assert g.std is None  # the true std overflows float64: reported as null, never inf
    m = metrics([[1e308, 1e308, -1e308], [1.7e308] * 3])
    assert all(v is None or math.isfinite(v) for v in m.values())


def test_inconsistent_stats_raise():
    for args in [(4, 0.5, 0.1, 1, 0), (4, 0.5, -0.1, 0, 1), (4, 0.5, 0.1, 0.5, 0.5)]:
        with pytest.raises(InconsistentStatsError):
            summarize_stats(*args)
    with pytest.raises(InconsistentStatsError):
        summarize_stats(4, 0.5, 0.5, 0, 1, n_pass=5)
    with pytest.raises(InconsistentStatsError, match="smallest possible"):
        summarize_stats(4, 0.5, 0.0, 0, 1)  # values 0 and 1 cannot have std 0


@pytest.mark.parametrize(
    ("args", "bound"),
    [
        ((2, 0.9, 0.7071, 0, 1), "impossible for 2 values"),  # two values 0 and 1: mean 0.5
        ((4, 0.26, 0.55, 0, 1), "largest possible"),  # Bhatia–Davis: std ≤ 0.507 at mean 0.26
        ((4, 0.5, 0.57735, 0, 1, 4), "n_pass 4 of n 4"),  # all pass, yet min is 0
        ((4, 0.75, 0.45, 0, 1, 2), "mean 0.75 does not match"),  # 2 of 4 pass: mean 0.5
        ((4, 0.5, 0.45, 0, 1, 2), "std 0.45 does not match"),  # 0.5 or 0.577 for 2 of 4
        ((3, 0.3, 0.1, 0.2, 0.4, 1), "binary"),  # n_pass on rewards that are not 0 or 1
    ],
)
def test_stats_no_rewards_could_have_are_refused(args, bound):
    with pytest.raises(InconsistentStatsError, match=bound):
        summarize_stats(*args)


def test_binary_stats_follow_the_runs_reward_range():
    wide = ACRSettings(reward_min=-1.0, reward_max=3.0)
    raw = summarize_rewards([3.0, -1.0, -1.0, 3.0, 3.0], settings=wide)
    stats = summarize_stats(raw.n, raw.mean, raw.std, raw.min, raw.max, raw.n_pass, wide)
    assert stats.n_pass == raw.n_pass == 3 and stats.cls == raw.cls
    with pytest.raises(InconsistentStatsError, match="binary"):
        summarize_stats(raw.n, raw.mean, raw.std, raw.min, raw.max, raw.n_pass)  # 0/1 run


def test_a_constant_groups_std_may_carry_rounding():
    """numpy's std of equal values can be a few ulps above 0; it reads as 0, and the group as
    collapsed, while a real spread is refused."""
    stats = summarize_stats(3, 5.8044338543399245, 1.09e-15, 5.8044338543399245, 5.8044338543399245)
    assert (stats.cls, stats.std) == (GroupClass.COLLAPSED, 0.0)
    with pytest.raises(InconsistentStatsError, match="min == max"):
        summarize_stats(3, 5.8, 0.01, 5.8, 5.8)


def test_window_metrics_pool_and_skip_null_steps():
    steps = [
        {"acr": 0.5, "n_collapsed": 1, "n_valid": 2},  # step A: [[1]*8, [0, 1]]
        {"acr": None, "n_collapsed": 0, "n_valid": 0},
        {"acr": 0.7, "n_collapsed": 7, "n_valid": 10},
    ]
    w = window_metrics(steps)
    assert w["acr_pooled"] == pytest.approx(8 / 12)
    assert w["acr_100"] is None and w["acr_volatility"] is None
    assert w["acr_streak"] == 2
    alpha = 1 - 2 ** (-1 / 20)
    assert w["acr_ema"] == pytest.approx(0.5 + alpha * 0.2)


def test_window_metrics_100_and_volatility():
    acrs = [0.2] * 50 + [0.6] * 75
    w = window_metrics({"acr": a, "n_collapsed": 0, "n_valid": 1} for a in acrs)
    assert w["acr_100"] == pytest.approx((50 * 0.2 + 50 * 0.6) / 100)
    assert w["acr_volatility"] == pytest.approx(0.0, abs=1e-12)
    assert w["acr_streak"] == 75
    # 25 equal ACRs whose rounded mean is an ulp off them: exactly 0, not ~1e-16
    for acr in (1 / 3, 2 / 3):
        w = window_metrics({"acr": acr, "n_collapsed": 0, "n_valid": 1} for _ in range(30))
        assert w["acr_volatility"] == 0.0


def test_a_tiny_negative_reward_mean_is_zero_not_negative_zero():
    m = metrics([[-5e-324, -5e-324], [0, 0]], reward_min=-1.0, reward_max=1.0)  # mean -2.5e-324
    assert m["reward_mean"] == 0.0 and math.copysign(1.0, m["reward_mean"]) == 1.0


# ------------------------------------------------------------------ properties (hypothesis)

finite = st.floats(allow_nan=False, allow_infinity=False)
reward = st.one_of(
    finite, st.sampled_from([0.0, 1.0, 0.5]), st.none(), st.just(NAN), st.just(INF), st.just(-INF)
)
binaryish = st.sampled_from([0.0, 1.0])
group = st.lists(st.one_of(reward, binaryish, binaryish), min_size=0, max_size=12)
step = st.lists(group, min_size=0, max_size=12)


@settings(max_examples=300, deadline=None)
@given(step, st.randoms(use_true_random=False))
def test_permutations_change_nothing(groups, rnd: random.Random):
    base = metrics(groups)
    shuffled = [rnd.sample(g, len(g)) for g in groups]
    rnd.shuffle(shuffled)
    assert _same(metrics(shuffled), base)


@settings(max_examples=300, deadline=None)
@given(step)
def test_no_output_is_ever_nan_or_infinite(groups):
    for value in metrics(groups).values():
        assert value is None or math.isfinite(value)
    for g in groups:
        s = summarize_rewards(g)
        for v in (s.mean, s.std, s.min, s.max):
            assert v is None or math.isfinite(v)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(finite, binaryish), min_size=2, max_size=16))
def test_stats_form_agrees_with_raw_form(rewards):
    raw = summarize_rewards(rewards)
    if raw.std is None:  # the std overflowed: a client could not send it either
        return
    stats = summarize_stats(raw.n, raw.mean, raw.std, raw.min, raw.max, raw.n_pass)
    assert (stats.cls, stats.side, stats.n_pass) == (raw.cls, raw.side, raw.n_pass)
    # numpy's default (population) std of the same rewards is accepted too
    population = raw.std * math.sqrt((raw.n - 1) / raw.n)
    summarize_stats(raw.n, raw.mean, population, raw.min, raw.max, raw.n_pass)


def _same(a: dict, b: dict) -> bool:
    for k in a:
        x, y = a[k], b[k]
        if x is None or y is None:
            if x is not y:
                return False
        elif not math.isclose(x, y, rel_tol=1e-12, abs_tol=1e-12):
            return False
    return True


@pytest.mark.parametrize(
    "groups",
    [[[1, 0], [1, 1, 1]], [[1, 0], [0, 0, 0, 0]], [[1, 1], [0, 1]], [[0, 1], [1, 0], [1, 1, 1, 1]]],
)
def test_stats_without_n_pass_are_binary_where_their_rewards_are(groups):
    """A collapsed stats group at a bound (or two values, one at each bound) fixes its n_pass;
    without it one such group turned pass_rate, expected_acr and excess_acr null for its step."""
    s = ACRSettings()
    stats = []
    for g in groups:
        r = summarize_rewards(g, settings=s)
        stats.append(summarize_stats(r.n, r.mean, r.std, r.min, r.max, settings=s))
    raw = summarize_step([summarize_rewards(g, settings=s) for g in groups])
    assert raw["pass_rate"] is not None
    got = summarize_step(stats)
    for name in ("pass_rate", "expected_acr", "excess_acr", "acr"):
        assert got[name] == pytest.approx(raw[name], rel=1e-12), name
    # values strictly inside the bounds say nothing about passes
    assert summarize_stats(3, 0.5, 0.0, 0.5, 0.5, settings=s).n_pass is None
    assert summarize_stats(3, 0.5, 0.5, 0.0, 1.0, settings=s).n_pass is None
