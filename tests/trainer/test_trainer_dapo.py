"""DAPO dynamic sampling (docs/design.md §7): the command and config that turn it on, the batches a
step generates and the groups it trains on (hand-computed), a training run, and the mitigation
issued by a real server's alert rule."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch
from vantage.client.acr import summarize_rewards
from vantage.client.schema import validate_command_params
from vantage.trainer.advantages import AvspoState
from vantage.trainer.commands import set_mitigation
from vantage.trainer.config import TrainConfig
from vantage.trainer.mitigation import Mitigation
from vantage.trainer.rollout import Rollouts, take_groups
from vantage.trainer.run import fit, setup, train

from tests.helpers.trainer import RecordingMonitor, recording_monitors, small_config


def t(rows):
    return torch.tensor(rows, dtype=torch.float64)


# ------------------------------------------------------------------ command and config


@pytest.mark.parametrize("bad", [0, 101, 2.5, True, "3"])
def test_the_server_takes_dapo_and_a_whole_number_of_batches(bad):
    validate_command_params("set_mitigation", {"mode": "dapo"})
    validate_command_params("set_mitigation", {"mode": "dapo", "max_gen_batches": 100})
    with pytest.raises(ValueError, match="max_gen_batches must be a whole number from 1 to 100"):
        validate_command_params("set_mitigation", {"mode": "dapo", "max_gen_batches": bad})


def test_set_mitigation_dapo_keeps_its_budget_for_when_dapo_is_on():
    target = SimpleNamespace(mitigation=Mitigation(), avspo_state=AvspoState())
    said = set_mitigation(target, {"mode": "dapo", "max_gen_batches": 5})
    assert said == "mitigation dapo max_gen_batches=5"
    assert target.mitigation.reported() == {"mode": "dapo", "max_gen_batches": 5}
    assert set_mitigation(target, {"mode": "none"}) == "mitigation none"
    assert set_mitigation(target, {"mode": "dapo"}) == "mitigation dapo max_gen_batches=5"
    for bad in (0, 2.5, True):  # a local command is not checked by the server: refused here
        with pytest.raises(ValueError, match="whole number from 1 to 100"):
            set_mitigation(target, {"mode": "dapo", "max_gen_batches": bad})
    assert target.mitigation.max_gen_batches == 5  # a rejected command changes nothing


def test_the_config_turns_dapo_on():
    cfg = TrainConfig(mitigation="dapo", max_gen_batches=4)
    assert Mitigation.from_config(cfg).described() == "dapo max_gen_batches=4"
    assert TrainConfig().max_gen_batches == 3
    with pytest.raises(ValueError, match="max_gen_batches must be from 1 to 100"):
        TrainConfig(mitigation="dapo", max_gen_batches=0)


# ------------------------------------------------------------------ the trained batch


def test_take_groups_pads_the_batches_of_a_step_into_one():
    # batch 1: two prompts of width 2, completions of width 1; batch 2: one left-padded prompt
    first = Rollouts(
        t([[5, 6], [5, 6], [7, 8], [7, 8]]).long(),
        torch.ones(4, 2, dtype=torch.long),
        t([[1], [2], [3], [4]]).long(),
        torch.ones(4, 1, dtype=torch.long),
        ["a", "b", "c", "d"],
    )
    second = Rollouts(
        t([[0, 9, 9], [0, 9, 9]]).long(),
        t([[0, 1, 1], [0, 1, 1]]).long(),
        t([[1, 2], [3, 4]]).long(),
        t([[1, 1], [1, 0]]).long(),
        ["e", "f"],
    )
    out = take_groups([(first, [1]), (second, [0])], group_size=2)
    assert out.prompt_ids.tolist() == [[0, 7, 8], [0, 7, 8], [0, 9, 9], [0, 9, 9]]
    assert out.prompt_mask.tolist() == [[0, 1, 1]] * 4
    assert out.completion_ids.tolist() == [[3, 0], [4, 0], [1, 2], [3, 4]]
    assert out.completion_mask.tolist() == [[1, 0], [1, 0], [1, 1], [1, 0]]
    assert out.texts == ["c", "d", "e", "f"]
    assert take_groups([(first, [0, 1])], group_size=2) is first  # nothing to redo
    assert take_groups([(first, []), (second, [])], group_size=2).completion_ids.shape == (0, 2)


def scripted_trainer(tmp_path, batches, **overrides):
    """A trainer on the tiny model whose rewards are ``batches`` ([P, G] each, in the order the
    step scores them); records the texts of each scored batch, the rewards the estimator got
    and the completions trained on."""
    monitors, factory = recording_monitors()
    cfg = small_config(tmp_path, **{"mitigation": "dapo", **overrides})
    trainer = setup(cfg, [], factory)
    seen = SimpleNamespace(scored=[], estimated=[], trained=[])
    script = iter(batches)

    def score(texts, problems):
        seen.scored.append(list(texts))
        return t(next(script))

    estimate, optimize = trainer.advantages, trainer.optimize

    def advantages(rewards, acr, problems):
        seen.estimated.append(rewards.tolist())
        return estimate(rewards, acr, problems)

    def train_on(rollouts, values):
        seen.trained.append(list(rollouts.texts))
        return optimize(rollouts, values)

    trainer.score, trainer.advantages, trainer.optimize = score, advantages, train_on
    return trainer, monitors[0], seen


ALL_FAIL, ALL_PASS = [0, 0, 0, 0], [1, 1, 1, 1]


def test_a_step_samples_until_the_batch_is_full_and_trains_on_the_first_kept_groups(tmp_path):
    trainer, monitor, seen = scripted_trainer(
        tmp_path,
        [
            [ALL_PASS, ALL_FAIL, [1, 0, 0, 0], ALL_FAIL],  # keeps group 2: 1 kept
            [[0, 1, 0, 1], ALL_PASS, [1, 1, 0, 1], ALL_FAIL],  # keeps 0 and 2: 3 kept
            [[1, 0, 1, 1], [0, 0, 1, 0], ALL_PASS, ALL_FAIL],  # keeps 0 and 1: 5, one too many
        ],
    )
    record = trainer.train_step()
    # 3 batches of 4 prompts × 4 completions; 3 + 2 + 2 groups dropped; the first 4 kept trained
    assert record["gen_batches"] == 3 and record["rollouts_per_step"] == 48
    assert record["filtered_groups"] == 7 and record["trained_groups"] == 4
    assert record["short_batch"] == 0
    assert seen.estimated == [[[1, 0, 0, 0], [0, 1, 0, 1], [1, 1, 0, 1], [1, 0, 1, 1]]]
    b1, b2, b3 = seen.scored
    assert seen.trained == [b1[8:12] + b2[0:4] + b2[8:12] + b3[0:4]]
    # raw ACR over every group generated (7 of 12 collapsed); none in the trained batch
    assert record["acr"] == pytest.approx(7 / 12) and record["acr_effective"] == 0.0
    ((step, rewards, prompt_ids),) = monitor.groups
    assert step == 1 and len(rewards) == 12 and len(prompt_ids) == 12
    assert monitor.effective == [(1, {"n_valid": 4, "n_zero_advantage": 0, "n_virtual": 0})]
    assert monitor.mitigations == [(1, {"mode": "dapo", "max_gen_batches": 3})]
    assert {"gen_batches", "rollouts_per_step", "filtered_groups", "short_batch"} <= set(
        monitor.scalars[0][1]
    )
    assert "loss" in record


def test_a_spent_budget_trains_on_what_there_is_and_says_so(tmp_path):
    trainer, monitor, seen = scripted_trainer(
        tmp_path,
        [
            [ALL_PASS, [0, 1, 1, 1], ALL_FAIL, ALL_FAIL],  # step 1: 1 kept
            [ALL_FAIL, ALL_FAIL, ALL_PASS, [0, 0, 1, 1]],  # 2 kept, the budget spent
            [ALL_PASS, ALL_FAIL, ALL_FAIL, ALL_PASS],  # step 2: nothing kept
            [ALL_FAIL] * 4,
        ],
        max_gen_batches=2,
    )
    short = trainer.train_step()
    assert (short["gen_batches"], short["trained_groups"], short["short_batch"]) == (2, 2, 1)
    assert short["filtered_groups"] == 6 and short["acr_effective"] == 0.0
    assert seen.estimated[-1] == [[0, 1, 1, 1], [0, 0, 1, 1]]

    weights = [p.detach().clone() for p in trainer.policy.parameters()]
    empty = trainer.train_step()
    # nothing to train on: no optimizer step (no loss), the weights unchanged, and it says so
    assert (empty["gen_batches"], empty["trained_groups"], empty["short_batch"]) == (2, 0, 1)
    assert empty["filtered_groups"] == 8 and empty["acr"] == 1.0
    assert empty["acr_effective"] is None and "loss" not in empty
    assert all(torch.equal(a, b) for a, b in zip(weights, trainer.policy.parameters(), strict=True))
    assert monitor.effective[-1] == (2, {"n_valid": 0, "n_zero_advantage": 0, "n_virtual": 0})
    assert trainer.step == 2 and len(seen.trained) == 1


def test_without_a_filter_a_step_generates_once_and_trains_on_every_group(tmp_path):
    trainer, monitor, seen = scripted_trainer(
        tmp_path, [[ALL_PASS, [1, 0, 0, 0], ALL_FAIL, [0, 1, 1, 1]]], mitigation="none"
    )
    record = trainer.train_step()
    assert (record["gen_batches"], record["rollouts_per_step"]) == (1, 16)
    assert (record["filtered_groups"], record["trained_groups"], record["short_batch"]) == (0, 4, 0)
    assert record["acr"] == 0.5 and record["acr_effective"] == 0.5
    assert len(seen.estimated[0]) == 4


# ------------------------------------------------------------------ training runs


def test_set_mitigation_dapo_mid_run(warm_policy, tmp_path):
    dapo = {"mode": "dapo", "max_gen_batches": 2}
    log: list[RecordingMonitor] = []

    def factory(**kwargs):
        log.append(RecordingMonitor(**kwargs))
        log[-1].script = {2: [{"command_id": "d1", "type": "set_mitigation", "params": dapo}]}
        return log[-1]

    cfg = small_config(tmp_path / "run", init_checkpoint=warm_policy, steps=4)
    summary = train(cfg, [], monitor_factory=factory)
    (mon,) = log
    assert mon.acks == [("d1", "applied", 1, "mitigation dapo max_gen_batches=2")]
    history = {r["step"]: r for r in summary["history"]}
    assert [history[s]["mitigation"] for s in (1, 2, 3, 4)] == ["none"] + ["dapo"] * 3
    reported = dict(mon.mitigations)
    assert reported[1] == {"mode": "none"} and reported[4] == dapo
    effective = dict(mon.effective)
    for step, rewards, prompt_ids in mon.groups:
        record = history[step]
        collapsed = sum(summarize_rewards(r).cls == "collapsed" for r in rewards)
        # every group generated is logged and in the raw ACR
        assert len(rewards) == len(prompt_ids) == 4 * record["gen_batches"]
        assert record["rollouts_per_step"] == 4 * len(rewards)
        assert record["acr"] == collapsed / len(rewards)
        if step == 1:
            assert record["gen_batches"] == 1 and record["filtered_groups"] == 0
            continue
        assert 1 <= record["gen_batches"] <= 2 and record["filtered_groups"] == collapsed
        assert effective[step]["n_valid"] == record["trained_groups"] <= 4
        assert effective[step]["n_zero_advantage"] == 0
        assert record["short_batch"] == (record["trained_groups"] < 4)
        assert record["acr_effective"] == (0.0 if record["trained_groups"] else None)


def test_an_alert_rule_turns_dapo_on_in_a_remote_run(warm_policy, tmp_path, server_url):
    """Alert rule → command → applied: a rule with DAPO as its mitigation fires on step 1 and the
    server (mitigation_mode auto) sends the command, which the trainer applies at the boundary."""
    httpx = pytest.importorskip("httpx")
    api = httpx.Client(base_url=server_url, timeout=30)
    dapo = {"mode": "dapo", "max_gen_batches": 2}
    rule = {"name": "collapse-dapo", "metric": "acr", "op": ">=", "threshold": 0,
            "mitigation": {"type": "set_mitigation", "params": dapo}}  # fmt: skip
    assert api.post("/api/v1/alert-rules", json=rule).status_code == 201
    cfg = small_config(tmp_path / "run", init_checkpoint=warm_policy, steps=4, server=server_url)
    trainer = setup(cfg)
    received = []
    trainer.monitor.monitor.on_command(received.append)

    def wait_for_the_command(t, record):
        # commands ride on ingest answers: send until the one for step 1 came back with it
        deadline = time.monotonic() + 30
        while record["step"] == 1 and not received and time.monotonic() < deadline:
            t.monitor.log_scalars(1, {"probe": 1.0})
            t.monitor.monitor.flush(timeout=5)

    summary = fit(trainer, hooks=[wait_for_the_command])
    history = {r["step"]: r for r in summary["history"]}
    assert [history[s]["mitigation"] for s in (1, 2, 3, 4)] == ["none"] + ["dapo"] * 3

    run_id = trainer.run_id
    commands = api.get(f"/api/v1/runs/{run_id}/commands").json()["commands"]
    first = commands[-1]  # newest first
    assert first["issued_by"] == "alert:collapse-dapo" and first["params"] == dapo
    assert first["status"] == "applied" and first["acked_step"] == 1
    points = api.get(f"/api/v1/runs/{run_id}/metrics").json()["points"]
    points = {p["step"]: p for p in points if p["step"] >= 1}
    for step in (2, 3, 4):
        p, record = points[step], history[step]
        # the server counts every group generated; the trained batch has no zero advantage
        assert p["n_valid"] == 4 * record["gen_batches"]
        assert p["acr"] == pytest.approx(record["acr"])
        assert p["acr_effective"] == (0.0 if record["trained_groups"] else None)
        assert p["scalars"]["gen_batches"] == record["gen_batches"]
        assert p["scalars"]["filtered_groups"] == record["filtered_groups"]
    run = api.get(f"/api/v1/runs/{run_id}").json()
    assert run["mitigation_reported"] == dapo and run["status"] == "finished"
