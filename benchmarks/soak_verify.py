"""The checks of benchmarks/soak.py after the run: from the database, the API, the webhook
receiver and each client's own counts. Every function returns plain numbers and a list of
``problems`` (sentences naming the run, rank, step or command), empty when all is well."""

from __future__ import annotations

import statistics
import time
from collections import Counter, defaultdict
from typing import Any

import httpx
import orjson
import psycopg


def stored_groups(database_url: str) -> dict[str, Counter]:
    """Every stored group key ``(attempt, step, split, rank, group_id)`` by run id, with the
    number of times it is stored (each must be 1)."""
    by_run: dict[str, Counter] = defaultdict(Counter)
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT r.id, b.attempt, b.step, b.split, b.rank, b.group_ids "
            "FROM group_blocks b JOIN runs r ON r.key = b.run_key"
        )
        for run_id, attempt, step, split, rank, ids in rows:
            counter = by_run[run_id]
            for gid in orjson.loads(ids):
                counter[(attempt, step, split, rank, gid)] += 1
    return by_run


def check_groups(
    results: list[dict], database_url: str, drop_runs: set[str]
) -> tuple[dict[str, int], list[str]]:
    """Lost, duplicated and unexpected groups, attempts and conflicts. A group is lost when the
    client logged it and it is neither stored nor counted as dropped by the client; only the
    runs in ``drop_runs`` (a small spool) may drop any."""
    stored = stored_groups(database_url)
    problems: list[str] = []
    out = Counter()
    for res in results:
        run_id, rank = res["run_id"], res["rank"]
        keys = stored.get(run_id, Counter())
        mine = {k: n for k, n in keys.items() if k[3] == rank}
        expected = {
            (step, str(g))
            for step in range(1, res["steps"] + 1)
            for g in range(res["groups_per_step"])
        }
        have = {(k[1], k[4]) for k in mine if k[2] == "train"}
        unique = len(have & expected)
        dropped = res["dropped_groups"]
        lost = res["logged_groups"] - unique - dropped
        out["logged"] += res["logged_groups"]
        out["stored"] += unique
        out["dropped"] += dropped
        out["lost"] += max(0, lost)
        out["duplicated"] += sum(n - 1 for n in mine.values())
        out["unexpected"] += len(have - expected)
        out["conflicts"] += res["stats"]["conflicts"]
        out["invalid_groups"] += res["stats"]["invalid_groups"]
        out["resent_duplicates"] += res["stats"]["duplicates"]
        attempts = {k[0] for k in mine}
        if lost:
            problems.append(f"run {run_id} rank {rank}: {lost} group(s) neither stored nor counted")
        if dropped and run_id not in drop_runs:
            problems.append(f"run {run_id} rank {rank}: {dropped} group(s) dropped")
        if attempts - {1}:
            problems.append(f"run {run_id} rank {rank}: attempts {sorted(attempts)}, not 1 only")
    for name in ("duplicated", "unexpected", "conflicts", "invalid_groups"):
        if out[name]:
            problems.append(f"{out[name]} {name.replace('_', ' ')} group(s)")
    return dict(out), problems


def check_steps(results: list[dict], database_url: str, drop_runs: set[str]) -> tuple[int, list]:
    """Steps whose stored group count is not the sum of what the ranks that reached the step
    logged (runs that may drop groups are left out); returns (incomplete steps, problems)."""
    by_run: dict[str, list[dict]] = defaultdict(list)
    for res in results:
        by_run[res["run_id"]].append(res)
    problems = []
    incomplete = 0
    with psycopg.connect(database_url) as conn:
        for run_id, ranks in by_run.items():
            if run_id in drop_runs:
                continue
            rows = dict(
                conn.execute(
                    "SELECT step, n_groups FROM steps WHERE run_id = %s AND split = 'train'",
                    (run_id,),
                ).fetchall()
            )
            for step in range(1, max(r["steps"] for r in ranks) + 1):
                want = sum(r["groups_per_step"] for r in ranks if r["steps"] >= step)
                if rows.get(step) != want:
                    incomplete += 1
                    if len(problems) < 10:
                        problems.append(
                            f"run {run_id} step {step}: {rows.get(step)} groups, not {want}"
                        )
    return incomplete, problems


def check_commands(api: httpx.Client, results: list[dict]) -> tuple[dict, list[str]]:
    """Every command in each run's log applied (acked with a step), and polled and acked once
    by the run's rank 0."""
    problems = []
    issued = delivered_once = 0
    for res in results:
        if res["rank"] != 0:
            continue
        log = api.get(f"/api/v1/runs/{res['run_id']}/commands").json()["commands"]
        for cmd in log:
            cid = cmd["command_id"]
            issued += 1
            polled, acked = res["polled"].get(cid, 0), res["acked"].get(cid, 0)
            if (
                cmd["status"] == "applied"
                and cmd["acked_step"] is not None
                and polled == acked == 1
            ):
                delivered_once += 1
            else:
                problems.append(
                    f"command {cid} of run {res['run_id']}: {cmd['status']}, polled {polled}, "
                    f"acked {acked}"
                )
    return {"commands": issued, "commands_acked_once": delivered_once}, problems


def episodes(api: httpx.Client, rules: dict[str, str]) -> list[dict]:
    """Every alert episode of the soak's rules (``rules``: run id → rule name)."""
    out = []
    for run_id, rule in rules.items():
        r = api.get("/api/v1/alerts", params={"run_id": run_id, "rule": rule})
        out += r.json()["alerts"]
    return out


def expected_messages(eps: list[dict]) -> Counter:
    """(alert_id, state) → 1 for each message the episodes owe the receiver."""
    want: Counter = Counter()
    for ep in eps:
        if ep["fired_step"] is not None:
            want[(ep["alert_id"], "firing")] = 1
            if ep["state"] == "resolved":
                want[(ep["alert_id"], "resolved")] = 1
    return want


def check_notifications(
    api: httpx.Client, rules: dict[str, str], messages: list[dict], wait_s: float
) -> tuple[dict, list[str]]:
    """Each episode's firing and resolved message received exactly once (waiting up to
    ``wait_s`` for the outbox to drain); no message for an episode the server does not list."""
    deadline = time.monotonic() + wait_s
    while True:
        eps = episodes(api, rules)
        want = expected_messages(eps)
        # Delivery is at least once: a copy of a message (same outbox id, a server killed
        # between the answer and recording it) is dropped as a receiver keeping ids does;
        # two messages for one transition are a real duplicate.
        seen = list(messages)
        got = Counter((m.get("alert_id"), m.get("state")) for m in _distinct(seen))
        if all(got[k] >= 1 for k in want) or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    problems = []
    missing = [k for k in want if got[k] == 0]
    twice = {k: n for k, n in got.items() if n > 1}
    strangers = [k for k in got if k not in want]
    if missing:
        problems.append(f"{len(missing)} notification(s) never received: {missing[:5]}")
    if twice:
        problems.append(f"notification(s) received more than once: {dict(list(twice.items())[:5])}")
    if strangers:
        problems.append(f"notification(s) for no listed episode: {strangers[:5]}")
    summary = {
        "alert_episodes": sum(1 for e in eps if e["fired_step"] is not None),
        "notifications": sum(got.values()),
        "notifications_missing": len(missing),
        "notifications_duplicated": sum(n - 1 for n in twice.values()),
        "notifications_redelivered": len(seen) - sum(got.values()),
    }
    return summary, problems


def _distinct(messages: list[dict]) -> list[dict]:
    """One of each message by its outbox id (`X-Vantage-Message-Id`); messages without one are
    all kept."""
    ids: set[str] = set()
    out = []
    for m in messages:
        mid = m.get("_message_id")
        if mid is None or mid not in ids:
            out.append(m)
        if mid is not None:
            ids.add(mid)
    return out


def check_client_health(api: httpx.Client, results: list[dict]) -> list[str]:
    """The run's client health (heartbeats) says the drops its ranks counted."""
    dropped: Counter = Counter()
    for res in results:
        dropped[res["run_id"]] += res["dropped_groups"]
    problems = []
    for run_id, n in dropped.items():
        run = api.get(f"/api/v1/runs/{run_id}").json()
        summary = api.get(f"/api/v1/runs/{run_id}/summary").json()
        for where, health in (("run", run["client"]), ("summary", summary["client"])):
            if health["dropped_groups"] != n:
                problems.append(
                    f"run {run_id}: {where} reports {health['dropped_groups']} dropped, "
                    f"the clients counted {n}"
                )
    return problems


def percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50_ms": None, "p99_ms": None, "n": 0}
    values = sorted(values)
    p99 = values[min(len(values) - 1, int(0.99 * len(values)))]
    return {
        "p50_ms": round(statistics.median(values), 1),
        "p99_ms": round(p99, 1),
        "n": len(values),
    }


def storage(database_url: str) -> dict[str, Any]:
    """Bytes (table, TOAST and indexes) of the group rows and of every Vantage table, per stored
    group."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
        groups = conn.execute("SELECT COALESCE(SUM(n_groups), 0) FROM group_blocks").fetchone()[0]
        blocks = conn.execute("SELECT pg_total_relation_size('group_blocks')").fetchone()[0]
        total = conn.execute(
            "SELECT SUM(pg_total_relation_size(c.oid)) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'public' AND c.relkind = 'r'"
        ).fetchone()[0]
    return {
        "stored_groups": int(groups),
        "bytes_per_group": round(blocks / max(1, groups), 1),
        "all_tables_bytes_per_group": round(int(total) / max(1, groups), 1),
    }


def mlflow_bytes_per_group(database_url: str, groups: list[tuple[int, list[float]]]) -> float:
    """Bytes (table, TOAST and indexes of ``metrics`` and ``latest_metrics``) per group when
    MLflow's own store (``SqlAlchemyStore``, what its tracking server writes through) keeps each
    of ``groups`` (step, rewards) as two metric points, ``group_mean`` and ``group_std``, each
    group at a timestamp of its own; ``database_url`` is an empty PostgreSQL database."""
    import tempfile

    import numpy as np
    from mlflow.entities import Metric
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    url = database_url.replace("postgresql://", "postgresql+psycopg://", 1)
    with tempfile.TemporaryDirectory(prefix="vantage-soak-mlflow-") as artifacts:
        store = SqlAlchemyStore(url, artifacts)
        experiment = store.create_experiment("soak")
        run = store.create_run(experiment, "soak", 0, [], "soak")
        ts = int(time.time() * 1000)
        for start in range(0, len(groups), 500):  # MLflow takes 1,000 metrics per call
            metrics = []
            for step, rewards in groups[start : start + 500]:
                x = np.asarray(rewards, dtype=np.float64)
                ts += 1
                metrics.append(Metric("group_mean", float(x.mean()), ts, step))
                metrics.append(Metric("group_std", float(x.std(ddof=1)), ts, step))
            store.log_batch(run.info.run_id, metrics=metrics, params=[], tags=[])
        store.engine.dispose()
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
        size = conn.execute(
            "SELECT pg_total_relation_size('metrics') + pg_total_relation_size('latest_metrics')"
        ).fetchone()[0]
    return size / max(1, len(groups))


def latency_report(results: list[dict], faults: list[dict], t0: float, warmup: float) -> dict:
    """Steady-state p50/p99 of the clients' successful ``POST .../steps`` (after warm-up, away
    from server and database faults), the same in the 20 s after each fault, and each fault's
    recovery: seconds from the fault until each client's first successful send once the server
    or database was back."""
    hard = [f for f in faults if f["fault"].startswith(("kill", "restart"))]
    steady, around = [], {i: [] for i in range(len(hard))}
    first_ok = {i: [] for i in range(len(hard))}
    for res in results:
        ok = [(t - t0, ms) for t, ms, _status, kind in res["latencies"] if kind == "ok"]
        for i, f in enumerate(hard):  # old workers may answer a little after a kill
            after = [t for t, _ in ok if t > f["back"]]
            if after:
                first_ok[i].append(min(after) - f["t"])
        for t, ms in ok:
            near = [i for i, f in enumerate(hard) if f["t"] - 1 <= t <= f["back"] + 20]
            for i in near:
                around[i].append(ms)
            if not near and t >= warmup:
                steady.append(ms)
    per_fault = []
    for i, f in enumerate(hard):
        rec = first_ok[i]
        per_fault.append(
            {
                **f,
                "back_after_s": round(f["back"] - f["t"], 1),
                "clients_recovered_s_median": round(statistics.median(rec), 1) if rec else None,
                "clients_recovered_s_max": round(max(rec), 1) if rec else None,
                **percentiles(around[i]),
            }
        )
    return {"steady": percentiles(steady), "faults": per_fault}


def rss_report(samples: list[tuple[float, int, int]]) -> dict:
    """RSS of the server's longest life: MiB after warm-up (a quarter of it in) and at its end."""
    lives: dict[int, list[tuple[float, int]]] = {}
    for t, gen, rss in samples:
        lives.setdefault(gen, []).append((t, rss))
    if not lives:
        return {"rss_growth_pct": None}
    life = max(lives.values(), key=lambda s: s[-1][0] - s[0][0])
    warm_at = life[0][0] + (life[-1][0] - life[0][0]) / 4
    warm = [rss for t, rss in life if t >= warm_at]
    first, last = statistics.median(warm[:5]), statistics.median(warm[-5:])
    return {
        "rss_mib_after_warmup": round(first / 2**20, 1),
        "rss_mib_end": round(last / 2**20, 1),
        "rss_mib_max": round(max(rss for _, _, rss in samples) / 2**20, 1),
        "rss_growth_pct": round(100 * (last - first) / first, 1),
        "rss_life_s": round(life[-1][0] - life[0][0]),
    }
