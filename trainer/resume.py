"""Resuming from the checkpoint in ``output_dir``: whether one is there, whether this config may
continue it, and which of this launch's settings replace those the run carried.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from .checkpoint import latest_checkpoint, load_checkpoint
from .config import TrainConfig
from .distributed import Distributed
from .grpo import GRPOTrainer
from .mitigation import CONFIG_FIELDS

__all__ = ["RESUME_FIELDS", "find_checkpoint", "resume"]

log = logging.getLogger(__name__)

# What a checkpoint must share with the config that resumes it: the model's shape and source,
# the task, and what the server fixed for the run. (Older checkpoints carry no config.)
RESUME_FIELDS = (
    "model_source", "model_path", "gguf_file", "tiny_hidden_size", "tiny_layers", "tiny_heads",
    "tiny_intermediate_size", "tiny_max_positions", "task", "data_path", "reasoning_gym_task",
    "group_size", "reward_min", "reward_max",
)  # fmt: skip

# Fields whose change on a resume says nothing worth a line (where the run goes, how it logs).
_QUIET_FIELDS = {"output_dir", "resume", "progress", "server", "api_key"}


def find_checkpoint(cfg: TrainConfig, dist: Distributed) -> tuple[Path | None, dict[str, Any]]:
    """The checkpoint to resume (None for a new run) and its saved state. Raises ValueError
    when it belongs to another config; a run that left its project out keeps the saved one."""
    output_dir = Path(cfg.output_dir)
    checkpoint = latest_checkpoint(output_dir) if cfg.resume else None
    if not cfg.resume and latest_checkpoint(output_dir) is not None and dist.is_main:
        log.warning("resume: false: training starts over, and replaces the checkpoint in %s",
                    output_dir)  # fmt: skip
    elif checkpoint is None and cfg.resume and dist.is_main:
        # output_dir is relative to the folder launched from: say where a new run starts
        log.info("no checkpoint in %s: a new run starts there", output_dir.resolve())
    if checkpoint is None:
        return None, {}
    state = torch.load(checkpoint / "state.pt", weights_only=False)
    _check_resumable(cfg, state.get("config"), output_dir)
    # left out, the run keeps its project, as the server does (and the next resume naming it
    # must agree with the checkpoint)
    if cfg.project is None and (state.get("config") or {}).get("project") is not None:
        cfg.project = state["config"]["project"]
    return checkpoint, state


def resume(trainer: GRPOTrainer, checkpoint: Path, saved: dict[str, Any] | None) -> None:
    """Restore the trainer from ``checkpoint``, then apply (and log) the settings this launch's
    config changed since the checkpoint's config ``saved``."""
    run_id = trainer.run_id
    load_checkpoint(trainer, checkpoint)
    trainer.run_id = run_id
    changed = _apply_changed_settings(trainer, saved)
    if changed and trainer.dist.is_main:
        log.warning("resuming with settings changed since the checkpoint: %s", "; ".join(changed))
    others = _other_changes(trainer.config, saved)
    if others and trainer.dist.is_main:
        log.info("this launch's config differs from the checkpoint's: %s", "; ".join(others))


def _check_resumable(cfg: TrainConfig, saved: dict[str, Any] | None, output_dir: Path) -> None:
    """Raise ValueError when the checkpoint in ``output_dir`` was made by a config that differs
    from ``cfg`` in `RESUME_FIELDS` (resuming would load another model or task into this run)."""
    if not saved:
        return
    diffs = [
        f"{name} {saved[name]!r}, here {getattr(cfg, name)!r}"
        for name in RESUME_FIELDS
        if name in saved and saved[name] != getattr(cfg, name)
    ]
    # the server fixes a run's project (409 for another), so a relaunch naming another could
    # only train into a spool that no `vantage sync` uploads. Left out, the run keeps its own.
    if cfg.project is not None and "project" in saved and saved["project"] != cfg.project:
        was, now = saved["project"], cfg.project
        diffs.append(f"project {was!r}, here {now!r}: a run's project is fixed, leave it out")
    if diffs:
        raise ValueError(
            f"{output_dir} holds the checkpoint of another config ({'; '.join(diffs)}); give "
            "this run an output_dir of its own, or set resume: false to start over there"
        )


def _apply_changed_settings(trainer: GRPOTrainer, saved: dict[str, Any] | None) -> list[str]:
    """After a resume, apply the fields of ``trainer.config`` that differ from the config the
    checkpoint was saved with (``saved``): lr, temperature and the mitigation's settings. A
    field this launch left alone keeps what the run carried (a command may have changed it).
    Returns what changed, as "lr 0.0001 → 1e-05"."""
    if not saved:
        return []
    cfg, changed = trainer.config, []
    carried = {  # what the run carried, commands included (the saved config's values were shown)
        "lr": trainer.scheduler.base_lrs[0],
        "temperature": trainer.temperature,
        **{name: getattr(trainer.mitigation, field) for name, field in CONFIG_FIELDS.items()},
    }
    for name in ("lr", "temperature", *CONFIG_FIELDS):
        if name in saved and saved[name] != getattr(cfg, name):
            changed.append(f"{name} {carried[name]!r} → {getattr(cfg, name)!r}")
            if name == "lr":
                _set_peak_lr(trainer.scheduler, cfg.lr)
            elif name == "temperature":
                trainer.temperature = cfg.temperature
            else:
                setattr(trainer.mitigation, CONFIG_FIELDS[name], getattr(cfg, name))
    return changed


def _other_changes(cfg: TrainConfig, saved: dict[str, Any] | None) -> list[str]:
    """The fields, other than `RESUME_FIELDS` and those `_apply_changed_settings` reports, in
    which ``cfg`` differs from the checkpoint's config ``saved``: this launch's value is used,
    and said. As "arith_max_operand 20 → 50"."""
    skip = {*RESUME_FIELDS, "lr", "temperature", *CONFIG_FIELDS, *_QUIET_FIELDS}
    current = cfg.to_dict()
    return [
        f"{name} {saved[name]!r} → {current[name]!r}"
        for name in sorted(set(saved or {}) & set(current) - skip)
        if saved[name] != current[name]
    ]


def _set_peak_lr(scheduler: torch.optim.lr_scheduler.LambdaLR, lr: float) -> None:
    """Make ``lr`` the schedule's peak from its current step on (the optimizer's lr is then
    ``lr`` times the schedule's factor at that step)."""
    scheduler.base_lrs = [lr for _ in scheduler.base_lrs]
    groups = scheduler.optimizer.param_groups
    for group, factor in zip(groups, scheduler.lr_lambdas, strict=True):
        group["initial_lr"], group["lr"] = lr, lr * factor(scheduler.last_epoch)
