"""Run under torchrun by test_distributed.py: trains a few steps and dumps what each rank saw."""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
from trainer_helpers import RecordingMonitor, small_config  # noqa: E402
from vantage.trainer.run import fit, setup  # noqa: E402

out, policy = Path(sys.argv[1]), sys.argv[2]
monitors = []


def factory(**kwargs):
    mon = RecordingMonitor(**kwargs)
    # only rank 0 is polled; it hands AVSPO to every rank at the boundary after step 2
    mon.script = {3: [{"command_id": "m1", "type": "set_mitigation", "params": {"mode": "avspo"}}]}
    monitors.append(mon)
    return mon


trainer = setup(small_config(out / "run", init_checkpoint=policy, steps=4), [], factory)
rank = trainer.dist.rank
checksum = float(sum(p.double().sum() for p in trainer.policy.parameters()))
summary = fit(trainer)
checksum_after = float(sum(p.double().sum() for p in trainer.policy.parameters()))
monitors[0].dump(out / f"monitor{rank}.json")
(out / f"rank{rank}.json").write_text(
    json.dumps(
        {
            "history": summary["history"],
            "polls": monitors[0].polls,
            "checksum": checksum,
            "checksum_after": checksum_after,
            "run_id": summary["run_id"],
            "initialized_after": dist.is_initialized(),
            "threads": torch.get_num_threads(),
        }
    )
)
