"""`vantage demo`: the main job end to end on this machine.

Starts the server and dashboard (a subprocess, on the embedded SQLite default unless a URL is
given), creates keys, installs an alert rule whose mitigation switches AVSPO on, trains on
arithmetic through the Monitor until collapse appears (the tiny character-level model, warm-started
until whole groups turn all-pass; or ``--model smollm2``, SmolLM2-135M, whose groups are all-fail
from the start), lets the alert fire and the trainer apply the command, trains on, and prints a
summary whose last line is JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
import webbrowser
from pathlib import Path
from statistics import fmean
from typing import Any

import httpx

from .launcher import ServerProcess, bind_problem, free_port, start_server, vantage_command
from .preflight import settings_or_exit, upgrade_or_explain

# ACR above this for DEMO_FOR_STEPS consecutive steps fires the demo rule. Published GRPO runs
# stall above 0.35; the tiny task collapses harder, so the demo waits for a clear majority.
DEMO_THRESHOLD = 0.5
DEMO_FOR_STEPS = 3
# How long `--quick` keeps serving after the run: two refreshes of an open dashboard page (2 s
# each by default), so that the page shows the run finished rather than "running" for ever.
QUICK_LINGER_S = 5.0


def serve_command() -> str:
    """How to run `vantage serve` from a shell here: ``vantage serve`` when the ``vantage`` on
    PATH is this installation's, else its full path or ``python -P -m vantage.server.cli`` (a
    venv not activated: the hint ``vantage serve`` answered "command not found")."""
    command = vantage_command()
    on_path = shutil.which("vantage")
    if on_path and Path(on_path).resolve() == Path(command[0]).resolve():
        command = ["vantage"]
    return shlex.join([*command, "serve"])


PROFILES = {
    # model: (config, quick overrides, full overrides)
    "tiny": (
        "arith-tiny",
        ["sft_steps=300", "steps=60", "eval_every=20"],
        ["sft_steps=400", "steps=260", "eval_every=20"],
    ),
    # SmolLM2-135M answers these sums wrongly, so whole groups are all-fail from the start: the
    # full run's 8 prompts a step give the ACR in eighths, and its 16 steps leave room for the
    # alert (3 steps), the command and a dozen steps with AVSPO on (~17 s a step on 2 idle cores)
    "smollm2": (
        "smollm2-arith",
        ["steps=4", "eval_every=2", "eval_size=8"],
        ["steps=16", "prompts_per_step=8", "max_new_tokens=16", "eval_every=8", "eval_size=16"],
    ),
}


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _start_server(database_url: str, port: int, work: Path) -> ServerProcess:
    """`vantage serve` on the schema the demo has upgraded; its output in ``work/server.log``."""
    return start_server(database_url, work, "--no-upgrade", port=port, log_name="server.log")


def _create_keys(database_url: str) -> tuple[str, str]:
    from .db import make_engine, session_factory
    from .keys import create_key

    engine = make_engine(database_url)
    try:
        with session_factory(engine)() as session:
            tag = uuid.uuid4().hex[:6]
            trainer = create_key(session, f"demo-trainer-{tag}", frozenset({"ingest"}), None)
            viewer = create_key(session, f"demo-viewer-{tag}", frozenset({"read", "control"}), None)
            session.commit()
    finally:
        engine.dispose()
    return trainer, viewer


def _revoke_key(database_url: str, plaintext: str) -> None:
    """Revoke the trainer's key once it has trained: it has nothing left to send, and demos run
    against a kept database would leave an ingest key behind each. The viewer's key stays, to
    browse the run later."""
    from .db import make_engine, session_factory
    from .keys import revoke_key

    engine = make_engine(database_url)
    try:
        with session_factory(engine)() as session:
            revoke_key(session, plaintext)
            session.commit()
    finally:
        engine.dispose()


def _install_rule(api: httpx.Client, project: str) -> dict[str, Any]:
    # Scoped by the demo's own project: the run does not exist until the trainer registers it.
    body = {
        "name": f"{project}-collapse",
        "project": project,
        "metric": "acr",
        "op": ">",
        "threshold": DEMO_THRESHOLD,
        "for_steps": DEMO_FOR_STEPS,
        "severity": "warning",
        "mitigation": {"type": "set_mitigation", "params": {"mode": "avspo"}},
        "cooldown_steps": 100_000,
    }
    r = api.post("/api/v1/alert-rules", json=body)
    r.raise_for_status()
    return r.json()


def _mean(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return round(fmean(kept), 4) if kept else None


def _summarize(
    api: httpx.Client, run_id: str, dashboard_url: str, accuracy_start: float | None = None
) -> dict[str, Any]:
    """The demo's outcome from the API. ``accuracy_start``: the trainer's evaluation before its
    first GRPO step, the accuracy before the alert when no later evaluation precedes it (only an
    evaluation at or before the alert's step counts as "before", never one with AVSPO on)."""
    points = api.get(f"/api/v1/runs/{run_id}/metrics").json()["points"]
    alerts = api.get("/api/v1/alerts", params={"run_id": run_id}).json()["alerts"]
    commands = api.get(f"/api/v1/runs/{run_id}/commands").json()["commands"]
    fired = [a for a in alerts if a.get("fired_step") is not None]
    alert_step = min((a["fired_step"] for a in fired), default=None)
    alert_ids = {a["alert_id"] for a in fired}
    applied = [
        c["acked_step"]
        for c in commands
        if c["type"] == "set_mitigation" and c["status"] == "applied" and c["alert_id"] in alert_ids
    ]
    applied_step = min(applied, default=None)
    before = [p for p in points if alert_step is None or p["step"] <= alert_step]
    after = [p for p in points if applied_step is not None and p["step"] > applied_step]
    evals = [(p["step"], p["scalars"].get("eval_accuracy")) for p in points]
    evals = [(s, a) for s, a in evals if isinstance(a, int | float)]  # not null, "NaN"
    before_alert = [(s, a) for s, a in evals if alert_step is not None and s <= alert_step]
    start = (0, accuracy_start) if accuracy_start is not None else (None, None)
    acc_before = before_alert[-1] if before_alert else start
    acc_after = evals[-1] if evals and applied_step is not None else (None, None)
    return {
        "run_id": run_id,
        "steps": max((p["step"] for p in points), default=0),  # step 0: the baseline eval
        "alert_step": alert_step,
        "mitigation_applied_step": applied_step,
        "acr_before": _mean([p["acr"] for p in before]),
        "acr_after": _mean([p["acr"] for p in after]),
        "acr_effective_after": _mean([p["acr_effective"] for p in after]),
        # held-out accuracy and the step it was measured at: the demo runs no plain-GRPO
        # control, so the change between the two is not AVSPO's effect (benchmarks/mitigation.py)
        "accuracy_before": acc_before[1],
        "accuracy_before_step": acc_before[0],
        "accuracy_after": acc_after[1],
        "accuracy_after_step": acc_after[0],
        "dashboard_url": dashboard_url,
    }


def _train(
    model: str, quick: bool, server: str, key: str, run_id: str, project: str, out_dir: Path
) -> dict[str, Any]:
    """Train the demo's run; returns the trainer's summary."""
    from vantage.trainer.run import train

    config, quick_overrides, full_overrides = PROFILES[model]
    overrides = [
        *(quick_overrides if quick else full_overrides),
        f"server={server}",
        f"api_key={key}",
        f"run_id={run_id}",
        f"run_name=demo-{model}",
        f"project={project}",
        f"output_dir={out_dir}",
        "checkpoint_every=0",
    ]
    return train(config, overrides)


def run_demo(args: argparse.Namespace) -> int:
    """The `vantage demo` command; returns the exit status."""
    from .db import safe_url

    database_url = settings_or_exit(args).database_url
    if args.model == "smollm2":  # before a server and a login key for a run that never comes
        from vantage.trainer.models import smollm2_gguf_path

        try:
            smollm2_gguf_path()
        except FileNotFoundError as exc:
            _say(f"error: --model smollm2: {exc}")
            return 1
    free = args.port and bind_problem("127.0.0.1", args.port) is None
    port = args.port if free else free_port()
    base = f"http://127.0.0.1:{port}"
    if args.port and not free:  # say so: the user expects the port they asked for
        _say(f"port {args.port} is taken: serving on {port} instead")
    _say(f"database: {safe_url(database_url)}")
    if not upgrade_or_explain(database_url):
        return 1
    work = Path(tempfile.mkdtemp(prefix="vantage-demo-"))  # removed when the demo succeeds
    trainer_key, viewer_key = _create_keys(database_url)
    server = _start_server(database_url, port, work)
    _sigterm_as_ctrl_c()  # so that the `finally` below stops the server on SIGTERM too
    succeeded = False
    try:
        run_id = str(uuid.uuid4())
        dashboard_url = f"{base}/dashboard/runs/{run_id}"
        with httpx.Client(
            base_url=base, timeout=30, headers={"Authorization": f"Bearer {viewer_key}"}
        ) as api:
            project = f"demo-{run_id[:8]}"
            _install_rule(api, project)
            _say(f"\nVantage is serving on {base} (API docs at {base}/docs)")
            _say(f"Dashboard: {dashboard_url}")
            _say(f"Log in with this key (read + control): {viewer_key}\n")
            _say(f"Alert rule: ACR > {DEMO_THRESHOLD} for {DEMO_FOR_STEPS} steps → switch AVSPO on")
            _say(
                "Training: a supervised warm start first, then GRPO; the run appears on the "
                "dashboard when GRPO starts.\n"
                if args.model == "tiny"
                else "Training: loading SmolLM2-135M, then GRPO; the run appears on the "
                "dashboard when GRPO starts.\n"
            )
            if not args.no_browser and os.environ.get("DISPLAY"):
                webbrowser.open(dashboard_url)
            trained = _train(
                args.model, args.quick, base, trainer_key, run_id, project, work / "run"
            )
            _revoke_key(database_url, trainer_key)
            time.sleep(0.5)
            summary = _summarize(api, run_id, dashboard_url, trained.get("accuracy_start"))
        _print_summary(summary)
        if args.quick:
            _say(
                f"\n--quick: the server stops in {QUICK_LINGER_S:g} s. To browse this run later: "
                f"{serve_command()} --port {port} --database-url {safe_url(database_url)}"
            )
            time.sleep(QUICK_LINGER_S)  # an open page's next refresh shows the run finished
        else:
            _say(f"\nStill serving {dashboard_url} — press Ctrl-C to stop.")
            with contextlib.suppress(KeyboardInterrupt):
                server.proc.wait()
        succeeded = True
        return 0
    finally:
        server.stop()
        if succeeded:  # a failure keeps the server's log, which its message points to
            shutil.rmtree(work, ignore_errors=True)


def _sigterm_as_ctrl_c() -> None:
    """SIGTERM acts as Ctrl-C does (KeyboardInterrupt), so the demo's `finally` stops its server
    instead of leaving it serving. Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        return

    def interrupt(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


def _print_summary(s: dict[str, Any]) -> None:
    def fmt(v: Any) -> str:
        return "-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)

    _say("\nDemo summary")
    _say(f"  steps trained            {s['steps']}")
    _say(f"  alert fired at step      {fmt(s['alert_step'])}")
    applied = s["mitigation_applied_step"]
    since = "" if applied is None else f" (in effect from step {applied + 1})"
    _say(f"  AVSPO applied after step {fmt(applied)}{since}")
    _say(f"  raw ACR before / after   {fmt(s['acr_before'])} / {fmt(s['acr_after'])}")
    _say(f"  effective ACR after      {fmt(s['acr_effective_after'])}")
    _say(
        f"  held-out accuracy        {fmt(s['accuracy_before'])} at step "
        f"{fmt(s['accuracy_before_step'])}, {fmt(s['accuracy_after'])} at step "
        f"{fmt(s['accuracy_after_step'])}"
    )
    _say(
        "  (GRPO trains on throughout, so the accuracy changes with or without AVSPO: this demo\n"
        "   runs no plain-GRPO control; benchmarks/mitigation.py compares the methods)"
    )
    print(json.dumps(s), flush=True)
