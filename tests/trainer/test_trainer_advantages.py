"""Advantage estimators against hand-computed values (docs/design.md §7)."""

import math

import pytest
import torch
from vantage.trainer.advantages import (
    ESTIMATORS,
    AvspoState,
    aapo,
    adaptive_tau_update,
    avspo,
    avspo_num_virtual,
    compute_advantages,
    dapo,
    dapo_keep,
    effective_stats,
    estimator_settings,
    group_filter,
    grpo,
)


def t(rows):
    return torch.tensor(rows, dtype=torch.float64)


def trl_formula(rewards, scale_rewards):
    """TRL GRPOTrainer's advantage, written out as TRL 1.x does it."""
    g = rewards.shape[1]
    flat = rewards.flatten()
    mean = flat.view(-1, g).mean(dim=1).repeat_interleave(g)
    adv = flat - mean
    if scale_rewards == "group":
        std = flat.view(-1, g).std(dim=1).repeat_interleave(g)
    else:
        std = flat.std().expand_as(flat)
    if scale_rewards != "none":
        adv = adv / (std + 1e-4)
    return adv.view(-1, g)


# ------------------------------------------------------------------ grpo


def test_grpo_group_hand_computed():
    # [1,0,0,0]: mean 0.25, sample std sqrt(0.75/3) = 0.5 -> 0.75/0.5001, -0.25/0.5001
    a = grpo(t([[1, 0, 0, 0]])).values
    assert a[0, 0].item() == pytest.approx(0.75 / 0.5001, abs=1e-12)
    assert a[0, 1].item() == pytest.approx(-0.25 / 0.5001, abs=1e-12)


def test_grpo_batch_and_none_hand_computed():
    r = t([[1, 0], [1, 1]])
    # batch std of [1,0,1,1] = 0.5; group means 0.5 and 1
    assert grpo(r, scale_rewards="batch").values.flatten().tolist() == pytest.approx(
        [0.5 / 0.5001, -0.5 / 0.5001, 0, 0]
    )
    assert grpo(r, scale_rewards="none").values.tolist() == [[0.5, -0.5], [0.0, 0.0]]


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_grpo_agrees_with_trl(scale):
    gen = torch.Generator().manual_seed(0)
    r = torch.randint(0, 2, (16, 8), generator=gen).double()
    r[3] = 1.0
    r[4] = torch.rand(8, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(grpo(r, scale_rewards=scale).values, trl_formula(r, scale))


def test_grpo_rejects_bad_input():
    with pytest.raises(ValueError, match=r"\[P, G\]"):
        grpo(torch.zeros(4))
    with pytest.raises(ValueError, match="NaN"):
        grpo(t([[1, float("nan")]]))
    with pytest.raises(ValueError, match="scale_rewards"):
        grpo(t([[1, 0]]), scale_rewards="rank")


def test_grpo_keeps_dtype():
    assert grpo(torch.tensor([[1.0, 0.0]])).values.dtype == torch.float32


# ------------------------------------------------------------------ AVSPO's K


@pytest.mark.parametrize(
    ("g", "acr", "k"),
    [
        (8, 0.25, 4),  # 8·0.5 = 4 exactly: an integer stays 4, not 5
        (8, 0.5625, 6),  # 8·0.75 = 6 exactly
        (4, 0.0625, 1),  # 4·0.25 = 1 exactly
        (10, 0.49, 7),  # 10·√0.49 = 7.000000000000001 in floats; the 1e-9 keeps it at 7
        (8, 0.3, 5),  # 8·0.5477 = 4.38 -> 5
        (8, 1.0, 8),  # capped at G
        (8, 0.0, 1),  # at least 1
        (4, 0.01, 1),  # 4·0.1 = 0.4 -> 1
    ],
)
def test_avspo_k(g, acr, k):
    assert avspo_num_virtual(g, acr) == k


def test_avspo_k_rejects_acr_out_of_range():
    with pytest.raises(ValueError):
        avspo_num_virtual(8, 1.5)


# ------------------------------------------------------------------ AVSPO's advantages


def test_avspo_all_pass_k4():
    # ACR 1, G 4 -> K 4; c = 1, b = 0: virtuals .8 .6 .4 .2. Mean of 1,1,1,1,.8,.6,.4,.2 = 0.75,
    # sample var = (4·.0625 + .0025 + .0225 + .1225 + .3025)/7 = 0.1 -> A = .25/(√.1 + 1e-4)
    out = avspo(t([[1, 1, 1, 1]]), acr=1.0)
    assert out.n_virtual == 4
    assert out.values.tolist()[0] == pytest.approx([0.25 / (math.sqrt(0.1) + 1e-4)] * 4)
    assert out.values[0, 0].item() == pytest.approx(0.790320, abs=1e-6)


def test_avspo_all_fail_k1_is_negative():
    # ACR 0.01, G 4 -> K 1; c = 0, b = 1: virtual 0.5. Values 0,0,0,0,.5: mean .1,
    # sample var (4·.01 + .16)/4 = .05 -> A = -.1/(√.05 + 1e-4) = -0.44701
    out = avspo(t([[0, 0, 0, 0]]), acr=0.01)
    assert out.n_virtual == 1
    assert out.values[0].tolist() == pytest.approx([-0.1 / (math.sqrt(0.05) + 1e-4)] * 4)
    assert out.values[0, 0].item() == pytest.approx(-0.447013, abs=1e-6)


def test_avspo_all_pass_k1_is_positive():
    # c = 1, virtual 0.5: mean .9, same spread -> +0.44701
    out = avspo(t([[1, 1, 1, 1]]), acr=0.01)
    assert out.values[0, 0].item() == pytest.approx(0.447013, abs=1e-6)


def test_avspo_constant_groups_take_the_far_side():
    # c = 0.5 >= midpoint -> b = 0, virtual 0.25: mean .45, var (4·.0025+.04)/4 = .0125
    # -> A = +.05/(√.0125 + 1e-4) = +0.44681; c = 0.3 < midpoint -> b = 1, virtual .65 -> negative
    out = avspo(t([[0.5] * 4, [0.3] * 4]), acr=0.01)
    assert out.values[0, 0].item() == pytest.approx(0.05 / (math.sqrt(0.0125) + 1e-4))
    assert (out.values[1] < 0).all()
    assert out.n_virtual == 2


def test_avspo_constant_outside_bounds_uses_farther_bound():
    # c = 2 above [0, 1]: b = 0 -> virtuals below c -> positive; c = -1: b = 1 -> negative
    out = avspo(t([[2.0, 2.0], [-1.0, -1.0]]), acr=0.01)
    assert (out.values[0] > 0).all() and (out.values[1] < 0).all()


def test_avspo_live_groups_match_grpo_and_near_collapsed_left_alone():
    r = t([[1, 0, 0, 1], [1, 1 + 1e-9, 1, 1], [0, 0, 0, 0]])
    out = avspo(r, acr=1 / 3)
    base = grpo(r).values
    torch.testing.assert_close(out.values[:2], base[:2])
    assert (out.values[2] < 0).all()
    # K = ceil(4·√(1/3)) = ceil(2.31) = 3 virtuals for the one collapsed group
    assert out.n_virtual == 3


def test_avspo_single_variant_k1_everywhere():
    out = avspo(t([[1] * 8, [0] * 8]), acr=1.0, variant="single")
    assert out.n_virtual == 2
    # c = 1, 8 ones and 0.5: mean 17/18 -> A = (1/18)/(std + 1e-4), std = sqrt((8/324 + (8/18)^2)/8)
    std = math.sqrt((8 * (1 / 18) ** 2 + (0.5 - 17 / 18) ** 2) / 8)
    assert out.values[0, 0].item() == pytest.approx((1 / 18) / (std + 1e-4))


def test_avspo_adaptive_threshold_is_strict():
    r = t([[1, 1], [0, 1]])
    off = avspo(r, acr=0.5, variant="adaptive", tau=0.5)
    on = avspo(r, acr=0.5, variant="adaptive", tau=0.49)
    assert off.n_virtual == 0 and (off.values[0] == 0).all()
    assert on.n_virtual > 0 and (on.values[0] > 0).all()


def test_avspo_without_collapse_is_grpo():
    r = t([[1, 0], [0, 1]])
    out = avspo(r, acr=0.0)
    assert out.n_virtual == 0
    torch.testing.assert_close(out.values, grpo(r).values)


# ------------------------------------------------------------------ adaptive tau


def test_tau_update_hand_computed():
    up = adaptive_tau_update
    assert up(0.5, acr=0.8, reward=0.6, previous_reward=0.5) == pytest.approx(0.503)
    assert up(0.5, acr=0.8, reward=0.4, previous_reward=0.5) == pytest.approx(0.497)
    assert up(0.5, acr=0.2, reward=0.6, previous_reward=0.5) == pytest.approx(0.497)
    assert up(0.9, acr=1.0, reward=0.6, previous_reward=0.5) == 0.9  # clipped
    assert up(0.1, acr=0.0, reward=0.6, previous_reward=0.5) == 0.1  # clipped
    assert up(0.5, acr=0.8, reward=0.6, previous_reward=None) == 0.5  # first step
    assert up(0.5, acr=0.8, reward=0.6, previous_reward=0.6) == 0.5  # J flat


def test_tau_state_order_decision_then_update():
    state = AvspoState()
    r = t([[1, 1], [1, 0]])  # acr 0.5
    # step 1: decision with tau_0 = 0.5 -> no augmentation (0.5 is not > 0.5); update: first step
    assert avspo(r, acr=0.5, variant="adaptive", tau=state.tau).n_virtual == 0
    state.update(acr=0.5, reward=0.75)
    assert state.tau == 0.5 and state.previous_reward == 0.75
    # step 2: acr 0.9, reward rose -> decision still uses 0.5, then tau moves to 0.5 + .01·.4
    assert avspo(r, acr=0.9, variant="adaptive", tau=state.tau).n_virtual > 0
    state.update(acr=0.9, reward=0.8)
    assert state.tau == pytest.approx(0.504)


# ------------------------------------------------------------------ AAPO


def test_aapo_clip_bounds_and_pairing():
    r = t([[1, 0, 0, 0]])
    ref = t([[0, 0, 1, 0]])
    # margins: 1 -> clip 0.28, 0, -1 -> clip -0.2, 0
    expected = grpo(r).values + t([[0.28, 0.0, -0.2, 0.0]])
    torch.testing.assert_close(aapo(r, reference_rewards=ref).values, expected)
    # pairing is by index: another order of the same reference rewards gives other advantages
    swapped = aapo(r, reference_rewards=t([[1, 0, 0, 0]])).values
    torch.testing.assert_close(swapped, grpo(r).values)


def test_aapo_gives_collapsed_groups_a_signal():
    out = aapo(t([[1, 1, 1, 1]]), reference_rewards=t([[0, 1, 1, 0]])).values
    assert out[0].tolist() == pytest.approx([0.28, 0.0, 0.0, 0.28])


def test_aapo_scale_m():
    # m = 10: margin (10 - 8)/10 = 0.2 (inside the bounds), (0 - 1)/10 = -0.1
    r, ref = t([[10, 0]]), t([[8, 1]])
    out = aapo(r, reference_rewards=ref, reward_min=0, reward_max=10).values
    torch.testing.assert_close(out, grpo(r).values + t([[0.2, -0.1]]))


def test_aapo_errors():
    with pytest.raises(ValueError, match="G completions"):
        aapo(t([[1, 0]]), reference_rewards=t([[1, 0, 1]]))
    with pytest.raises(ValueError, match="must exceed"):
        aapo(t([[1, 0]]), reference_rewards=t([[1, 0]]), reward_min=1, reward_max=1)


# ------------------------------------------------------------------ dapo


def test_dapo_keeps_the_groups_whose_rewards_differ():
    r = t([[1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 1, 0], [0.5, 0.5, 0.5, 0.5], [0, 0, 0, 1]])
    # all-pass, all-fail and constant 0.5 are dropped; 2 of 4 and 1 of 4 right are kept
    assert dapo_keep(r).tolist() == [False, False, True, False, True]
    # rewards that differ at all are kept, however little (the filter is max > min, exact)
    assert dapo_keep(t([[1, 1 + 1e-9, 1, 1]])).tolist() == [True]
    assert dapo_keep(t([[2.0, 2.0]])).tolist() == [False]
    assert dapo_keep(torch.empty(0, 4, dtype=torch.float64)).tolist() == []
    with pytest.raises(ValueError, match="NaN or inf"):
        dapo_keep(t([[1, float("nan")]]))
    with pytest.raises(ValueError, match=r"\[P, G\]"):
        dapo_keep(t([1, 0]))


def test_dapo_advantages_are_grpo_on_the_kept_groups():
    kept = t([[1, 0, 1, 0], [0, 0, 0, 1]])
    a = dapo(kept).values
    # [1, 0, 1, 0]: mean 0.5, sample std √(1/3) = 0.577350 → ±0.5 / 0.577450 = ±0.865875
    assert a[0].tolist() == pytest.approx([0.865875, -0.865875, 0.865875, -0.865875], abs=1e-6)
    # [0, 0, 0, 1]: mean 0.25, sample std 0.5 → (−0.25, 0.75) / 0.5001 = −0.499900, 1.499700
    assert a[1].tolist() == pytest.approx([-0.4999, -0.4999, -0.4999, 1.4997], abs=1e-4)
    assert torch.equal(a, grpo(kept).values)
    assert torch.equal(
        dapo(kept, scale_rewards="none").values, grpo(kept, scale_rewards="none").values
    )
    # the trained batch has no zero-advantage group: effective ACR 0
    assert effective_stats(dapo(kept)) == (2, 0, 0)


def test_dapo_is_registered_with_its_filter_and_setting():
    assert group_filter("dapo") is dapo_keep
    assert all(group_filter(name) is None for name in ("grpo", "avspo", "aapo"))
    assert estimator_settings("dapo") == ("max_gen_batches",)
    with pytest.raises(ValueError, match="known"):
        group_filter("ppo")


# ------------------------------------------------------------------ registry and statistics


def test_registry_and_effective_stats():
    assert set(ESTIMATORS) == {"grpo", "avspo", "aapo", "dapo"}
    r = t([[1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 1, 0], [1, 1 + 1e-9, 1, 1]])
    plain = compute_advantages("grpo", r)
    assert effective_stats(plain) == (4, 3, 0)  # two collapsed and one near-collapsed
    mitigated = compute_advantages("avspo", r, acr=0.5)
    # K = ceil(4·√.5) = 3 virtuals for each of the two collapsed groups
    assert effective_stats(mitigated) == (4, 1, 6)
    with pytest.raises(ValueError, match="known"):
        compute_advantages("ppo", r)
