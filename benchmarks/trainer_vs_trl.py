"""The bundled GRPO trainer against TRL's ``GRPOTrainer``, side by side on the CPU.

    python benchmarks/trainer_vs_trl.py --quick     # 2 rounds of 6 measured steps: minutes
    python benchmarks/trainer_vs_trl.py --rounds 4 --steps 20

One tiny Llama is built from one config (``arith-tiny``'s shape, ~3.2M parameters), warm-started
for ``--sft-steps`` SFT steps and saved; both trainers start from those files and train GRPO on
the same prompts in the same order (the sequence the bundled trainer samples, handed to TRL as an
unshuffled dataset), with the same group size, completion length, temperature, learning rate,
clipping (ε 0.2 / 0.28, token-level loss), one policy update per step, no KL, fp32, the same
number of torch threads and the same exact-match reward. TRL runs as its users run it on a CPU,
minus what would handicap it: ``gradient_checkpointing`` and ``bf16`` (both on by default) are off.

Each round runs each trainer once, in a process of its own, alternating which goes first, so
machine noise (other processes on the cores) reaches both. A step's time is the wall time from
one step's start to the next's (generation, reward, loss, backward, optimizer, the trainer's
bookkeeping); the first ``--warmup`` steps of each process are dropped. The process's CPU time
over the same span is kept too: on cores other jobs share, it is the steadier of the two. Printed:
each trainer's median step time; last line JSON ``{"trl_step_s", "vantage_step_s", "ratio"}``,
ratio = TRL's median over ours (above 1: ours is faster), and the same in CPU time
(``trl_cpu_s``, ``vantage_cpu_s``, ``cpu_ratio``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SETTINGS = {  # what both trainers share (besides the model files and the prompts)
    "prompts_per_step": 16,
    "group_size": 8,
    "max_new_tokens": 8,
    "temperature": 1.0,
    "lr": 1e-4,
    "seed": 0,
}


def build_model(folder: Path, sft_steps: int, threads: int) -> None:
    """The tiny Llama of ``arith-tiny`` built from its config, warm-started, saved in ``folder``."""
    import torch

    torch.set_num_threads(threads)  # idle OpenMP threads spin: on busy cores, far slower
    from vantage.trainer.config import load_config
    from vantage.trainer.data import load_task
    from vantage.trainer.models import char_tokenizer, tiny_llama
    from vantage.trainer.sft import sft_warm_start

    cfg = load_config("arith-tiny", [f"output_dir={folder / 'unused'}"])
    tokenizer = char_tokenizer()
    torch.manual_seed(cfg.seed)
    model = tiny_llama(cfg, tokenizer)
    if sft_steps:
        sft_warm_start(model, tokenizer, load_task(cfg), sft_steps, seed=cfg.seed)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def vantage_config(model: Path, out: Path, steps: int, threads: int) -> dict[str, Any]:
    s = SETTINGS
    return {
        "run_name": "bench-vs-trl",
        "output_dir": str(out),
        "seed": s["seed"],
        "device": "cpu",
        "torch_threads": threads,
        "init_checkpoint": str(model),
        "task": "arithmetic",
        "eval_size": 1,
        "steps": steps,
        "prompts_per_step": s["prompts_per_step"],
        "group_size": s["group_size"],
        "max_new_tokens": s["max_new_tokens"],
        "temperature": s["temperature"],
        "lr": s["lr"],
        "eps_low": 0.2,
        "eps_high": 0.28,
        "num_iterations": 1,
        "kl_beta": 0.0,
        "eval_every": 0,
        "progress": False,
        "server": "none",
        "resume": False,
    }


def run_vantage(model: Path, out: Path, steps: int, threads: int) -> list[float]:
    """Step-start to step-start seconds of the bundled trainer's ``fit`` (its hooks run once a
    step, after the step and before its commands: consecutive calls bound one whole loop)."""
    from vantage.trainer.run import fit, setup

    marks: list[tuple[float, float]] = []
    trainer = setup(vantage_config(model, out, steps + 1, threads))
    original = trainer.train_step

    def timed_step() -> dict[str, Any]:
        marks.append((time.perf_counter(), time.process_time()))
        return original()

    trainer.train_step = timed_step  # type: ignore[method-assign]
    fit(trainer)
    return _intervals(marks)


def prompts_in_order(steps: int) -> list[dict[str, str]]:
    """The problems the bundled trainer samples, step after step (its sampler's seed on rank
    0), as TRL's rows: ``prompt`` and the ``answer`` the reward checks."""
    from vantage.trainer.config import load_config
    from vantage.trainer.data import load_task

    cfg = load_config(vantage_config(Path("m"), Path("o"), 1, 1))
    task, rng = load_task(cfg), random.Random(f"grpo-{cfg.seed}-0")
    rows = []
    for _ in range(steps):
        rows += [
            {"prompt": p.question, "answer": p.answer}
            for p in task.sample(cfg.prompts_per_step, rng)
        ]
    return rows


def run_trl(model: Path, out: Path, steps: int, threads: int) -> list[float]:
    """Step-start to step-start seconds of TRL's ``GRPOTrainer.train``."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from vantage.trainer.rewards import math_reward

    torch.set_num_threads(threads)
    s = SETTINGS
    marks: list[tuple[float, float]] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            marks.append((time.perf_counter(), time.process_time()))

    def reward(completions: list[str], answer: list[str], **kwargs: Any) -> list[float]:
        return [
            math_reward(c, a, 0.0, 1.0, False) for c, a in zip(completions, answer, strict=True)
        ]

    n_steps = steps + 1
    args = GRPOConfig(
        output_dir=str(out),
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        report_to=[],
        save_strategy="no",
        logging_steps=1,  # one log per step, as the bundled trainer logs its scalars
        disable_tqdm=True,
        max_steps=n_steps,
        per_device_train_batch_size=s["prompts_per_step"] * s["group_size"],
        gradient_accumulation_steps=1,
        num_generations=s["group_size"],
        max_completion_length=s["max_new_tokens"],
        temperature=s["temperature"],
        top_p=1.0,
        top_k=0,
        learning_rate=s["lr"],
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=1.0,
        adam_beta2=0.99,
        num_iterations=1,
        beta=0.0,
        epsilon=0.2,
        epsilon_high=0.28,
        loss_type="dapo",  # token-level over the batch, as ours
        scale_rewards="group",
        shuffle_dataset=False,
        seed=s["seed"],
        dataloader_num_workers=0,
    )
    policy = AutoModelForCausalLM.from_pretrained(model, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(model, local_files_only=True)
    trainer = GRPOTrainer(
        model=policy,
        reward_funcs=reward,
        args=args,
        train_dataset=Dataset.from_list(prompts_in_order(n_steps)),
        processing_class=tokenizer,
        callbacks=[Clock()],
    )
    trainer.train()
    return _intervals(marks)


def _intervals(marks: list[tuple[float, float]]) -> list[list[float]]:
    """[wall s, CPU s] of each step, from its start to the next one's."""
    return [[b[0] - a[0], b[1] - a[1]] for a, b in zip(marks, marks[1:], strict=False)]


def worker(which: str, model: Path, out: Path, steps: int, threads: int, dump: Path) -> None:
    run = run_trl if which == "trl" else run_vantage
    dump.write_text(json.dumps(run(model, out, steps, threads)))


def spawn(
    which: str, model: Path, tmp: Path, steps: int, threads: int, i: int
) -> list[list[float]]:
    dump = tmp / f"{which}-{i}.json"
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, __file__, "--worker", which, "--model", str(model),
           "--out", str(tmp / f"{which}-{i}"), "--steps", str(steps), "--threads", str(threads),
           "--dump", str(dump)]  # fmt: skip
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    return json.loads(dump.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="2 rounds of 6 measured steps, 100 SFT steps"
    )
    parser.add_argument("--rounds", type=int, default=3, help="processes per trainer")
    parser.add_argument("--steps", type=int, default=15, help="measured steps per process")
    parser.add_argument("--warmup", type=int, default=2, help="steps dropped per process")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each trainer")
    parser.add_argument("--sft-steps", type=int, default=150, help="warm start of the model")
    parser.add_argument("--worker", choices=("trl", "vantage"), help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--dump", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.model, args.out, args.steps, args.threads, args.dump)
        return
    if args.quick:
        args.rounds, args.steps, args.sft_steps = 2, 6, 100

    wall: dict[str, list[float]] = {"trl": [], "vantage": []}
    cpu: dict[str, list[float]] = {"trl": [], "vantage": []}
    with tempfile.TemporaryDirectory(prefix="vantage-vs-trl-") as tmp_name:
        tmp = Path(tmp_name)
        build_model(tmp / "model", args.sft_steps, args.threads)
        for i in range(args.rounds):
            order = ("trl", "vantage") if i % 2 == 0 else ("vantage", "trl")
            for which in order:
                steps = spawn(which, tmp / "model", tmp, args.warmup + args.steps, args.threads, i)
                kept = steps[args.warmup :]
                wall[which] += [w for w, _ in kept]
                cpu[which] += [c for _, c in kept]
                w, c = (statistics.median(x[k] for x in kept) for k in (0, 1))
                print(f"round {i + 1} {which:8s} median {w:.4f} s/step wall, {c:.4f} s CPU, "
                      f"over {len(kept)} steps", flush=True)  # fmt: skip
    trl, ours = statistics.median(wall["trl"]), statistics.median(wall["vantage"])
    trl_cpu, ours_cpu = statistics.median(cpu["trl"]), statistics.median(cpu["vantage"])
    s = SETTINGS
    print(f"{s['prompts_per_step']} prompts x {s['group_size']} completions, "
          f"{s['max_new_tokens']} new tokens, {args.threads} thread(s), "
          f"{len(wall['trl'])} steps each")  # fmt: skip
    print(f"TRL {trl:.4f} s/step  vantage {ours:.4f} s/step  ratio (TRL/ours) {trl / ours:.2f}")
    print(f"CPU time: TRL {trl_cpu:.4f} s/step  vantage {ours_cpu:.4f} s/step  "
          f"ratio {trl_cpu / ours_cpu:.2f}")  # fmt: skip
    print(json.dumps({"trl_step_s": trl, "vantage_step_s": ours, "ratio": trl / ours,
                      "trl_cpu_s": trl_cpu, "vantage_cpu_s": ours_cpu,
                      "cpu_ratio": trl_cpu / ours_cpu}))  # fmt: skip


if __name__ == "__main__":
    main()
