"""GRPO vs AVSPO vs AAPO vs DAPO on the CPU arithmetic task, in two collapse regimes.

    python benchmarks/mitigation.py --quick          # 3 seeds x 30 steps per regime
    python benchmarks/mitigation.py                  # 3 seeds x 60 steps per regime
    python benchmarks/mitigation.py --regimes all_fail --methods grpo,dapo --steps 100

Regimes (arith-tiny, 16 prompts x 8 completions, one warm start shared by every run of a regime):
``all_pass`` warms up with 600 SFT steps (``--sft-steps``), so the policy is good and whole
groups turn all-pass; ``all_fail`` with 45 (``--fail-sft-steps``), so it is weak and whole
groups turn all-fail. The methods run interleaved within each seed (machine drift hits all alike).

Per method and regime, over the GRPO steps: mean raw ``acr`` (every group generated), mean
``acr_effective`` (groups of the trained batch whose every advantage is below 1e-3 after the
mitigation), final held-out greedy accuracy (mean and sample std over seeds), mean ``step_s``
(training time of a step, evaluations excluded) and mean ``rollouts_per_step`` (completions
generated: DAPO samples again while its filter leaves the batch short). ``curve`` holds the
held-out accuracy against steps, completions consumed and training seconds, means over seeds.
``accuracy_vs_grpo`` is the mean over seeds of the method's final accuracy minus GRPO's in the
same seed (same warm start, same held-out problems), ``accuracy_vs_grpo_std`` those gaps' spread,
and ``beyond_spread`` whether the mean gap exceeds it.

The last line is JSON: ``{"grpo": {"all_pass": STATS, "all_fail": STATS}, "avspo": ...,
"aapo": ..., "dapo": ..., "regimes": {...}, "settings": {...}, "avspo_step_overhead": x}`` with
STATS = ``{"acr", "acr_effective", "accuracy", "accuracy_std", "step_s", "rollouts_per_step",
"accuracy_by_seed", "acr_by_seed", "curve": [[step, rollouts, train_s, accuracy, std], ...],
"accuracy_vs_grpo", "accuracy_vs_grpo_std", "beyond_spread"}``. ``avspo_step_overhead``: AVSPO's
estimator cost beyond GRPO's, as a share of a GRPO step, from the recorded GRPO rewards replayed
through both.
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
    "aapo": {"mitigation": "aapo"},
    "dapo": {"mitigation": "dapo"},
    "avspo_adaptive": {"mitigation": "avspo", "avspo_threshold": "adaptive"},  # on request
}
DEFAULT_METHODS = ("grpo", "avspo", "aapo", "dapo")
REGIMES = ("all_pass", "all_fail")


class RewardRecorder:
    """Takes the Monitor's place to keep each step's [P, G] rewards for the replay."""

    def __init__(self, **kwargs: Any) -> None:
        self.rewards: list[list[list[float]]] = []

    def log_groups(self, step, rewards, *args, **kwargs):
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
        max_gen_batches=args.max_gen_batches,
        output_dir=str(workdir / "warm"),
    )
    return config


def warm_start(workdir: Path, args: argparse.Namespace, regime: str) -> tuple[str, float]:
    """The regime's warm-started policy (saved under ``workdir``) and its held-out accuracy; one
    that a kept ``--workdir`` holds from a run with the same SFT steps is reused."""
    sft = args.sft_steps if regime == "all_pass" else args.fail_sft_steps
    path = workdir / f"warm-policy-{regime}-{sft}"
    if (path / "warm.json").is_file():
        return str(path), json.loads((path / "warm.json").read_text())["accuracy"]
    cfg = {**base_config(workdir, args), "sft_steps": sft, "steps": 0}
    cfg["output_dir"] = str(workdir / f"warm-{regime}")
    trainer = setup(cfg)
    trainer.policy.save_pretrained(path)
    trainer.tokenizer.save_pretrained(path)
    accuracy = trainer.evaluate()
    (path / "warm.json").write_text(json.dumps({"sft_steps": sft, "accuracy": accuracy}))
    return str(path), accuracy


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
            times[name].append((time.perf_counter() - start) / max(1, len(recorded)))
    return {name: statistics.median(values) for name, values in times.items()}


def curve(summary: dict[str, Any]) -> list[list[float]]:
    """[[step, completions generated up to it, training seconds up to it, accuracy], ...] at each
    held-out evaluation of one run."""
    out = []
    for step, accuracy in summary["evals"]:
        done = [r for r in summary["history"] if r["step"] <= step]
        out.append(
            [
                step,
                sum(r["rollouts_per_step"] for r in done),
                sum(r["step_s"] for r in done),
                accuracy,
            ]
        )
    return out


def _std(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def aggregate(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """One method's STATS in one regime over its seeds (the module docstring's shape)."""
    accuracy = [s["accuracy_final"] for s in summaries]
    curves = [curve(s) for s in summaries]
    points = []
    for at in zip(*curves, strict=True):  # every seed evaluates at the same steps
        points.append(
            [
                at[0][0],
                statistics.fmean(p[1] for p in at),
                statistics.fmean(p[2] for p in at),
                statistics.fmean(p[3] for p in at),
                _std([p[3] for p in at]),
            ]
        )
    return {
        "acr": statistics.fmean(s["acr_mean"] for s in summaries),
        "acr_effective": statistics.fmean(s["acr_effective_mean"] for s in summaries),
        "accuracy": statistics.fmean(accuracy),
        "accuracy_std": _std(accuracy),
        "step_s": statistics.fmean(s["step_s_mean"] for s in summaries),
        "rollouts_per_step": statistics.fmean(
            statistics.fmean(r["rollouts_per_step"] for r in s["history"]) for s in summaries
        ),
        "acr_by_seed": [s["acr_mean"] for s in summaries],
        "accuracy_by_seed": accuracy,
        "curve": points,
    }


def compare_to_grpo(result: dict[str, dict[str, Any]], regime: str) -> None:
    """Adds to each method's STATS of ``regime`` its final accuracy's gap to GRPO's, paired by
    seed (the same warm start and the same held-out problems: the arithmetic task draws them from
    the seed, so unpaired spreads mix in how hard each seed's problems are): ``accuracy_vs_grpo``
    the mean gap, ``accuracy_vs_grpo_std`` the gaps' sample std, and ``beyond_spread`` whether the
    mean gap exceeds that std."""
    base = result["grpo"][regime]["accuracy_by_seed"]
    for stats in (by_regime[regime] for by_regime in result.values()):
        gaps = [a - b for a, b in zip(stats["accuracy_by_seed"], base, strict=True)]
        stats["accuracy_vs_grpo"] = statistics.fmean(gaps)
        stats["accuracy_vs_grpo_std"] = _std(gaps)
        stats["beyond_spread"] = abs(stats["accuracy_vs_grpo"]) > stats["accuracy_vs_grpo_std"]


# what a kept run must share with the one asked for to stand in for it
SAME = ("steps", "eval_every", "seed", "lr", "mitigation", "avspo_threshold", "max_gen_batches")


def kept_run(cfg: dict[str, Any]) -> dict[str, Any] | None:
    """The summary of a finished run that a kept ``--workdir`` holds with the same settings, so
    an interrupted benchmark goes on where it stopped; None when there is none."""
    folder = Path(cfg["output_dir"])
    try:
        summary = json.loads((folder / "summary.json").read_text())
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    same = all(config.get(key) == cfg[key] for key in SAME)
    return summary if same and summary["steps_completed"] == cfg["steps"] else None


def run_regime(
    workdir: Path, args: argparse.Namespace, regime: str, recorded: list[torch.Tensor]
) -> tuple[dict[str, list[dict[str, Any]]], float]:
    """Every method, every seed, from the regime's warm start; GRPO's rewards into ``recorded``."""
    t0 = time.perf_counter()
    warm, warm_accuracy = warm_start(workdir, args, regime)
    print(
        f"[{regime}] warm start: held-out accuracy {warm_accuracy:.3f}, "
        f"{time.perf_counter() - t0:.0f}s",
        file=sys.stderr,
        flush=True,
    )
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in args.methods}
    for seed in range(args.seeds):
        for name in args.methods:  # interleaved: machine drift hits all alike
            recorder = RewardRecorder()
            cfg = {
                **base_config(workdir, args),
                **METHODS[name],
                "seed": seed,
                "init_checkpoint": warm,
                "sft_steps": 0,  # the warm start is done: arith-tiny's 300 would run again
                "steps": args.steps,
                "eval_every": args.eval_every,
                "output_dir": str(workdir / f"{regime}-{name}-{seed}"),
            }
            summary = kept_run(cfg) or train(
                cfg, monitor_factory=lambda recorder=recorder, **kw: recorder
            )
            if name == "grpo":
                recorded += [torch.tensor(r, dtype=torch.float64) for r in recorder.rewards]
            runs[name].append(summary)
            print(
                f"[{regime}] seed {seed} {name:14s} acr {summary['acr_mean']:.3f} effective "
                f"{summary['acr_effective_mean']:.3f} accuracy {summary['accuracy_final']:.3f} "
                f"step {summary['step_s_mean']:.3f}s",
                file=sys.stderr,
                flush=True,
            )
    return runs, warm_accuracy


def print_tables(result: dict[str, Any], args: argparse.Namespace) -> None:
    """The human-readable tables (stderr): per regime, the STATS, then the accuracy curves."""
    for regime in args.regimes:
        print(f"\n{regime} (warm start {result['regimes'][regime]['warm_accuracy']:.3f})",
              file=sys.stderr)  # fmt: skip
        print(f"{'method':15s} {'acr':>6s} {'acr_eff':>8s} {'accuracy':>13s} {'vs GRPO':>13s} "
              f"{'beyond':>7s} {'step_s':>7s} {'rollouts':>9s}", file=sys.stderr)  # fmt: skip
        for name in args.methods:
            r = result[name][regime]
            print(
                f"{name:15s} {r['acr']:6.3f} {r['acr_effective']:8.3f} "
                f"{r['accuracy']:6.3f}±{r['accuracy_std']:.3f} {r['accuracy_vs_grpo']:+.3f}"
                f"±{r['accuracy_vs_grpo_std']:.3f} "
                f"{'yes' if r['beyond_spread'] else 'no':>7s} {r['step_s']:7.3f} "
                f"{r['rollouts_per_step']:9.0f}",
                file=sys.stderr,
            )
        print("accuracy at [step, completions, train s]:", file=sys.stderr)
        for name in args.methods:
            cells = [f"{p[3]:.3f}@[{p[0]:.0f},{p[1]:.0f},{p[2]:.0f}s]"
                     for p in result[name][regime]["curve"]]  # fmt: skip
            print(f"  {name:13s} " + " ".join(cells), file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 seeds x 30 steps per regime")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--sft-steps", type=int, default=600, help="warm start of all_pass")
    parser.add_argument("--fail-sft-steps", type=int, default=45, help="warm start of all_fail")
    parser.add_argument("--regimes", default=",".join(REGIMES))
    parser.add_argument("--methods", default=",".join(DEFAULT_METHODS))
    parser.add_argument("--max-gen-batches", type=int, default=3, help="DAPO's budget per step")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7, help="replay repeats for the overhead")
    parser.add_argument(
        "--workdir",
        default=None,
        help="keep runs here, and reuse those it holds (default: a temp folder)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.steps = 3, 30
    args.regimes = [r for r in args.regimes.split(",") if r]
    args.methods = [m for m in args.methods.split(",") if m]
    unknown = set(args.regimes) - set(REGIMES) or set(args.methods) - set(METHODS)
    if unknown or "grpo" not in args.methods:
        parser.error(f"regimes from {REGIMES}, methods from {tuple(METHODS)} with grpo among them")

    result: dict[str, Any] = {name: {} for name in args.methods}
    result["regimes"] = {}
    recorded: list[torch.Tensor] = []
    with tempfile.TemporaryDirectory(prefix="vantage-bench-") as tmp:
        workdir = Path(args.workdir or tmp)
        for regime in args.regimes:
            runs, warm_accuracy = run_regime(workdir, args, regime, recorded)
            for name, summaries in runs.items():
                result[name][regime] = aggregate(summaries)
            compare_to_grpo({name: result[name] for name in args.methods}, regime)
            sft = args.sft_steps if regime == "all_pass" else args.fail_sft_steps
            result["regimes"][regime] = {"sft_steps": sft, "warm_accuracy": warm_accuracy}

    replay = replay_overhead(recorded, args.repeats)  # GRPO runs reused from a kept workdir: none
    grpo_step = statistics.fmean(result["grpo"][r]["step_s"] for r in args.regimes)
    overhead = (replay["avspo"] - replay["grpo"]) / grpo_step if recorded else None
    result["avspo_step_overhead"] = overhead
    result["estimator_s"] = replay
    result["settings"] = {
        "seeds": args.seeds,
        "steps": args.steps,
        "eval_every": args.eval_every,
        "lr": args.lr,
        "max_gen_batches": args.max_gen_batches,
        "prompts_per_step": 16,
        "group_size": 8,
        "eval_size": 128,
    }
    print_tables(result, args)
    if overhead is not None:
        print(f"\nAVSPO estimator overhead: {overhead:.5f} of a GRPO step", file=sys.stderr)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
