"""AVSPO's scalar rules (docs/design.md §7), shared by the bundled trainer and the integrations.

Pure Python on floats, no torch: the client imports nothing heavy, and the trainer and the verl
integration apply these to their own tensors. From the AVSPO paper (virtual reward samples),
with §7's spacing of the virtual rewards.
"""

from __future__ import annotations

import math


def avspo_num_virtual(group_size: int, acr: float, alpha: float = 0.5) -> int:
    """AVSPO's K = max(1, min(G, ⌈G·ACR^α − 1e-9⌉)); the 1e-9 keeps G·√ACR = 3 at 3.

    Raises ValueError when ``acr`` is outside [0, 1]."""
    if not 0.0 <= acr <= 1.0:
        raise ValueError(f"acr must be in [0, 1]; got {acr}")
    return max(1, min(group_size, math.ceil(group_size * acr**alpha - 1e-9)))


def virtual_rewards(c: float, k: int, reward_min: float, reward_max: float) -> list[float]:
    """K values strictly between c and the bound b, evenly spaced: v_k = c + (b − c)·k/(K + 1),
    with b = reward_min when c ≥ the midpoint of the bounds, else reward_max."""
    # For c outside [reward_min, reward_max] this rule picks the bound farther from c, as §7 asks.
    b = reward_min if c >= (reward_min + reward_max) / 2 else reward_max
    return [c + (b - c) * j / (k + 1) for j in range(1, k + 1)]


def adaptive_tau_update(
    tau: float,
    acr: float,
    reward: float,
    previous_reward: float | None,
    eta: float = 0.01,
    low: float = 0.1,
    high: float = 0.9,
) -> float:
    """τ_{t+1} = clip(τ_t + η·sign(J_t − J_{t−1})·(acr_t − τ_t), 0.1, 0.9) (AVSPO's adaptive rule).

    Called after step t, whose augmentation decision used τ_t. τ stays put at the first step
    (previous_reward None) and when J does not change.
    """
    if previous_reward is None or reward == previous_reward:
        return tau
    sign = 1.0 if reward > previous_reward else -1.0
    return min(high, max(low, tau + eta * sign * (acr - tau)))


AVSPO_THRESHOLDS = ("fixed", "adaptive", "single")
# set_mitigation's numeric AVSPO params and their ranges (docs/design.md §4).
_RANGES = (("alpha", 0.0, 100.0), ("eta", 0.0, 1.0), ("tau", 0.0, 1.0))


def parse_avspo_params(params: dict, threshold: str) -> tuple[str, dict[str, float]]:
    """The AVSPO part of a ``set_mitigation`` command: ``(threshold, {alpha|eta|tau: value})``,
    the threshold (or its other name ``variant``) defaulting to ``threshold``. Raises ValueError
    with the reason a trainer rejects the command for."""
    threshold = params.get("threshold", params.get("variant", threshold))
    if threshold not in AVSPO_THRESHOLDS:
        raise ValueError(f"AVSPO threshold is fixed, adaptive or single, not {threshold!r}")
    numbers = {}
    for key, low, high in _RANGES:
        if key in params:
            v = params[key]
            if isinstance(v, bool) or not isinstance(v, int | float) or not low <= v <= high:
                raise ValueError(f"set_mitigation {key} must be a number in [{low}, {high}]")
            numbers[key] = float(v)
    if numbers.get("alpha", 1.0) == 0.0:
        raise ValueError("set_mitigation alpha must be above 0")
    return threshold, numbers


def avspo_collapsed_advantage(
    c: float,
    group_size: int,
    k: int,
    reward_min: float,
    reward_max: float,
    eps: float,
    scale: bool = True,
) -> float:
    """The advantage of every real completion of a collapsed group (all G rewards equal to c)
    under AVSPO: K virtual rewards enter only the mean μ′ and the sample std σ′ (n − 1) of the
    G + K values; ``(c − μ′)/(σ′ + eps)``, or ``c − μ′`` without ``scale``. In float64."""
    values = [c] * group_size + virtual_rewards(c, k, reward_min, reward_max)
    mean = math.fsum(values) / len(values)
    centred = c - mean
    if not scale:
        return centred
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))
    return centred / (std + eps)
