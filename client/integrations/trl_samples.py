"""Completion samples from a TRL ``GRPOTrainer`` (``attach(..., log_samples=N)``, docs/design.md
§5 'Samples'): of each scored batch, N prompts with their completions and rewards go to
``Monitor.log_samples``, the collapsed groups first (what the dashboard's prompts tab asks
"what did the model answer?" about). Off (N = 0) by default: nothing is gathered or sent."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["gather_texts", "log_samples", "picked_groups", "text_of"]


def text_of(item: Any) -> str:
    """A TRL prompt or completion as text: a string as it is; chat messages (a list of
    ``{"role", "content"}``) as ``role: content`` lines; anything else as its ``str``."""
    if isinstance(item, str):
        return item
    if isinstance(item, list) and all(isinstance(m, dict) for m in item):
        return "\n".join(f"{m.get('role', '?')}: {m.get('content', '')}" for m in item)
    return str(item)


def gather_texts(dist: Any, prompts: Sequence[Any] | None, completions: Sequence[Any] | None
                 ) -> tuple[list[str], list[str]] | None:  # fmt: skip
    """This batch's prompt and completion texts, from every process when ``torch.distributed``
    runs several (a collective: every rank calls it), in the order the rewards are gathered;
    None when the reward functions were not given both."""
    mine = None
    if prompts is not None and completions is not None and len(prompts) == len(completions):
        mine = ([text_of(p) for p in prompts], [text_of(c) for c in completions])
    if dist is None or dist.get_world_size() <= 1:
        return mine
    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, mine)
    if any(p is None for p in parts):
        return None
    return [t for p in parts for t in p[0]], [t for p in parts for t in p[1]]


def picked_groups(groups: Sequence[Sequence[float]], n: int) -> list[int]:
    """The indices of ``n`` groups to sample: the collapsed ones (every reward the same) first,
    then the others, each in order."""
    collapsed = [i for i, g in enumerate(groups) if g and max(g) == min(g)]
    chosen = set(collapsed)
    return (collapsed + [i for i in range(len(groups)) if i not in chosen])[: max(0, n)]


def log_samples(monitor: Any, step: int, groups: Sequence[Sequence[float]],
                texts: tuple[list[str], list[str]], prompt_ids: Sequence[str] | None, n: int,
                split: str) -> None:  # fmt: skip
    """Send ``n`` of a batch's ``groups`` (G consecutive completions each) to
    ``monitor.log_samples``: the prompt's text, the group's completions and rewards."""
    prompts, completions = texts
    g = len(groups[0]) if groups else 0
    for i in picked_groups(groups, n):
        monitor.log_samples(
            step,
            prompts[i * g],
            completions[i * g : (i + 1) * g],
            list(groups[i]),
            prompt_id=None if prompt_ids is None else prompt_ids[i],
            split=split,
        )
