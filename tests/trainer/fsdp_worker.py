"""Run under torchrun (2 CPU processes, gloo) by test_trainer_fsdp.py. Arguments: OUT_DIR.

Three runs of the same small config with a KL to a warm-started reference (so the reference is
a saved snapshot, and sharded too): data parallel for 2 steps; FSDP for 4 steps straight, its
full weights taken after step 2; FSDP for 2 steps, then resumed from its checkpoint to 4. Each
rank dumps what it saw as rankR.json."""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from vantage.trainer.run import fit, setup
from vantage.trainer.sharding import full_state_dict, is_sharded

# a script that torchrun runs: the repository root goes on the path for tests.helpers
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.helpers.trainer import small_config  # noqa: E402

out = Path(sys.argv[1])
dist.init_process_group("gloo")  # ours, so that fit leaves it up for the next run
rank = dist.get_rank()


def weights(trainer):
    """Rank 0's full weights, summed per tensor (the same on every rank for a plain policy)."""
    state = full_state_dict(trainer.policy) if is_sharded(trainer.policy) else None
    if state is None:
        state = trainer.policy.state_dict()
    return {k: float(v.double().sum()) for k, v in state.items()} if rank == 0 else {}


def config(name, steps, **extra):
    return small_config(
        out / name, steps=steps, sft_steps=4, kl_beta=0.05, eval_size=5, prompts_per_step=3,
        server="none", **extra,
    )  # fmt: skip


def trace(history):
    return [[r["step"], r["reward"], r["acr"], r["loss"], r["kl"], r["grad_norm"]] for r in history]


dump = {}
plain = setup(config("dp", 2))
dump["dp"] = {"history": trace(fit(plain)["history"]), "weights": weights(plain)}

straight = setup(config("fsdp", 4, fsdp=True))
dump["sharded"] = is_sharded(straight.policy)
dump["local_numel"] = sum(p.to_local().numel() for p in straight.policy.parameters())
dump["full_numel"] = sum(p.numel() for p in straight.policy.parameters())
at_step_2 = {}


def keep_step_2(trainer, record):
    if record["step"] == 2:
        at_step_2.update(weights(trainer))


summary = fit(straight, [keep_step_2])
dump["straight"] = {
    "history": trace(summary["history"]),
    "weights": weights(straight),
    "at_step_2": at_step_2,
    "accuracy": [summary["accuracy_start"], summary["accuracy_final"]],
    "reference_sharded": is_sharded(straight.reference),
}

first = fit(setup(config("split", 2, fsdp=True)))
resumed = setup(config("split", 4, fsdp=True))
second = fit(resumed)
state = torch.load(out / "split" / "checkpoint" / "state.pt", weights_only=False)
dump["split"] = {
    "history": trace(first["history"] + second["history"]),
    "start_step": second["start_step"],
    "weights": weights(resumed),
    "optimizer_keys": sorted(state["optimizer"]["state"])[:2],
}
(out / f"rank{rank}.json").write_text(json.dumps(dump))
dist.destroy_process_group()
