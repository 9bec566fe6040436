"""Checkpoints (everything needed to continue exactly) and the saved reference policy.

Layout under ``output_dir``::

    checkpoint/policy/       the policy (save_pretrained; sharded, its gathered full weights) and
                             its tokenizer
    checkpoint/state.pt      step, optimizer, scheduler, mitigation, AVSPO τ, temperature, commands
                             seen, run_id, reference spec, history
    checkpoint/rng-rank{r}.pt  each rank's Python, torch (and CUDA) RNG and its prompt sampler
    reference/               the policy at GRPO step 0 of attempt 1 (AAPO, KL), when it differs
                             from the files the policy was loaded from
    reference.json           how to rebuild the reference policy
"""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
from pathlib import Path
from typing import Any, Protocol

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from .config import TrainConfig
from .distributed import Distributed
from .models import load_policy
from .sharding import full_optimizer_state, full_state_dict, is_sharded

__all__ = [
    "Checkpointable",
    "WeightsDiverged",
    "latest_checkpoint",
    "load_checkpoint",
    "load_reference",
    "save_checkpoint",
    "save_reference",
]

CHECKPOINT = "checkpoint"


class Checkpointable(Protocol):
    """What a checkpoint saves and restores: the trainer's policy, tokenizer, prompt sampler and
    ``state_dict`` (step, optimizer, mitigation, ...), on every rank of ``dist``."""

    policy: PreTrainedModel
    optimizer: torch.optim.Optimizer
    tokenizer: PreTrainedTokenizerBase
    output_dir: Path
    dist: Distributed
    rng: random.Random

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class WeightsDiverged(RuntimeError):
    """The policy's weights are no longer finite numbers (too high an lr, say): saving them
    would replace the last good checkpoint with one no resume can use."""


def _check_finite(policy: torch.nn.Module, dist: Distributed) -> None:
    """Raise WeightsDiverged naming the first parameter that holds NaN or an infinity; on every
    rank when the policy is sharded (each checks its shards, then they agree)."""
    bad = next(
        (
            name
            for name, p in policy.named_parameters()
            if not torch.isfinite(p.to_local() if hasattr(p, "to_local") else p).all()
        ),
        None,
    )
    if is_sharded(policy):
        (ranks_bad,) = dist.sum([float(bad is not None)])
        if ranks_bad and bad is None:
            bad = "on another rank"
    if bad is not None:
        raise WeightsDiverged(f"parameter {bad} holds NaN or infinite values")


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The checkpoint folder under output_dir, or None when there is none (or it is incomplete)."""
    path = Path(output_dir) / CHECKPOINT
    return path if (path / "state.pt").exists() else None


def _rng_state(trainer: Checkpointable) -> dict[str, Any]:
    state = {
        "python": random.getstate(),
        "torch": torch.get_rng_state(),
        "sampler": trainer.rng.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def save_checkpoint(trainer: Checkpointable) -> Path:
    """Write the checkpoint atomically (a temporary folder renamed into place); every rank calls
    this together. Returns the checkpoint folder. Raises WeightsDiverged, writing nothing, when
    the weights are not finite (every rank holds the same weights, so every rank raises)."""
    dist = trainer.dist
    _check_finite(trainer.policy, dist)
    # a sharded run gathers the full weights and optimizer state on rank 0 (None otherwise)
    weights = full_state_dict(trainer.policy)
    optimizer = full_optimizer_state(trainer.policy, trainer.optimizer)
    out = Path(trainer.output_dir)
    final, tmp = out / CHECKPOINT, out / f"{CHECKPOINT}.tmp"
    if dist.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    torch.save(_rng_state(trainer), tmp / f"rng-rank{dist.rank}.pt")
    if dist.is_main:
        trainer.policy.save_pretrained(tmp / "policy", state_dict=weights)
        trainer.tokenizer.save_pretrained(tmp / "policy")
        state = trainer.state_dict()
        if optimizer is not None:  # by parameter name; `load_optimizer_state` takes both
            state["optimizer"] = optimizer
        torch.save(state, tmp / "state.pt")
    dist.barrier()
    if dist.is_main:
        old = out / f"{CHECKPOINT}.old"
        shutil.rmtree(old, ignore_errors=True)
        if final.exists():
            final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    return final


def load_checkpoint(trainer: Checkpointable, path: str | Path) -> None:
    """Restore the trainer's state and this rank's RNG (the policy weights are loaded by the
    caller from ``path/policy``)."""
    path = Path(path)
    trainer.load_state_dict(torch.load(path / "state.pt", weights_only=False))
    rng_file = path / f"rng-rank{trainer.dist.rank}.pt"
    if rng_file.exists():
        rng = torch.load(rng_file, weights_only=False)
        random.setstate(rng["python"])
        torch.set_rng_state(rng["torch"])
        trainer.rng.setstate(rng["sampler"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])


def save_reference(
    policy: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    output_dir: str | Path,
    config: TrainConfig,
    loaded_from_files: bool,
    weights: dict[str, torch.Tensor] | None = None,
) -> dict[str, Any]:
    """Record the policy at GRPO step 0 of attempt 1 as the reference. When its weights are the
    unchanged files it came from, the spec points there (no copy); otherwise a snapshot is saved
    (of ``weights`` when given: a sharded policy's gathered full state dict). Returns the spec,
    also written to ``reference.json``."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if loaded_from_files:
        keys = ("model_source", "model_path", "gguf_file", "init_checkpoint", "dtype")
        spec = {"kind": "source", **{k: getattr(config, k) for k in keys}}
    else:
        policy.save_pretrained(out / "reference", state_dict=weights)
        tokenizer.save_pretrained(out / "reference")
        spec = {"kind": "snapshot", "path": "reference"}
    (out / "reference.json").write_text(json.dumps(spec, indent=2))
    return spec


def load_reference(
    spec: dict[str, Any], output_dir: str | Path, config: TrainConfig
) -> PreTrainedModel:
    """The reference policy a spec describes, frozen."""
    if spec["kind"] == "snapshot":
        model = AutoModelForCausalLM.from_pretrained(
            Path(output_dir) / spec["path"],
            local_files_only=True,
            dtype=torch.bfloat16 if config.dtype == "bfloat16" else torch.float32,
        )
    else:
        fields = {k: v for k, v in spec.items() if k != "kind"}
        model, _ = load_policy(dataclasses.replace(config, **fields))
    return model.eval().requires_grad_(False)
