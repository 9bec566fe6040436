"""verl's own ``compute_advantage`` and ``DataProto`` with the ``"vantage"`` estimator
(``vantage.client.integrations.verl``) against a real server: verl's GRPO bit for bit without
mitigation, the stored ACR of every step, and ``set_mitigation avspo`` from the server."""

from __future__ import annotations

import copy
import logging
import sys
import types
import uuid
from pathlib import Path

import pytest

pytest.importorskip("verl")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from vantage.client import Monitor  # noqa: E402
from vantage.client.integrations import verl as vantage_verl  # noqa: E402
from vantage.trainer.advantages import avspo  # noqa: E402
from verl.protocol import DataProto  # noqa: E402
from verl.trainer.config import AlgoConfig  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.trainer.ppo.ray_trainer import compute_advantage  # noqa: E402

from tests.helpers.polling import wait_until  # noqa: E402
from tests.helpers.server import RestartableServer, free_port  # noqa: E402

LENGTH = 7


def batch(group_rewards: list[list[float]], seed: int, binary_tokens: bool = True) -> DataProto:
    """One row per completion, the rows of a group sharing a uid, shuffled as verl may hold them;
    each row's reward on its last response token, random response lengths and masks."""
    gen = torch.Generator().manual_seed(seed)
    uids = [f"prompt-{seed}-{p}" for p in range(len(group_rewards))]
    rows = [(uids[p], r) for p, g in enumerate(group_rewards) for r in g]
    order = torch.randperm(len(rows), generator=gen).tolist()
    rows = [rows[i] for i in order]
    bs = len(rows)
    lengths = torch.randint(1, LENGTH + 1, (bs,), generator=gen)
    mask = (torch.arange(LENGTH).unsqueeze(0) < lengths.unsqueeze(1)).to(torch.float32)
    rewards = torch.zeros(bs, LENGTH)
    for i, (_, r) in enumerate(rows):
        if binary_tokens:
            rewards[i, lengths[i] - 1] = r
        else:  # spread over the tokens: the score is a float32 sum, as verl forms it
            part = torch.rand(int(lengths[i]), generator=gen)
            rewards[i, : lengths[i]] = part / part.sum() * r
    return DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": mask},
        non_tensors={"uid": np.array([u for u, _ in rows], dtype=object)},
    )


def random_groups(seed: int) -> list[list[float]]:
    gen = torch.Generator().manual_seed(seed)
    groups = []
    for _ in range(int(torch.randint(3, 12, (1,), generator=gen))):
        size = int(torch.randint(1, 9, (1,), generator=gen))  # uneven, singletons too
        kind = int(torch.randint(0, 4, (1,), generator=gen))
        if kind == 0:  # collapsed
            groups.append([float(torch.randint(0, 2, (1,), generator=gen))] * size)
        elif kind == 1:
            groups.append(torch.randint(0, 2, (size,), generator=gen).float().tolist())
        else:
            groups.append(torch.rand(size, generator=gen).tolist())
    return groups


def run_both(data: DataProto, norm: bool) -> tuple[torch.Tensor, torch.Tensor]:
    grpo = compute_advantage(copy.deepcopy(data), "grpo", norm_adv_by_std_in_grpo=norm)
    cfg = AlgoConfig(norm_adv_by_std_in_grpo=norm)
    ours = compute_advantage(copy.deepcopy(data), "vantage", config=cfg)
    return grpo.batch["advantages"], ours.batch["advantages"]


@pytest.fixture
def monitor(noauth_server: RestartableServer, tmp_path: Path):
    mon = Monitor(noauth_server.url, None, run_name=f"verl-{uuid.uuid4().hex[:6]}",
                  spool_dir=tmp_path / "spool", trainer_eps=1e-6, heartbeat_s=0.2)  # fmt: skip
    yield mon
    mon.close(timeout=30)
    vantage_verl.configure(None)


def test_importing_registers_the_estimator():
    assert core_algos.get_adv_estimator_fn("vantage") is vantage_verl.vantage_advantage
    assert vantage_verl.register()  # again: a no-op


@pytest.mark.parametrize("norm", [True, False])
def test_without_mitigation_it_is_verls_grpo_bit_for_bit(
    monitor: Monitor, noauth_server: RestartableServer, norm: bool
):
    vantage_verl.configure(monitor)
    expected_acr = {}
    for step, seed in enumerate(range(40, 52), start=1):
        data = batch(random_groups(seed), seed, binary_tokens=seed % 2 == 0)
        grpo, ours = run_both(data, norm)
        assert torch.equal(grpo, ours), seed
        assert ours.dtype == grpo.dtype
        # the ACR by hand: a row's reward is its summed token rewards (spread rewards may not sum
        # to the same float32, and such a group is not collapsed)
        scores = data.batch["token_level_rewards"].sum(-1).tolist()
        groups: dict[str, list[float]] = {}
        for uid, score in zip(data.non_tensor_batch["uid"], scores, strict=True):
            groups.setdefault(uid, []).append(score)
        valid = [g for g in groups.values() if len(g) >= 2]
        collapsed = [g for g in valid if len(set(g)) == 1]
        expected_acr[step] = (len(groups), len(valid), len(collapsed))
    assert any(n_collapsed for _, _, n_collapsed in expected_acr.values())
    assert monitor.flush(30)
    points = {p["step"]: p for p in noauth_server.metrics(monitor.run_id)}
    assert sorted(points) == list(range(1, 13))
    for step, (n_groups, n_valid, n_collapsed) in expected_acr.items():
        p = points[step]
        assert (p["n_groups"], p["n_valid"], p["n_collapsed"]) == (n_groups, n_valid, n_collapsed)
        assert p["n_degenerate"] == n_groups - n_valid
        assert p["acr"] == (n_collapsed / n_valid if n_valid else None)


def test_avspo_from_the_server_changes_collapsed_groups_only(
    monitor: Monitor, noauth_server: RestartableServer
):
    est = vantage_verl.configure(monitor)
    arrived: list[str] = []
    monitor.on_command(lambda cmd: arrived.append(cmd.command_id))
    groups = [[1.0] * 4, [0.0] * 4, [1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 0.0], [1.0] * 4,
              [0.25, 0.5, 0.75, 1.0]]  # fmt: skip
    data = batch(groups, seed=7)
    uids = data.non_tensor_batch["uid"]
    grpo, ours = run_both(data, True)  # step 1: plain
    assert torch.equal(grpo, ours)
    assert monitor.flush(20)
    with noauth_server.api() as api:
        r = api.post(f"/api/v1/runs/{monitor.run_id}/commands",
                     json={"type": "set_mitigation", "params": {"mode": "avspo"}})  # fmt: skip
        assert r.status_code == 201, r.text
        avspo_id = r.json()["command_id"]
        assert wait_until(lambda: len(arrived) == 1, timeout=20)
        grpo, ours = run_both(data, True)  # step 2: AVSPO from this call
        order = list(dict.fromkeys(uids))
        rewards = torch.tensor([groups[int(u.rsplit("-", 1)[1])] for u in order])
        collapsed_uids = {
            u for u, g in zip(order, rewards.tolist(), strict=True) if len(set(g)) == 1
        }
        scores = data.batch["token_level_rewards"].sum(-1)
        trainer = avspo(torch.stack([scores[torch.tensor(uids == u)] for u in order]),
                        acr=3 / 6, eps=1e-6).values  # fmt: skip
        mask = data.batch["response_mask"]
        for i, u in enumerate(uids):
            if u in collapsed_uids:
                assert not torch.equal(ours[i], grpo[i])
                within = list(np.nonzero(uids == u)[0]).index(i)
                assert torch.equal(ours[i], trainer[order.index(u), within] * mask[i])
                assert ours[i].abs().max() > 1e-3
            else:
                assert torch.equal(ours[i], grpo[i])
        for body in ({"type": "set_mitigation", "params": {"mode": "aapo"}},
                     {"type": "stop", "params": {}},
                     {"type": "set_mitigation", "params": {"mode": "none"}}):  # fmt: skip
            r = api.post(f"/api/v1/runs/{monitor.run_id}/commands", json=body)
            assert r.status_code == 201, r.text
        applied_by_step_2 = [(c, status, step) for c, status, step in est.applied]
        assert wait_until(lambda: len(arrived) == 4, timeout=20)
        grpo, ours = run_both(data, True)  # step 3: back to plain GRPO
        assert torch.equal(grpo, ours)
        assert monitor.flush(20)
        log = {c["command_id"]: c for c in
               api.get(f"/api/v1/runs/{monitor.run_id}/commands").json()["commands"]}  # fmt: skip
    assert applied_by_step_2 == [(avspo_id, "applied", 2)]
    assert (log[avspo_id]["status"], log[avspo_id]["acked_step"]) == ("applied", 2)
    others = [c for cid, c in log.items() if cid != avspo_id]
    by_type = {(c["type"], c["params"].get("mode")): c for c in others}
    assert by_type[("set_mitigation", "none")]["status"] == "applied"
    assert "aapo" in by_type[("set_mitigation", "aapo")]["detail"]
    assert by_type[("set_mitigation", "aapo")]["status"] == "rejected"
    assert by_type[("stop", None)]["status"] == "rejected"
    assert "advantage estimator" in by_type[("stop", None)]["detail"]
    assert {c["acked_step"] for c in others} == {3}
    points = {p["step"]: p for p in noauth_server.metrics(monitor.run_id)}
    assert [points[s]["acr"] for s in (1, 2, 3)] == [0.5, 0.5, 0.5]
    assert [points[s]["acr_effective"] for s in (1, 2, 3)] == [0.5, 0.0, 0.5]


def test_client_avspo_equals_the_trainers_for_verls_eps():
    gen = torch.Generator().manual_seed(3)
    for _ in range(50):
        p, g = (
            int(torch.randint(1, 6, (1,), generator=gen)),
            int(torch.randint(2, 9, (1,), generator=gen)),
        )
        rewards = torch.rand(p, g, generator=gen)
        values = torch.tensor([0.0, 1.0, 0.3, 0.7, 1.5, -0.5])
        for row in range(p):
            if torch.rand(1, generator=gen) < 0.6:
                rewards[row] = values[torch.randint(0, 6, (1,), generator=gen)]
        acr = float(torch.rand(1, generator=gen))
        alpha = float(torch.rand(1, generator=gen)) * 2 + 0.1
        trainer = avspo(rewards, acr=acr, alpha=alpha, eps=1e-6).values
        for row in range(p):
            if len(set(rewards[row].tolist())) == 1:
                k = vantage_verl.avspo_num_virtual(g, acr, alpha)
                ours = vantage_verl.avspo_group_advantages(rewards[row], k, eps=1e-6)
                assert torch.equal(ours.to(rewards.dtype), trainer[row])


class Breaking:
    """A Monitor whose every call fails."""

    def __init__(self) -> None:
        self.calls = 0

    def __getattr__(self, name: str):
        def fail(*a, **kw):
            self.calls += 1
            raise RuntimeError(f"{name} is down")

        return fail


def test_monitoring_failures_never_stop_training(caplog: pytest.LogCaptureFixture):
    broken = Breaking()
    vantage_verl.configure(broken)  # type: ignore[arg-type]
    try:
        with caplog.at_level(logging.ERROR, logger="vantage.client"):
            for seed in range(3):
                grpo, ours = run_both(batch(random_groups(seed), seed), True)
                assert torch.equal(grpo, ours)
        assert broken.calls >= 6
        failures = [r for r in caplog.records if "training goes on" in r.getMessage()]
        assert len(failures) == 2  # commands and logging, each once
    finally:
        vantage_verl.configure(None)


def test_start_step_from_the_environment(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("VANTAGE_START_STEP", "41")
    est = vantage_verl.configure(None)
    assert est.next_step == 41
    assert vantage_verl.configure(None, start_step=5).next_step == 5
    vantage_verl.configure(None)


def test_a_verl_without_register_adv_est_is_a_warning_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    old = types.ModuleType("verl.trainer.ppo.core_algos")
    monkeypatch.setitem(sys.modules, "verl.trainer.ppo.core_algos", old)
    monkeypatch.setattr(sys.modules["verl.trainer.ppo"], "core_algos", old)
    with caplog.at_level(logging.WARNING, logger="vantage.client"):
        assert not vantage_verl.register()
        assert not vantage_verl.register()
    said = [r.getMessage() for r in caplog.records if "register_adv_est" in r.getMessage()]
    assert len(said) == 1 and "not registered" in said[0]


@pytest.mark.parametrize("server", ["none", "unreachable"])
def test_bad_input_never_stops_training_and_is_said_once(
    server: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """The Monitor built from the environment with no server or an unreachable one, a NaN reward
    and a uid holding two prompts' rows: verl's advantages as they are, each problem said once."""
    for name in ("VANTAGE_SERVER", "VANTAGE_API_KEY", "VANTAGE_START_STEP"):
        monkeypatch.delenv(name, raising=False)
    if server == "unreachable":
        monkeypatch.setenv("VANTAGE_SERVER", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("VANTAGE_SPOOL_DIR", str(tmp_path / "spool"))
    est = vantage_verl.configure(None)
    groups = [
        [1.0] * 4,
        [0.0, 1.0, 0.0, 1.0],
        [float("nan"), 1.0, 0.0, 1.0],
        [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0],  # one uid, two prompts' rows
    ]
    try:
        with caplog.at_level(logging.WARNING, logger="vantage.client"):
            for seed in (1, 2):
                grpo, ours = run_both(batch(groups, seed), True)
                torch.testing.assert_close(ours, grpo, rtol=0, atol=0, equal_nan=True)
                assert ours.isnan().any()  # verl's own GRPO makes the NaN group's NaN
        said = [r.getMessage() for r in caplog.records]
        assert len([m for m in said if "shared by several prompts" in m]) == 1
        assert not [m for m in said if "training goes on" in m]  # nothing failed
        if server == "none":
            assert len([m for m in said if "no server" in m]) == 1
        assert est.monitor is not None and est.next_step == 3
    finally:
        if est.monitor is not None:
            est.monitor.close(timeout=1)
        vantage_verl.configure(None)
