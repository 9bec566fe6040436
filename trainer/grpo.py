"""The GRPO trainer: one step reads top to bottom, everything else is a module it calls.

    sample prompts → generate G completions each → score → monitor (raw rewards) → advantages
    (grpo | avspo | aapo) → clipped-surrogate loss → optimizer step → (at the boundary) commands

Data parallel: each rank samples its own prompts; the step's ACR, rewards and token counts are
summed over ranks, gradients are summed with the loss already divided by the global token count,
and rank 0's commands are broadcast so every rank applies them at the same step boundary.
"""

from __future__ import annotations

import logging
import math
import random
import signal
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from vantage.client.acr import ACRSettings, StepAccumulator, summarize_rewards

from .advantages import Advantages, AvspoState, compute_advantages, effective_stats
from .checkpoint import load_reference, save_reference
from .commands import Mitigation, apply_command, is_number
from .config import TrainConfig
from .data import Problem, Task
from .loss import policy_loss
from .monitoring import Command, Distributed, MonitorAdapter
from .rewards import math_reward
from .rollout import HFBackend, Rollouts
from .sft import lm_inputs

__all__ = ["GRPOTrainer", "Mitigation", "StepHook"]

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
        cfg, step, t0 = self.config, self.step + 1, time.perf_counter()

        problems = self.task.sample(cfg.prompts_per_step, self.rng)
        rollouts = self.backend.generate(
            self.policy,
            [p.question for p in problems],
            cfg.group_size,
            self.temperature,
            cfg.top_p,
            cfg.max_new_tokens,
        )
        t_generate = time.perf_counter()

        rewards = self.score(rollouts.texts, problems)
        self.monitor.log_groups(step, rewards, [p.prompt_id for p in problems])
        acr, reward_mean, reward_std = self.step_acr(rewards)
        t_score = time.perf_counter()

        advantages = self.advantages(rewards, acr, problems)
        effective = effective_stats(advantages)
        self.monitor.log_effective(step, *effective, mitigation=self.reported_mitigation())
        t_advantage = time.perf_counter()

        losses = self.optimize(rollouts, advantages.values)
        if self.mitigation.mode == "avspo" and self.mitigation.threshold == "adaptive":
            self.avspo_state.update(
                acr if acr is not None else 0.0, reward_mean, self.mitigation.eta
            )
        self.step = step
        t_end = time.perf_counter()

        # pooled over ranks, as acr and reward are (n_virtual was rank 0's alone: a trial)
        n_valid, n_zero, n_virtual = self.dist.sum(
            [effective.n_valid, effective.n_zero_advantage, effective.n_virtual]
        )
        record = {
            "step": step,
            "reward": reward_mean,
            "reward_std": reward_std,
            "acr": acr,
            "acr_effective": n_zero / n_valid if n_valid else None,
            "n_virtual": int(n_virtual),
            "mitigation": self.mitigation.mode,
            "temperature": self.temperature,
            "lr": self.scheduler.get_last_lr()[0],
            "avspo_tau": self.avspo_state.tau,
            **losses,
            "time_generate_s": t_generate - t0,
            "time_score_s": t_score - t_generate,
            "time_advantage_s": t_advantage - t_score,
            "time_train_s": t_end - t_advantage,
            "step_s": t_end - t0,
        }
        self.monitor.log_scalars(
            step, {k: v for k, v in record.items() if k != "step" and is_number(v)}
        )
        self.history.append(record)
        return record

    # ------------------------------------------------------------------ pieces the step calls

    def score(self, texts: list[str], problems: list[Problem]) -> torch.Tensor:
        """[P, G] rewards, completions prompt-major (G = len(texts) / P)."""
        c, g = self.config, len(texts) // len(problems)
        values = [
            math_reward(text, problems[i // g].answer, c.reward_min, c.reward_max, c.math_verify)
            for i, text in enumerate(texts)
        ]
        return torch.tensor(values, dtype=torch.float64).view(len(problems), g)

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
        """The estimator the current mitigation names, applied to this rank's groups."""
        c, m = self.config, self.mitigation
        common = {"scale_rewards": c.scale_rewards}
        if m.mode == "avspo":
            return compute_advantages(
                "avspo",
                rewards,
                acr=acr or 0.0,
                reward_min=c.reward_min,
                reward_max=c.reward_max,
                alpha=m.alpha,
                variant=m.threshold,
                tau=self.avspo_state.tau,
                **common,
            )
        if m.mode == "aapo":
            reference_rewards = self.reference_rewards(problems)
            return compute_advantages(
                "aapo",
                rewards,
                reference_rewards=reference_rewards,
                reward_min=c.reward_min,
                reward_max=c.reward_max,
                delta_low=m.delta_low,
                delta_high=m.delta_high,
                **common,
            )
        return compute_advantages("grpo", rewards, **common)

    def reference_rewards(self, problems: list[Problem]) -> torch.Tensor:
        """Rewards of G completions the reference policy samples for the same prompts, with the
        policy's current generation settings (AAPO's r_ref). Always through HF ``generate``,
        also when the policy samples with vLLM (which holds the policy's weights only)."""
        reference = self.ensure_reference()
        sampler = HFBackend(self.tokenizer, self.config.chat_template)
        out = sampler.generate(
            reference,
            [p.question for p in problems],
            self.config.group_size,
            self.temperature,
            self.config.top_p,
            self.config.max_new_tokens,
        )
        return self.score(out.texts, problems)

    def ensure_reference(self) -> PreTrainedModel:
        """The frozen policy of GRPO step 0 (attempt 1), loaded the first time it is needed."""
        if self.reference is None:
            if self.reference_spec is None:
                raise RuntimeError("no reference policy was recorded at GRPO step 0")
            self.reference = load_reference(self.reference_spec, self.output_dir, self.config)
            self.reference.to(self.device).eval().requires_grad_(False)
        return self.reference

    def record_reference(self, loaded_from_files: bool) -> None:
        """At GRPO step 0 of attempt 1: remember the policy as the reference (a snapshot unless the
        weights are still exactly the files they were loaded from)."""
        if self.dist.is_main:
            self.reference_spec = save_reference(
                self.policy, self.tokenizer, self.output_dir, self.config, loaded_from_files
            )
        self.reference_spec = self.dist.broadcast(self.reference_spec)

    def _logprobs(
        self, model: PreTrainedModel, rollouts: Rollouts, rows: slice, entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-token log-probabilities [b, Lc] of the sampled completions (logits / temperature,
        as the sampler drew them) and, when asked, the per-token entropy."""
        inputs = lm_inputs(
            rollouts.prompt_ids[rows],
            rollouts.prompt_mask[rows],
            rollouts.completion_ids[rows],
            rollouts.completion_mask[rows],
        )
        width = rollouts.completion_ids.shape[1]
        logits = model(**inputs).logits[:, -width - 1 : -1].float()
        if self.temperature > 0:
            logits = logits / self.temperature
        logp_all = torch.log_softmax(logits, dim=-1)
        logp = logp_all.gather(-1, rollouts.completion_ids[rows].unsqueeze(-1)).squeeze(-1)
        ent = -(logp_all.exp() * logp_all).sum(-1).detach() if entropy else None
        return logp, ent

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
        params = [p for p in self.policy.parameters() if p.requires_grad]

        old_logp = ref_logp = None
        with torch.no_grad():
            if c.num_iterations > 1:
                old_logp = torch.cat([self._logprobs(self.policy, rollouts, s)[0] for s in chunks])
            if c.kl_beta > 0:
                reference = self.ensure_reference()
                ref_logp = torch.cat([self._logprobs(reference, rollouts, s)[0] for s in chunks])

        self.policy.train()
        totals = {"loss": 0.0, "kl": 0.0, "entropy": 0.0, "clip_fraction": 0.0, "grad_norm": 0.0}
        share = 1.0 / global_tokens / c.num_iterations  # of a token's value in the step's means
        for _ in range(c.num_iterations):
            self.optimizer.zero_grad(set_to_none=True)
            for rows in chunks:
                logp, entropy = self._logprobs(self.policy, rollouts, rows, entropy=True)
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
            self.dist.all_reduce_grads(params)
            grad_norm = torch.nn.utils.clip_grad_norm_(params, c.grad_clip)
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
        when a signal cut it short: a large evaluation went on for 78 s after SIGTERM, past a
        scheduler's grace (a trial)."""
        problems = self.task.eval_problems[self.dist.rank :: self.dist.world_size]
        correct = 0.0
        sampler = HFBackend(self.tokenizer, self.config.chat_template)
        for i in range(0, len(problems), 64):
            if self.stop_signal is not None:
                problems = []  # every rank still takes part in the sum below
                break
            chunk = problems[i : i + 64]
            out = sampler.generate(
                self.policy, [p.question for p in chunk], 1, 0.0, 1.0, self.config.max_new_tokens
            )
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
        learns of it here, at the step boundary, and rank 0 queues the stop all ranks apply
        (rank 1 alone said it would stop, and training went on: a trial)."""
        term, interrupt = self.dist.sum(
            [float(self.stop_signal == signal.SIGTERM), float(self.stop_signal == signal.SIGINT)]
        )
        if self.stop_signal is None and (term or interrupt):
            self.stop_signal = signal.SIGTERM if term else signal.SIGINT
            if self.dist.is_main:  # its own signal queued the stop already
                self.submit_command("stop", source=signal.Signals(self.stop_signal).name)

    def reported_mitigation(self) -> dict[str, Any]:
        """The mitigation in effect as each step reports it: its mode and settings, and for
        AVSPO's adaptive threshold the current τ (a τ set by command went unreported)."""
        reported = self.mitigation.reported()
        if self.mitigation.mode == "avspo" and self.mitigation.threshold == "adaptive":
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
            try:
                detail = apply_command(self, command)
                status = "applied"
            except (ValueError, TypeError, KeyError, RuntimeError, OSError) as exc:
                status, detail = "rejected", str(exc)
            source = command.command_id.split("-", 1)[0] if command.local else "the server"
            log.log(  # a rejection is worth a warning: someone asked for something not done
                logging.INFO if status == "applied" else logging.WARNING,
                "command %s from %s %s at step %d: %s",
                command.type,
                source,
                status,
                self.step,
                detail,
            )
            if self.dist.is_main:
                self.monitor.ack(command, status, self.step, detail)
            done.append(
                {
                    "command_id": command.command_id,
                    "type": command.type,
                    "status": status,
                    "step": self.step,
                    "detail": detail,
                }
            )
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
        self.optimizer.load_state_dict(state["optimizer"])
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
        from .checkpoint import save_checkpoint

        state = (self.step, len(self.seen_commands))  # every command applied or refused adds one
        if self.last_checkpoint is None or self.last_checkpoint[0] != state:
            self.last_checkpoint = (state, str(save_checkpoint(self)))
        return self.last_checkpoint[1]
