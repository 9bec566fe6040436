"""Remote AVSPO in a real ``trl.GRPOTrainer`` (tiny model from a config, CPU): a ``set_mitigation``
command from a real server changes the next step's collapsed groups' advantages and TRL's loss,
leaves mixed groups' alone, is acked with that step, and ``mode: none`` returns to TRL's own."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

pytest.importorskip("trl")

import torch  # noqa: E402
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402
from vantage.client import Monitor  # noqa: E402
from vantage.client.avspo import avspo_num_virtual  # noqa: E402
from vantage.client.commands import Command  # noqa: E402
from vantage.client.integrations.trl import attach  # noqa: E402
from vantage.client.integrations.trl_avspo import RemoteAvspo  # noqa: E402

from tests.client.test_trl_integration import tiny_model_and_tokenizer  # noqa: E402
from tests.helpers.polling import wait_until  # noqa: E402
from tests.helpers.server import RestartableServer  # noqa: E402

G = 4


def test_avspo_from_the_server_reaches_trls_advantages_and_loss(
    noauth_server: RestartableServer, tmp_path: Path
):
    mon = Monitor(noauth_server.url, None, run_name="trl-avspo", spool_dir=tmp_path / "spool",
                  heartbeat_s=0.2)  # fmt: skip
    arrived: list[str] = []
    mon.on_command(lambda cmd: arrived.append(cmd.command_id))
    api = noauth_server.api()

    def post(body: dict) -> str:
        r = api.post(f"/api/v1/runs/{mon.run_id}/commands", json=body)
        assert r.status_code == 201, r.text
        return r.json()["command_id"]

    ids: dict[str, str] = {}

    def reward(completions, prompts=None, trainer_state=None, **kw):
        """Steps 1-2: every group collapsed (1.0). Steps 3-4: prompts starting 0-4 collapsed,
        the others a 0/1 coin. During step 3 it sends `mode: none` (effective at step 4)."""
        step = trainer_state.global_step + 1
        if step == 3 and "none" not in ids:
            ids["none"] = post({"type": "set_mitigation", "params": {"mode": "none"}})
            assert wait_until(lambda: len(arrived) == 2, timeout=20)
        if step <= 2:
            return [1.0] * len(completions)
        return [1.0 if p[0] in "01234" else float(len(c) % 2)
                for p, c in zip(prompts, completions, strict=True)]  # fmt: skip

    model, tok = tiny_model_and_tokenizer()
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=32, num_generations=G,
        max_completion_length=6, logging_steps=1, max_steps=4, use_cpu=True, report_to=[],
        learning_rate=1e-3, save_strategy="no", disable_tqdm=True, seed=0,
    )  # fmt: skip
    prompts = [f"{a}+{b}=" for a in range(10) for b in range(10)]
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=args,
                          train_dataset=Dataset.from_dict({"prompt": prompts}),
                          processing_class=tok)  # fmt: skip
    # TRL's own advantages of each step (cloned before AVSPO rewrites them) and the output dict
    trl_generate = trainer._generate_and_score_completions
    seen: list[tuple[torch.Tensor, dict, list[float]]] = []

    def recording(inputs):
        out = trl_generate(inputs)
        seen.append((out["advantages"].clone(), out, list(callback.rewards.last_values)))
        return out

    trainer._generate_and_score_completions = recording
    callback = attach(trainer, mon)
    assert mon.flush(20)
    ids["avspo"] = post({"type": "set_mitigation", "params": {"mode": "avspo"}})
    assert wait_until(lambda: len(arrived) == 1, timeout=20)
    trainer.train()
    mon.close(timeout=30)

    assert len(seen) == 4
    logs = {h["step"]: h for h in trainer.state.log_history if "loss" in h}
    # step 1: plain TRL, every group collapsed: zero advantages, zero loss
    trl_1, out_1, _ = seen[0]
    assert torch.equal(out_1["advantages"], trl_1) and not trl_1.any()
    assert logs[1]["loss"] == 0.0
    # step 2: AVSPO from the command: K = ⌈4·1^0.5⌉ = 4 virtual rewards 0.8, 0.6, 0.4, 0.2 beside
    # four 1.0: μ′ = 0.75, σ′ = √(0.7/7) = 0.316228…, A = 0.25/(0.316228 + 1e-4) = 0.790320…
    assert avspo_num_virtual(G, 1.0) == 4
    _, out_2, _ = seen[1]
    assert torch.allclose(out_2["advantages"], torch.full((32,), 0.790320), atol=1e-5)
    # TRL's loss reads the new advantages: on policy (ratio 1) it is −mean(A) = −0.790320
    assert logs[2]["loss"] == pytest.approx(-0.790320, abs=1e-4)
    # step 3: collapsed groups changed, mixed groups exactly TRL's
    trl_3, out_3, rewards_3 = seen[2]
    groups = [rewards_3[i : i + G] for i in range(0, 32, G)]
    collapsed = [len(set(g)) == 1 for g in groups]
    assert any(collapsed) and not all(collapsed)
    for p, is_collapsed in enumerate(collapsed):
        ours, theirs = out_3["advantages"][p * G : (p + 1) * G], trl_3[p * G : (p + 1) * G]
        if is_collapsed:
            assert not theirs.any() and ours.abs().min() > 1e-3
        else:
            assert torch.equal(ours, theirs)
    # step 4: `mode: none` again: TRL's own advantages
    trl_4, out_4, _ = seen[3]
    assert torch.equal(out_4["advantages"], trl_4)
    # acked with the step each took effect at, and Vantage's ACR is still TRL's zero-std share
    assert [(s, step) for _, s, step in callback.applied] == [("applied", 2), ("applied", 4)]
    log = {c["command_id"]: c for c in
           api.get(f"/api/v1/runs/{mon.run_id}/commands").json()["commands"]}  # fmt: skip
    api.close()
    assert (log[ids["avspo"]]["status"], log[ids["avspo"]]["acked_step"]) == ("applied", 2)
    assert (log[ids["none"]]["status"], log[ids["none"]]["acked_step"]) == ("applied", 4)
    points = {p["step"]: p for p in noauth_server.metrics(mon.run_id)}
    for step in range(1, 5):
        trl_zero_std = trainer.state.log_history[step - 1]["frac_reward_zero_std"]
        assert points[step]["acr"] == pytest.approx(trl_zero_std, abs=1e-9)
    assert points[2]["acr"] == 1.0 and points[2]["acr_effective"] == 0.0
    assert points[3]["acr_effective"] == 0.0 < points[3]["acr"]
    assert points[4]["acr_effective"] == points[4]["acr"]


def test_other_trl_versions_and_setups_are_refused_with_a_reason(monkeypatch: pytest.MonkeyPatch):
    class Rewards:
        log_index = None

    class Trainer:
        scale_rewards = "group"

        def _generate_and_score_completions(self, inputs):  # noqa: ANN001, ANN202
            return inputs

    avspo = RemoteAvspo(Trainer(), Rewards(), None)  # type: ignore[arg-type]
    cmd = Command("c1", "set_mitigation", {"mode": "avspo"})
    monkeypatch.setattr(trl, "__version__", "1.17.0")
    status, detail = avspo.request(cmd)
    assert status == "rejected" and "tested with TRL 1.16 only, not 1.17.0" in detail
    monkeypatch.setattr(trl, "__version__", "1.16.2")
    Trainer.scale_rewards = "batch"
    assert "not 'batch'" in avspo.request(cmd)[1]
    Trainer.scale_rewards = "group"
    Rewards.log_index = 0
    assert "without log_func" in avspo.request(cmd)[1]
    Rewards.log_index = None
    bad = Command("c2", "set_mitigation", {"mode": "avspo", "alpha": 0})
    assert avspo.request(bad) == ("rejected", "set_mitigation alpha must be above 0")
    assert avspo.request(cmd) is None and avspo.pending  # waits for the next generation
    assert math.isclose(avspo.reward_max, 1.0)
