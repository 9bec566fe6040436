"""GRPO vs AVSPO (fixed, adaptive) vs AAPO on the CPU arithmetic task, from one shared warm start.

    python benchmarks/mitigation.py --quick          # 2 seeds x 40 steps, well under 20 minutes
    python benchmarks/mitigation.py --seeds 3 --steps 150

Per method, over the GRPO steps: mean raw ``acr``, mean ``acr_effective`` (groups whose every
advantage is below 1e-3 after mitigation), final held-out greedy accuracy (mean and std over
seeds) and mean step time. Separately, the estimators' own cost: the rewards recorded during the
GRPO runs are replayed through ``grpo`` and ``avspo``, interleaved, median of several repeats, as
a share of GRPO's step time. The last line is JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from vantage.trainer.advantages import avspo, grpo
from vantage.trainer.config import load_config
from vantage.trainer.run import setup, train

METHODS: dict[str, dict[str, Any]] = {
    "grpo": {"mitigation": "none"},
    "avspo": {"mitigation": "avspo", "avspo_threshold": "fixed"},
    "avspo_adaptive": {"mitigation": "avspo", "avspo_threshold": "adaptive"},
    "aapo": {"mitigation": "aapo"},
}


class RewardRecorder:
    """Takes the Monitor's place to keep each step's [P, G] rewards for the replay."""

    def __init__(self, **kwargs: Any) -> None:
        self.rewards: list[list[list[float]]] = []

    def log_groups(self, step, rewards, **kwargs):
        self.rewards.append(rewards)

    def log_effective(self, *args, **kwargs):
        pass

    def log_scalars(self, *args, **kwargs):
        pass

    def poll_commands(self):
        return []

    def ack(self, *args, **kwargs):
        pass

    def close(self, *args, **kwargs):
        pass


def base_config(workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The bundled arith-tiny config (16 prompts x 8 completions), unmonitored and quiet."""
    config = dataclasses.asdict(load_config("arith-tiny"))
    config.update(
        run_name="bench",
        torch_threads=args.threads,
        lr=args.lr,
        eval_every=0,
        progress=False,
        resume=False,
        server=None,
        output_dir=str(workdir / "warm"),
    )
    return config


def warm_start(workdir: Path, args: argparse.Namespace) -> tuple[str, float]:
    cfg = {**base_config(workdir, args), "sft_steps": args.sft_steps, "steps": 0}
    trainer = setup(cfg)
    path = workdir / "warm-policy"
    trainer.policy.save_pretrained(path)
    trainer.tokenizer.save_pretrained(path)
    return str(path), trainer.evaluate()


def replay_overhead(recorded: list[torch.Tensor], repeats: int) -> dict[str, float]:
    """Median seconds per step of grpo and avspo over the same recorded rewards, interleaved."""
    times: dict[str, list[float]] = {"grpo": [], "avspo": []}
    acrs = [float((r.amax(1) == r.amin(1)).double().mean()) for r in recorded]
    for _ in range(repeats):
        for name in ("grpo", "avspo"):
            start = time.perf_counter()
            for rewards, acr in zip(recorded, acrs, strict=True):
                if name == "grpo":
                    grpo(rewards)
                else:
                    avspo(rewards, acr=acr)
            times[name].append((time.perf_counter() - start) / len(recorded))
    return {name: statistics.median(values) for name, values in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 seeds x 40 steps")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--sft-steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7, help="replay repeats for the overhead")
    parser.add_argument("--workdir", default=None, help="keep runs here (default: a temp folder)")
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.steps = 2, 40

    with tempfile.TemporaryDirectory(prefix="vantage-bench-") as tmp:
        workdir = Path(args.workdir or tmp)
        t0 = time.perf_counter()
        warm, warm_accuracy = warm_start(workdir, args)
        print(
            f"warm start: {args.sft_steps} SFT steps, held-out accuracy {warm_accuracy:.3f}, "
            f"{time.perf_counter() - t0:.0f}s",
            file=sys.stderr,
        )

        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in METHODS}
        recorded: list[torch.Tensor] = []
        for seed in range(args.seeds):
            for name, settings in METHODS.items():  # interleaved: machine drift hits all alike
                recorder = RewardRecorder()
                cfg = {
                    **base_config(workdir, args),
                    **settings,
                    "seed": seed,
                    "init_checkpoint": warm,
                    "steps": args.steps,
                    "output_dir": str(workdir / f"{name}-{seed}"),
                }
                summary = train(cfg, monitor_factory=lambda recorder=recorder, **kw: recorder)
                if name == "grpo":
                    recorded += [torch.tensor(r, dtype=torch.float64) for r in recorder.rewards]
                runs[name].append(summary)
                print(
                    f"seed {seed} {name:15s} acr {summary['acr_mean']:.3f} effective "
                    f"{summary['acr_effective_mean']:.3f} accuracy "
                    f"{summary['accuracy_final']:.3f} step {summary['step_s_mean']:.3f}s",
                    file=sys.stderr,
                )

    result: dict[str, Any] = {}
    for name, summaries in runs.items():
        accuracy = [s["accuracy_final"] for s in summaries]
        result[name] = {
            "acr": statistics.fmean(s["acr_mean"] for s in summaries),
            "acr_effective": statistics.fmean(s["acr_effective_mean"] for s in summaries),
            "accuracy": statistics.fmean(accuracy),
            "accuracy_std": statistics.stdev(accuracy) if len(accuracy) > 1 else 0.0,
            "step_s": statistics.fmean(s["step_s_mean"] for s in summaries),
            "acr_by_seed": [s["acr_mean"] for s in summaries],
            "accuracy_by_seed": accuracy,
        }
    replay = replay_overhead(recorded, args.repeats)
    grpo_step = result["grpo"]["step_s"]
    result["avspo_step_overhead"] = (replay["avspo"] - replay["grpo"]) / grpo_step
    result["estimator_s"] = replay
    result["warm_start_accuracy"] = warm_accuracy
    result["settings"] = {
        "seeds": args.seeds,
        "steps": args.steps,
        "sft_steps": args.sft_steps,
        "lr": args.lr,
        "prompts_per_step": 16,
        "group_size": 8,
    }

    print(
        f"{'method':16s} {'acr':>6s} {'acr_eff':>8s} {'accuracy':>14s} {'step_s':>7s}",
        file=sys.stderr,
    )
    for name in METHODS:
        r = result[name]
        print(
            f"{name:16s} {r['acr']:6.3f} {r['acr_effective']:8.3f} "
            f"{r['accuracy']:7.3f}±{r['accuracy_std']:.3f} {r['step_s']:7.3f}",
            file=sys.stderr,
        )
    print(
        f"AVSPO estimator overhead: {result['avspo_step_overhead']:.5f} of a GRPO step; AAPO "
        f"step time {result['aapo']['step_s'] / grpo_step:.2f}x GRPO's",
        file=sys.stderr,
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
