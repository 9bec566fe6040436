"""``torch.distributed`` for the trainer: starting the process group under torchrun, and the
helpers that sum (or take the minimum of) per-step counts, share rank 0's objects and keep the
ranks' weights equal.

Without a process group every helper acts as a single process would.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["Distributed", "broadcast_parameters", "init_process_group"]


def init_process_group() -> bool:
    """Start the process group when launched by torchrun (WORLD_SIZE > 1); True when we did."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return False
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend=backend)
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    return True


class Distributed:
    """``torch.distributed`` when a process group is up, else a single process."""

    def __init__(self) -> None:
        self.enabled = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.enabled else 0
        self.world_size = dist.get_world_size() if self.enabled else 1
        # where the counts are reduced: NCCL takes CUDA tensors only, gloo CPU ones
        self.device = torch.device("cpu")
        if self.enabled and dist.get_backend() == "nccl":
            self.device = torch.device("cuda", torch.cuda.current_device())

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sum over ranks (float64)."""
        return self._all_reduce(values, dist.ReduceOp.SUM)

    def min(self, values: list[float]) -> list[float]:
        """Element-wise minimum over ranks (float64)."""
        return self._all_reduce(values, dist.ReduceOp.MIN)

    def max(self, values: list[float]) -> list[float]:
        """Element-wise maximum over ranks (float64)."""
        return self._all_reduce(values, dist.ReduceOp.MAX)

    def _all_reduce(self, values: list[float], op: Any) -> list[float]:
        if not self.enabled:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=op)
        return t.tolist()

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's object on every rank."""
        if not self.enabled:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def all_reduce_grads(self, parameters: list[torch.nn.Parameter]) -> None:
        """Sum gradients over ranks (the loss is already divided by the global token count)."""
        if not self.enabled:
            return
        for p in parameters:
            if p.grad is not None:
                dist.all_reduce(p.grad)

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()


def broadcast_parameters(model: torch.nn.Module, distributed: Distributed) -> None:
    """Rank 0's weights on every rank (after a warm start that only rank 0 ran)."""
    if distributed.enabled:
        for p in model.state_dict().values():
            dist.broadcast(p, src=0)
