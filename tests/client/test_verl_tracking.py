"""verl's own ``Tracking`` with ``logger=[console, vantage]`` (the backend of
``vantage.client.integrations.verl.tracking``) against a real server, and the launcher
``python -m vantage.client.integrations.verl`` running verl's real ``main_ppo`` on the CPU as far as
it goes without a model and GPUs."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

pytest.importorskip("verl")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from vantage.client import Monitor  # noqa: E402
from vantage.client.integrations import verl as vantage_verl  # noqa: E402
from verl.utils.tracking import Tracking  # noqa: E402

from tests.helpers.server import RestartableServer  # noqa: E402


@pytest.fixture
def fresh_estimator(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("VANTAGE_START_STEP", raising=False)
    yield vantage_verl.configure(None)
    vantage_verl.configure(None)


def test_the_backend_is_installed_once_and_only_when_named(fresh_estimator):
    assert vantage_verl.install() and vantage_verl.install()
    assert Tracking.supported_backend.count("vantage") == 1
    assert "vantage" not in Tracking("p", "e", default_backend=["console"]).logger
    with pytest.raises(AssertionError, match="nope is not supported"):  # verl's own check stays
        Tracking("p", "e", default_backend=["nope"])


def test_verls_tracking_sends_the_step_metrics_with_canonical_names(
    noauth_server: RestartableServer, tmp_path: Path, fresh_estimator
):
    mon = Monitor(noauth_server.url, None, run_name=f"verl-track-{uuid.uuid4().hex[:6]}",
                  spool_dir=tmp_path / "spool")  # fmt: skip
    vantage_verl.configure(mon)
    tracking = Tracking(project_name="proj", experiment_name="exp",
                        default_backend=["console", "vantage"], config={"trainer": {}})  # fmt: skip
    assert isinstance(tracking.logger["vantage"], vantage_verl.VantageTracking)
    metrics = {  # as verl's fit() hands them over: numpy, torch and Python numbers
        "actor/entropy": np.float32(0.5), "actor/pg_loss": float("nan"),
        "actor/grad_norm": np.float64("inf"), "actor/kl_loss": torch.tensor(0.125),
        "actor/reward_kl_penalty": 9.0, "critic/score/mean": 0.25, "timing_s/gen": 1.5,
        "val-core/gsm8k/reward/mean@1": 0.75, "note": "text is no metric",
    }  # fmt: skip
    tracking.log(data=metrics, step=3)
    tracking.log(data={"actor/reward_kl_penalty": 0.5, "actor/pg_loss": -0.25}, step=4)
    tracking.finish()
    assert tracking.finish() is None  # verl finishes once; ours too
    mon.close(timeout=30)
    points = {p["step"]: p["scalars"] for p in noauth_server.metrics(mon.run_id)}
    three = points[3]
    assert three["entropy"] == three["actor/entropy"] == 0.5
    # sent, not dropped; the server answers non-finite values as strings (docs/design.md §5)
    assert three["loss"] == three["actor/pg_loss"] == "NaN"
    assert three["grad_norm"] == three["actor/grad_norm"] == "Infinity"
    assert three["kl"] == 0.125  # actor/kl_loss first; actor/reward_kl_penalty only without it
    assert three["critic/score/mean"] == 0.25 and three["timing_s/gen"] == 1.5
    assert "note" not in three and "val-core/gsm8k/reward/mean@1" not in three
    assert points[4]["kl"] == 0.5 and points[4]["loss"] == -0.25
    evals = noauth_server.metrics(mon.run_id, split="eval")
    assert [(p["step"], p["scalars"]) for p in evals] == [
        (3, {"val-core/gsm8k/reward/mean@1": 0.75})
    ]


def test_a_resumed_run_is_numbered_from_verls_checkpoint(tmp_path: Path, fresh_estimator):
    (tmp_path / "global_step_7").mkdir()
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("7")
    config = {"trainer": {"resume_mode": "auto", "default_local_dir": str(tmp_path)}}
    Tracking("proj", "exp", default_backend=["vantage"], config=config)
    est = vantage_verl.estimator()
    assert est.next_step == 8  # verl's next global step
    assert (est.default_run_name, est.default_project) == ("exp", "proj")
    # an explicit start step wins; resume_mode disable starts afresh
    assert vantage_verl.configure(None, start_step=3).next_step == 3
    Tracking("proj", "exp", default_backend=["vantage"], config=config)
    assert vantage_verl.estimator().next_step == 3
    vantage_verl.configure(None)
    Tracking("proj", "exp", default_backend=["vantage"],
             config={"trainer": {**config["trainer"], "resume_mode": "disable"}})  # fmt: skip
    assert vantage_verl.estimator().next_step == 1


def test_the_launcher_runs_verls_main_ppo_with_both_in_the_task_runner(tmp_path: Path):
    """Runs far enough to fail where a CPU must: the TaskRunner (a Ray actor) loading the model.
    The setup hook's line carries the TaskRunner's pid, and the TaskRunner's printed config has
    the overrides; the VANTAGE_* variables go into Ray's runtime_env."""
    overrides = [
        "algorithm.adv_estimator=vantage", "trainer.logger=[console,vantage]",
        "trainer.use_v1=false", "trainer.n_gpus_per_node=1", "ray_kwargs.ray_init.num_cpus=1",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1",
        f"actor_rollout_ref.model.path={tmp_path / 'no-model'}",
    ]  # fmt: skip
    env = {**os.environ, "VANTAGE_RUN_NAME": "launched", "RAY_DEDUP_LOGS": "0"}
    proc = subprocess.run(
        [sys.executable, "-m", "vantage.client.integrations.verl", *overrides],
        capture_output=True, text=True, timeout=240, cwd=tmp_path, env=env,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "'worker_process_setup_hook': 'vantage.client.integrations.verl.setup_worker'" in out
    assert "'VANTAGE_RUN_NAME': 'launched'" in out
    runner = re.search(r"\(TaskRunner pid=(\d+)\)", out)
    assert runner, out[-3000:]
    assert f"vantage: verl worker {runner.group(1)} has the 'vantage' advantage estimator" in out
    assert "'adv_estimator': 'vantage'" in out and "'logger': ['console', 'vantage']" in out
    assert "no-model" in out  # it failed at the model, the first thing a CPU cannot give


def test_a_tracking_without_its_backend_list_is_a_warning_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    import verl.utils.tracking

    class OtherTracking:  # a verl whose Tracking builds backends some other way
        def log(self, data, step): ...  # noqa: ANN001

    monkeypatch.setattr(verl.utils.tracking, "Tracking", OtherTracking)
    with caplog.at_level(logging.WARNING, logger="vantage.client"):
        assert not vantage_verl.install()
        assert not vantage_verl.install()
    said = [r.getMessage() for r in caplog.records if "tracking backend" in r.getMessage()]
    assert len(said) == 1 and "no supported_backend list" in said[0]
