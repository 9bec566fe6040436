"""The mitigation in effect: which registered advantage estimator the step uses, and its settings.

A mode is the name of an estimator in ``advantages.ESTIMATORS``, except ``none``: plain GRPO.
A ``set_mitigation`` command or a resume with a changed config changes it between steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vantage.client.schema import MITIGATION_DEFAULTS

from .advantages import ESTIMATORS, estimator_settings

__all__ = ["CONFIG_FIELDS", "Mitigation", "mitigation_modes"]

NO_MITIGATION = "none"
PLAIN_ESTIMATOR = "grpo"  # the estimator of mode none

# The config's fields that set the mitigation at launch → the Mitigation field each sets.
CONFIG_FIELDS = {
    "mitigation": "mode", "avspo_threshold": "threshold", "avspo_alpha": "alpha",
    "avspo_eta": "eta", "aapo_delta_low": "delta_low", "aapo_delta_high": "delta_high",
    "max_gen_batches": "max_gen_batches",
}  # fmt: skip


def mitigation_modes() -> tuple[str, ...]:
    """The modes a config and a set_mitigation take: none, then every other registered estimator."""
    return (NO_MITIGATION, *(name for name in ESTIMATORS if name != PLAIN_ESTIMATOR))


@dataclass
class Mitigation:
    """The advantage estimator in use and its parameters (set_mitigation changes it)."""

    mode: str = NO_MITIGATION  # none (plain grpo) | avspo | aapo | dapo
    threshold: str = MITIGATION_DEFAULTS["threshold"]  # AVSPO: fixed | adaptive | single
    alpha: float = MITIGATION_DEFAULTS["alpha"]  # AVSPO: K = max(1, min(G, ⌈G·ACR^α⌉))
    eta: float = MITIGATION_DEFAULTS["eta"]  # AVSPO adaptive: τ's step size
    delta_low: float = MITIGATION_DEFAULTS["delta_low"]  # AAPO: margin clip, low
    delta_high: float = MITIGATION_DEFAULTS["delta_high"]  # AAPO: margin clip, high
    max_gen_batches: int = MITIGATION_DEFAULTS["max_gen_batches"]  # DAPO: batches a step samples

    @classmethod
    def from_config(cls, config: Any) -> Mitigation:
        """The mitigation a TrainConfig starts with (its `CONFIG_FIELDS`)."""
        return cls(**{field: getattr(config, name) for name, field in CONFIG_FIELDS.items()})

    @property
    def estimator(self) -> str:
        """The name of the registered advantage estimator this mode uses."""
        return PLAIN_ESTIMATOR if self.mode == NO_MITIGATION else self.mode

    @property
    def adapts_tau(self) -> bool:
        """Whether AVSPO's threshold τ moves after each step (the adaptive threshold)."""
        return self.mode == "avspo" and self.threshold == "adaptive"

    def estimator_inputs(self) -> dict[str, Any]:
        """The settings as the estimators name their keyword inputs."""
        return {
            "alpha": self.alpha,
            "variant": self.threshold,
            "delta_low": self.delta_low,
            "delta_high": self.delta_high,
        }

    def reported(self) -> dict[str, Any]:
        """The mode and the parameters that act in it, as the trainer reports them with each
        step (the record's ``mitigation``: what is really in effect, whatever was acked)."""
        active = estimator_settings(self.estimator)
        return {"mode": self.mode, **{k: getattr(self, k) for k in active}}

    def described(self) -> str:
        """The mode and its active parameters: "avspo threshold=fixed alpha=0.5 eta=0.01"."""
        active = estimator_settings(self.estimator)
        return " ".join([self.mode, *(f"{k}={getattr(self, k)}" for k in active)])
