"""Run under torchrun by test_trainer_distributed.py: trains a few steps and dumps what each rank
saw. Arguments: OUT_DIR POLICY [SERVER_URL]. Without a server each rank records its Monitor calls
(rank 0's Monitor hands out a set_mitigation command at its third poll: AVSPO, or DAPO when
VANTAGE_TEST_DAPO is set); with one, each rank streams to the real server and rank 0 issues the
command over HTTP after step 2."""

import json
import os
import sys
import time
from pathlib import Path

import torch.distributed as dist
from vantage.trainer.run import fit, setup

# a script that torchrun runs: the repository root goes on the path for tests.helpers
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.helpers.trainer import RecordingMonitor, small_config  # noqa: E402

out, policy = Path(sys.argv[1]), sys.argv[2]
server = sys.argv[3] if len(sys.argv) > 3 else None
monitors = []
mitigation = (
    {"mode": "dapo", "max_gen_batches": 3}
    if os.environ.get("VANTAGE_TEST_DAPO")
    else {"mode": "avspo"}
)


def factory(**kwargs):
    mon = RecordingMonitor(**kwargs)
    mon.script = {3: [{"command_id": "m1", "type": "set_mitigation", "params": mitigation}]}
    monitors.append(mon)
    return mon


def issue_command_over_http(trainer, record):
    import httpx

    if record["step"] != 2 or trainer.dist.rank != 0:
        return
    r = httpx.post(
        f"{server}/api/v1/runs/{trainer.run_id}/commands",
        json={"type": "set_mitigation", "params": {"mode": "avspo"}},
        timeout=30,
    )
    r.raise_for_status()
    deadline = time.monotonic() + 30
    while not received and time.monotonic() < deadline:
        trainer.monitor.log_scalars(2, {"probe": 1.0})
        trainer.monitor.monitor.flush(timeout=5)


def signal_rank1(trainer, record):
    """A scheduler's SIGTERM that reaches rank 1 only, during step 2."""
    import os
    import signal

    if record["step"] == 2 and trainer.dist.rank == 1:
        os.kill(os.getpid(), signal.SIGTERM)


received = []
config = small_config(out / "run", init_checkpoint=policy, steps=4, server=server)
trainer = setup(config, [], None if server else factory)
rank = trainer.dist.rank
hooks = []
if os.environ.get("VANTAGE_TEST_SIGNAL_RANK1"):
    hooks.append(signal_rank1)
if server and rank == 0:
    trainer.monitor.monitor.on_command(received.append)
    hooks.append(issue_command_over_http)
checksum = float(sum(p.double().sum() for p in trainer.policy.parameters()))
summary = fit(trainer, hooks)
checksum_after = float(sum(p.double().sum() for p in trainer.policy.parameters()))
if monitors:
    monitors[0].dump(out / f"monitor{rank}.json")
(out / f"rank{rank}.json").write_text(
    json.dumps(
        {
            "history": summary["history"],
            "polls": monitors[0].polls if monitors else None,
            "checksum": checksum,
            "checksum_after": checksum_after,
            "run_id": summary["run_id"],
            "initialized_after": dist.is_initialized(),
            "steps_completed": summary["steps_completed"],
            "signal": summary["signal"],
            "accuracy_start": summary["accuracy_start"],
        }
    )
)
