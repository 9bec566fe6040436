"""Rollout backends: Hugging Face ``generate`` (default) and vLLM (optional, imported when chosen).

A backend turns P prompts into P·G completions, prompt-major (completions of one prompt are
contiguous, so ``rewards.view(P, G)`` gives the groups), as token tensors the loss can use.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .sharding import agree, is_sharded

__all__ = [
    "Rollouts",
    "HFBackend",
    "VLLMBackend",
    "completion_mask",
    "encode_prompts",
    "kv_cache_keyword",
    "prompt_prefix_cache",
    "shared_prompt_cache",
    "takes_logits_to_keep",
    "take_groups",
]

log = logging.getLogger(__name__)


@dataclass
class Rollouts:
    """prompt_ids/prompt_mask: [B, Lp] left-padded; completion_ids/completion_mask: [B, Lc], the
    mask covering tokens up to and including the first EOS; texts: B decoded completions."""

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    texts: list[str]

    @property
    def num_tokens(self) -> int:
        return int(self.completion_mask.sum())


def take_groups(parts: list[tuple[Rollouts, list[int]]], group_size: int) -> Rollouts:
    """One batch of the groups that ``parts`` name, in order: each part is a batch of rollouts
    (prompt-major, ``group_size`` completions a group) and the indices of the groups to take.
    Prompts are padded again on the left and completions on the right, masked out, so the batches
    of one step, padded to different widths, train as one. A single part taking all its groups
    is returned as it is."""
    if len(parts) == 1 and parts[0][1] == list(range(len(parts[0][0].texts) // group_size)):
        return parts[0][0]
    rows = [
        (r, [g * group_size + i for g in groups for i in range(group_size)]) for r, groups in parts
    ]
    prompt_width = max(r.prompt_ids.shape[1] for r, _ in rows)
    completion_width = max(r.completion_ids.shape[1] for r, _ in rows)

    def cat(name: str, width: int, left: bool) -> torch.Tensor:
        padded = []
        for r, index in rows:
            t = getattr(r, name)[torch.tensor(index, dtype=torch.long, device=r.prompt_ids.device)]
            extra = width - t.shape[1]
            padded.append(torch.nn.functional.pad(t, (extra, 0) if left else (0, extra)))
        return torch.cat(padded)

    return Rollouts(
        cat("prompt_ids", prompt_width, left=True),
        cat("prompt_mask", prompt_width, left=True),
        cat("completion_ids", completion_width, left=False),
        cat("completion_mask", completion_width, left=False),
        [r.texts[i] for r, index in rows for i in index],
    )


def encode_prompts(
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    chat_template: bool,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ids and attention mask of the prompts (through the chat template when asked)."""
    if chat_template:
        prompts = [
            tokenizer.apply_chat_template(
                [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
            )
            for p in prompts
        ]
    batch = tokenizer(
        prompts, return_tensors="pt", padding=True, add_special_tokens=not chat_template
    )
    return batch["input_ids"].to(device), batch["attention_mask"].to(device)


def completion_mask(completion_ids: torch.Tensor, eos_token_id: int | list[int]) -> torch.Tensor:
    """1 for tokens up to and including the first EOS of each row, 0 after it."""
    eos_ids = eos_token_id if isinstance(eos_token_id, list) else [eos_token_id]
    is_eos = torch.isin(completion_ids, torch.tensor(eos_ids, device=completion_ids.device))
    # tokens strictly after the first EOS: a cumulative count of EOS seen before this position
    seen_before = torch.cumsum(is_eos.long(), dim=1) - is_eos.long()
    return (seen_before == 0).long()


def kv_cache_keyword(model: torch.nn.Module) -> str | None:
    """The name the model's forward takes a KV cache under (``cache`` from transformers 5.x on,
    ``past_key_values`` before), or None when it takes neither (or is an encoder-decoder)."""
    if getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        return None
    parameters = inspect.signature(model.forward).parameters
    return next((k for k in ("cache", "past_key_values") if k in parameters), None)


def prompt_prefix_cache(
    model: torch.nn.Module,
    keyword: str,
    ids: torch.Tensor,
    mask: torch.Tensor,
    positions: torch.Tensor,
) -> Any:
    """A DynamicCache holding the keys and values of ``ids`` [b, L] (with their attention mask
    and position ids), from one forward that skips the LM head where the model allows. Under
    autograd when called with grad enabled: gradients reach the prefix through the cache."""
    from transformers import DynamicCache

    takes_config = "config" in inspect.signature(DynamicCache).parameters
    cache = DynamicCache(config=model.config) if takes_config else DynamicCache()
    extra = {"logits_to_keep": 1} if takes_logits_to_keep(model) else {}
    model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=positions,
        use_cache=True,
        **{keyword: cache},
        **extra,
    )
    return cache


def takes_logits_to_keep(model: torch.nn.Module) -> bool:
    """Whether the model's forward can compute the LM head on the last positions only."""
    return "logits_to_keep" in inspect.signature(model.forward).parameters


@torch.no_grad()
def shared_prompt_cache(
    model: PreTrainedModel, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, n: int
) -> dict[str, Any]:
    """The KV cache of each prompt but its last token, computed once for its ``n`` completions
    and repeated n times, as the keyword ``generate`` takes it; ``generate`` then runs only the
    last prompt token and the new ones (a group's G rows share one prompt: without this the
    prompt was encoded G times). {} where it does not apply: one completion a prompt, a one-token
    prompt, a row whose prefix is all padding, a model that takes no cache (for a sharded
    model: on some rank).

    prompt_ids, prompt_mask: [P, Lp] left-padded. Positions are ``cumsum(mask) − 1``, padding
    0, as ``generate`` numbers them, so the completions are those of the plain call."""
    keyword = kv_cache_keyword(model)
    prefix_mask = prompt_mask[:, :-1]
    if n < 2 or keyword is None:
        return {}
    if not agree(model, bool(prefix_mask.numel()) and bool(prefix_mask.any(1).all())):
        return {}
    positions = (prompt_mask.long().cumsum(-1) - 1).masked_fill(prompt_mask == 0, 0)
    cache = prompt_prefix_cache(model, keyword, prompt_ids[:, :-1], prefix_mask, positions[:, :-1])
    cache.batch_repeat_interleave(n)
    return {keyword: cache}


def _eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    eos = model.generation_config.eos_token_id
    if eos is None:
        eos = tokenizer.eos_token_id
    return list(eos) if isinstance(eos, list | tuple) else [int(eos)]


class HFBackend:
    """Sampling with ``model.generate``; temperature 0 means greedy."""

    name = "hf"

    def __init__(self, tokenizer: PreTrainedTokenizerBase, chat_template: bool = False) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template

    @torch.no_grad()
    def generate(
        self,
        model: PreTrainedModel,
        prompts: list[str],
        n: int,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
    ) -> Rollouts:
        device = next(model.parameters()).device
        prompt_ids, prompt_mask = encode_prompts(
            self.tokenizer, prompts, self.chat_template, device
        )
        eos = _eos_ids(model, self.tokenizer)
        sampling: dict[str, Any] = (
            {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": 0}
            if temperature > 0
            else {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
        )
        was_training = model.training
        model.eval()
        cache = shared_prompt_cache(model, prompt_ids, prompt_mask, n)
        prompt_ids = prompt_ids.repeat_interleave(n, dim=0)
        prompt_mask = prompt_mask.repeat_interleave(n, dim=0)
        out = model.generate(
            input_ids=prompt_ids,
            attention_mask=prompt_mask,
            max_new_tokens=max_new_tokens,
            pad_token_id=self.tokenizer.pad_token_id,
            eos_token_id=eos,
            synced_gpus=is_sharded(model),  # each forward is a collective: step together
            **cache,
            **sampling,
        )
        model.train(was_training)
        completion_ids = out[:, prompt_ids.shape[1] :]
        mask = completion_mask(completion_ids, eos)
        texts = self.tokenizer.batch_decode(completion_ids * mask, skip_special_tokens=True)
        return Rollouts(prompt_ids, prompt_mask, completion_ids, mask, texts)

    def sync_weights(self, model: PreTrainedModel) -> None:
        """HF generate uses the training model itself: nothing to copy."""


class VLLMBackend:
    """vLLM colocated with training on one GPU; weights are copied in after each optimizer step.

    ``vllm_module`` lets tests pass a stand-in module with ``LLM`` and ``SamplingParams``; by
    default ``vllm`` is imported here, only when this backend is chosen (the ``vllm`` extra).
    Untested on this project's machines, which have no vLLM.
    """

    name = "vllm"

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        model_path: str | Path,
        chat_template: bool = False,
        gpu_memory_utilization: float = 0.3,
        seed: int = 0,
        dtype: str = "float32",
        vllm_module: ModuleType | None = None,
    ) -> None:
        if vllm_module is None:
            try:
                vllm_module = importlib.import_module("vllm")
            except ImportError as exc:
                raise ImportError(
                    "backend vllm needs a CUDA GPU and the extra: pip install 'vantage-rl[vllm]'"
                ) from exc
        self.vllm = vllm_module
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.llm = vllm_module.LLM(
            model=str(model_path),
            gpu_memory_utilization=gpu_memory_utilization,
            seed=seed,
            dtype="bfloat16" if dtype == "bfloat16" else "float32",
            enable_prefix_caching=True,
        )

    def generate(
        self,
        model: PreTrainedModel,
        prompts: list[str],
        n: int,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
    ) -> Rollouts:
        device = next(model.parameters()).device
        prompt_ids, prompt_mask = encode_prompts(
            self.tokenizer, prompts, self.chat_template, device
        )
        requests = [
            {"prompt_token_ids": ids[m.bool()].tolist()}
            for ids, m in zip(prompt_ids, prompt_mask, strict=True)
        ]
        params = self.vllm.SamplingParams(
            n=n, temperature=temperature, top_p=top_p, max_tokens=max_new_tokens
        )
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        eos = _eos_ids(model, self.tokenizer)
        rows = [list(c.token_ids) for o in outputs for c in o.outputs]
        if len(rows) != len(prompts) * n:
            raise RuntimeError(f"vLLM returned {len(rows)} completions for {len(prompts)}×{n}")
        width = max(1, max(len(r) for r in rows))
        pad = self.tokenizer.pad_token_id
        completion_ids = torch.full((len(rows), width), pad, dtype=torch.long, device=device)
        for i, r in enumerate(rows):
            completion_ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        lengths = torch.tensor([len(r) for r in rows], device=device)
        in_length = torch.arange(width, device=device)[None, :] < lengths[:, None]
        mask = completion_mask(completion_ids, eos) * in_length.long()
        texts = self.tokenizer.batch_decode(completion_ids * mask, skip_special_tokens=True)
        return Rollouts(
            prompt_ids.repeat_interleave(n, dim=0),
            prompt_mask.repeat_interleave(n, dim=0),
            completion_ids,
            mask,
            texts,
        )

    def sync_weights(self, model: PreTrainedModel) -> None:
        """Copy the policy's weights into vLLM's model (after every optimizer step)."""
        weights = ((name, p.detach()) for name, p in model.state_dict().items())
        engine = self.llm.llm_engine
        executor = getattr(engine, "model_executor", None)
        worker = getattr(executor, "driver_worker", None)
        runner = getattr(getattr(worker, "worker", worker), "model_runner", None)
        if runner is not None:
            runner.model.load_weights(weights)
        elif hasattr(self.llm, "collective_rpc"):
            state = dict(weights)
            self.llm.collective_rpc(
                lambda self_: self_.model_runner.model.load_weights(state.items())
            )
        else:
            raise RuntimeError("this vLLM version exposes no way to load weights in place")
