"""Supervised warm start: teach a fresh model the answer format before GRPO.

Loss on answer tokens only, AdamW with a linear warmup and grad-norm clipping: without the warmup
and the clip the tiny model stalls below 10% accuracy (NOTES.md).
"""

from __future__ import annotations

import random
import time

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .data import Problem, Task

__all__ = ["sft_batch", "sft_warm_start", "lm_inputs"]


def lm_inputs(
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """input_ids, attention_mask and position_ids (cumsum(mask) − 1) of prompt + completion, so
    left padding does not shift absolute positions."""
    ids = torch.cat([prompt_ids, completion_ids], dim=1)
    mask = torch.cat([prompt_mask, completion_mask], dim=1)
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    return {"input_ids": ids, "attention_mask": mask, "position_ids": positions}


def sft_batch(
    tokenizer: PreTrainedTokenizerBase, problems: list[Problem], device: torch.device
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Model inputs and labels (-100 everywhere but the answer and its EOS)."""
    prompts = tokenizer([p.question for p in problems], return_tensors="pt", padding=True)
    answers = [
        tokenizer(p.answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        for p in problems
    ]
    width = max(len(a) for a in answers)
    completion = torch.full((len(problems), width), tokenizer.pad_token_id, dtype=torch.long)
    completion_mask = torch.zeros_like(completion)
    for i, a in enumerate(answers):
        completion[i, : len(a)] = torch.tensor(a)
        completion_mask[i, : len(a)] = 1
    inputs = lm_inputs(prompts["input_ids"], prompts["attention_mask"], completion, completion_mask)
    labels = torch.full_like(inputs["input_ids"], -100)
    labels[:, -width:] = completion.masked_fill(completion_mask == 0, -100)
    return {k: v.to(device) for k, v in inputs.items()}, labels.to(device)


def sft_warm_start(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    steps: int,
    batch_size: int = 64,
    lr: float = 1e-3,
    warmup_steps: int = 50,
    grad_clip: float = 1.0,
    seed: int = 0,
    progress: bool = False,
) -> dict[str, float]:
    """Train on (question → answer + EOS) for ``steps`` steps; returns loss and time.
    ``progress`` shows a progress bar (tqdm) with the loss."""
    from tqdm.auto import tqdm

    device = next(model.parameters()).device
    rng = random.Random(f"sft-{seed}")
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.99))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / max(1, warmup_steps))
    )
    model.train()
    start, loss_value = time.perf_counter(), float("nan")
    bar = tqdm(total=steps, desc="SFT warm start", unit="step", disable=not progress)
    for _ in range(steps):
        inputs, labels = sft_batch(tokenizer, task.sample(batch_size, rng), device)
        logits = model(**inputs).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(),
            labels[:, 1:].reshape(-1),
            ignore_index=-100,
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        schedule.step()
        loss_value = loss.item()
        bar.update()
        bar.set_postfix(loss=f"{loss_value:.3f}", refresh=False)
    bar.close()
    return {"sft_steps": steps, "sft_loss": loss_value, "sft_s": time.perf_counter() - start}
