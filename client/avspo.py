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
