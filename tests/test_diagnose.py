"""`vantage diagnose RUN` through the installed command, on a database a real server filled over
HTTP: detector verdicts with the steps they would fire, the ACR summary and wasted share,
an applied command with what changed after it, next actions; text and JSON."""

from __future__ import annotations

import json
import math
import random

import pytest

from tests.helpers.api import new_run, post_steps
from tests.helpers.cli import run_cli
from tests.helpers.server import start_server

SPIKE = 30  # grad_norm spikes here
AVSPO = 20  # set_mitigation avspo is applied at this step


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    """(database URL, run id) of a 40-step run: half its groups all-pass (ACR 0.5), AVSPO
    applied at step 20 (effective ACR 0 from then on), a grad_norm spike at step 30, one eval
    step; then the ids of a finished run whose entropy collapsed to its end and of a run with
    no steps."""
    url = f"sqlite:///{tmp_path_factory.mktemp('diagnose') / 'vantage.db'}"
    run_cli("db", "upgrade", "--database-url", url)
    srv = start_server(url, tmp_path_factory.mktemp("diagnose-logs"), "--insecure-no-auth")
    try:
        with srv.client(None) as api:
            run = new_run(api, name="diagnosed")
            rng = random.Random(5)
            for step in range(1, 41):
                record = {
                    "step": step,
                    "groups": [[1, 1, 1, 1]] * 4 + [[0, 1, 0, 1]] * 4,
                    "scalars": {"grad_norm": math.exp(rng.gauss(0, 0.2)), "loss": 0.1},
                }
                if step == SPIKE:
                    record["scalars"]["grad_norm"] = 40.0
                if step > AVSPO:
                    record["effective"] = {"n_valid": 8, "n_zero_advantage": 0, "n_virtual": 4}
                post_steps(api, run, [record])
                if step == AVSPO:
                    rid = run["run_id"]
                    body = {"type": "set_mitigation", "params": {"mode": "avspo"}}
                    cid = api.post(f"/api/v1/runs/{rid}/commands", json=body).json()["command_id"]
                    ack = {"status": "applied", "step": AVSPO}
                    r = api.post(f"/api/v1/runs/{rid}/commands/{cid}/ack", json=ack)
                    assert r.status_code == 200, r.text
            post_steps(api, run, [{"step": 40, "split": "eval", "groups": [[0, 1, 1, 0]]}])
            # a run whose entropy collapsed up to its end, then finished (its alert resolved)
            ended = new_run(api, name="ended")
            for step in range(1, 31):
                entropy = 2.0 if step <= 20 else 0.2
                post_steps(api, ended, [{"step": step, "scalars": {"entropy": entropy}}])
            r = api.post(f"/api/v1/runs/{ended['run_id']}/finish", json={"status": "finished"})
            assert r.status_code == 200, r.text
            empty = new_run(api, name="empty")
    finally:
        srv.stop()
    return url, run["run_id"], ended["run_id"], empty["run_id"]


def test_diagnose_json_gives_verdicts_waste_commands_and_actions(filled):
    url, run_id, *_ = filled
    out = run_cli("diagnose", run_id, "--format", "json", "--database-url", url)
    report = json.loads(out.stdout)
    rules = {v["rule"]: v for v in report["rules"]}
    assert rules["grad_norm_spike"]["fires_at"] == [SPIKE]
    assert rules["grad_norm_spike"]["suggested_command"] == {"type": "checkpoint", "params": {}}
    assert rules["kl_spike"]["verdict"] == "no data"  # the run sends no kl
    assert rules["loss_non_finite"]["verdict"] == "ok"
    # raw ACR 0.5 throughout, but AVSPO keeps the ACR it trains on at 0: no stall
    assert rules["acr_stall"]["fires_at"] == []
    acr = report["acr"]
    assert acr["acr_pooled"] == 0.5 and acr["sides"]["all_pass"] == 0.5
    assert acr["wasted_rollouts"] == 40 * 16 and acr["wasted_share"] == 0.5
    assert acr["acr_effective_latest"] == 0.0
    (command,) = report["commands"]
    assert (command["type"], command["step"]) == ("set_mitigation", AVSPO)
    assert command["before"]["acr_effective"] is None and command["after"]["acr_effective"] == 0
    assert command["before"]["acr"] == command["after"]["acr"] == 0.5
    actions = "\n".join(report["next_actions"])
    assert "grad_norm_spike" in actions and "effective ACR 0.00" in actions
    assert "too easy" in actions  # all-pass collapse


def test_diagnose_text_and_an_unknown_run(filled):
    url, run_id, *_ = filled
    text = run_cli("diagnose", run_id, "--database-url", url).stdout
    assert "wasted rollouts 640 of 1280 completions (50.0%)" in text
    assert f"grad_norm_spike        scalars.grad_norm > 6 [zscore]: {SPIKE}" in text
    assert "step 20: set_mitigation" in text and "Next actions" in text
    missing = run_cli("diagnose", "no-such-run", "--database-url", url, check=False)
    assert missing.returncode == 1 and "no run 'no-such-run'" in missing.stderr


def test_diagnose_short_ids_splits_ended_and_empty_runs(filled):
    url, run_id, ended_id, empty_id = filled
    report = json.loads(
        run_cli("diagnose", run_id[:8], "--format", "json", "--database-url", url).stdout
    )
    assert report["run"]["run_id"] == run_id  # the short id the dashboard shows
    bogus = run_cli("diagnose", run_id, "--split", "bogus", "--database-url", url, check=False)
    assert bogus.returncode == 1 and "its splits are eval, train" in bogus.stderr
    missing = run_cli(
        "diagnose", "no-such-run", "--format", "json", "--database-url", url, check=False
    )
    assert missing.returncode == 1 and "no run 'no-such-run'" in json.loads(missing.stdout)["error"]
    ended = run_cli("diagnose", ended_id, "--format", "json", "--database-url", url)
    report = json.loads(ended.stdout)
    (alert,) = [a for a in report["alerts"] if a["rule"] == "entropy_collapse"]
    assert alert["state"] == "resolved"
    (verdict,) = [v for v in report["rules"] if v["rule"] == "entropy_collapse"]
    assert verdict["verdict"] == "fired recently" and verdict["fires_at"] == [25]
    # a resolved alert keeps the command it suggested (docs/detectors.md)
    assert alert["suggested_command"] == verdict["suggested_command"] is not None
    empty = run_cli("diagnose", empty_id, "--database-url", url).stdout
    assert "no data yet" in empty and "nothing to do" not in empty
