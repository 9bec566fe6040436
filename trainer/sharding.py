"""FSDP2 sharding (``fsdp: true``): the policy, and the reference when AAPO or the KL needs it,
sharded over the ranks of a torchrun job with ``torch.distributed.fsdp.fully_shard``; the full
weights and optimizer state a checkpoint gathers; and the agreement sharded forwards need.

Each decoder block (the classes the model lists in ``_no_split_modules``) is one FSDP unit and
the root holds the rest (embeddings, tied LM head, final norm). On CUDA the forward and backward
run in bf16 with fp32 gradient reduction (``MixedPrecisionPolicy``); the sharded parameters and
the optimizer state stay in the dtype they were loaded in. Gradients are summed over ranks, not
averaged: the loss is already divided by the step's global token count (docs/design.md §7).

Every forward of a sharded model is a collective (its blocks are all-gathered), so every rank
must run as many: generation runs with ``synced_gpus`` (a rank that is done keeps stepping until
every rank is), and a choice between code paths that depends on a rank's own data is agreed
first (`agree`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "agree",
    "full_optimizer_state",
    "full_state_dict",
    "fused_adamw",
    "is_sharded",
    "load_optimizer_state",
    "shard_model",
]


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether ``fully_shard`` was applied to the model (its parameters are DTensor shards)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def shard_model(model: torch.nn.Module, device: torch.device) -> None:
    """Shard ``model`` in place over the default process group: one FSDP unit per decoder block,
    then the root. Parameters become DTensors: build optimizers after this. Requires an
    initialized process group (torchrun); raises RuntimeError otherwise."""
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("fsdp needs a process group: launch with torchrun")
    policy = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if device.type == "cuda"
        else MixedPrecisionPolicy()
    )
    blocks = set(getattr(model, "_no_split_modules", None) or ())
    for module in list(model.modules()):
        if module is not model and type(module).__name__ in blocks:
            fully_shard(module, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            # sum, not mean: the loss is already divided by the global token count. A plain
            # sum also works on gloo, which has no PREMUL_SUM.
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)


def agree(model: torch.nn.Module, flag: bool) -> bool:
    """``flag`` if every rank holds it, for a sharded model (one MIN all-reduce on the model's
    device, so NCCL takes it); ``flag`` as it is otherwise. Call it on every rank together."""
    if not is_sharded(model):
        return flag
    device = next(model.parameters()).device
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def _options() -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
    """The full (unsharded) weights on rank 0's CPU, {} on the other ranks; None for a model
    that is not sharded. A collective: every rank calls it together."""
    if not is_sharded(model):
        return None
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_options())


def full_optimizer_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> dict[str, Any] | None:
    """The full optimizer state keyed by parameter name, on rank 0's CPU ({} on the others);
    None when the model is not sharded. A collective, like `full_state_dict`."""
    if not is_sharded(model):
        return None
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=_options())


def load_optimizer_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    """Restore an optimizer state saved by either kind of run: keyed by parameter index
    (``optimizer.state_dict()`` of an unsharded run) or by name (`full_optimizer_state`), so a
    run may change ``fsdp`` on a resume. Indices follow ``model.named_parameters()``, the order
    the optimizer was built in. A sharded optimizer takes its shard of the full state (every
    rank calls it with the full state: each reads the checkpoint)."""
    names = [name for name, _ in model.named_parameters()]
    by_name = any(isinstance(p, str) for g in state.get("param_groups", []) for p in g["params"])
    if not is_sharded(model):
        if by_name:
            index = {name: i for i, name in enumerate(names)}
            state = _rekeyed(state, index.__getitem__)
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    if not by_name:
        state = _rekeyed(state, names.__getitem__)
    set_optimizer_state_dict(
        model, optimizer, state, options=StateDictOptions(full_state_dict=True)
    )


def _rekeyed(state: dict[str, Any], key: Any) -> dict[str, Any]:
    """``state`` with each parameter's key (in ``state`` and in the groups) mapped by ``key``."""
    return {
        "state": {key(k): v for k, v in state["state"].items()},
        "param_groups": [
            {**g, "params": [key(p) for p in g["params"]]} for g in state["param_groups"]
        ],
    }


def fused_adamw(model: torch.nn.Module) -> bool | None:
    """True (one fused AdamW kernel for every parameter, not a loop of small ops per tensor)
    where torch has it: plain float parameters on the CPU or CUDA; None (torch's own choice)
    otherwise, as for the DTensor shards of a sharded model."""
    floats = (torch.float32, torch.bfloat16, torch.float16)
    params = list(model.parameters())
    plain = all(
        type(p) is torch.nn.Parameter and p.device.type in ("cpu", "cuda") and p.dtype in floats
        for p in params
    )
    return True if params and plain else None
