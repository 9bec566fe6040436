"""The GRPO trainer: one step reads top to bottom, everything else is a module it calls.

    sample prompts → generate G completions each → score (again while DAPO's filter leaves the
    batch short) → monitor (raw rewards of every group) → advantages (the registered estimator
    the mitigation names, on the groups it trains on) → clipped-surrogate loss → optimizer step →
    (at the boundary) commands

Data parallel: each rank samples its own prompts; the step's ACR, rewards and token counts are
summed over ranks, gradients are summed with the loss already divided by the global token count,
and rank 0's commands are broadcast so every rank applies them at the same step boundary. Under
DAPO every rank generates as many batches and trains on as many groups as the rank that kept
the fewest.
"""

from __future__ import annotations

import logging
import math
import random
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from vantage.client.acr import ACRSettings, StepAccumulator, summarize_rewards
from vantage.client.commands import Command

from .advantages import (
    Advantages,
    AvspoState,
    EffectiveStats,
    apply_estimator,
    effective_stats,
    estimator_keywords,
    get_adv_estimator,
    group_filter,
)
from .checkpoint import load_reference, save_checkpoint, save_reference
from .commands import apply_logged, is_number
from .config import TrainConfig
from .data import Problem, Task
from .distributed import Distributed
from .loss import completion_logprobs, policy_loss
from .mitigation import Mitigation
from .monitoring import MonitorAdapter
from .rewards import math_reward
from .rollout import HFBackend, Rollouts, take_groups
from .sharding import (
    full_state_dict,
    fused_adamw,
    is_sharded,
    load_optimizer_state,
    shard_model,
)

__all__ = ["GRPOTrainer", "StepHook"]

log = logging.getLogger(__name__)

StepHook = Callable[["GRPOTrainer", dict[str, Any]], None]


class GRPOTrainer:
    """GRPO on one task with a live-switchable advantage estimator; see the module docstring."""

    def __init__(
        self,
        config: TrainConfig,
        policy: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        task: Task,
        monitor: MonitorAdapter | None = None,
        distributed: Distributed | None = None,
        backend: Any | None = None,
        reference_spec: dict[str, Any] | None = None,
    ) -> None:
        self.config = config
        self.policy = policy
        self.tokenizer = tokenizer
        self.task = task
        self.monitor = monitor or MonitorAdapter(None)
        self.dist = distributed or Distributed()
        self.backend = backend or HFBackend(tokenizer, config.chat_template)
        self.output_dir = Path(config.output_dir)
        self.device = next(policy.parameters()).device
        self.optimizer = torch.optim.AdamW(
            policy.parameters(),
            lr=config.lr,
            betas=tuple(config.adam_betas),
            weight_decay=config.weight_decay,
            fused=fused_adamw(policy),
        )
        warmup = max(1, config.warmup_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / warmup)
        )
        self.rng = random.Random(f"grpo-{config.seed}-{self.dist.rank}")
        self.acr_settings = ACRSettings(config.reward_min, config.reward_max)
        self.step = 0
        self.mitigation = Mitigation.from_config(config)
        self.avspo_state = AvspoState(tau=config.avspo_tau0)
        self.temperature = config.temperature
        self.reference_spec = reference_spec  # how to rebuild the step-0 policy
        self.reference: PreTrainedModel | None = None
        self.seen_commands: set[str] = set()
        self.local_commands: list[Command] = []
        self.stop_requested = False
        self.stop_signal: int | None = None  # SIGTERM or SIGINT arrived (run.fit stops)
        self.history: list[dict[str, Any]] = []
        self.hooks: list[StepHook] = []
        self.run_id: str | None = None
        self.sft_stats: dict[str, Any] = {}
        self.owns_process_group = False
        self.last_checkpoint: tuple[tuple[int, int], str] | None = None  # (step, commands)

    # ------------------------------------------------------------------ the step

    def train_step(self) -> dict[str, Any]:
        """One GRPO step; returns its record (the numbers sent as scalars, plus the step's ACR)."""
        step, clock, per_step = self.step + 1, _StepClock(), self.config.prompts_per_step
        keep = group_filter(self.mitigation.estimator)  # DAPO's drops collapsed groups; or None
        budget = self.mitigation.max_gen_batches if keep else 1

        # a mode that filters groups samples again while some rank keeps too few, within budget
        batches: list[_GenerationBatch] = []
        fewest_kept = 0.0  # over every rank
        while len(batches) < budget and (not batches or fewest_kept < per_step):
            problems = self.task.sample(per_step, self.rng)
            rollouts = self.generate(self.backend, self.policy, problems)
            clock.lap("generate")
            rewards = self.score(rollouts.texts, problems)
            kept = keep(rewards) if keep else torch.ones(len(problems), dtype=torch.bool)
            batches.append(_GenerationBatch(problems, rollouts, rewards, kept))
            (fewest_kept,) = self.dist.min([float(sum(int(b.kept.sum()) for b in batches))])
            clock.lap("score")

        every_group = torch.cat([b.rewards for b in batches])  # the raw ACR covers them all
        prompt_ids = [p.prompt_id for b in batches for p in b.problems]
        self.monitor.log_groups(step, every_group, prompt_ids)
        first = batches[0]  # a few prompts of the first batch, from rank 0 only
        n_samples = self.config.log_samples if self.dist.is_main else 0
        self.monitor.log_samples(
            step, first.problems, first.rollouts.texts, first.rewards, n_samples
        )
        acr, reward_mean, reward_std = self.step_acr(every_group)
        problems, rollouts, rewards = self.trained_groups(batches, int(min(fewest_kept, per_step)))
        clock.lap("score")

        advantages = self.advantages(rewards, acr, problems)
        effective = effective_stats(advantages)
        self.monitor.log_effective(step, *effective, mitigation=self.reported_mitigation())
        clock.lap("advantage")

        # no group kept on some rank (DAPO's budget spent): no rank updates the weights
        losses = self.optimize(rollouts, advantages.values) if problems else {}
        if self.mitigation.adapts_tau:
            self.avspo_state.update(
                acr if acr is not None else 0.0, reward_mean, self.mitigation.eta
            )
        self.step = step
        clock.lap("train")

        record = {
            "step": step,
            "reward": reward_mean,
            "reward_std": reward_std,
            "acr": acr,
            **self.pooled_effective(effective),
            **self.sampling_stats(batches, len(problems)),
            **self.settings_in_effect(),
            **losses,
            **clock.times(),
        }
        scalars = {k: v for k, v in record.items() if k != "step" and is_number(v)}
        self.monitor.log_scalars(step, scalars)
        self.history.append(record)
        return record

    # ------------------------------------------------------------------ pieces the step calls

    def generate(self, backend: Any, model: PreTrainedModel, problems: list[Problem]) -> Rollouts:
        """G completions of each problem's question, sampled with the current settings."""
        c = self.config
        questions = [p.question for p in problems]
        return backend.generate(
            model, questions, c.group_size, self.temperature, c.top_p, c.max_new_tokens
        )

    def score(self, texts: list[str], problems: list[Problem]) -> torch.Tensor:
        """[P, G] rewards, completions prompt-major (G = len(texts) / P)."""
        c, g = self.config, len(texts) // len(problems)
        values = [
            math_reward(text, problems[i // g].answer, c.reward_min, c.reward_max, c.math_verify)
            for i, text in enumerate(texts)
        ]
        return torch.tensor(values, dtype=torch.float64).view(len(problems), g)

    def trained_groups(
        self, batches: list[_GenerationBatch], n: int
    ) -> tuple[list[Problem], Rollouts, torch.Tensor]:
        """The first ``n`` kept groups of the step's batches, in order: their problems, their
        rollouts as one batch and their [n, G] rewards."""
        picked: list[tuple[_GenerationBatch, list[int]]] = []
        for batch in batches:
            taken = sum(len(groups) for _, groups in picked)
            picked.append((batch, torch.nonzero(batch.kept).flatten().tolist()[: n - taken]))
        problems = [batch.problems[i] for batch, groups in picked for i in groups]
        rollouts = take_groups([(b.rollouts, g) for b, g in picked], self.config.group_size)
        rewards = torch.cat([batch.rewards[groups] for batch, groups in picked])
        return problems, rollouts, rewards

    def sampling_stats(self, batches: list[_GenerationBatch], trained: int) -> dict[str, float]:
        """What the step generated and trained on, over every rank: completions, generation
        batches (as many on every rank), groups a filter dropped, groups trained on, and 1 when
        each rank trained on fewer than prompts_per_step groups (DAPO's budget ran out)."""
        world = self.dist.world_size
        (dropped,) = self.dist.sum([float(sum(int((~b.kept).sum()) for b in batches))])
        return {
            "rollouts_per_step": float(sum(b.rewards.numel() for b in batches) * world),
            "gen_batches": float(len(batches)),
            "filtered_groups": dropped,
            "trained_groups": float(trained * world),
            "short_batch": float(trained < self.config.prompts_per_step),
        }

    def step_acr(self, rewards: torch.Tensor) -> tuple[float | None, float, float]:
        """The step's raw ACR, mean reward and reward standard deviation (population, of
        every completion) over every rank; the ACR from the engine of vantage.client. The
        std is logged as the ``reward_std`` scalar, the dashboard's band around the mean."""
        acc = StepAccumulator()
        for row in rewards.tolist():
            acc.add(summarize_rewards(row, settings=self.acr_settings))
        valid, collapsed, reward_sum, square_sum, n = self.dist.sum(
            [
                acc.n_valid,
                acc.n_collapsed,
                float(rewards.sum()),
                float(rewards.square().sum()),
                rewards.numel(),
            ]
        )
        mean = reward_sum / n if n else 0.0
        std = math.sqrt(max(0.0, square_sum / n - mean * mean)) if n else 0.0
        return (collapsed / valid if valid else None), mean, std

    def advantages(
        self, rewards: torch.Tensor, acr: float | None, problems: list[Problem]
    ) -> Advantages:
        """The estimator the current mitigation names (one registry lookup), given the step's
        inputs it takes: this rank's groups, the step's ACR, the settings."""
        c = self.config
        estimator = get_adv_estimator(self.mitigation.estimator)
        inputs: dict[str, Any] = {
            "acr": acr or 0.0,
            "reward_min": c.reward_min,
            "reward_max": c.reward_max,
            "scale_rewards": c.scale_rewards,
            "tau": self.avspo_state.tau,
            **self.mitigation.estimator_inputs(),
        }
        if "reference_rewards" in estimator_keywords(estimator):  # costs a generation
            inputs["reference_rewards"] = self.reference_rewards(problems)
        return apply_estimator(estimator, rewards, inputs)

    def pooled_effective(self, effective: EffectiveStats) -> dict[str, Any]:
        """The step's effective ACR and virtual rewards over every rank (as ACR and reward)."""
        n_valid, n_zero, n_virtual = self.dist.sum(
            [effective.n_valid, effective.n_zero_advantage, effective.n_virtual]
        )
        return {"acr_effective": n_zero / n_valid if n_valid else None, "n_virtual": int(n_virtual)}

    def settings_in_effect(self) -> dict[str, Any]:
        """The settings the step ran with that commands may change, and the learning rate."""
        return {
            "mitigation": self.mitigation.mode,
            "temperature": self.temperature,
            "lr": self.scheduler.get_last_lr()[0],
            "avspo_tau": self.avspo_state.tau,
        }

    def reference_rewards(self, problems: list[Problem]) -> torch.Tensor:
        """Rewards of G completions the reference policy samples for the same prompts, with the
        policy's current generation settings (AAPO's r_ref). Always through HF ``generate``,
        also when the policy samples with vLLM (which holds the policy's weights only)."""
        reference = self.ensure_reference()
        sampler = HFBackend(self.tokenizer, self.config.chat_template)
        out = self.generate(sampler, reference, problems)
        return self.score(out.texts, problems)

    def ensure_reference(self) -> PreTrainedModel:
        """The frozen policy of GRPO step 0 (attempt 1), loaded the first time it is needed."""
        if self.reference is None:
            if self.reference_spec is None:
                raise RuntimeError("no reference policy was recorded at GRPO step 0")
            self.reference = load_reference(self.reference_spec, self.output_dir, self.config)
            self.reference.to(self.device).eval().requires_grad_(False)
            if is_sharded(self.policy):  # every rank builds it at the same step boundary
                shard_model(self.reference, self.device)
        return self.reference

    def record_reference(self, loaded_from_files: bool) -> None:
        """At GRPO step 0 of attempt 1: remember the policy as the reference (a snapshot unless the
        weights are still exactly the files they were loaded from)."""
        # sharded, the weights are gathered on rank 0 first (every rank takes part)
        weights = None if loaded_from_files else full_state_dict(self.policy)
        if self.dist.is_main:
            self.reference_spec = save_reference(
                self.policy, self.tokenizer, self.output_dir, self.config, loaded_from_files,
                weights,
            )  # fmt: skip
        self.reference_spec = self.dist.broadcast(self.reference_spec)

    @torch.no_grad()
    def _frozen_logprobs(
        self, rollouts: Rollouts, chunks: list[slice]
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The log-probabilities that stay fixed through the step's updates: the policy's before
        them (only needed for more than one update) and the reference's (only for the KL)."""
        old_logp = ref_logp = None
        if self.config.num_iterations > 1:
            old_logp = torch.cat(
                [completion_logprobs(self.policy, rollouts, s, self.temperature)[0] for s in chunks]
            )
        if self.config.kl_beta > 0:
            reference = self.ensure_reference()
            ref_logp = torch.cat(
                [completion_logprobs(reference, rollouts, s, self.temperature)[0] for s in chunks]
            )
        return old_logp, ref_logp

    def optimize(self, rollouts: Rollouts, advantages: torch.Tensor) -> dict[str, float]:
        """Clipped surrogate (ε_low, ε_high) with token-level aggregation over every rank, optional
        k3 KL to the reference; AdamW with grad-norm clipping; ``num_iterations`` updates."""
        c = self.config
        adv = advantages.reshape(-1).to(self.device, torch.float32)  # one per completion
        mask = rollouts.completion_mask.float()
        (global_tokens,) = self.dist.sum([float(mask.sum())])
        global_tokens = max(1.0, global_tokens)
        batch = rollouts.completion_ids.shape[0]
        micro = c.micro_batch_size or batch
        chunks = [slice(i, min(i + micro, batch)) for i in range(0, batch, micro)]
        # the optimizer's own: FSDP leaves the root's weights gathered after a forward without a
        # backward (generation), and policy.parameters() then yields those, not the shards
        params = [p for g in self.optimizer.param_groups for p in g["params"] if p.requires_grad]
        old_logp, ref_logp = self._frozen_logprobs(rollouts, chunks)
        sharded = is_sharded(self.policy)  # FSDP sums the gradients in backward

        self.policy.train()
        totals = {"loss": 0.0, "kl": 0.0, "entropy": 0.0, "clip_fraction": 0.0, "grad_norm": 0.0}
        share = 1.0 / global_tokens / c.num_iterations  # of a token's value in the step's means
        for _ in range(c.num_iterations):
            self.optimizer.zero_grad(set_to_none=True)
            for rows in chunks:
                if sharded:  # reduce-scatter once, after the last micro-batch
                    self.policy.set_requires_gradient_sync(rows is chunks[-1])  # type: ignore[operator]
                logp, entropy = completion_logprobs(
                    self.policy, rollouts, rows, self.temperature, entropy=True
                )
                m = mask[rows]
                out = policy_loss(
                    logp,
                    logp.detach() if old_logp is None else old_logp[rows],
                    adv[rows],
                    m,
                    global_tokens,
                    c.eps_low,
                    c.eps_high,
                    None if ref_logp is None else ref_logp[rows],
                    c.kl_beta,
                )
                out.loss.backward()
                totals["loss"] += float(out.loss.detach()) / c.num_iterations
                totals["kl"] += float((out.kl * m).sum()) * share
                totals["entropy"] += float((entropy * m).sum()) * share  # type: ignore[operator]
                totals["clip_fraction"] += float((out.clipped * m).sum()) * share
            if not sharded:
                self.dist.all_reduce_grads(params)
            grad_norm = torch.nn.utils.clip_grad_norm_(params, c.grad_clip)
            if hasattr(grad_norm, "full_tensor"):  # a DTensor when the grads are sharded
                grad_norm = grad_norm.full_tensor()
            totals["grad_norm"] += float(grad_norm) / c.num_iterations
            self.optimizer.step()
        self.scheduler.step()
        self.backend.sync_weights(self.policy)
        # the loss, KL and entropy above are this rank's share of the global token mean
        summed = self.dist.sum(
            [totals["loss"], totals["kl"], totals["entropy"], totals["clip_fraction"]]
        )
        totals.update(loss=summed[0], kl=summed[1], entropy=summed[2], clip_fraction=summed[3])
        return totals

    # ------------------------------------------------------------------ evaluation

    @torch.no_grad()
    def evaluate(self) -> float | None:
        """Greedy accuracy on the held-out problems (each rank takes a shard; summed), or None
        when a signal cut it short (a large evaluation must not outlast a scheduler's grace)."""
        problems = self.task.eval_problems[self.dist.rank :: self.dist.world_size]
        correct = 0.0
        sampler = HFBackend(self.tokenizer, self.config.chat_template)
        sharded = is_sharded(self.policy)  # then every rank generates as often, stops together
        chunks = math.ceil(len(problems) / 64)
        if sharded:
            (chunks,) = self.dist.max([chunks])
        for i in range(0, 64 * int(chunks), 64):
            stop = self.stop_signal is not None
            if sharded:
                stop = self.dist.sum([float(stop)])[0] > 0
            if stop:
                problems = []  # every rank still takes part in the sum below
                break
            chunk = problems[i : i + 64]
            questions = [p.question for p in chunk or self.task.eval_problems[:1]]
            out = sampler.generate(self.policy, questions, 1, 0.0, 1.0, self.config.max_new_tokens)
            if chunk:  # a sharded rank out of problems generated for the others' sake
                correct += float((self.score(out.texts, chunk) == self.config.reward_max).sum())
        total_correct, total, cut = self.dist.sum(
            [correct, float(len(problems)), float(self.stop_signal is not None and not problems)]
        )
        if cut:
            return None
        return total_correct / total if total else 0.0

    # ------------------------------------------------------------------ commands

    def _share_stop_signal(self) -> None:
        """A signal may reach one rank only (a scheduler signalling one process): every rank
        learns of it here, at the step boundary, and rank 0 queues the stop all ranks apply."""
        term, interrupt = self.dist.sum(
            [float(self.stop_signal == signal.SIGTERM), float(self.stop_signal == signal.SIGINT)]
        )
        if self.stop_signal is None and (term or interrupt):
            self.stop_signal = signal.SIGTERM if term else signal.SIGINT
            if self.dist.is_main:  # its own signal queued the stop already
                self.submit_command("stop", source=signal.Signals(self.stop_signal).name)

    def reported_mitigation(self) -> dict[str, Any]:
        """The mitigation in effect as each step reports it: its mode and settings, and for
        AVSPO's adaptive threshold the current τ."""
        reported = self.mitigation.reported()
        if self.mitigation.adapts_tau:
            reported["tau"] = self.avspo_state.tau
        return reported

    def submit_command(
        self,
        type: str,  # noqa: A002
        params: dict[str, Any] | None = None,
        source: str = "local",
    ) -> None:
        """Queue a command locally (tests, the demo, notebooks, a signal: ``source`` names it in
        the log); applied at the next boundary like a server command, but not acked to the
        server. Call it on rank 0."""
        cid = f"{source}-{len(self.local_commands)}-{time.monotonic_ns()}"
        self.local_commands.append(Command(cid, type, dict(params or {}), local=True))

    def apply_commands(self) -> list[dict[str, Any]]:
        """At a step boundary: rank 0 polls, every rank applies the same commands in order, rank 0
        acks each with the step just completed. Returns what was done (for logs and tests)."""
        commands: list[Command] = []
        if self.dist.enabled:
            self._share_stop_signal()
        if self.dist.is_main:
            commands = self.monitor.poll_commands() + self.local_commands
            self.local_commands = []
            commands = [c for c in commands if c.command_id not in self.seen_commands]
        commands = self.dist.broadcast(commands) if self.dist.enabled else commands
        done = []
        for command in commands:
            self.seen_commands.add(command.command_id)
            done.append(apply_logged(self, command))
            if self.dist.is_main:
                self.monitor.ack(command, done[-1]["status"], self.step, done[-1]["detail"])
        return done

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "mitigation": asdict(self.mitigation),
            "avspo_state": asdict(self.avspo_state),
            "temperature": self.temperature,
            "seen_commands": sorted(self.seen_commands),
            "reference_spec": self.reference_spec,
            "run_id": self.run_id,
            "history": self.history,
            "config": self.config.to_dict(),  # what a resume must agree with (`run.setup`)
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        load_optimizer_state(self.policy, self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.mitigation = Mitigation(**state["mitigation"])
        self.avspo_state = AvspoState(**state["avspo_state"])
        self.temperature = float(state["temperature"])
        self.seen_commands = set(state["seen_commands"])
        self.reference_spec = state["reference_spec"]
        self.run_id = state.get("run_id")
        self.history = list(state.get("history", []))

    def save_checkpoint(self) -> str:
        """Save, unless nothing changed since the last save: a checkpoint command and the end
        of training at one step share one save, but a command applied after it at that step (a
        set_mitigation, then stop) saves again, so a resume continues as the acks said."""
        state = (self.step, len(self.seen_commands))  # every command applied or refused adds one
        if self.last_checkpoint is None or self.last_checkpoint[0] != state:
            self.last_checkpoint = (state, str(save_checkpoint(self)))
        return self.last_checkpoint[1]


@dataclass
class _GenerationBatch:
    """One batch a step generated: P problems, their P·G rollouts, [P, G] rewards, and [P] bool
    the groups the mode's filter keeps (all of them without a filter)."""

    problems: list[Problem]
    rollouts: Rollouts
    rewards: torch.Tensor
    kept: torch.Tensor


class _StepClock:
    """Seconds spent in each part of a step, as the record's ``time_<part>_s`` and ``step_s``; a
    part timed more than once (each generation batch) adds up."""

    def __init__(self) -> None:
        self.start = self.last = time.perf_counter()
        self.parts: dict[str, float] = {}

    def lap(self, part: str) -> None:
        now = time.perf_counter()
        key = f"time_{part}_s"
        self.parts[key], self.last = self.parts.get(key, 0.0) + now - self.last, now

    def times(self) -> dict[str, float]:
        return {**self.parts, "step_s": self.last - self.start}
