"""Advantage estimators: ``grpo``, ``avspo``, ``aapo`` and ``dapo`` as pure functions on ``[P, G]``
rewards.

Every estimator takes ``rewards: [P, G] float`` (P prompts, G completions each, one group per row)
and its inputs by keyword, and returns an :class:`Advantages` (``values: [P, G]`` plus how many
virtual rewards it used). No I/O. ``@register_adv_est(name)`` (after verl's registry) puts an
estimator in ``ESTIMATORS``, where the trainer looks the mitigation's mode up, so adding an
estimator is one function and its decorator line. An estimator may come with a group filter
(``keep=``, DAPO's dynamic sampling): the trainer then trains on the groups it keeps only, and
samples more prompts while too few are kept. docs/design.md §7 is normative; the docstrings say
where each formula comes from.

Numerics: everything is computed in float64 and returned in the rewards' dtype.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, TypeVar

import torch
from vantage.client.avspo import adaptive_tau_update, avspo_num_virtual, virtual_rewards

__all__ = [
    "Advantages",
    "AvspoState",
    "EffectiveStats",
    "ESTIMATORS",
    "aapo",
    "adaptive_tau_update",
    "apply_estimator",
    "avspo",
    "dapo",
    "dapo_keep",
    "avspo_num_virtual",
    "compute_advantages",
    "effective_stats",
    "estimator_keywords",
    "estimator_settings",
    "get_adv_estimator",
    "group_filter",
    "grpo",
    "register_adv_est",
]

TRAINER_EPS = 1e-4  # TRL's eps in the advantage denominator; the ACR engine's default trainer_eps
ZERO_ADVANTAGE_TOL = 1e-3  # docs/design.md §3: a group is zero-advantage when max_i |A_i| < tol

ScaleRewards = Literal["group", "batch", "none"]


class Advantages(NamedTuple):
    """values: [P, G] advantages of the real completions; n_virtual: virtual rewards added."""

    values: torch.Tensor
    n_virtual: int = 0


# --------------------------------------------------------------------------- the registry

Estimator = TypeVar("Estimator", bound=Callable[..., Advantages])

GroupFilter = Callable[[torch.Tensor], torch.Tensor]  # rewards [P, G] → [P] bool: train on it

ESTIMATORS: dict[str, Callable[..., Advantages]] = {}
_SETTINGS: dict[str, tuple[str, ...]] = {}
_FILTERS: dict[str, GroupFilter | None] = {}


def register_adv_est(
    name: str, settings: tuple[str, ...] = (), keep: GroupFilter | None = None
) -> Callable[[Estimator], Estimator]:
    """Register ``estimator(rewards, **inputs) -> Advantages`` under ``name`` (a mitigation mode).

    ``settings`` name the mitigation's settings that act in this mode (the trainer reports them
    with each step). ``keep`` picks the groups the mode trains on (the estimator then sees only
    those); None trains on every group. Raises ValueError when another estimator holds the name.
    """

    def register(estimator: Estimator) -> Estimator:
        if ESTIMATORS.get(name, estimator) is not estimator:
            raise ValueError(f"advantage estimator {name!r} is registered already")
        ESTIMATORS[name] = estimator
        _SETTINGS[name] = settings
        _FILTERS[name] = keep
        return estimator

    return register


def get_adv_estimator(name: str) -> Callable[..., Advantages]:
    """The estimator registered as ``name``; raises ValueError naming the known ones."""
    if name not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {name!r}; known: {sorted(ESTIMATORS)}")
    return ESTIMATORS[name]


def estimator_settings(name: str) -> tuple[str, ...]:
    """The mitigation settings that act when ``name`` estimates the advantages."""
    get_adv_estimator(name)
    return _SETTINGS[name]


def group_filter(name: str) -> GroupFilter | None:
    """The filter of the groups ``name`` trains on, or None when it trains on every group."""
    get_adv_estimator(name)
    return _FILTERS[name]


def estimator_keywords(estimator: Callable[..., Advantages]) -> frozenset[str]:
    """The inputs an estimator takes by keyword (what the trainer must give it)."""
    parameters = inspect.signature(estimator).parameters.values()
    return frozenset(p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY)


def apply_estimator(
    estimator: Callable[..., Advantages], rewards: torch.Tensor, inputs: Mapping[str, Any]
) -> Advantages:
    """Apply ``estimator`` with those of ``inputs`` it takes (the rest keep their defaults)."""
    keywords = estimator_keywords(estimator)
    return estimator(rewards, **{k: v for k, v in inputs.items() if k in keywords})


def compute_advantages(name: str, rewards: torch.Tensor, **params: object) -> Advantages:
    """Look up an estimator by name and apply it; raises ValueError naming the known ones."""
    return get_adv_estimator(name)(rewards, **params)


def _check(rewards: torch.Tensor) -> torch.Tensor:
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [P, G]; got shape {tuple(rewards.shape)}")
    if not torch.isfinite(rewards).all():
        raise ValueError("rewards contain NaN or inf; score every completion with a finite reward")
    return rewards.to(torch.float64)


def _sample_std(x: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sample std (n-1); 0 where fewer than 2 values (TRL gives NaN there, which helps nobody)."""
    n = x.numel() if dim is None else x.shape[dim]
    if n < 2 or x.numel() == 0:  # no group at all: DAPO's step that kept none
        return torch.zeros(()) if dim is None else torch.zeros_like(x.select(dim, 0))
    return x.std() if dim is None else x.std(dim=dim)


def collapsed_mask(rewards: torch.Tensor) -> torch.Tensor:
    """[P] bool: groups whose rewards are all exactly equal (docs/design.md §3 'collapsed')."""
    return rewards.amax(dim=1) == rewards.amin(dim=1)


@register_adv_est("grpo")
def grpo(
    rewards: torch.Tensor, *, scale_rewards: ScaleRewards = "group", eps: float = TRAINER_EPS
) -> Advantages:
    """GRPO's group-relative advantage, identical to TRL's ``GRPOTrainer``.

    ``A_i = (r_i − mean_g(r)) / (std + eps)`` with the group mean; ``std`` is the group's sample
    std (``scale_rewards="group"``), the sample std of all P·G rewards (``"batch"``), or the
    division is skipped (``"none"``). Shao et al. 2024, "DeepSeekMath", eq. 3 (Dr. GRPO, Liu et al.
    2025, drops the std: ``"none"``). rewards: [P, G] finite; raises ValueError otherwise.
    """
    r = _check(rewards)
    centred = r - r.mean(dim=1, keepdim=True)
    if scale_rewards == "group":
        values = centred / (_sample_std(r, dim=1).unsqueeze(1) + eps)
    elif scale_rewards == "batch":
        values = centred / (_sample_std(r) + eps)
    elif scale_rewards == "none":
        values = centred
    else:
        raise ValueError(f"scale_rewards must be group, batch or none; got {scale_rewards!r}")
    return Advantages(values.to(rewards.dtype), 0)


@register_adv_est("avspo", settings=("threshold", "alpha", "eta"))
def avspo(
    rewards: torch.Tensor,
    *,
    acr: float,
    reward_min: float = 0.0,
    reward_max: float = 1.0,
    alpha: float = 0.5,
    variant: Literal["fixed", "adaptive", "single"] = "fixed",
    tau: float = 0.5,
    scale_rewards: ScaleRewards = "group",
    eps: float = TRAINER_EPS,
) -> Advantages:
    """AVSPO: virtual reward samples give collapsed groups a non-zero advantage without rollouts.

    For each collapsed group (all G rewards equal to c; near-collapsed groups are left alone) add K
    virtual rewards ``v_k = c + (b − c)·k/(K+1)``, k = 1..K, b the reward bound on the other side of
    the midpoint; they enter only that group's mean μ′ and sample std σ′, so the G real completions
    get ``A_i = (r_i − μ′)/(σ′ + eps)`` and the virtual ones get nothing. K =
    :func:`avspo_num_virtual` (G, acr, α); variant ``single`` uses K = 1. Trigger: ``fixed``
    augments whenever a group collapsed, ``adaptive`` only when ``acr > tau`` (the paper's
    threshold), ``single`` always. Groups that did not collapse get :func:`grpo` advantages.

    acr: the step's raw ACR over all ranks, in [0, 1]. From the AVSPO paper (virtual samples); the
    spacing is docs/design.md §7's fix of its r_max·(1 − (k−1)/K), which repeats c.
    Returns ``n_virtual`` = virtual rewards added over all groups.
    """
    base = grpo(rewards, scale_rewards=scale_rewards, eps=eps).values.to(torch.float64)
    r = _check(rewards)
    collapsed = collapsed_mask(r)
    augment = bool(collapsed.any()) and (variant != "adaptive" or acr > tau)
    if variant not in ("fixed", "adaptive", "single"):
        raise ValueError(f"AVSPO variant must be fixed, adaptive or single; got {variant!r}")
    if not augment:
        return Advantages(base.to(rewards.dtype), 0)
    g = r.shape[1]
    k = 1 if variant == "single" else avspo_num_virtual(g, acr, alpha)
    n_virtual = 0
    for p in torch.nonzero(collapsed).flatten().tolist():
        c = float(r[p, 0])
        augmented = torch.cat(
            [r[p], torch.tensor(virtual_rewards(c, k, reward_min, reward_max), dtype=r.dtype)]
        )
        mu, sigma = augmented.mean(), augmented.std()
        base[p] = (r[p] - mu) / (sigma + eps)
        n_virtual += k
    return Advantages(base.to(rewards.dtype), n_virtual)


@register_adv_est("aapo", settings=("delta_low", "delta_high"))
def aapo(
    rewards: torch.Tensor,
    *,
    reference_rewards: torch.Tensor,
    reward_min: float = 0.0,
    reward_max: float = 1.0,
    delta_low: float = -0.2,
    delta_high: float = 0.28,
    scale_rewards: ScaleRewards = "group",
    eps: float = TRAINER_EPS,
) -> Advantages:
    """AAPO: GRPO's advantage plus a clipped margin over a frozen reference policy's rewards.

    ``A_i = Â_i + clip((r_i − r_ref_i)/m, δ_low, δ_high)`` with Â the :func:`grpo` advantage,
    m = reward_max − reward_min, and r_ref_i the reward of the i-th of G completions the reference
    policy sampled for the same prompt (paired by index). reference_rewards: [P, G] like rewards.
    AAPO ("advantage momentum", arXiv 2505.14264) as docs/design.md §7 fixes it.
    Raises ValueError on a shape mismatch or m ≤ 0.
    """
    if reference_rewards.shape != rewards.shape:
        raise ValueError(
            f"reference_rewards has shape {tuple(reference_rewards.shape)}; rewards have "
            f"{tuple(rewards.shape)}: the reference policy must sample G completions per prompt"
        )
    scale = reward_max - reward_min
    if scale <= 0:
        raise ValueError(f"reward_max ({reward_max}) must exceed reward_min ({reward_min})")
    base = grpo(rewards, scale_rewards=scale_rewards, eps=eps).values.to(torch.float64)
    margin = ((_check(rewards) - _check(reference_rewards)) / scale).clamp(delta_low, delta_high)
    return Advantages((base + margin).to(rewards.dtype), 0)


def dapo_keep(rewards: torch.Tensor) -> torch.Tensor:
    """[P] bool: the groups DAPO's dynamic sampling trains on, those whose G rewards are not all
    equal (``max_i r_i > min_i r_i``).

    A group of equal rewards has zero GRPO advantage for every completion and gives no gradient;
    DAPO drops it and samples more prompts instead (Yu et al. 2025, "DAPO", §3.2 "Dynamic
    Sampling": the objective's constraint ``0 < |{o_i | is_equivalent(a, o_i)}| < G``, here for any
    reward, not only correctness). rewards: [P, G] finite; raises ValueError otherwise.
    """
    return ~collapsed_mask(_check(rewards))


@register_adv_est("dapo", settings=("max_gen_batches",), keep=dapo_keep)
def dapo(
    rewards: torch.Tensor, *, scale_rewards: ScaleRewards = "group", eps: float = TRAINER_EPS
) -> Advantages:
    """DAPO: :func:`grpo`'s advantages of the groups :func:`dapo_keep` kept (the trainer passes
    only those, so no group of the trained batch has zero advantage). Yu et al. 2025, §3.2."""
    return grpo(rewards, scale_rewards=scale_rewards, eps=eps)


# --------------------------------------------------------------------------- AVSPO's threshold


@dataclass
class AvspoState:
    """What AVSPO carries from step to step (part of the checkpoint): τ and the last mean reward."""

    tau: float = 0.5
    previous_reward: float | None = None

    def update(self, acr: float, reward: float, eta: float = 0.01) -> None:
        self.tau = adaptive_tau_update(self.tau, acr, reward, self.previous_reward, eta)
        self.previous_reward = reward


# --------------------------------------------------------------------------- statistics


class EffectiveStats(NamedTuple):
    """What ``Monitor.log_effective`` takes, counted after mitigation."""

    n_valid: int
    n_zero_advantage: int
    n_virtual: int


def effective_stats(advantages: Advantages, tol: float = ZERO_ADVANTAGE_TOL) -> EffectiveStats:
    """n_zero_advantage counts groups with max_i |A_i| < tol (docs/design.md §3
    ``acr_effective``)."""
    values = advantages.values
    n_zero = int((values.abs().amax(dim=1) < tol).sum()) if values.numel() else 0
    return EffectiveStats(values.shape[0], n_zero, advantages.n_virtual)
