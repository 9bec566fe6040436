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
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as torch_dist

from .checkpoint import WeightsDiverged, latest_checkpoint, load_checkpoint
from .config import TrainConfig, load_config
from .data import load_task
from .grpo import GRPOTrainer, StepHook
from .models import load_policy
from .monitoring import Distributed, make_monitor
from .rollout import VLLMBackend
from .sft import sft_warm_start
from .signals import Interrupted, interrupt_on_signals

__all__ = ["train", "setup", "fit", "main"]

log = logging.getLogger("vantage.trainer")

MonitorFactory = Callable[..., Any]
SIGNAL_CLOSE_S = 5.0  # how long a run stopped by a signal waits for the server at close


def _init_distributed() -> bool:
    """Start the process group when launched by torchrun (WORLD_SIZE > 1); True when we did."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or torch_dist.is_initialized():
        return False
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    torch_dist.init_process_group(backend=backend)
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    return True


def _device(config: TrainConfig) -> torch.device:
    if config.device == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            "device cuda: this torch sees no CUDA device (a CPU build, or no GPU); "
            "set device: cpu or auto"
        )
    if config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available()):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# What a checkpoint must share with the config that resumes it: the model's shape and source,
# the task, and what the server fixed for the run. (Older checkpoints carry no config.)
RESUME_FIELDS = (
    "model_source", "model_path", "gguf_file", "tiny_hidden_size", "tiny_layers", "tiny_heads",
    "tiny_intermediate_size", "tiny_max_positions", "task", "data_path", "reasoning_gym_task",
    "group_size", "reward_min", "reward_max",
)  # fmt: skip


def _check_resumable(cfg: TrainConfig, saved: dict[str, Any] | None, output_dir: Path) -> None:
    """Raise ValueError when the checkpoint in ``output_dir`` was made by a config that differs
    from ``cfg`` in `RESUME_FIELDS` (resuming would load another model or task into this run)."""
    if not saved:
        return
    diffs = [
        f"{name} {saved[name]!r}, here {getattr(cfg, name)!r}"
        for name in RESUME_FIELDS
        if name in saved and saved[name] != getattr(cfg, name)
    ]
    # the server fixes a run's project (409 for another): the relaunch trained into a spool
    # that no `vantage sync` could upload (a trial). Left out, the run keeps its own.
    if cfg.project is not None and "project" in saved and saved["project"] != cfg.project:
        was, now = saved["project"], cfg.project
        diffs.append(f"project {was!r}, here {now!r}: a run's project is fixed, leave it out")
    if diffs:
        raise ValueError(
            f"{output_dir} holds the checkpoint of another config ({'; '.join(diffs)}); give "
            "this run an output_dir of its own, or set resume: false to start over there"
        )


# Settings the trainer carries in its checkpoint, which commands may have changed mid-run: a
# resume keeps the carried value, unless this launch's config changed the field since the
# checkpoint's launch (`--set lr=...` after a divergence was ignored: a trial).
CARRIED_FIELDS = {
    "mitigation": "mode", "avspo_threshold": "threshold", "avspo_alpha": "alpha",
    "avspo_eta": "eta", "aapo_delta_low": "delta_low", "aapo_delta_high": "delta_high",
}  # fmt: skip


def _apply_changed_settings(trainer: GRPOTrainer, saved: dict[str, Any] | None) -> list[str]:
    """After a resume, apply the fields of ``trainer.config`` that differ from the config the
    checkpoint was saved with (``saved``): lr, temperature and the mitigation's settings.
    Returns what changed, as "lr 0.0001 → 1e-05"."""
    if not saved:
        return []
    cfg, changed = trainer.config, []
    carried = {  # what the run carried, commands included (the saved config's values were shown)
        "lr": trainer.scheduler.base_lrs[0],
        "temperature": trainer.temperature,
        **{name: getattr(trainer.mitigation, field) for name, field in CARRIED_FIELDS.items()},
    }
    for name in ("lr", "temperature", *CARRIED_FIELDS):
        if name in saved and saved[name] != getattr(cfg, name):
            changed.append(f"{name} {carried[name]!r} → {getattr(cfg, name)!r}")
            if name == "lr":
                _set_peak_lr(trainer.scheduler, cfg.lr)
            elif name == "temperature":
                trainer.temperature = cfg.temperature
            else:
                setattr(trainer.mitigation, CARRIED_FIELDS[name], getattr(cfg, name))
    return changed


# Fields whose change on a resume says nothing worth a line (where the run goes, how it logs).
_QUIET_FIELDS = {"output_dir", "resume", "progress", "server", "api_key"}


def _other_changes(cfg: TrainConfig, saved: dict[str, Any] | None) -> list[str]:
    """The fields, other than `RESUME_FIELDS` and those `_apply_changed_settings` reports, in
    which ``cfg`` differs from the checkpoint's config ``saved``: this launch's value is used
    (a harder task on resume was taken without a word: a trial). As "arith_max_operand 20 → 50"."""
    skip = {*RESUME_FIELDS, "lr", "temperature", *CARRIED_FIELDS, *_QUIET_FIELDS}
    current = cfg.to_dict()
    return [
        f"{name} {saved[name]!r} → {current[name]!r}"
        for name in sorted(set(saved or {}) & set(current) - skip)
        if saved[name] != current[name]
    ]


def _set_peak_lr(scheduler: torch.optim.lr_scheduler.LambdaLR, lr: float) -> None:
    """Make ``lr`` the schedule's peak from its current step on (the optimizer's lr is then
    ``lr`` times the schedule's factor at that step)."""
    scheduler.base_lrs = [lr for _ in scheduler.base_lrs]
    groups = scheduler.optimizer.param_groups
    for group, factor in zip(groups, scheduler.lr_lambdas, strict=True):
        group["initial_lr"], group["lr"] = lr, lr * factor(scheduler.last_epoch)


def _broadcast_parameters(model: torch.nn.Module, dist: Distributed) -> None:
    if dist.enabled:
        for p in model.state_dict().values():
            torch_dist.broadcast(p, src=0)


def setup(
    config: str | os.PathLike[str] | dict[str, Any] | TrainConfig,
    overrides: Sequence[str] = (),
    monitor_factory: MonitorFactory | None = None,
) -> GRPOTrainer:
    """A trainer ready for :func:`fit`: resumed from ``output_dir`` when a checkpoint is there,
    else freshly loaded, warm-started (``sft_steps``) and with the step-0 reference recorded."""
    cfg = load_config(config, list(overrides))
    if not cfg.progress:  # transformers' own bars (loading and writing weights) too
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    owns_group = _init_distributed()
    dist = Distributed()
    if cfg.torch_threads > 0:
        torch.set_num_threads(cfg.torch_threads)
    device = _device(cfg)
    output_dir = Path(cfg.output_dir)
    checkpoint = latest_checkpoint(output_dir) if cfg.resume else None
    if not cfg.resume and latest_checkpoint(output_dir) is not None and dist.is_main:
        log.warning("resume: false: training starts over, and replaces the checkpoint in %s",
                    output_dir)  # fmt: skip
    elif checkpoint is None and cfg.resume and dist.is_main:
        # output_dir is relative to the folder launched from: a relaunch from another folder
        # started a new run without a word (a trial)
        log.info("no checkpoint in %s: a new run starts there", output_dir.resolve())
    state: dict[str, Any] = {}
    if checkpoint is not None:
        state = torch.load(checkpoint / "state.pt", weights_only=False)
        _check_resumable(cfg, state.get("config"), output_dir)
        # left out, the run keeps its project, as the server does: a resume without it wrote
        # None into the checkpoint, and the next resume naming it was refused (a trial)
        if cfg.project is None and (state.get("config") or {}).get("project") is not None:
            cfg.project = state["config"]["project"]
    if dist.is_main:
        try:  # before any model loads: an unusable folder is said at once, in one line
            output_dir.mkdir(parents=True, exist_ok=True)
            config_json = json.dumps(cfg.to_dict(), indent=2, default=str)
            (output_dir / "config.json").write_text(config_json)
        except OSError as exc:
            raise ValueError(
                f"output_dir {output_dir} cannot be written: {exc.strerror or exc}"
            ) from None

    sft_stats: dict[str, Any] = {}
    if checkpoint is not None:
        log.info("resuming from %s", checkpoint)
        load_cfg = TrainConfig(**{**cfg.__dict__, "init_checkpoint": str(checkpoint / "policy")})
        policy, tokenizer = load_policy(load_cfg)
    else:
        policy, tokenizer = load_policy(cfg)
    policy.to(device)
    task = load_task(cfg)
    random.seed(cfg.seed + dist.rank)
    torch.manual_seed(cfg.seed + dist.rank)

    if checkpoint is None and cfg.sft_steps > 0:
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
        _broadcast_parameters(policy, dist)

    # one run_id for every rank: the checkpoint's, the config's, or a new one from rank 0
    run_id = dist.broadcast(state.get("run_id") or cfg.run_id or str(uuid.uuid4()))
    monitor = make_monitor(
        monitor_factory,
        cfg.server,
        {
            "server": cfg.server,
            "api_key": cfg.api_key,
            "run_name": cfg.run_name,
            "run_id": run_id,
            "launch_id": None,
            "project": cfg.project,
            "config": cfg.to_dict(),
            "reward_min": cfg.reward_min,
            "reward_max": cfg.reward_max,
            "trainer_eps": 1e-4,
            "rank": dist.rank,
            "world_size": dist.world_size,
            "group_size": cfg.group_size,
        },
    )

    backend = None
    if cfg.backend == "vllm":
        init_dir = output_dir / "vllm-init"
        if dist.is_main:
            policy.save_pretrained(init_dir)
            tokenizer.save_pretrained(init_dir)
        dist.barrier()
        backend = VLLMBackend(
            tokenizer,
            init_dir,
            cfg.chat_template,
            cfg.vllm_gpu_memory_utilization,
            cfg.seed,
            cfg.dtype,
        )

    trainer = GRPOTrainer(cfg, policy, tokenizer, task, monitor, dist, backend)
    trainer.run_id = run_id
    trainer.sft_stats = sft_stats
    trainer.owns_process_group = owns_group
    if checkpoint is not None:
        load_checkpoint(trainer, checkpoint)
        trainer.run_id = run_id
        changed = _apply_changed_settings(trainer, state.get("config"))
        if changed and dist.is_main:
            log.warning(
                "resuming with settings changed since the checkpoint: %s", "; ".join(changed)
            )
        others = _other_changes(cfg, state.get("config"))
        if others and dist.is_main:
            log.info("this launch's config differs from the checkpoint's: %s", "; ".join(others))
    else:
        from_files = cfg.model_source != "tiny" or bool(cfg.init_checkpoint)
        trainer.record_reference(loaded_from_files=from_files and not sft_stats)
    return trainer


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
    with _stop_on_signals(trainer):
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
            # not taken within SIGNAL_CLOSE_S stays in the spool (a preempted job waited 30 s
            # for a server that was down, and torchrun killed its workers: a trial)
            wait = SIGNAL_CLOSE_S if trainer.stop_signal is not None else None
            trainer.monitor.close(failed=failed, timeout=wait)
            if trainer.owns_process_group and torch_dist.is_initialized():
                torch_dist.destroy_process_group()
    summary = _summary(trainer, start_step, elapsed, evals, commands, checkpoint)
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
    """Save a checkpoint; a folder that cannot be written is logged and training goes on (an
    output_dir replaced mid-run ended the run with a traceback: a trial). None when not saved."""
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


@contextmanager
def _stop_on_signals(trainer: GRPOTrainer) -> Iterator[None]:
    """While it is open, SIGTERM (a scheduler's preemption, ``kill``) and SIGINT (Ctrl-C) stop
    training at the next step boundary as a ``stop`` command does (rank 0 queues one, which
    every rank applies at the same step): a checkpoint, the Monitor closed with the run marked
    failed, exit status 128 + the signal (143, 130). A second one quits now, the Monitor still
    closed (within SIGNAL_CLOSE_S) with the run marked failed: SIGTERM raises SystemExit(143),
    Ctrl-C KeyboardInterrupt (a second SIGTERM killed the process, and the run read "running"
    until it went stale). Outside the main thread signals cannot be caught, and keep their
    default action."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    second = {signal.SIGTERM: _quit_now, signal.SIGINT: signal.default_int_handler}

    def on_signal(signum: int, _frame: Any) -> None:
        for sig, action in second.items():
            signal.signal(sig, action)
        if trainer.stop_signal is None:
            trainer.stop_signal = signum
            name = signal.Signals(signum).name
            # at the next step boundary: after the step under way, or before the first one
            # (the evaluation before it is cut short; it said "after step 1": a trial)
            log.warning("%s: stopping at the next step boundary with a checkpoint (again to "
                        "quit now)", name)  # fmt: skip
            if trainer.dist.is_main:
                trainer.submit_command("stop", source=name)

    previous = {sig: signal.signal(sig, on_signal) for sig in second}
    try:
        yield
    finally:
        for sig, action in previous.items():
            signal.signal(sig, action)


def _quit_now(signum: int, _frame: Any) -> None:
    """A second SIGTERM's handler: unwind (closing the Monitor) and exit with 128 + signum."""
    raise SystemExit(128 + signum)


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


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _summary(
    trainer: GRPOTrainer,
    start_step: int,
    seconds: float,
    evals: list[tuple[int, float]],
    commands: list[dict[str, Any]],
    checkpoint: Path | None,
) -> dict[str, Any]:
    new = [r for r in trainer.history if r["step"] > start_step]
    acrs = [r["acr"] for r in new if r["acr"] is not None]
    effective = [r["acr_effective"] for r in new if r["acr_effective"] is not None]
    first_collapse = next((r["step"] for r in new if (r["acr"] or 0) > 0.5), None)
    return {
        "run_id": trainer.run_id,
        "output_dir": str(trainer.config.output_dir),
        "checkpoint": None if checkpoint is None else str(checkpoint),
        "start_step": start_step,
        "steps_completed": trainer.step,
        "stopped": trainer.stop_requested,
        "terminated": trainer.stop_signal is not None,
        "signal": None if trainer.stop_signal is None else signal.Signals(trainer.stop_signal).name,
        "seconds": seconds,
        "sft": trainer.sft_stats,
        "accuracy_start": evals[0][1] if evals else None,
        # measured at the last step, or none (a signal's stop skips the final evaluation, and
        # the evaluation before the first step was reported as the final one: a trial)
        "accuracy_final": evals[-1][1] if evals and evals[-1][0] == trainer.step else None,
        "evals": evals,
        "acr_mean": _mean(acrs),
        "acr_max": max(acrs) if acrs else None,
        "acr_last10_mean": _mean(acrs[-10:]),
        "acr_effective_mean": _mean(effective),
        "first_step_acr_above_0_5": first_collapse,
        "reward_last10_mean": _mean([r["reward"] for r in new[-10:]]),
        "step_s_mean": _mean([r["step_s"] for r in new]),
        "mitigation": trainer.mitigation.mode,
        "commands": commands,
        "history": new,
    }


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
