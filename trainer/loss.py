"""The policy loss: PPO's clipped surrogate with asymmetric clipping and an optional k3 KL, and
the per-token log-probabilities it is computed from.

Pure tensor functions; the trainer sums them over micro-batches and ranks.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from transformers import PreTrainedModel

from .rollout import Rollouts, kv_cache_keyword, prompt_prefix_cache, takes_logits_to_keep
from .sft import lm_inputs
from .sharding import agree, is_sharded

__all__ = ["PolicyLoss", "completion_logits", "completion_logprobs", "policy_loss"]


class PolicyLoss(NamedTuple):
    """loss: the scalar to backpropagate; kl, clipped: per-token [B, T] terms (detached)."""

    loss: torch.Tensor
    kl: torch.Tensor
    clipped: torch.Tensor


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    normalizer: float,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    ref_logp: torch.Tensor | None = None,
    kl_beta: float = 0.0,
) -> PolicyLoss:
    """``Σ_tokens mask·(−min(ρ·A, clip(ρ, 1−ε_low, 1+ε_high)·A) + β·KL) / normalizer``.

    logp, old_logp, ref_logp, mask: [B, T] per completion token; advantages: [B] or [B, 1], one
    per completion, shared by its tokens. ρ = exp(logp − old_logp). ``normalizer`` is the number
    of completion tokens in the whole step (over every micro-batch and rank): token-level
    aggregation, so long completions weigh by their tokens (DAPO, Yu et al. 2025, eq. 8–9; its
    clip-higher ε_high > ε_low). KL is Schulman's k3 estimator ``exp(r − l) − (r − l) − 1`` ≥ 0
    with r = ref_logp, l = logp (as in DeepSeekMath eq. 4). PPO: Schulman et al. 2017, eq. 7.
    """
    adv = advantages.reshape(-1, 1).to(logp.dtype)
    ratio = torch.exp(logp - old_logp)
    clipped_ratio = torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    per_token = -torch.min(ratio * adv, clipped_ratio * adv)
    kl = torch.zeros_like(logp)
    if ref_logp is not None and kl_beta:
        delta = ref_logp - logp
        kl = torch.exp(delta) - delta - 1
        per_token = per_token + kl_beta * kl
    loss = (per_token * mask).sum() / normalizer
    return PolicyLoss(loss, kl.detach(), (ratio != clipped_ratio).detach())


def completion_logprobs(
    model: PreTrainedModel,
    rollouts: Rollouts,
    rows: slice,
    temperature: float,
    entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probabilities [b, Lc] of the sampled completions (logits / temperature,
    as the sampler drew them) and, when asked, the per-token entropy."""
    logits = completion_logits(model, rollouts, rows).float()
    if temperature > 0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, rollouts.completion_ids[rows].unsqueeze(-1)).squeeze(-1)
    ent = -(logp_all.exp() * logp_all).sum(-1).detach() if entropy else None
    return logp, ent


def completion_logits(model: PreTrainedModel, rollouts: Rollouts, rows: slice) -> torch.Tensor:
    """The logits [b, Lc, V] that predict each completion token of ``rows``.

    Rows that share a prompt (a group's G completions, consecutive) share its forward: the
    prompt but its last token runs once per distinct prompt into a KV cache, which is indexed
    out to every row, and only the last prompt token and the completion run per row, with
    gradients reaching the prompt through the cache. The logits are those of one forward over
    prompt + completion (up to float rounding); that forward is used where sharing does not
    apply (no repeated prompt, a one-token prompt, a model without a cache)."""
    prompt_ids, prompt_mask = rollouts.prompt_ids[rows], rollouts.prompt_mask[rows]
    completion_ids = rollouts.completion_ids[rows]
    inputs = lm_inputs(prompt_ids, prompt_mask, completion_ids, rollouts.completion_mask[rows])
    width, cut = completion_ids.shape[1], prompt_ids.shape[1] - 1  # cut: the prefix's length
    first = torch.ones(len(prompt_ids), dtype=torch.bool, device=prompt_ids.device)
    first[1:] = (prompt_ids[1:] != prompt_ids[:-1]).any(1) | (
        prompt_mask[1:] != prompt_mask[:-1]
    ).any(1)
    keyword = kv_cache_keyword(model)
    prefix_mask = inputs["attention_mask"][first, :cut]
    shared = not bool(first.all()) and cut > 0 and bool(prefix_mask.any(1).all())
    # FSDP frees a block's gathered weights after each forward, and a backward through two
    # forwards of one block met freed storage: sharded, only gradient-free passes share
    two_passes = not (torch.is_grad_enabled() and is_sharded(model))
    if keyword is None or not two_passes or not agree(model, shared):  # sharded: as many forwards
        if takes_logits_to_keep(model):
            inputs["logits_to_keep"] = width + 1  # the LM head skips the prompt's positions
        return model(**inputs).logits[:, -width - 1 : -1]
    positions = inputs["position_ids"]
    cache = prompt_prefix_cache(
        model, keyword, inputs["input_ids"][first, :cut], prefix_mask, positions[first, :cut]
    )
    cache.batch_select_indices(first.long().cumsum(0) - 1)  # each row's distinct prompt
    return model(  # type: ignore[no-any-return]
        input_ids=inputs["input_ids"][:, cut : cut + width],
        attention_mask=inputs["attention_mask"][:, : cut + width],
        position_ids=positions[:, cut : cut + width],
        use_cache=True,
        **{keyword: cache},
    ).logits
