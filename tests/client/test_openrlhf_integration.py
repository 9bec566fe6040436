"""``vantage.client.integrations.openrlhf`` against the real ``openrlhf`` package (0.11.2) and a
real server, on the CPU.

OpenRLHF's trainer modules import ``flash_attn``, ``deepspeed`` and ``vllm`` at module level, which
have no CPU build here. The script below runs in a subprocess of its own that gives those three
missing packages (and ``wandb``, optional) empty stand-in modules, so that OpenRLHF's real
``RemoteExperienceMaker`` and ``BasePPOTrainer`` import; nothing of theirs is called. Not tested
here: a whole ``train_ppo_ray`` run (Ray actors on GPUs, vLLM generation, DeepSpeed training),
the launcher's ``runpy`` of ``train_ppo_ray`` and its setup hook in the Ray workers, and the
steps of ``train_step`` after it notes the step (they need those actors).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

pytest.importorskip("openrlhf")

from tests.helpers.server import RestartableServer  # noqa: E402

SCRIPT = r"""
import copy, importlib.machinery, json, sys, types
from types import SimpleNamespace as NS

class _Stubs:  # only for packages that are missing (CUDA-only builds); never shadows one
    names = {"flash_attn", "deepspeed", "vllm", "wandb"}
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.names:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        def attribute(n):
            if n.startswith("__"):
                raise AttributeError(n)
            return None
        module.__getattr__ = attribute
        return module
    def exec_module(self, module):
        pass

sys.meta_path.append(_Stubs())

import httpx, torch
from openrlhf.trainer.ppo_trainer import BasePPOTrainer
from openrlhf.trainer.ppo_utils.experience import Experience
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController
from vantage.client import Monitor
from vantage.client.integrations import openrlhf as vantage_openrlhf

server, spool, run_id = sys.argv[1:4]
args = NS(rollout=NS(n_samples_per_prompt=4, max_new_tokens=8), data=NS(max_len=16),
          algo=NS(advantage=NS(estimator="group_norm", gamma=1.0, lambd=1.0, no_std_norm=False)),
          reward=NS(clip_range=None), logger=NS(logging_steps=1), ckpt=NS(save_steps=float("inf")))
maker = RemoteExperienceMaker(None, None, None, None, FixedKLController(0.0), NS(args=args), None)
groups = [[1.0] * 4, [0.0, 1.0, 0.0, 1.0], [0.0] * 4, [0.25, 0.5, 0.5, 1.0]]
order = torch.randperm(16, generator=torch.Generator().manual_seed(0)).tolist()  # as scheduled
flat = [r for g in groups for r in g]
def experience(positions):
    mask = torch.ones(len(positions), 5, dtype=torch.bool)
    return Experience(action_mask=mask, kl=torch.zeros(len(positions), 5), index=positions,
                      rewards=torch.tensor([flat[i] for i in positions]))
batch = [experience(order[:8]), experience(order[8:])]
plain = maker.compute_advantages_and_returns(copy.deepcopy(batch))  # before patch()

assert vantage_openrlhf.patch() and vantage_openrlhf.patch()
mon = Monitor(server, None, run_name="openrlhf", run_id=run_id, spool_dir=spool, heartbeat_s=0.2)
state = vantage_openrlhf.configure(mon)
assert mon.flush(20)
arrived = []
mon.on_command(lambda cmd: arrived.append(cmd))
r = httpx.post(f"{server}/api/v1/runs/{run_id}/commands", json={"type": "stop", "params": {}})
assert r.status_code == 201, r.text
import time
deadline = time.monotonic() + 20
while not arrived and time.monotonic() < deadline:
    time.sleep(0.05)

trainer = BasePPOTrainer.__new__(BasePPOTrainer)  # the attributes its two methods read
trainer.args, trainer.wandb_logger, trainer.tensorboard_logger = args, None, None
trainer.experience_maker = None
try:  # the real train_step: fails at once without Ray actors, after the wrapper noted the step
    BasePPOTrainer.train_step(trainer, [], 6)
except AttributeError:
    pass
ours = maker.compute_advantages_and_returns(batch)
logs = {"policy_loss": float("nan"), "actor_grad_norm": 0.5, "kl": 0.01, "entropy_loss": 2.0,
        "rollout/reward_mean": 0.4, "generated_samples": ["text", 1.0]}
trainer.save_logs_and_checkpoints(7, logs, {})
mon.close(timeout=30)
print(json.dumps({
    "same_advantages": all(torch.equal(a.advantages, b.advantages) for a, b in zip(plain, ours)),
    "group_reward_std": [float(s) for e in ours for s in e.info["group_reward_std"]],
    "logged_steps": state.logged_steps, "rejected": state.rejected,
}))
"""


def test_groups_scalars_and_commands_through_openrlhfs_own_methods(
    noauth_server: RestartableServer, tmp_path: Path
):
    script = tmp_path / "openrlhf_run.py"
    script.write_text(SCRIPT)
    run_id = str(uuid.uuid4())
    proc = subprocess.run(
        [sys.executable, str(script), noauth_server.url, str(tmp_path / "spool"), run_id],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["same_advantages"]  # Vantage only watches: OpenRLHF's advantages stay
    assert result["logged_steps"] == [7]  # train_step(…, 6) makes step 7
    point = {p["step"]: p for p in noauth_server.metrics(run_id)}[7]
    # groups in prompt order: [1,1,1,1] and [0,0,0,0] collapsed of four
    assert (point["n_groups"], point["n_valid"], point["n_collapsed"]) == (4, 4, 2)
    zero_std = [s == 0.0 for s in result["group_reward_std"]]
    assert point["acr"] == 0.5 == sum(zero_std) / len(zero_std)  # OpenRLHF's own group std
    scalars = point["scalars"]
    assert scalars["loss"] == scalars["policy_loss"] == "NaN"
    assert (scalars["grad_norm"], scalars["kl"], scalars["entropy"]) == (0.5, 0.01, 2.0)
    assert scalars["rollout/reward_mean"] == 0.4 and "generated_samples" not in scalars
    [(command_id, step)] = result["rejected"]
    assert step == 7
    with noauth_server.api() as api:
        [cmd] = api.get(f"/api/v1/runs/{run_id}/commands").json()["commands"]
    assert (cmd["command_id"], cmd["status"], cmd["acked_step"]) == (command_id, "rejected", 7)
    assert "only watches" in cmd["detail"]


def test_an_openrlhf_that_cannot_be_hooked_is_a_warning_once(caplog: pytest.LogCaptureFixture):
    """Here, without flash_attn, OpenRLHF's trainer does not import: the setup hook says so once
    and returns (a Ray worker it runs in goes on)."""
    if importlib.util.find_spec("flash_attn") is not None:
        pytest.skip("flash_attn is installed: OpenRLHF's trainer imports")
    from vantage.client.integrations import openrlhf as vantage_openrlhf

    with caplog.at_level(logging.WARNING, logger="vantage.client"):
        vantage_openrlhf.setup_worker()
        assert not vantage_openrlhf.patch()
    said = [r.getMessage() for r in caplog.records if "not hooked" in r.getMessage()]
    assert len(said) == 1 and "flash_attn" in said[0]
