"""Entry points: ``train(config, overrides)`` (what ``vantage train`` and the demo call) and
``main(argv)`` (``python -m vantage.trainer.run CONFIG --set key=value``; also under torchrun).

``setup`` builds a ready :class:`GRPOTrainer` (distributed init, policy, SFT warm start, reference
policy, Monitor, resume) and ``fit`` runs it, so a caller can hold the trainer in-process (submit
commands, read ``history``) between the two.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as torch_dist
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .advantages import TRAINER_EPS
from .checkpoint import WeightsDiverged
from .config import TrainConfig, load_config
from .data import Task, load_task
from .distributed import Distributed, broadcast_parameters, init_process_group
from .grpo import GRPOTrainer, StepHook
from .models import load_policy
from .monitoring import MonitorAdapter, make_monitor
from .resume import find_checkpoint, resume
from .rollout import VLLMBackend
from .sft import sft_warm_start
from .sharding import shard_model
from .signals import Interrupted, interrupt_on_signals, stop_on_signals
from .summary import summarize

__all__ = ["train", "setup", "fit", "main"]

log = logging.getLogger("vantage.trainer")

MonitorFactory = Callable[..., Any]
SIGNAL_CLOSE_S = 5.0  # how long a run stopped by a signal waits for the server at close


def setup(
    config: str | os.PathLike[str] | dict[str, Any] | TrainConfig,
    overrides: Sequence[str] = (),
    monitor_factory: MonitorFactory | None = None,
) -> GRPOTrainer:
    """A trainer ready for :func:`fit`: resumed from ``output_dir`` when a checkpoint is there,
    else freshly loaded, warm-started (``sft_steps``) and with the step-0 reference recorded."""
    cfg = load_config(config, list(overrides))
    owns_group, dist, device = _start_process(cfg)
    checkpoint, state = find_checkpoint(cfg, dist)
    _write_config(cfg, dist)
    policy, tokenizer = _load_policy(cfg, checkpoint, device)
    task = load_task(cfg)
    _seed(cfg, dist)
    sft_stats = _warm_start(cfg, policy, tokenizer, task, dist) if checkpoint is None else {}
    if cfg.fsdp:
        _shard(policy, dist, device)
    # one run_id for every rank: the checkpoint's, the config's, or a new one from rank 0
    run_id = dist.broadcast(state.get("run_id") or cfg.run_id or str(uuid.uuid4()))
    monitor = _start_monitor(cfg, run_id, dist, monitor_factory, device)
    backend = _rollout_backend(cfg, policy, tokenizer, dist)

    trainer = GRPOTrainer(cfg, policy, tokenizer, task, monitor, dist, backend)
    trainer.run_id = run_id
    trainer.sft_stats = sft_stats
    trainer.owns_process_group = owns_group
    if checkpoint is not None:
        resume(trainer, checkpoint, state.get("config"))
    else:
        from_files = cfg.model_source != "tiny" or bool(cfg.init_checkpoint)
        trainer.record_reference(loaded_from_files=from_files and not sft_stats)
    return trainer


def _start_process(cfg: TrainConfig) -> tuple[bool, Distributed, torch.device]:
    """Progress bars, the process group (True when this process started it), torch's threads
    and the device to train on."""
    if not cfg.progress:  # transformers' own bars (loading and writing weights) too
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    owns_group = init_process_group()
    dist = Distributed()
    if cfg.torch_threads > 0:
        torch.set_num_threads(cfg.torch_threads)
    return owns_group, dist, _device(cfg)


def _device(config: TrainConfig) -> torch.device:
    if config.device == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            "device cuda: this torch sees no CUDA device (a CPU build, or no GPU); "
            "set device: cpu or auto"
        )
    if config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available()):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _write_config(cfg: TrainConfig, dist: Distributed) -> None:
    """``output_dir/config.json``, before any model loads: an unusable folder is said at once,
    in one line (ValueError)."""
    if not dist.is_main:
        return
    output_dir = Path(cfg.output_dir)
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        config_json = json.dumps(cfg.to_dict(), indent=2, default=str)
        (output_dir / "config.json").write_text(config_json)
    except OSError as exc:
        raise ValueError(
            f"output_dir {output_dir} cannot be written: {exc.strerror or exc}"
        ) from None


def _load_policy(
    cfg: TrainConfig, checkpoint: Path | None, device: torch.device
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The policy and its tokenizer on ``device``: the checkpoint's weights when resuming."""
    if checkpoint is not None:
        log.info("resuming from %s", checkpoint)
        cfg = TrainConfig(**{**cfg.__dict__, "init_checkpoint": str(checkpoint / "policy")})
    policy, tokenizer = load_policy(cfg)
    policy.to(device)
    return policy, tokenizer


def _seed(cfg: TrainConfig, dist: Distributed) -> None:
    """Python's and torch's RNG, one stream per rank."""
    random.seed(cfg.seed + dist.rank)
    torch.manual_seed(cfg.seed + dist.rank)


def _warm_start(
    cfg: TrainConfig,
    policy: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    dist: Distributed,
) -> dict[str, Any]:
    """``sft_steps`` of supervised warm start on rank 0, its weights then on every rank;
    returns its statistics ({} when there are no SFT steps)."""
    if cfg.sft_steps <= 0:
        return {}
    sft_stats: dict[str, Any] = {}
    if dist.is_main:
        sft_stats = sft_warm_start(
            policy,
            tokenizer,
            task,
            cfg.sft_steps,
            cfg.sft_batch_size,
            cfg.sft_lr,
            cfg.sft_warmup_steps,
            cfg.sft_grad_clip,
            cfg.seed,
            progress=cfg.progress,
        )
        log.info("SFT warm start: %s", sft_stats)
    broadcast_parameters(policy, dist)
    return sft_stats


def _shard(policy: PreTrainedModel, dist: Distributed, device: torch.device) -> None:
    """``fsdp: true``: shard the policy over the ranks (after the warm start and any resumed
    weights, before the optimizer is built); a single process has nothing to shard."""
    if not dist.enabled:
        log.warning("fsdp: true in a single process (no torchrun): the policy is not sharded")
        return
    shard_model(policy, device)


def _start_monitor(
    cfg: TrainConfig,
    run_id: str,
    dist: Distributed,
    factory: MonitorFactory | None,
    device: torch.device | None = None,
) -> MonitorAdapter:
    """This rank's Monitor of the run (none without a server or a factory). The run's config
    carries ``gpus`` (the ranks' GPUs, 0 on CPU): with the ``step_s`` scalar it prices the
    rollouts that collapse wasted in GPU-hours (`vantage.server.cost`)."""
    gpus = dist.world_size if device is not None and device.type == "cuda" else 0
    return make_monitor(
        factory,
        cfg.server,
        {
            "server": cfg.server,
            "api_key": cfg.api_key,
            "run_name": cfg.run_name,
            "run_id": run_id,
            "launch_id": None,
            "project": cfg.project,
            "config": {**cfg.to_dict(), "gpus": gpus},
            "reward_min": cfg.reward_min,
            "reward_max": cfg.reward_max,
            "trainer_eps": TRAINER_EPS,
            "rank": dist.rank,
            "world_size": dist.world_size,
            "group_size": cfg.group_size,
            "samples_per_step": max(1, cfg.log_samples),
        },
    )


def _rollout_backend(
    cfg: TrainConfig,
    policy: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    dist: Distributed,
) -> VLLMBackend | None:
    """vLLM when the config asks for it (started from the policy's weights), else None: the
    trainer samples with HF ``generate``."""
    if cfg.backend != "vllm":
        return None
    init_dir = Path(cfg.output_dir) / "vllm-init"
    if dist.is_main:
        policy.save_pretrained(init_dir)
        tokenizer.save_pretrained(init_dir)
    dist.barrier()
    return VLLMBackend(
        tokenizer,
        init_dir,
        cfg.chat_template,
        cfg.vllm_gpu_memory_utilization,
        cfg.seed,
        cfg.dtype,
    )


def fit(trainer: GRPOTrainer, hooks: Sequence[StepHook] = ()) -> dict[str, Any]:
    """Train until ``config.steps``, a stop command, SIGTERM or Ctrl-C; evaluate, checkpoint and
    close the Monitor (the run marked failed after a signal). Returns the summary (also written to
    ``output_dir/summary.json``)."""
    cfg, dist = trainer.config, trainer.dist
    trainer.hooks.extend(hooks)
    start_step, start_time = trainer.step, time.perf_counter()
    if trainer.step >= cfg.steps and dist.is_main:
        log.warning("the checkpoint is at step %d of steps=%d: nothing left to train (raise "
                    "steps to go on)", trainer.step, cfg.steps)  # fmt: skip
    evals: list[tuple[int, float]] = []
    commands: list[dict[str, Any]] = []
    failed = True
    with stop_on_signals(trainer):
        try:
            if (accuracy := trainer.evaluate()) is not None:  # None: a signal cut it short
                evals.append((trainer.step, accuracy))
                if trainer.step == 0:  # the baseline (a resumed run's is its last attempt's)
                    trainer.monitor.log_scalars(0, {"eval_accuracy": accuracy})
            commands += trainer.apply_commands()  # commands waiting before the first step
            commands += _train_steps(trainer, evals)
            last = evals[-1][0] if evals else None
            final = trainer.stop_signal is None and last != trainer.step
            if final and (accuracy := trainer.evaluate()) is not None:
                evals.append((trainer.step, accuracy))
                trainer.monitor.log_scalars(trainer.step, {"eval_accuracy": accuracy})
            checkpoint = _checkpoint(trainer)
            elapsed = time.perf_counter() - start_time  # not the Monitor's wait at close
            failed = trainer.stop_signal is not None  # interrupted (a relaunch resumes it)
        finally:
            # after a signal the scheduler's grace (often 30 s) is short: what the server has
            # not taken within SIGNAL_CLOSE_S stays in the spool for `vantage sync`
            wait = SIGNAL_CLOSE_S if trainer.stop_signal is not None else None
            trainer.monitor.close(failed=failed, timeout=wait)
            if trainer.owns_process_group and torch_dist.is_initialized():
                torch_dist.destroy_process_group()
    summary = summarize(trainer, start_step, elapsed, evals, commands, checkpoint)
    if dist.is_main:
        try:
            (Path(cfg.output_dir) / "summary.json").write_text(json.dumps(summary, indent=2))
        except OSError as exc:  # the summary is returned (and printed) all the same
            log.error("could not write summary.json in %s (%s)", cfg.output_dir, exc)
    return summary


def _train_steps(trainer: GRPOTrainer, evals: list[tuple[int, float]]) -> list[dict[str, Any]]:
    """GRPO steps until ``config.steps``, a stop command or a signal, each followed by its
    evaluation (every ``eval_every``), hooks, commands and checkpoint; returns the commands
    done. Appends to ``evals``."""
    from tqdm.auto import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    cfg = trainer.config
    shown = cfg.progress and trainer.dist.is_main
    bar = tqdm(
        total=cfg.steps,
        initial=trainer.step,
        desc=cfg.run_name,
        unit="step",
        disable=not shown,
        dynamic_ncols=True,
    )
    # log lines above the bar (tqdm.write): written to the console they went on the bar's line
    with bar, logging_redirect_tqdm() if shown else nullcontext():
        return _steps_with_bar(trainer, bar, evals)


def _steps_with_bar(trainer: GRPOTrainer, bar: Any, evals: list[tuple[int, float]]) -> list:
    """The loop of `_train_steps`, updating ``bar`` (a tqdm) after each step."""
    cfg, commands = trainer.config, []
    while trainer.step < cfg.steps and not trainer.stop_requested:
        record = trainer.train_step()
        if cfg.eval_every and trainer.step % cfg.eval_every == 0:
            record["eval_accuracy"] = accuracy = trainer.evaluate()
            if accuracy is not None:  # None: a signal cut it short
                evals.append((trainer.step, accuracy))
                trainer.monitor.log_scalars(trainer.step, {"eval_accuracy": accuracy})
        for hook in trainer.hooks:
            hook(trainer, record)
        mode = trainer.mitigation.mode  # this step's: a command applied now acts from the next
        commands += trainer.apply_commands()
        if cfg.checkpoint_every and trainer.step % cfg.checkpoint_every == 0:
            _checkpoint(trainer)
        bar.set_postfix(  # drawn by update: the bar showed the step before's numbers
            reward=f"{record['reward']:.3f}",
            acr=_fmt(record["acr"]),
            mode=mode,
            refresh=False,
        )
        bar.update(1)
    return commands


def _checkpoint(trainer: GRPOTrainer) -> Path | None:
    """Save a checkpoint; a folder that cannot be written (an output_dir replaced mid-run) is
    logged and training goes on. None when not saved."""
    try:
        return Path(trainer.save_checkpoint())
    except OSError as exc:
        log.error(
            "could not write the checkpoint of step %d (%s); training goes on, and the last "
            "checkpoint written stays",
            trainer.step,
            exc,
        )
        return None


def train(
    config: str | os.PathLike[str] | dict[str, Any] | TrainConfig,
    overrides: Sequence[str] = (),
    monitor_factory: MonitorFactory | None = None,
    hooks: Sequence[StepHook] = (),
) -> dict[str, Any]:
    """Run a whole training job: ``setup`` then ``fit``. ``config`` is a YAML path, a bundled
    config name (``arith-tiny``), a dict or a TrainConfig; ``overrides`` are ``key=value``.
    ``monitor_factory(**kwargs)`` replaces ``vantage.client.Monitor``; ``hooks`` are called as
    ``hook(trainer, record)`` after each step, before its commands are applied."""
    return fit(setup(config, overrides, monitor_factory), hooks)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def main(argv: Sequence[str] | None = None) -> int:
    """``vantage train CONFIG [--set key=value ...]``: exit 0 when done or stopped by command."""
    parser = argparse.ArgumentParser(prog="vantage train", description=__doc__.splitlines()[0])
    parser.add_argument(
        "config", help="a YAML file, or a bundled config: arith-tiny, smollm2-arith, gsm8k-gpu"
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config field (repeatable)",
    )
    parser.add_argument("--quiet", action="store_true", help="log warnings only")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING if args.quiet else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request drowns the log
    try:
        with interrupt_on_signals():
            trainer = setup(args.config, args.overrides)
        summary = fit(trainer)
    except Interrupted as exc:
        print(
            f"vantage train: {signal.Signals(exc.signum).name} before the first GRPO step (while "
            "loading or in the warm start): stopped without a checkpoint, so a relaunch starts "
            "that part over",
            file=sys.stderr,
        )
        return 128 + exc.signum
    except (ValueError, FileNotFoundError, ImportError) as exc:
        print(f"vantage train: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        # torch's sampler met NaN or inf, or a checkpoint would have saved such weights
        if not isinstance(exc, WeightsDiverged) and "probability tensor contains" not in str(exc):
            raise
        print(
            "vantage train: the policy's weights diverged (NaN or infinite) and the run is "
            "marked failed. No checkpoint holds such weights, but the last one may already be "
            "far off: relaunch with a lower lr or grad_clip (a resume takes the new values), or "
            "with resume: false to start over.",
            file=sys.stderr,
        )
        return 1
    if int(os.environ.get("RANK", "0")) == 0:
        brief = {k: v for k, v in summary.items() if k not in ("history", "commands")}
        print(json.dumps(brief))
    return 128 + signal.Signals[summary["signal"]] if summary["signal"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
