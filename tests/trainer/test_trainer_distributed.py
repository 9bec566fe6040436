"""Data parallel through torchrun: 2 CPU processes with gloo."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from vantage.client.acr import summarize_rewards


def torchrun(tmp_path, *args, env: dict | None = None, worker: str = "dp_worker.py"):
    """Run a worker script (dp_worker.py) on 2 CPU processes (gloo); returns each rank's dump."""
    worker = Path(__file__).parent / worker
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    # --standalone: torchrun binds its rendezvous store to a port of its own choosing. A port
    # picked here and freed could be taken by another process before torchrun bound it, and
    # the workers then waited for a store that never answered (seen once in CI).
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(worker), str(tmp_path), *args]  # fmt: skip
    # its own process group, so that a timeout also stops the workers, not torchrun alone
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True,
    )  # fmt: skip
    try:
        _, stderr = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, stderr = proc.communicate()
        pytest.fail(f"torchrun did not finish in 300 s:\n{stderr[-3000:]}")
    assert proc.returncode == 0, stderr[-3000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_two_ranks_pool_acr_and_apply_a_command_at_the_same_step(warm_policy, tmp_path):
    ranks = torchrun(tmp_path, warm_policy)
    monitors = [json.loads((tmp_path / f"monitor{r}.json").read_text()) for r in (0, 1)]

    assert ranks[0]["run_id"] == ranks[1]["run_id"]
    assert [m["kwargs"]["rank"] for m in monitors] == [0, 1]
    assert all(m["kwargs"]["world_size"] == 2 for m in monitors)
    # rank 0 alone polls and acks; both ranks switch to AVSPO at the same step
    assert ranks[0]["polls"] == 5 and ranks[1]["polls"] == 0
    assert monitors[0]["acks"] == [["m1", "applied", 2, monitors[0]["acks"][0][3]]]
    assert monitors[1]["acks"] == []
    for r in ranks:
        assert [h["mitigation"] for h in r["history"]] == ["none", "none", "avspo", "avspo"]
    # same weights on both ranks before and after training (gradients are all-reduced)
    assert ranks[0]["checksum"] == ranks[1]["checksum"]
    assert ranks[0]["checksum_after"] == ranks[1]["checksum_after"]
    assert ranks[0]["checksum_after"] != ranks[0]["checksum"]
    # each rank sends its own groups; the step's ACR is pooled over both ranks
    for step in (1, 2, 3, 4):
        groups = [g for m in monitors for g in m["groups"] if g[0] == step]
        assert len(groups) == 2
        assert groups[0][2] != groups[1][2]  # different prompts on each rank
        rows = [row for g in groups for row in g[1]]
        collapsed = sum(summarize_rewards(row).cls == "collapsed" for row in rows)
        for r in ranks:
            assert r["history"][step - 1]["acr"] == collapsed / len(rows)
        # virtual samples are pooled like the rest (the scalar was rank 0's alone: a trial)
        virtual = sum(e[1]["n_virtual"] for m in monitors for e in m["effective"] if e[0] == step)
        assert [r["history"][step - 1]["n_virtual"] for r in ranks] == [virtual, virtual]


def test_two_ranks_agree_on_dapo_batches_and_train_on_as_many_groups(warm_policy, tmp_path):
    ranks = torchrun(tmp_path, warm_policy, env={"VANTAGE_TEST_DAPO": "1"})
    monitors = [json.loads((tmp_path / f"monitor{r}.json").read_text()) for r in (0, 1)]
    for r in ranks:
        assert [h["mitigation"] for h in r["history"]] == ["none", "none", "dapo", "dapo"]
    assert ranks[0]["checksum_after"] == ranks[1]["checksum_after"]
    for step in (3, 4):
        records = [r["history"][step - 1] for r in ranks]
        # as many generation batches and trained groups on each rank, whatever each kept
        for key in ("gen_batches", "trained_groups", "filtered_groups", "rollouts_per_step"):
            assert records[0][key] == records[1][key], key
        batches, trained = records[0]["gen_batches"], records[0]["trained_groups"]
        rows = []
        for m in monitors:
            (groups,) = [g[1] for g in m["groups"] if g[0] == step]
            assert len(groups) == 4 * batches  # every group generated is logged
            rows += groups
            (effective,) = [e[1] for e in m["effective"] if e[0] == step]
            assert effective["n_valid"] == trained / 2 and effective["n_zero_advantage"] == 0
        collapsed = sum(summarize_rewards(row).cls == "collapsed" for row in rows)
        assert records[0]["acr"] == collapsed / len(rows)
        assert records[0]["filtered_groups"] == collapsed
        assert records[0]["rollouts_per_step"] == 4 * len(rows)


def test_two_ranks_against_a_real_server(warm_policy, tmp_path, server_url):
    ranks = torchrun(tmp_path, warm_policy, server_url)
    assert ranks[0]["run_id"] == ranks[1]["run_id"]
    for r in ranks:
        assert [h["mitigation"] for h in r["history"]] == ["none", "none", "avspo", "avspo"]
    run_id = ranks[0]["run_id"]
    with httpx.Client(base_url=server_url, timeout=30) as api:
        points = api.get(f"/api/v1/runs/{run_id}/metrics").json()["points"]
        commands = api.get(f"/api/v1/runs/{run_id}/commands").json()["commands"]
    # the server pools both ranks' groups per step: 2 ranks x 4 groups, the trainer's own ACR
    baseline = points.pop(0)  # the held-out accuracy before training, every rank's the same
    assert baseline["step"] == 0 and baseline["n_valid"] == 0
    assert baseline["scalars"]["eval_accuracy"] == pytest.approx(ranks[0]["accuracy_start"])
    assert [p["step"] for p in points] == [1, 2, 3, 4]
    for p in points:
        assert p["n_valid"] == 8
        assert p["acr"] == pytest.approx(ranks[0]["history"][p["step"] - 1]["acr"])
    assert [(c["status"], c["acked_step"]) for c in commands] == [("applied", 2)]


def test_a_signal_to_one_rank_stops_every_rank_with_a_checkpoint(warm_policy, tmp_path):
    """A SIGTERM that reached rank 1 only said it would stop, and training went on without a
    checkpoint (a trial): every rank now stops at the same step boundary."""
    ranks = torchrun(tmp_path, warm_policy, env={"VANTAGE_TEST_SIGNAL_RANK1": "1"})
    assert [r["steps_completed"] for r in ranks] == [2, 2]
    assert [r["signal"] for r in ranks] == ["SIGTERM", "SIGTERM"]
    assert (tmp_path / "run" / "checkpoint" / "state.pt").exists()
