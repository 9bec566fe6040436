"""Alert-evaluation cost of the built-in detectors (migration 0014) per ingested step, side by side
with the rules of before, in one process on one database.

The app is built in this process (`create_app`, FastAPI's TestClient, auth off) on a fresh SQLite
file, or a fresh PostgreSQL database with ``--postgres``. The six detector rules are scoped to
the project ``detectors-on`` (`PUT /alert-rules`), so two runs see:

- ``before``: a run of project ``detectors-off``: the seven built-in rules of before;
- ``after``: a run of project ``detectors-on``: those seven and the six detectors.

Both get the same steps (``--groups`` groups of 8 continuous rewards, the four canonical scalars),
one request a step, alternating which run goes first. Measured per step: the time of alert
evaluation inside ingest (`Evaluator.after_ingest`, wrapped) and of the whole request; also the
reward-shape counting every ingested record now does (`add_reward_shape`, timed on the same
records). Reported: means and medians in microseconds, the added evaluation time per step and the
ratio after/before.

    python benchmarks/detector_cost.py                # SQLite, 400 steps per run
    python benchmarks/detector_cost.py --postgres     # PostgreSQL (VANTAGE_BENCH_POSTGRES_URL)

The last line is JSON: {"eval_us_before", "eval_us_after", "eval_added_us", "eval_ratio", ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from fastapi.testclient import TestClient
from vantage.client.acr import ACRSettings, StepAccumulator
from vantage.client.schema import StepRecord
from vantage.server.classify import classify_reward_lists
from vantage.server.main import create_app
from vantage.server.migrate import upgrade
from vantage.server.reward_shape import add_reward_shape
from vantage.server.settings import Settings

PG_ADMIN = os.environ.get(
    "VANTAGE_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
DETECTORS = (
    "entropy_collapse",
    "kl_spike",
    "grad_norm_spike",
    "loss_non_finite",
    "reward_variance_spike",
    "reward_out_of_range",
)


def record(rng: random.Random, step: int, groups: int) -> dict:
    return {
        "step": step,
        "groups": [[rng.gauss(0.5, 0.1) for _ in range(8)] for _ in range(groups)],
        "scalars": {
            "entropy": 2.0 * rng.uniform(0.97, 1.03),
            "kl": 0.02 * rng.uniform(0.9, 1.1),
            "grad_norm": rng.lognormvariate(0, 0.2),
            "loss": rng.gauss(0.1, 0.05),
        },
    }


def summary(xs: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(xs) * 1e6, "median": statistics.median(xs) * 1e6}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=400, help="steps per run")
    p.add_argument("--groups", type=int, default=64, help="groups of 8 completions per step")
    p.add_argument("--postgres", action="store_true", help="a fresh PostgreSQL database")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="vantage-detector-cost-"))
    drop = None
    if args.postgres:
        import psycopg

        admin = psycopg.connect(PG_ADMIN, autocommit=True)
        name = f"vantage_bench_{uuid.uuid4().hex[:8]}"
        admin.execute(f'CREATE DATABASE "{name}"')
        url = f"{PG_ADMIN.rsplit('/', 1)[0]}/{name}"

        def drop() -> None:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    else:
        url = f"sqlite:///{work / 'vantage.db'}"
    try:
        result = measure(url, args)
    finally:
        if drop is not None:
            drop()
    result["database"] = "postgresql" if args.postgres else "sqlite"
    print(
        f"alert evaluation per step: before {result['eval_us_before']:.0f} us, after "
        f"{result['eval_us_after']:.0f} us (+{result['eval_added_us']:.0f} us, ratio "
        f"{result['eval_ratio']:.2f}); request {result['request_us_before']:.0f} -> "
        f"{result['request_us_after']:.0f} us (ratio {result['request_ratio']:.2f}); reward "
        f"shape {result['shape_us']:.0f} us a record of {args.groups} groups",
        file=sys.stderr,
    )
    print(json.dumps(result))


def measure(url: str, args: argparse.Namespace) -> dict:
    upgrade(url)
    app = create_app(Settings(database_url=url, auth_enabled=False, alert_worker=False))
    evaluator = app.state.evaluator
    spent: dict[str, list[float]] = {"off": [], "on": []}
    current = {"run": "off"}
    inner = evaluator.after_ingest

    def timed(*a, **kw):  # noqa: ANN002, ANN003, ANN202
        t0 = time.perf_counter()
        try:
            return inner(*a, **kw)
        finally:
            spent[current["run"]].append(time.perf_counter() - t0)

    evaluator.after_ingest = timed
    requests: dict[str, list[float]] = {"off": [], "on": []}
    with TestClient(app) as api:
        for rule in api.get("/api/v1/alert-rules").json()["rules"]:
            if rule["name"] in DETECTORS:
                r = api.put(f"/api/v1/alert-rules/{rule['id']}", json={"project": "detectors-on"})
                r.raise_for_status()
        runs = {}
        for side in ("off", "on"):
            r = api.post("/api/v1/runs", json={"name": side, "project": f"detectors-{side}"})
            r.raise_for_status()
            runs[side] = r.json()
        rng = random.Random(0)
        shape: list[float] = []
        for step in range(1, args.steps + 1):
            rec = record(rng, step, args.groups)
            order = ("off", "on") if step % 2 else ("on", "off")
            for side in order:
                current["run"] = side
                body = {"attempt": runs[side]["attempt"], "records": [rec]}
                t0 = time.perf_counter()
                r = api.post(f"/api/v1/runs/{runs[side]['run_id']}/steps", json=body)
                requests[side].append(time.perf_counter() - t0)
                r.raise_for_status()
            parsed = StepRecord.model_validate(rec)
            cols = classify_reward_lists(parsed.reward_lists(), ACRSettings(), lazy=True)
            t0 = time.perf_counter()
            add_reward_shape(StepAccumulator(), parsed, cols, None, ACRSettings())
            shape.append(time.perf_counter() - t0)
        fired = api.get("/api/v1/alerts", params={"run_id": runs["on"]["run_id"]}).json()
    skip = min(20, args.steps // 10)  # first steps: caches warming
    before, after = summary(spent["off"][skip:]), summary(spent["on"][skip:])
    req_before, req_after = summary(requests["off"][skip:]), summary(requests["on"][skip:])
    return {
        "eval_us_before": round(before["mean"], 1),
        "eval_us_after": round(after["mean"], 1),
        "eval_median_us_before": round(before["median"], 1),
        "eval_median_us_after": round(after["median"], 1),
        "eval_added_us": round(after["mean"] - before["mean"], 1),
        "eval_ratio": round(after["mean"] / before["mean"], 3),
        "request_us_before": round(req_before["mean"], 1),
        "request_us_after": round(req_after["mean"], 1),
        "request_ratio": round(req_after["mean"] / req_before["mean"], 3),
        "shape_us": round(summary(shape)["mean"], 1),
        "steps": args.steps,
        "groups_per_step": args.groups,
        "alerts_on_the_detector_run": len(fired["alerts"]),
    }


if __name__ == "__main__":
    main()
