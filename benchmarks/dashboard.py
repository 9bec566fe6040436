"""Server time of the run page's data callback at 20,000 and 100,000 steps (issue 6, item 7).

Builds the app `vantage serve` builds (SQLite in a temporary folder, or --database-url), creates
each run through the API, writes its step history straight into the steps table (ingesting
100,000 steps through HTTP takes many minutes and is not what is measured here), then times
what the callback runs (``run_view.first_load`` / ``run_view.live_update``) plus serialising its
answer the way Dash does:

- first load: every figure (5,000 points per series at most), KPI and header of a fresh page;
- live update: the trainer sends one step through the real ingest API (not timed), then the
  update that appends it (timed).

Goals: first load under 500 ms and live update under 50 ms at 100,000 steps. Prints a table and,
last, one JSON line.

    python benchmarks/dashboard.py [--steps 20000,100000] [--loads 20] [--updates 50]

`python benchmarks/dashboard.py alerts [--alerts 10000] [--database-url URL]` times the alerts
page's first load instead (`alerts_main`); `python benchmarks/dashboard.py runs [--runs
10000,100000] [--database-url URL]` the runs page's in headless Chromium (`runs_main`).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from vantage.server.launcher import vantage_command

GROUPS, SIZE = 16, 8
CHUNK = 5000


def live_record(step: int, rng: random.Random) -> dict:
    p = rng.random()
    rewards = [1.0 if rng.random() < p else 0.0 for _ in range(GROUPS * SIZE)]
    return {"step": step, "time": time.time(), "rewards": rewards, "group_size": SIZE,
            "scalars": {"loss": rng.random(), "kl": 0.01, "entropy": 1.0, "temperature": 1.0,
                        "reward_std": 0.4}}  # fmt: skip


def history_row(run_id: str, step: int, rng: random.Random, t0: float) -> dict:
    """One steps-table row with plausible metrics (16 groups of 8, binary rewards)."""
    p = min(0.95, 0.2 + step / 150_000)
    passes = [sum(rng.random() < min(1, max(0, rng.gauss(p, 0.3))) for _ in range(SIZE))
              for _ in range(GROUPS)]  # fmt: skip
    all_pass, all_fail = passes.count(SIZE), passes.count(0)
    collapsed = all_pass + all_fail
    rate = sum(passes) / (GROUPS * SIZE)
    expected = rate**SIZE + (1 - rate) ** SIZE
    return {
        "run_id": run_id, "split": "train", "step": step, "attempt": 1, "time": t0 + 2 * step,
        "n_groups": GROUPS, "n_valid": GROUPS, "n_collapsed": collapsed, "n_near_collapsed": 0,
        "n_invalid": 0, "n_degenerate": 0, "acr": collapsed / GROUPS, "acr_eps": collapsed / GROUPS,
        "acr_all_pass": all_pass / GROUPS, "acr_all_fail": all_fail / GROUPS, "acr_constant": 0.0,
        "acr_effective": None, "wasted_rollouts": collapsed * SIZE, "pass_rate": rate,
        "expected_acr": expected, "excess_acr": collapsed / GROUPS - expected, "reward_mean": rate,
        "scalars": {"loss": rng.random(), "kl": 0.01, "entropy": 1.0, "temperature": 1.0,
                    "reward_std": 0.4},
        "evaluated": True,
    }  # fmt: skip


def seed(app, client, steps: int, rng: random.Random) -> tuple[str, int, float]:
    from sqlalchemy import insert
    from vantage.server.models import Run, Step

    r = client.post("/api/v1/runs", json={"name": f"bench-{steps}", "group_size": SIZE})
    r.raise_for_status()
    run_id, attempt = r.json()["run_id"], r.json()["attempt"]
    start = time.perf_counter()
    t0 = time.time() - 2 * steps
    with app.state.session_factory() as s:
        for lo in range(0, steps, CHUNK):
            rows = [history_row(run_id, i, rng, t0) for i in range(lo, min(steps, lo + CHUNK))]
            s.execute(insert(Step), rows)
        run = s.get(Run, run_id)
        run.last_step, run.latest_acr = steps - 1, rows[-1]["acr"]
        s.commit()
    return run_id, attempt, time.perf_counter() - start


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", default="20000,100000")
    ap.add_argument("--loads", type=int, default=20)
    ap.add_argument("--updates", type=int, default=50)
    ap.add_argument("--database-url")
    args = ap.parse_args()
    sizes = [int(s) for s in args.steps.split(",")]
    folder = Path(tempfile.mkdtemp(prefix="vantage-bench-"))
    db_url = args.database_url or f"sqlite:///{folder / 'bench.db'}"
    subprocess.run([*vantage_command(), "db", "upgrade", "--database-url", db_url], check=True)

    from dash._utils import to_json
    from fastapi.testclient import TestClient
    from vantage.dashboard import data
    from vantage.dashboard.pages.run import view as run_view
    from vantage.server.keys import ALL_ACCESS
    from vantage.server.main import create_app
    from vantage.server.settings import Settings

    app = create_app(Settings(database_url=db_url, auth_enabled=False, alert_worker=False))
    client = TestClient(app)
    rng = random.Random(0)
    results = {}
    for n in sizes:
        run_id, attempt, took = seed(app, client, n, rng)
        print(f"wrote {n:,} steps in {took:.1f} s", file=sys.stderr)
        first, live, sizes_kb = [], [], []
        state = None
        for _ in range(args.loads):
            t0 = time.perf_counter()
            out = run_view.first_load(ALL_ACCESS, run_id, True)
            body = to_json(out)
            first.append(1000 * (time.perf_counter() - t0))
            sizes_kb.append(len(body) / 1024)
            state = out[3]
        # How much of a first load is the server's queries (the rest: figures, KPIs, JSON).
        queries = []
        for _ in range(max(3, args.loads // 2)):
            t0 = time.perf_counter()
            data.run_snapshot(ALL_ACCESS, run_id)
            queries.append(1000 * (time.perf_counter() - t0))
        # The newest step (a downsampled figure may end earlier).
        step = state["latest"]["step"]
        # The first update of a process also compiles its SQL statements (~200 ms once):
        # reported apart, as `live_update_first_ms`, and left out of the percentiles.
        for _ in range(args.updates + 1):
            step += 1
            body = {"attempt": attempt, "records": [live_record(step, rng)]}
            client.post(f"/api/v1/runs/{run_id}/steps", json=body).raise_for_status()
            t0 = time.perf_counter()
            out = run_view.live_update(ALL_ACCESS, run_id, state)
            to_json(out)
            live.append(1000 * (time.perf_counter() - t0))
            state = out[3]
            assert state["last_step"] == step, (state["last_step"], step)
        live_first, live = live[0], live[1:]
        results[str(n)] = {
            "first_load_ms_p50": round(statistics.median(first), 1),
            "first_load_ms_p99": round(pct(first, 0.99), 1),
            "live_update_ms_p50": round(statistics.median(live), 1),
            "live_update_ms_p99": round(pct(live, 0.99), 1),
            "live_update_first_ms": round(live_first, 1),
            "first_load_kib": round(statistics.median(sizes_kb)),
            "first_load_queries_ms_p50": round(statistics.median(queries), 1),
        }
        r = results[str(n)]
        print(f"{n:>7,} steps  first load p50 {r['first_load_ms_p50']:7.1f} ms  "
              f"p99 {r['first_load_ms_p99']:7.1f} ms  ({r['first_load_kib']} KiB; queries "
              f"{r['first_load_queries_ms_p50']:.0f} ms)   "
              f"live update p50 {r['live_update_ms_p50']:6.1f} ms  "
              f"p99 {r['live_update_ms_p99']:6.1f} ms")  # fmt: skip
    big = results[str(max(sizes))]
    results["goals_met"] = big["first_load_ms_p50"] < 500 and big["live_update_ms_p50"] < 50
    results["database"] = db_url.split(":")[0]
    client.close()
    app.state.engine.dispose()
    shutil.rmtree(folder, ignore_errors=True)
    print(json.dumps(results))
    return 0


# --- The alerts page (issue 42, items 3 and 8): `python benchmarks/dashboard.py alerts` -------


def seed_alerts(app, client, n_alerts: int, n_runs: int, rng: random.Random) -> float:
    """``n_runs`` runs (through the API) in 5 projects, 20 rules and ``n_alerts`` episodes
    written straight into the tables: 10% firing, 5% pending, the rest resolved."""
    from datetime import UTC, datetime, timedelta

    from sqlalchemy import insert
    from vantage.server.alerts.models import AlertEpisode, AlertRule

    start = time.perf_counter()
    runs = []
    for i in range(n_runs):
        body = {"name": f"alerts-bench-{i}", "project": f"team-{i % 5}"}
        runs.append(client.post("/api/v1/runs", json=body).json()["run_id"])
    now = datetime.now(UTC)
    with app.state.session_factory() as s:
        rules = []
        for i in range(20):
            rule = AlertRule(name=f"bench_rule_{i}", metric="acr", op=">", threshold=0.5,
                             severity=("info", "warning", "critical")[i % 3], notify=[],
                             created_at=now, updated_at=now)  # fmt: skip
            s.add(rule)
            rules.append(rule)
        s.flush()
        rows = []
        for i in range(n_alerts):
            rule = rules[i % len(rules)]
            u = rng.random()
            state = "firing" if u < 0.10 else "pending" if u < 0.15 else "resolved"
            at = now - timedelta(seconds=n_alerts - i)
            rows.append({
                "rule_id": rule.id, "run_id": runs[i % n_runs], "state": state,
                "severity": rule.severity, "value": rng.random(), "pending_step": i,
                "fired_step": None if state == "pending" else i,
                "resolved_step": i + 5 if state == "resolved" else None, "created_at": at,
                "updated_at": at, "fired_at": None if state == "pending" else at,
                "resolved_at": at if state == "resolved" else None, "notified": True,
            })  # fmt: skip
        s.execute(insert(AlertEpisode), rows)
        s.commit()
    return time.perf_counter() - start


def browser_loads(db_url: str, folder: Path, loads: int) -> tuple[list[float], list[float]]:
    """Milliseconds from opening /dashboard/alerts in a fresh headless Chromium page to its
    table drawn, served by a `vantage serve` on ``db_url`` (auth off); and, the peer, to the
    same page filtered to no alert (what Dash's own start costs)."""
    import os

    from playwright.sync_api import sync_playwright
    from vantage.server.launcher import start_server

    chromium = os.environ.get("VANTAGE_TEST_CHROMIUM", "/usr/bin/chromium")
    out: tuple[list[float], list[float]] = ([], [])
    serve = ("--insecure-no-auth", "--no-upgrade")
    # alert i has rule i % 20 and a run of project i % 5: rule 1 has none in team-0
    pages = (("", "#alerts-table tbody tr"), ("?rule=bench_rule_1&project=team-0", "#alerts-empty"))
    with start_server(db_url, folder, *serve) as server, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--headless", "--no-sandbox"])
        for i in range(loads + 1):  # the first warms the server's first-request setup up
            for times, (query, drawn) in zip(out, pages, strict=True):
                page = browser.new_page()
                t0 = time.perf_counter()
                page.goto(f"{server.url}/dashboard/alerts{query}")
                page.wait_for_selector(drawn, timeout=60_000)
                if i:
                    times.append(1000 * (time.perf_counter() - t0))
                page.close()
        browser.close()
    return out


def alerts_main(argv: list[str]) -> int:
    """Time the alerts page's first load (its filters' options, then its table callback,
    serialised as Dash does) with ``--alerts`` alerts, against a page that reads and draws every
    alert (the peer); goal p99 under 500 ms. Last line JSON."""
    ap = argparse.ArgumentParser(description="alerts page first load")
    ap.add_argument("--alerts", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--loads", type=int, default=50)
    ap.add_argument("--database-url")
    ap.add_argument("--browser", type=int, default=0, help="page loads in headless Chromium")
    args = ap.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="vantage-bench-"))
    db_url = args.database_url or f"sqlite:///{folder / 'bench.db'}"
    subprocess.run([*vantage_command(), "db", "upgrade", "--database-url", db_url], check=True)

    from dash._utils import to_json
    from fastapi.testclient import TestClient
    from vantage.dashboard import alert_data
    from vantage.dashboard.pages.alerts.table import alerts_outputs, alerts_table
    from vantage.server.alerts.listing import list_alerts
    from vantage.server.keys import ALL_ACCESS
    from vantage.server.main import create_app
    from vantage.server.settings import Settings

    app = create_app(Settings(database_url=db_url, auth_enabled=False, alert_worker=False))
    client = TestClient(app)
    took = seed_alerts(app, client, args.alerts, args.runs, random.Random(0))
    print(f"wrote {args.alerts:,} alerts on {args.runs} runs in {took:.1f} s", file=sys.stderr)
    no_filter = dict.fromkeys(("state", "severity", "rule", "project"))

    def first_load(filters: dict) -> float:
        t0 = time.perf_counter()
        to_json(alert_data.filter_options(ALL_ACCESS))
        to_json(alerts_outputs(ALL_ACCESS, filters, 50)._asdict())  # a dict, as Dash sends
        return 1000 * (time.perf_counter() - t0)

    def every_alert() -> float:  # the peer: a page that reads and draws all of them
        t0 = time.perf_counter()
        with app.state.session_factory() as s:
            alerts = list_alerts(s, limit=args.alerts)
        to_json(alerts_table(alerts, {}, {}, True))
        return 1000 * (time.perf_counter() - t0)

    first_load(no_filter)  # compiles the statements once
    loads = [first_load(no_filter) for _ in range(args.loads)]
    filtered = [first_load({**no_filter, "project": "team-3", "severity": "critical"})
                for _ in range(args.loads)]  # fmt: skip
    api = []
    for _ in range(args.loads):
        t0 = time.perf_counter()
        client.get("/api/v1/alerts", params={"order": "firing_first", "limit": 50})
        api.append(1000 * (time.perf_counter() - t0))
    peer = [every_alert() for _ in range(max(3, args.loads // 10))]
    result = {
        "alerts": args.alerts,
        "first_load_ms_p50": round(statistics.median(loads), 1),
        "first_load_ms_p99": round(pct(loads, 0.99), 1),
        "filtered_first_load_ms_p99": round(pct(filtered, 0.99), 1),
        "api_first_page_ms_p99": round(pct(api, 0.99), 1),
        "peer_every_alert_ms_p50": round(statistics.median(peer), 1),
    }
    result["peer_over_paged_p50"] = round(result["peer_every_alert_ms_p50"] /
                                          result["first_load_ms_p50"], 1)  # fmt: skip
    result["goal_met"] = result["first_load_ms_p99"] < 500
    result["database"] = db_url.split(":")[0]
    if args.browser:
        renders, empty = browser_loads(db_url, folder, args.browser)
        result["browser_render_ms_p50"] = round(statistics.median(renders), 1)
        result["browser_render_ms_max"] = round(max(renders), 1)
        result["browser_empty_page_ms_p50"] = round(statistics.median(empty), 1)
    r = result
    print(f"{args.alerts:,} alerts  first load p50 {r['first_load_ms_p50']:6.1f} ms  "
          f"p99 {r['first_load_ms_p99']:6.1f} ms (filtered p99 "
          f"{r['filtered_first_load_ms_p99']:.1f} ms; API first page p99 "
          f"{r['api_first_page_ms_p99']:.1f} ms)  |  peer, every alert: p50 "
          f"{r['peer_every_alert_ms_p50']:.1f} ms = {r['peer_over_paged_p50']}x")  # fmt: skip
    if args.browser:
        print(f"headless Chromium, page opened to table drawn: p50 "
              f"{r['browser_render_ms_p50']:.0f} ms, max {r['browser_render_ms_max']:.0f} ms; "
              f"peer, no alert to draw: p50 {r['browser_empty_page_ms_p50']:.0f} ms")  # fmt: skip
    client.close()
    app.state.engine.dispose()
    shutil.rmtree(folder, ignore_errors=True)
    print(json.dumps(result))
    return 0


# --- The runs page (issue 42, item 8): `python benchmarks/dashboard.py runs` ----------------


def seed_runs(db_url: str, n_runs: int, rng: random.Random) -> float:
    """``n_runs`` runs of 3 steps each in 10 projects, written straight into the tables (through
    the API, 100,000 runs take an hour): 60% finished, 3% failed, the rest running; half report
    8 GPUs and a step time; 10% run AVSPO at an effective ACR of 0; 2% have `acr_stall` firing."""
    import uuid
    from datetime import UTC, datetime, timedelta

    from sqlalchemy import insert, select
    from vantage.server.alerts.models import AlertEpisode, AlertRule
    from vantage.server.db import make_engine, session_factory
    from vantage.server.models import Run, Step

    start = time.perf_counter()
    engine = make_engine(db_url)
    now = datetime.now(UTC)
    templates = [history_row("", step, rng, time.time()) for step in range(3) for _ in range(50)]
    with session_factory(engine)() as s:
        stall = s.scalar(select(AlertRule.id).where(AlertRule.name == "acr_stall"))
        for lo in range(0, n_runs, CHUNK):
            runs, steps, episodes = [], [], []
            for i in range(lo, min(n_runs, lo + CHUNK)):
                run_id, u = str(uuid.uuid4()), rng.random()
                status = "failed" if u < 0.03 else "finished" if u < 0.63 else "running"
                avspo, gpus = i % 10 == 0, i % 2 == 0
                for step in range(3):
                    row = dict(templates[step * 50 + i % 50], run_id=run_id, step=step)
                    row["acc"] = {"n_completions": GROUPS * SIZE}
                    row["scalars"] = {**row["scalars"], "step_s": 2.0}
                    if avspo:
                        row["acr_effective"], row["mitigation"] = 0.0, {"mode": "avspo"}
                    steps.append(row)
                created = now - timedelta(seconds=n_runs - i)
                runs.append({
                    "id": run_id, "key": i + 1, "name": f"runs-bench-{i}",
                    "project": f"team-{i % 10}", "tags": ["bench", f"t{i % 7}"],
                    "config": {"gpus": 8} if gpus else {}, "status": status, "attempt": 1,
                    "created_at": created, "last_seen_at": now if i >= n_runs - 20 else created,
                    "finished_at": None if status == "running" else created,
                    "last_step": 2, "latest_acr": steps[-1]["acr"], "latest_acr_step": 2,
                    "mitigation_reported": {"mode": "avspo"} if avspo else None,
                    "has_unevaluated": False,
                })  # fmt: skip
                if i % 50 == 1 and stall is not None:
                    episodes.append({"rule_id": stall, "run_id": run_id, "state": "firing",
                                     "severity": "warning", "value": 0.9, "pending_step": 0,
                                     "fired_step": 2, "created_at": created,
                                     "updated_at": created, "fired_at": created})  # fmt: skip
            s.execute(insert(Run), runs)
            s.execute(insert(Step), steps)
            if episodes:
                s.execute(insert(AlertEpisode), episodes)
            s.commit()
    engine.dispose()
    return time.perf_counter() - start


def _page_loads(page, url: str, rows: int, loads: int) -> list[float]:
    """Milliseconds from navigating to ``url`` to its runs table showing ``rows`` rows, each
    load a fresh page load of the Dash app (scripts from the browser's cache, as a returning
    user has them), after one load that fills that cache."""
    shown = f"document.querySelectorAll('#runs-table tr.run-row').length >= {rows}"
    out = []
    for i in range(loads + 1):
        t0 = time.perf_counter()
        page.goto(url)
        page.wait_for_function(shown, timeout=120_000, polling=10)
        if i:
            out.append(1000 * (time.perf_counter() - t0))
    return out


def runs_main(argv: list[str]) -> int:
    """Time the runs page's first load in headless Chromium with each of ``--runs`` runs (3
    steps each), newest first and ordered by health, and `GET /api/v1/runs`, against the same
    page with 3 runs (the peer); goal p99 under 500 ms at 10,000 runs. Last line JSON."""
    ap = argparse.ArgumentParser(description="runs page first load")
    ap.add_argument("--runs", default="10000,100000")
    ap.add_argument("--loads", type=int, default=20)
    ap.add_argument("--database-url", help="a PostgreSQL URL; its database is emptied per size")
    ap.add_argument("--health-loads", type=int, default=5, help="loads ordered by health")
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    args = ap.parse_args(argv)
    import httpx
    from playwright.sync_api import sync_playwright
    from vantage.server.launcher import start_server

    results: dict = {"database": (args.database_url or "sqlite").split(":")[0].split("+")[0]}
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=args.chromium, args=["--headless", "--no-sandbox", "--disable-gpu"]
        )
        for n in [3, *(int(x) for x in args.runs.split(","))]:
            folder = Path(tempfile.mkdtemp(prefix="vantage-bench-"))
            db_url = args.database_url or f"sqlite:///{folder / 'bench.db'}"
            if args.database_url:
                _empty_postgres(db_url)
            subprocess.run([*vantage_command(), "db", "upgrade", "--database-url", db_url],
                           check=True, capture_output=True)  # fmt: skip
            took = seed_runs(db_url, n, random.Random(0))
            print(f"wrote {n:,} runs in {took:.1f} s", file=sys.stderr)
            server = start_server(db_url, folder, "--insecure-no-auth")
            try:
                page = browser.new_page()
                base = f"{server.url}/dashboard/"
                newest = _page_loads(page, base, min(n, 50), args.loads)
                health = _page_loads(page, base + "?order=health", min(n, 50), args.health_loads)
                page.close()
                api = []
                with httpx.Client(base_url=server.url, timeout=60) as c:
                    for _ in range(args.loads + 1):
                        t0 = time.perf_counter()
                        c.get("/api/v1/runs").raise_for_status()
                        api.append(1000 * (time.perf_counter() - t0))
            finally:
                server.stop()
                shutil.rmtree(folder, ignore_errors=True)
            results[str(n)] = r = {
                "first_load_ms_p50": round(statistics.median(newest), 1),
                "first_load_ms_p99": round(pct(newest, 0.99), 1),
                "by_health_ms_p99": round(pct(health, 0.99), 1),
                "api_runs_ms_p50": round(statistics.median(api[1:]), 1),
            }
            peer = results["3"]
            r["over_3_runs_p50"] = round(r["first_load_ms_p50"] / peer["first_load_ms_p50"], 2)
            print(f"{n:>7,} runs  first load p50 {r['first_load_ms_p50']:6.1f} ms  "
                  f"p99 {r['first_load_ms_p99']:6.1f} ms  (by health p99 "
                  f"{r['by_health_ms_p99']:.1f} ms)  GET /api/v1/runs p50 "
                  f"{r['api_runs_ms_p50']:.1f} ms  |  {r['over_3_runs_p50']}x the 3-run "
                  "page")  # fmt: skip
        browser.close()
    goal = results.get("10000")
    results["goal_met"] = goal is not None and goal["first_load_ms_p99"] < 500
    print(json.dumps(results))
    return 0


def _empty_postgres(db_url: str) -> None:
    """Drop every table of the benchmark's PostgreSQL database (a fresh schema per size)."""
    from sqlalchemy import create_engine, text

    engine = create_engine(db_url.replace("postgresql://", "postgresql+psycopg://", 1))
    with engine.begin() as conn:
        conn.execute(text("DROP SCHEMA public CASCADE; CREATE SCHEMA public"))
    engine.dispose()


SECTIONS = {"alerts": alerts_main, "runs": runs_main}

if __name__ == "__main__":
    section = SECTIONS.get(sys.argv[1]) if sys.argv[1:2] else None
    sys.exit(section(sys.argv[2:]) if section else main())
