"""Who this process is in a training job: its launch id, rank and world size (docs/design.md §5).

Every rank of one launch must name the same ``launch_id`` so that the server gives them one
attempt; a resumed job is a new launch and gets the next attempt.
"""

from __future__ import annotations

import os
import sys
import uuid
from typing import Any

__all__ = ["derive_launch_id", "rank_and_world_size", "run_id_of", "torch_distributed"]


def torch_distributed() -> Any:
    """``torch.distributed`` when torch is already imported and a process group is up; never
    imports torch itself (the client must not need it)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    dist = getattr(torch, "distributed", None)
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return dist
    except Exception:  # pragma: no cover - exotic builds
        return None
    return None


def _shared_through_store(dist: Any) -> str | None:
    """One UUID per process group, through its key-value store: the first rank to ask sets it,
    every later one reads it (``compare_set``). Unlike a broadcast it needs no collective, so it
    never hangs when only some ranks build a Monitor. None when the store cannot do it."""
    try:
        from torch.distributed.distributed_c10d import _get_default_store  # noqa: PLC0415

        value = _get_default_store().compare_set("vantage/launch_id", "", str(uuid.uuid4()))
    except Exception:  # no default store, or a store without compare_set
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def derive_launch_id(explicit: str | None = None) -> str:
    """The launch id that every rank of one launch shares (docs/design.md §5), in this order: the
    argument, ``VANTAGE_LAUNCH_ID``, ``TORCHELASTIC_RUN_ID`` (unless torchrun's default "none")
    + ``TORCHELASTIC_RESTART_COUNT``, a
    UUID shared by the ranks of the ``torch.distributed`` process group (through its store; a
    broadcast from rank 0 where the store cannot, which every rank must then join), else a fresh
    UUID."""
    if explicit:
        return str(explicit)
    env = os.environ.get("VANTAGE_LAUNCH_ID")
    if env:
        return env
    elastic = os.environ.get("TORCHELASTIC_RUN_ID")
    # plain `torchrun` (no --rdzv-id) names every launch "none": no launch id at all (else
    # each relaunch would be the same launch, and a resumed job never a new attempt)
    if elastic and elastic != "none":
        return f"{elastic}-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    dist = torch_distributed()
    if dist is not None:
        shared = _shared_through_store(dist)
        if shared:
            return shared
        box = [str(uuid.uuid4()) if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(box, src=0)
        return str(box[0])
    return str(uuid.uuid4())


def rank_and_world_size(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``torch.distributed``'s when a process group is up, else ``RANK``/``WORLD_SIZE``, else
    0 and 1; an argument given wins."""
    dist = torch_distributed()
    if rank is None:
        rank = dist.get_rank() if dist is not None else int(os.environ.get("RANK", 0))
    if world_size is None:
        world_size = (
            dist.get_world_size() if dist is not None else int(os.environ.get("WORLD_SIZE", 1))
        )
    return int(rank), int(world_size)


def run_id_of(launch_id: str, run_name: Any, project: Any) -> str:
    """The run id every rank of a launch derives alike: a UUID (version 5) of the launch id,
    the run's name and its project."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"vantage:{project}/{run_name}/{launch_id}"))
