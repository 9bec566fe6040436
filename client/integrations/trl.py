"""Vantage for TRL's ``GRPOTrainer`` (docs/design.md §5).

Two pieces, usually put in place together by ``attach``::

    from vantage.client import Monitor
    from vantage.client.integrations.trl import attach

    trainer = GRPOTrainer(model=..., reward_funcs=[accuracy, fmt], args=GRPOConfig(...), ...)
    mon = Monitor("http://127.0.0.1:8000", api_key, run_name="qwen-grpo")
    attach(trainer, mon)            # wraps the reward functions, adds the callback
    trainer.train()
    mon.close()

- ``VantageRewards`` wraps the reward functions. After the last of them has scored a batch it
  forms each completion's reward as TRL does (the weighted ``nansum`` in float32; a completion
  every function scored ``None`` is non-finite), gathers the batch from every process when
  ``torch.distributed`` is initialised (TRL hands each process only its own completions, and one
  group can span processes), and rank 0 logs whole groups of ``num_generations`` consecutive
  completions under ``trainer_state.global_step + 1``, the step TRL logs them under. With
  ``log_func`` only that one function's rewards are logged.
- ``VantageCallback`` sends TRL's logged scalars (``loss``, ``grad_norm``, ``kl``, ``entropy``
  (the canonical names, ``CANONICAL_SCALARS``), ``frac_reward_zero_std``, ...; NaN and ±Infinity
  as they are) and applies the run's commands at step boundaries: ``stop`` and ``checkpoint``
  through the trainer's control flags, ``set_sampling`` by changing the generation temperature,
  on every rank at the same step; ``set_mitigation`` ``avspo`` (and back to ``none``) through
  ``trl_avspo.RemoteAvspo`` from the next training generation, acked there (TRL 1.16 only);
  ``aapo`` and ``dapo`` are rejected (TRL has neither).
  The Monitor itself sends heartbeats.

Async reward functions and reward models (``nn.Module``) are left unwrapped; pass ``log_func``
naming a plain function, or log rewards yourself. This module imports torch and transformers only
when it is used, never at import.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import logging
import math
import numbers
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from . import trl_samples
from .trl_avspo import RemoteAvspo

if TYPE_CHECKING:
    from ..commands import Command
    from ..monitor import Monitor

__all__ = ["VantageRewards", "VantageCallback", "attach", "prompt_id"]  # noqa: F822 (lazy)

log = logging.getLogger("vantage.client")


def prompt_id(prompt: Any) -> str:
    """A stable short id for a prompt (text or chat messages), so collapse can be tracked per
    prompt across steps without sending the prompt itself."""
    text = prompt if isinstance(prompt, str) else repr(prompt)
    return hashlib.blake2b(text.encode("utf-8", "replace"), digest_size=8).hexdigest()


def _dist() -> Any:
    import torch.distributed as dist  # noqa: PLC0415 (torch only when TRL is in use)

    return dist if dist.is_available() and dist.is_initialized() else None


def _is_plain_callable(func: Any) -> bool:
    if not callable(func) or isinstance(func, str):
        return False
    try:
        import torch.nn as nn  # noqa: PLC0415

        if isinstance(func, nn.Module):
            return False
    except ImportError:  # pragma: no cover
        pass
    call = getattr(type(func), "__call__", None)  # noqa: B004 (async __call__ of an object)
    return not (inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(call))


def _name(func: Any) -> str:
    return getattr(func, "__name__", None) or type(func).__name__


class VantageRewards:
    """Wraps a GRPO trainer's reward functions so that every scored batch reaches ``monitor``.

    ``reward_weights`` default to 1 per function (TRL's default); ``num_generations`` (G) is read
    from the trainer's arguments by ``VantageCallback`` when not given; ``log_func`` (a name or an
    index) logs that function alone instead of the weighted sum. ``reward_funcs`` is the list to
    hand to ``GRPOTrainer`` (each wrapper keeps the original's ``__name__``, which TRL logs under).
    """

    def __init__(
        self,
        monitor: Monitor | None,
        reward_funcs: Sequence[Any] | Any,
        reward_weights: Sequence[float] | None = None,
        num_generations: int | None = None,
        log_func: str | int | None = None,
        log_samples: int = 0,
    ) -> None:
        funcs = list(reward_funcs) if isinstance(reward_funcs, list | tuple) else [reward_funcs]
        self.monitor = monitor
        self.num_generations = num_generations
        self.num_generations_eval: int | None = None
        self.weights = (
            [1.0] * len(funcs) if reward_weights is None else [float(w) for w in reward_weights]
        )
        if len(self.weights) != len(funcs):
            raise ValueError(
                f"{len(self.weights)} reward weights for {len(funcs)} reward functions"
            )
        if isinstance(log_func, str):
            names = [_name(f) for f in funcs]
            if log_func not in names:
                raise ValueError(
                    f"log_func {log_func!r} is not one of the reward functions {names}"
                )
            log_func = names.index(log_func)
        self.log_index: int | None = log_func
        wrappable = [_is_plain_callable(f) for f in funcs]
        if log_func is not None and not wrappable[log_func]:
            raise ValueError("log_func must name a plain (synchronous) reward function")
        if log_func is None and not all(wrappable):
            raise ValueError(
                "reward models and async reward functions cannot be wrapped; pass log_func naming "
                "a plain reward function to log that one alone"
            )
        self.model: Any = None  # set by VantageCallback: its .training tells train from eval
        self.logged_steps: list[int] = []
        # The latest training batch's rewards, gathered (every process holds them) and its step:
        # what remote AVSPO (trl_avspo.RemoteAvspo) recomputes collapsed groups from.
        self.last_values: list[float] | None = None
        self.last_step: int | None = None
        self._outputs: dict[int, list[float]] = {}
        self._prompts: list[Any] | None = None
        # completion samples a batch sends (trl_samples); their texts are kept only then
        self.log_samples = int(log_samples)
        self._completions: list[Any] | None = None
        self._state: Any = None
        self._fallback_step = 0
        self.reward_funcs = [
            self._wrap(i, f) if (log_func is None or i == log_func) else f
            for i, f in enumerate(funcs)
        ]

    def _wrap(self, index: int, func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            out = func(*args, **kwargs)
            try:
                if self.log_samples:
                    self._completions = kwargs.get("completions")
                self._collect(index, out, kwargs.get("prompts"), kwargs.get("trainer_state"))
            except Exception:  # monitoring must never break training
                log.exception("vantage: could not log the rewards of %s", _name(func))
            return out

        if not hasattr(wrapped, "__name__"):  # callable objects
            wrapped.__name__ = _name(func)  # type: ignore[attr-defined]
        return wrapped

    def _collect(self, index: int, out: Sequence[Any], prompts: Any, state: Any) -> None:
        self._outputs[index] = [math.nan if r is None else float(r) for r in out]
        if prompts is not None:
            self._prompts = list(prompts)
        if state is not None:
            self._state = state
        expected = {self.log_index} if self.log_index is not None else set(range(len(self.weights)))
        if not expected <= self._outputs.keys():
            return
        outputs, self._outputs = self._outputs, {}
        self._log_batch(outputs)

    def _log_batch(self, outputs: dict[int, list[float]]) -> None:
        import torch  # noqa: PLC0415

        if self.log_index is not None:
            rewards = torch.tensor(outputs[self.log_index], dtype=torch.float32)
        else:
            # Exactly TRL's combination: float32, weighted nansum, NaN when no function scored.
            per_func = torch.tensor([outputs[i] for i in range(len(self.weights))],
                                    dtype=torch.float32).T  # fmt: skip
            weights = torch.tensor(self.weights, dtype=torch.float32)
            rewards = (per_func * weights.unsqueeze(0)).nansum(dim=1)
            rewards[torch.isnan(per_func).all(dim=1)] = torch.nan
        prompts = [prompt_id(p) for p in self._prompts] if self._prompts is not None else None
        values = rewards.tolist()
        dist = _dist()
        if dist is not None and dist.get_world_size() > 1:
            parts: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(parts, (values, prompts))
            values = [v for part in parts for v in part[0]]
            prompts = None if any(p[1] is None for p in parts) else [x for p in parts for x in p[1]]
        training = self.model is None or bool(getattr(self.model, "training", True))
        g = (
            self.num_generations
            if training
            else (self.num_generations_eval or self.num_generations)
        )
        if self._state is not None:
            step = int(self._state.global_step) + 1
        else:
            self._fallback_step += 1
            step = self._fallback_step
        if training:
            self.last_values, self.last_step = values, step
        texts = None  # every rank gathers (a collective), rank 0 sends
        if self.log_samples:
            texts = trl_samples.gather_texts(dist, self._prompts, self._completions)
        if dist is not None and dist.get_world_size() > 1 and dist.get_rank() != 0:
            return
        if not g or len(values) % g:
            log.warning("vantage: %d rewards do not divide into groups of num_generations=%s; "
                        "not logged", len(values), g)  # fmt: skip
            return
        groups = [values[i : i + g] for i in range(0, len(values), g)]
        group_prompts = None if prompts is None else prompts[::g]
        self.logged_steps.append(step)
        if self.monitor is not None:
            self.monitor.log_groups(step, groups, prompt_ids=group_prompts,
                                    split="train" if training else "eval")  # fmt: skip
            if texts is not None:
                split = "train" if training else "eval"
                trl_samples.log_samples(self.monitor, step, groups, texts, group_prompts,
                                        self.log_samples, split)  # fmt: skip


# TRL's names for the canonical scalars of docs/design.md §5 (TRL name → canonical name): the
# training loss and the gradient norm before clipping (transformers' Trainer logs both), the mean
# KL to the reference model (logged only when beta > 0) and the mean per-token entropy. TRL 1.x
# already logs them under these names; a TRL name that differs is sent under both names.
CANONICAL_SCALARS = {"loss": "loss", "grad_norm": "grad_norm", "kl": "kl", "entropy": "entropy"}


def _numeric_logs(logs: dict[str, Any]) -> dict[str, float]:
    """The numbers of one TRL log, non-finite ones kept. TRL's ``log`` averages each metric over
    the logging window without its NaN values and logs None when every value was NaN (a KL or an
    entropy gone NaN): that None is sent as NaN, so that the server sees what happened
    (docs/design.md §5: a non-finite scalar is never dropped)."""
    out = {}
    for key, value in logs.items():
        if value is None:
            out[key] = math.nan
        elif isinstance(value, numbers.Real) and not isinstance(value, bool):
            out[key] = float(value)
    for key, canonical in CANONICAL_SCALARS.items():
        if key in out and canonical not in out:
            out[canonical] = out[key]
    return out


class _CallbackMixin:
    """The body of ``VantageCallback`` (the class itself subclasses transformers'
    ``TrainerCallback``, imported only when first used)."""

    def __init__(
        self,
        monitor: Monitor | None,
        rewards: VantageRewards | None = None,
        trainer: Any = None,
        apply_commands: bool = True,
    ) -> None:
        self.monitor = monitor
        self.rewards = rewards
        self.trainer = trainer
        self.apply_commands = apply_commands
        self.applied: list[tuple[str, str, int]] = []
        self.avspo = (
            RemoteAvspo(trainer, rewards, monitor, self.applied)
            if trainer is not None and rewards is not None
            else None
        )

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any):
        if self.rewards is not None:
            self.rewards._state = state
            if model is not None:
                self.rewards.model = model
            if self.rewards.num_generations is None:
                self.rewards.num_generations = getattr(args, "num_generations", None)
            if self.rewards.num_generations_eval is None:
                self.rewards.num_generations_eval = getattr(args, "num_generations_eval", None)
        return control

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kw: Any):
        if self.monitor is None or not logs or not state.is_world_process_zero:
            return control
        train = {k: v for k, v in _numeric_logs(logs).items() if not k.startswith("eval_")}
        evals = {k[5:]: v for k, v in _numeric_logs(logs).items() if k.startswith("eval_")}
        if train:
            self.monitor.log_scalars(state.global_step, train)
        if evals:
            self.monitor.log_scalars(state.global_step, evals, split="eval")
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any):
        if not self.apply_commands:
            return control
        commands: list[Command] = []
        if self.monitor is not None and self.monitor.rank == 0:
            commands = self.monitor.poll_commands()
        dist = _dist()
        if dist is not None and dist.get_world_size() > 1:
            # Every rank applies the same commands at the same step; only rank 0 receives them.
            box: list[Any] = [commands if dist.get_rank() == 0 else None]
            dist.broadcast_object_list(box, src=0)
            commands = box[0] or []
        for cmd in commands:
            answer = self._apply(cmd, control)
            if answer is None:  # a mitigation: acked where it takes effect (RemoteAvspo)
                continue
            status, detail = answer
            self.applied.append((cmd.command_id, status, state.global_step))
            if self.monitor is not None and self.monitor.rank == 0:
                self.monitor.ack(cmd.command_id, status, state.global_step, detail)
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any):
        if self.avspo is not None:
            self.avspo.expire(state.global_step)
        return control

    def _apply(self, cmd: Command, control: Any) -> tuple[str, str] | None:
        if cmd.type == "stop":
            control.should_training_stop = True
            return "applied", "training stops after this step"
        if cmd.type == "checkpoint":
            control.should_save = True
            return "applied", "checkpoint saved at this step"
        if cmd.type == "set_sampling":
            temperature = cmd.params.get("temperature")
            trainer = self.trainer
            if trainer is None or not isinstance(temperature, int | float):
                return "rejected", "set_sampling needs attach(trainer, ...) and a temperature"
            trainer.temperature = float(temperature)
            for name in ("generation_config", "generation_kwargs"):
                cfg = getattr(trainer, name, None)
                if isinstance(cfg, dict) and "temperature" in cfg:
                    cfg["temperature"] = float(temperature)
                elif cfg is not None and hasattr(cfg, "temperature"):
                    cfg.temperature = float(temperature)
            return "applied", f"temperature {temperature}"
        if cmd.type == "set_mitigation":
            if self.avspo is not None:
                return self.avspo.request(cmd)
            if cmd.params.get("mode") == "none":
                return "applied", "no mitigation (TRL's own GRPO)"
            if cmd.params.get("mode") == "avspo":
                return "rejected", "AVSPO needs attach(trainer, ...): this callback has no trainer"
            return "rejected", f"TRL's GRPOTrainer does not implement {cmd.params.get('mode')}"
        return "rejected", f"unknown command type {cmd.type!r}"


@functools.cache
def _callback_class() -> type:
    from transformers import TrainerCallback  # noqa: PLC0415

    class VantageCallback(_CallbackMixin, TrainerCallback):
        """Sends TRL's logged scalars and applies the run's commands at step boundaries."""

    return VantageCallback


def __getattr__(name: str) -> Any:
    if name == "VantageCallback":
        return _callback_class()
    raise AttributeError(name)


def attach(
    trainer: Any,
    monitor: Monitor | None,
    log_func: str | int | None = None,
    apply_commands: bool = True,
    log_samples: int = 0,
) -> Any:
    """Wire a constructed ``GRPOTrainer`` to ``monitor``: its reward functions are wrapped in
    place (weights and ``num_generations`` taken from the trainer) and a ``VantageCallback`` is
    added. Call it on every process (the gathering is collective); ``monitor`` may be None on
    ranks other than 0. Returns the callback.

    Only rank 0's Monitor sends (groups are gathered there); a Monitor given on another rank
    is not used, and a warning says so (a Monitor made on every rank would register a run of
    its own on each, which never gets data and goes stale)."""
    dist = _dist()
    if monitor is not None and dist is not None and dist.get_rank() != 0:
        log.warning(
            "vantage: attach() on rank %d was given a Monitor; only rank 0's sends (groups are "
            "gathered there), so it is not used. Create the Monitor on rank 0 only and pass "
            "None elsewhere: a Monitor of its own run (%s) stays empty",
            dist.get_rank(),
            monitor.run_id,
        )
        monitor = None
    weights = getattr(trainer, "reward_weights", None)
    weights = None if weights is None else [float(w) for w in weights]
    rewards = VantageRewards(
        monitor,
        trainer.reward_funcs,
        reward_weights=weights,
        num_generations=getattr(trainer, "num_generations", None),
        log_func=log_func,
        log_samples=log_samples,
    )
    rewards.num_generations_eval = getattr(trainer, "num_generations_eval", None)
    rewards.model = getattr(trainer, "model", None)
    trainer.reward_funcs = rewards.reward_funcs
    callback = _callback_class()(monitor, rewards=rewards, trainer=trainer,
                                 apply_commands=apply_commands)  # fmt: skip
    trainer.add_callback(callback)
    return callback
