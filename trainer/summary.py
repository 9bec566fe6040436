"""The summary of a training job that ``fit`` returns and writes to ``output_dir/summary.json``."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

from .grpo import GRPOTrainer

__all__ = ["summarize"]


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize(
    trainer: GRPOTrainer,
    start_step: int,
    seconds: float,
    evals: list[tuple[int, float]],
    commands: list[dict[str, Any]],
    checkpoint: Path | None,
) -> dict[str, Any]:
    """What a ``fit`` did, from ``start_step`` on: steps, evaluations (``(step, accuracy)``),
    ACR and reward over the new steps, the commands done, the checkpoint, the new history."""
    new = [r for r in trainer.history if r["step"] > start_step]
    acrs = [r["acr"] for r in new if r["acr"] is not None]
    effective = [r["acr_effective"] for r in new if r["acr_effective"] is not None]
    first_collapse = next((r["step"] for r in new if (r["acr"] or 0) > 0.5), None)
    return {
        "run_id": trainer.run_id,
        "output_dir": str(trainer.config.output_dir),
        "checkpoint": None if checkpoint is None else str(checkpoint),
        "start_step": start_step,
        "steps_completed": trainer.step,
        "stopped": trainer.stop_requested,
        "terminated": trainer.stop_signal is not None,
        "signal": None if trainer.stop_signal is None else signal.Signals(trainer.stop_signal).name,
        "seconds": seconds,
        "sft": trainer.sft_stats,
        "accuracy_start": evals[0][1] if evals else None,
        # measured at the last step, or none (a signal's stop skips the final evaluation; the
        # one before the first step is not the final one)
        "accuracy_final": evals[-1][1] if evals and evals[-1][0] == trainer.step else None,
        "evals": evals,
        "acr_mean": _mean(acrs),
        "acr_max": max(acrs) if acrs else None,
        "acr_last10_mean": _mean(acrs[-10:]),
        "acr_effective_mean": _mean(effective),
        "first_step_acr_above_0_5": first_collapse,
        "reward_last10_mean": _mean([r["reward"] for r in new[-10:]]),
        "step_s_mean": _mean([r["step_s"] for r in new]),
        "mitigation": trainer.mitigation.mode,
        "commands": commands,
        "history": new,
    }
