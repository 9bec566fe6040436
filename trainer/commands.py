"""The server's commands (docs/design.md §4) as the trainer applies them at a step boundary.

``set_mitigation {mode: none|avspo|aapo|dapo, threshold?, alpha?, eta?, tau?, delta_low?,
delta_high?, max_gen_batches?}``,
``set_sampling {temperature}``, ``checkpoint``, ``stop``. Each function returns the detail sent
with the ack, or raises ValueError (the command is then acked ``rejected`` with that reason).
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict
from typing import Any, Protocol

from vantage.client.commands import Command
from vantage.client.schema import MITIGATION_NUMBERS, temperature_problem

from .advantages import AvspoState, estimator_keywords, get_adv_estimator
from .mitigation import Mitigation, mitigation_modes

__all__ = ["CommandTarget", "apply_command", "apply_logged", "is_number", "set_mitigation"]

log = logging.getLogger(__name__)

# names set_mitigation also takes for mode none
NO_MITIGATION_ALIASES = ("grpo", "off")
AVSPO_THRESHOLDS = ("fixed", "adaptive", "single")


class CommandTarget(Protocol):
    """What a command changes: the trainer's settings, its stop flag and its checkpoint."""

    step: int
    temperature: float
    mitigation: Mitigation
    avspo_state: AvspoState
    stop_requested: bool

    def save_checkpoint(self) -> str: ...

    def ensure_reference(self) -> Any: ...


def apply_command(trainer: CommandTarget, command: Command) -> str:
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


def apply_logged(trainer: CommandTarget, command: Command) -> dict[str, Any]:
    """Apply one command at a step boundary and log the outcome; returns what was done:
    ``{command_id, type, status: applied | rejected, step, detail}``."""
    try:
        detail = apply_command(trainer, command)
        status = "applied"
    except (ValueError, TypeError, KeyError, RuntimeError, OSError) as exc:
        status, detail = "rejected", str(exc)
    source = command.command_id.split("-", 1)[0] if command.local else "the server"
    log.log(  # a rejection is worth a warning: someone asked for something not done
        logging.INFO if status == "applied" else logging.WARNING,
        "command %s from %s %s at step %d: %s",
        command.type,
        source,
        status,
        trainer.step,
        detail,
    )
    return {
        "command_id": command.command_id,
        "type": command.type,
        "status": status,
        "step": trainer.step,
        "detail": detail,
    }


def set_mitigation(trainer: CommandTarget, params: dict[str, Any]) -> str:
    """Switch the advantage estimator and its settings; a rejected command changes nothing."""
    new = _mitigation_from(trainer.mitigation, params)
    tau = float(params.pop("tau")) if "tau" in params else None
    if "reference_rewards" in estimator_keywords(get_adv_estimator(new.estimator)):
        trainer.ensure_reference()  # fail now, with a reason, rather than mid-step
    trainer.mitigation = new
    said = new.described()
    if tau is not None:  # after the last check: a rejected command changes nothing
        trainer.avspo_state.tau = tau
    if tau is not None or new.adapts_tau:
        said += f" tau={trainer.avspo_state.tau}"
    ignored = f"; ignored {sorted(params)}" if params else ""
    return f"mitigation {said}{ignored}"


def _mitigation_from(current: Mitigation, params: dict[str, Any]) -> Mitigation:
    """``current`` with the mode and settings of a set_mitigation's ``params`` (popped from
    it); raises ValueError on a mode, threshold or AAPO range that cannot be applied."""
    mode = params.pop("mode", None)
    modes = mitigation_modes()
    if mode not in modes and mode not in NO_MITIGATION_ALIASES:
        raise ValueError(f"set_mitigation mode must be {_one_of(modes)}; got {mode!r}")
    mode = modes[0] if mode in NO_MITIGATION_ALIASES else mode
    new = Mitigation(**{**asdict(current), "mode": mode})
    threshold = params.pop("threshold", params.pop("variant", None))
    if threshold is not None:
        if threshold not in AVSPO_THRESHOLDS:
            raise ValueError(
                f"AVSPO threshold must be {_one_of(AVSPO_THRESHOLDS)}; got {threshold!r}"
            )
        new.threshold = threshold
    for key in ("alpha", "eta", "delta_low", "delta_high"):
        if key in params:
            setattr(new, key, float(params.pop(key)))
    if "max_gen_batches" in params:
        n = params.pop("max_gen_batches")
        low, high, _ = MITIGATION_NUMBERS["max_gen_batches"]
        if isinstance(n, bool) or not isinstance(n, int) or not low <= n <= high:
            raise ValueError(
                f"DAPO max_gen_batches must be a whole number from {low} to {high}; got {n!r}"
            )
        new.max_gen_batches = n
    if new.delta_low > new.delta_high:  # the pair as it would be, not just as sent
        raise ValueError(
            f"AAPO delta_low {new.delta_low} would exceed delta_high {new.delta_high}; "
            "send both to move the range"
        )
    return new


def _one_of(names: tuple[str, ...]) -> str:
    """("none", "avspo", "aapo") → "none, avspo or aapo"."""
    return f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0]


def is_number(value: Any) -> bool:
    """A finite int or float (not a bool): what a scalar or a temperature must be."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
