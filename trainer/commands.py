"""The server's commands (DESIGN §4) as the trainer applies them at a step boundary.

``set_mitigation {mode: none|avspo|aapo, threshold?, alpha?, eta?, tau?, delta_low?, delta_high?}``,
``set_sampling {temperature}``, ``checkpoint``, ``stop``. Each function returns the detail sent
with the ack, or raises ValueError (the command is then acked ``rejected`` with that reason).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from vantage.client.schema import MITIGATION_DEFAULTS, temperature_problem

from .config import TrainConfig
from .monitoring import Command

if TYPE_CHECKING:
    from .grpo import GRPOTrainer

__all__ = ["Mitigation", "apply_command", "is_number"]


ACTIVE_PARAMS = {"avspo": ("threshold", "alpha", "eta"), "aapo": ("delta_low", "delta_high")}


@dataclass
class Mitigation:
    """The advantage estimator in use and its parameters (set_mitigation changes it)."""

    mode: str = "none"  # none (plain grpo) | avspo | aapo
    threshold: str = MITIGATION_DEFAULTS["threshold"]  # AVSPO: fixed | adaptive | single
    alpha: float = MITIGATION_DEFAULTS["alpha"]  # AVSPO: K = max(1, min(G, ⌈G·ACR^α⌉))
    eta: float = MITIGATION_DEFAULTS["eta"]  # AVSPO adaptive: τ's step size
    delta_low: float = MITIGATION_DEFAULTS["delta_low"]  # AAPO: margin clip, low
    delta_high: float = MITIGATION_DEFAULTS["delta_high"]  # AAPO: margin clip, high

    def reported(self) -> dict[str, Any]:
        """The mode and the parameters that act in it, as the trainer reports them with each
        step (the record's ``mitigation``: what is really in effect, whatever was acked)."""
        active = ACTIVE_PARAMS.get(self.mode, ())
        return {"mode": self.mode, **{k: getattr(self, k) for k in active}}

    @classmethod
    def from_config(cls, c: TrainConfig) -> Mitigation:
        return cls(
            c.mitigation,
            c.avspo_threshold,
            c.avspo_alpha,
            c.avspo_eta,
            c.aapo_delta_low,
            c.aapo_delta_high,
        )


def apply_command(trainer: GRPOTrainer, command: Command) -> str:
    """Apply one command to the trainer; returns the ack's detail, raises ValueError to reject."""
    params = dict(command.params)
    if command.type == "set_mitigation":
        return set_mitigation(trainer, params)
    if command.type == "set_sampling":
        temperature = params.get("temperature")
        # as the server checks and the config requires: near 0 (greedy) the G completions of a
        # prompt are identical, so every group collapses and GRPO learns nothing
        if problem := temperature_problem(temperature):
            raise ValueError(f"set_sampling: {problem}")
        trainer.temperature = float(temperature)
        return f"temperature {trainer.temperature}"
    if command.type == "checkpoint":
        return f"saved {trainer.save_checkpoint()}"
    if command.type == "stop":
        trainer.stop_requested = True
        return f"stopping after step {trainer.step}; saved {trainer.save_checkpoint()}"
    raise ValueError(f"unknown command type {command.type!r}")


def set_mitigation(trainer: GRPOTrainer, params: dict[str, Any]) -> str:
    mode = params.pop("mode", None)
    if mode not in ("none", "avspo", "aapo", "grpo", "off"):
        raise ValueError(f"set_mitigation mode must be none, avspo or aapo; got {mode!r}")
    mode = "none" if mode in ("grpo", "off") else mode
    new = Mitigation(**{**asdict(trainer.mitigation), "mode": mode})
    threshold = params.pop("threshold", params.pop("variant", None))
    if threshold is not None:
        if threshold not in ("fixed", "adaptive", "single"):
            raise ValueError(
                f"AVSPO threshold must be fixed, adaptive or single; got {threshold!r}"
            )
        new.threshold = threshold
    for key in ("alpha", "eta", "delta_low", "delta_high"):
        if key in params:
            setattr(new, key, float(params.pop(key)))
    if new.delta_low > new.delta_high:  # the pair as it would be, not just as sent
        raise ValueError(
            f"AAPO delta_low {new.delta_low} would exceed delta_high {new.delta_high}; "
            "send both to move the range"
        )
    tau = float(params.pop("tau")) if "tau" in params else None
    if mode == "aapo":
        trainer.ensure_reference()  # fail now, with a reason, rather than mid-step
    trainer.mitigation = new
    said = _described(new)
    if tau is not None:  # after the last check: a rejected command changes nothing
        trainer.avspo_state.tau = tau
    if tau is not None or (new.mode == "avspo" and new.threshold == "adaptive"):
        said += f" tau={trainer.avspo_state.tau}"  # the ack left it out (a trial)
    ignored = f"; ignored {sorted(params)}" if params else ""
    return f"mitigation {said}{ignored}"


def _described(m: Mitigation) -> str:
    """The mode and the parameters that act in it ("avspo threshold=fixed alpha=0.5 eta=0.01")."""
    return " ".join([m.mode, *(f"{k}={getattr(m, k)}" for k in ACTIVE_PARAMS.get(m.mode, ()))])


def is_number(value: Any) -> bool:
    """A finite int or float (not a bool): what a scalar or a temperature must be."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
