"""The trainer against a real `vantage serve` process: groups, effective statistics and scalars
arrive per step, and a command issued over HTTP is applied at a step boundary and acked."""

from __future__ import annotations

import time

import pytest
from vantage.client.acr import summarize_rewards
from vantage.trainer.run import fit, setup

from tests.helpers.trainer import small_config

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi", reason="the server extra is not installed")


def test_trainer_streams_to_a_real_server_and_obeys_its_commands(warm_policy, tmp_path, server_url):
    cfg = small_config(
        tmp_path / "run",
        init_checkpoint=warm_policy,
        steps=5,
        server=server_url,
        run_name="trainer-e2e",
        log_samples=2,
    )
    trainer = setup(cfg)
    run_id = trainer.run_id
    api = httpx.Client(base_url=server_url, timeout=30)
    issued = {}
    received = []
    trainer.monitor.monitor.on_command(received.append)

    def hook(t, record):
        if record["step"] == 2:
            # the Monitor registers the run from its sender thread: on a busy machine it was
            # not there yet at step 2 (a 404 below)
            deadline = time.monotonic() + 30
            while api.get(f"/api/v1/runs/{run_id}").status_code == 404:
                assert time.monotonic() < deadline, "the Monitor never registered the run"
                time.sleep(0.1)
            r = api.post(
                f"/api/v1/runs/{run_id}/commands",
                json={"type": "set_mitigation", "params": {"mode": "avspo"}, "reason": "test"},
            )
            assert r.status_code == 201, r.text
            issued["id"] = r.json()["command_id"]
            # commands ride on ingest answers (the sender is asynchronous): send something and
            # wait for the answer, so the command is in hand at this boundary
            deadline = time.monotonic() + 30
            while not received and time.monotonic() < deadline:
                t.monitor.log_scalars(2, {"probe": 1.0})
                t.monitor.monitor.flush(timeout=5)

    summary = fit(trainer, hooks=[hook])
    history = {r["step"]: r for r in summary["history"]}
    assert [history[s]["mitigation"] for s in range(1, 6)] == ["none"] * 2 + ["avspo"] * 3

    commands = api.get(f"/api/v1/runs/{run_id}/commands").json()["commands"]
    (command,) = [c for c in commands if c["command_id"] == issued["id"]]
    assert command["status"] == "applied" and command["acked_step"] == 2

    points = api.get(f"/api/v1/runs/{run_id}/metrics").json()["points"]
    # step 0: the held-out accuracy before training, the baseline of the eval chart (it was
    # kept in the trainer's summary only), and no groups
    baseline = points.pop(0)
    assert baseline["step"] == 0 and baseline["acr"] is None and baseline["n_valid"] == 0
    assert baseline["scalars"] == {"eval_accuracy": pytest.approx(summary["accuracy_start"])}
    assert [p["step"] for p in points] == [1, 2, 3, 4, 5]
    for p in points:
        assert p["acr"] == pytest.approx(history[p["step"]]["acr"])
        assert p["n_valid"] == 4
        assert "loss" in p["scalars"] and "avspo_tau" in p["scalars"]
        if p["step"] >= 3:
            assert p["acr_effective"] == 0.0
        else:
            assert p["acr_effective"] == pytest.approx(p["acr"])
    run = api.get(f"/api/v1/runs/{run_id}").json()
    assert run["status"] == "finished"
    # the trainer reports the mitigation in effect with each step, whatever was acked
    assert run["mitigation_reported"] == {"mode": "avspo", "threshold": "fixed", "alpha": 0.5,
                                          "eta": 0.01}  # fmt: skip
    assert summarize_rewards([1.0, 1.0]).cls == "collapsed"  # the engine the trainer shares
    # log_samples: 2 prompts a step with their completions and rewards, collapsed groups first
    samples = api.get(f"/api/v1/runs/{run_id}/samples", params={"limit": 200}).json()["samples"]
    assert sorted(s["step"] for s in samples) == [1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    for s in samples:
        assert len(s["completions"]) == len(s["rewards"]) == 4 and s["prompt_id"]
        assert "=" in s["prompt"]  # the arithmetic question
