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


if __name__ == "__main__":
    sys.exit(main())
