"""Ingest throughput: Vantage vs an MLflow tracking server, side by side on one PostgreSQL.

Both servers run as their own processes on this machine, each on a fresh database of the same
PostgreSQL. One client process sends the same groups to each, in the same batch sizes:
- Vantage: ``POST /api/v1/runs/{id}/steps`` with ``--batch`` groups of G rewards per request.
- MLflow: ``log_batch`` (its REST call ``runs/log-batch``, which ``MlflowClient.log_batch`` sends)
  with two metric points per group (``group_mean``, ``group_std``, computed with numpy; step =
  the training step; a distinct millisecond timestamp per group), ``--batch`` groups = 2·batch
  points per call (MLflow allows 1,000 metrics per call, so --batch is at most 500).
Both servers run ``--workers`` processes (default 2, one per core here), and the client sends from
``--concurrency`` threads (default 2) and from one thread, each thread over a kept-alive connection
(``http.client``) of its own, spread over the server's workers in the same way for both servers (see
`ingest_senders.PlacedSender`). By default each thread sends steps of its own, as fast as it can
(the load of two ranks, without their synchronisation); with ``--lockstep`` the threads send as the
ranks of one job do: the same steps, each its own rank's groups, meeting before each step. The two
servers are measured in alternating rounds (these machines are noisy) after a warm-up, once the
machine is quiet, and the ratio of their steady-state rates is printed. MLflow's stored point count
is checked in its database. Also measured, beside the ratio: the same points sent through MLflow's
own client (``MlflowClient.log_batch`` with ``Metric`` entities, as a training script sends them;
its overhead and connection pool are MLflow's), and for Vantage the latency of 1,000-group batches
from one sender and the read time of the metrics of a 20,000-step run; for both servers, the CPU
time each round costs per group: this process, the server's processes and PostgreSQL's (`CpuMeter`).

    python benchmarks/ingest.py --quick      # under 5 minutes

The last line is JSON: {"vantage_groups_per_s", "mlflow_groups_per_s", "ratio", ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
import psycopg
from ingest_senders import MlflowSender, Sender, StockMlflowSender, VantageSender
from vantage.server.launcher import free_port, start_server

PG_ADMIN = os.environ.get(
    "VANTAGE_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
BIN = Path(sys.executable).parent


def make_db(admin: psycopg.Connection, prefix: str) -> str:
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    admin.execute(f'CREATE DATABASE "{name}"')
    return name


def wait_http(url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: process exited {proc.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} did not come up")


def settle(busy_percent: float = 30.0, limit_s: float = 90.0) -> float:
    """Wait until this machine's CPUs are mostly idle (or ``limit_s`` passed): MLflow's server
    answers /health and then starts its job runners, which kept both cores busy for about ten
    seconds, into the first round. Returns the seconds waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s and psutil.cpu_percent(interval=1.0) > busy_percent:
        pass
    return time.monotonic() - t0


def make_groups(rng: random.Random, n: int, g: int) -> list[list[float]]:
    """Binary rewards with a realistic share of collapsed groups."""
    out = []
    for _ in range(n):
        p = rng.random()
        out.append([1.0 if rng.random() < p else 0.0 for _ in range(g)])
    return out


def round_batches(batches: list, concurrency: int, lockstep: bool) -> list:
    """The batches a round sends: in ``lockstep`` a whole number of steps (one batch per sender
    each), so the last incomplete step is left out."""
    return batches[: len(batches) - len(batches) % concurrency] if lockstep else batches


def timed_round(
    sender: Sender, batches: list[list[list[float]]], concurrency: int, lockstep: bool = False
) -> float:
    """Groups per second sending ``batches`` from ``concurrency`` senders (threads), each with
    its own client and an equal share of the batches. ``lockstep``: sender i sends its k-th
    batch as rank i of step k (of fresh steps), after every sender sent its batch of step k−1
    (ranks meet at each step's gradient all-reduce)."""
    batches = round_batches(batches, concurrency, lockstep)
    if lockstep:
        first = sender.reserve_steps(len(batches) // concurrency)
        barrier = threading.Barrier(concurrency)

    def share(i: int) -> int:
        if not lockstep:
            return sum(sender.send(b, i) for b in batches[i::concurrency])
        total = 0
        for k, b in enumerate(batches[i::concurrency]):
            barrier.wait()
            total += sender.send(b, i, step=first + k, ranks=concurrency)
        return total

    sender.prepare(concurrency)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        n = sum(pool.map(share, range(concurrency)))
    return n / (time.perf_counter() - t0)


def _cpu_seconds(procs: list[psutil.Process]) -> float:
    total = 0.0
    for proc in procs:
        try:
            times = proc.cpu_times()
        except psutil.Error:  # exited meanwhile
            continue
        total += times.user + times.system
    return total


class CpuMeter:
    """CPU time (user + system, µs per group) that a round costs each part of the machine: this
    sending process, the server's process tree (its workers), and PostgreSQL's processes (the
    server's backends and the database's background writers; one server runs at a time). On
    two cores a server that spends less CPU per group is not always faster (a lock or a round
    trip can leave a core idle), so both numbers are shown; the goal is the rate."""

    PARTS = ("client", "server", "database")

    def __init__(self, server: subprocess.Popen) -> None:
        self.server = psutil.Process(server.pid)
        self.client = psutil.Process()

    def _now(self) -> tuple[float, float, float]:
        server = [self.server, *self.server.children(recursive=True)]
        database = [p for p in psutil.process_iter(["name"]) if p.info["name"] == "postgres"]
        return _cpu_seconds([self.client]), _cpu_seconds(server), _cpu_seconds(database)

    def round(self, sender: Sender, batches: list, concurrency: int, lockstep: bool) -> tuple:
        """`timed_round`'s rate, and the CPU µs per group of each part."""
        groups = sum(len(b) for b in round_batches(batches, concurrency, lockstep))
        before = self._now()
        rate = timed_round(sender, batches, concurrency, lockstep)
        after = self._now()
        parts = zip(self.PARTS, before, after, strict=True)
        return rate, {k: 1e6 * (b - a) / groups for k, a, b in parts}


def seed_run(url: str, steps: int) -> str:
    """A run of ``steps`` steps of 4 groups each; returns its id."""
    with httpx.Client(base_url=url, timeout=120) as client:
        run = client.post("/api/v1/runs", json={"name": f"read-{steps}"}).json()
        rng = random.Random(1)
        for start in range(0, steps, 1000):
            recs = [
                {"step": s, "groups": make_groups(rng, 4, 8)} for s in range(start, start + 1000)
            ]
            client.post(
                f"/api/v1/runs/{run['run_id']}/steps", json={"attempt": 1, "records": recs}
            ).raise_for_status()
    return run["run_id"]


def metrics_read_time(url: str, run_id: str, repeats: int = 15) -> dict:
    """Time GET /metrics of a run (default max_points 5,000)."""
    times = []
    with httpx.Client(base_url=url, timeout=120) as client:
        for _ in range(repeats):
            t0 = time.perf_counter()
            r = client.get(f"/api/v1/runs/{run_id}/metrics")
            times.append(time.perf_counter() - t0)
            r.raise_for_status()
    times.sort()
    return {
        "p50_ms": 1000 * times[len(times) // 2],
        "p99_ms": 1000 * times[-1],
        "points": len(r.json()["points"]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer rounds (under 5 minutes)")
    ap.add_argument("--batch", type=int, default=500, help="groups per request (≤ 500)")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument(
        "--workers", type=int, default=2, help="server processes, for both servers (default 2)"
    )
    ap.add_argument(
        "--concurrency",
        type=int,
        default=2,
        help="sending threads, for both servers (default 2); every round also measures one sender",
    )
    ap.add_argument(
        "--lockstep",
        action="store_true",
        help="the threads send as the ranks of one job: the same steps, each its own rank's "
        "groups, all of a step before the next",
    )
    args = ap.parse_args()
    rounds = args.rounds or (3 if args.quick else 6)
    # Batches per round, so that each server runs for about as long (1-3 s at this machine's
    # rates; --quick has fewer rounds, not shorter ones): shorter rounds measured the threads'
    # start and uneven finish more than the steady state (40 Vantage batches, a quarter of a
    # second; and 160, under a second, read 10-15% below these rounds' rate).
    v_batches, m_batches = (400, 16) if args.quick else (800, 32)

    admin = psycopg.connect(PG_ADMIN, autocommit=True)
    base = PG_ADMIN.rsplit("/", 1)[0]
    vdb, mdb = make_db(admin, "vantage_bench"), make_db(admin, "mlflow_bench")
    tmp = Path(tempfile.mkdtemp(prefix="vantage-bench-"))
    procs: list[subprocess.Popen] = []
    try:
        mport = free_port()
        murl = f"http://127.0.0.1:{mport}"
        murl_db = f"{base.replace('postgresql://', 'postgresql+psycopg://')}/{mdb}"
        mlflow_proc = subprocess.Popen(  # first: it takes the longer to start
            [
                str(BIN / "mlflow"),
                "server",
                "--backend-store-uri",
                murl_db,
                "--host",
                "127.0.0.1",
                "--port",
                str(mport),
                "--workers",
                str(args.workers),
                "--default-artifact-root",
                str(tmp / "art"),
            ],
            stdout=(tmp / "mlflow.log").open("w"),
            stderr=subprocess.STDOUT,
        )
        procs.append(mlflow_proc)
        vantage_server = start_server(
            f"{base}/{vdb}",
            tmp,
            "--insecure-no-auth",
            "--workers",
            str(args.workers),
            log_name="vantage.log",
            timeout=120,
        )
        procs.append(vantage_server.proc)
        vurl = vantage_server.url
        wait_http(f"{murl}/health", mlflow_proc, timeout=240)
        print(f"servers up: vantage {vurl}, mlflow {murl}", flush=True)
        waited = settle()
        print(f"machine quiet after {waited:.0f} s (MLflow starts job runners after /health)")

        rng = random.Random(0)
        vantage = VantageSender(vurl, args.group_size, args.workers)
        mlflow_ = MlflowSender(murl, args.workers)
        stock = StockMlflowSender(murl, args.workers)
        warm = [make_groups(rng, args.batch, args.group_size) for _ in range(3)]
        for b in warm:  # warm-up: connections, caches, first inserts
            for i in range(args.concurrency):
                vantage.send(b, i)
                mlflow_.send(b, i)
                stock.send(b, i)
        rates: dict[tuple[str, int], list[float]] = {}
        cpu: dict[tuple[str, int], list[dict[str, float]]] = {}
        meters = {"vantage": CpuMeter(vantage_server.proc), "mlflow": CpuMeter(mlflow_proc)}
        levels = sorted({args.concurrency, 1}, reverse=True)
        for r in range(rounds):  # alternating rounds, same batches for both
            vb = [make_groups(rng, args.batch, args.group_size) for _ in range(v_batches)]
            line = []
            for level in levels:
                v, v_cpu = meters["vantage"].round(vantage, vb, level, args.lockstep)
                m, m_cpu = meters["mlflow"].round(mlflow_, vb[:m_batches], level, args.lockstep)
                k = timed_round(stock, vb[:m_batches], level, args.lockstep)
                cpu.setdefault(("vantage", level), []).append(v_cpu)
                cpu.setdefault(("mlflow", level), []).append(m_cpu)
                rates.setdefault(("vantage", level), []).append(v)
                rates.setdefault(("mlflow", level), []).append(m)
                rates.setdefault(("stock", level), []).append(k)
                line.append(
                    f"{level} sender{'s' if level > 1 else ''}: vantage {v:,.0f}, mlflow {m:,.0f} "
                    f"groups/s, ratio {v / m:.1f} (MLflow's own client {k:,.0f}, ratio {v / k:.1f})"
                    f"; CPU µs/group vantage {sum(v_cpu.values()):.1f}, "
                    f"mlflow {sum(m_cpu.values()):.0f}"
                )
            print(f"round {r + 1}/{rounds}: " + "; ".join(line), flush=True)

        with psycopg.connect(f"{base}/{mdb}") as conn:
            for sent in (mlflow_, stock):
                stored = conn.execute(
                    "SELECT count(*) FROM metrics WHERE run_uuid = %s", (sent.run_id,)
                ).fetchone()[0]
                assert stored == sent.sent_points, f"mlflow stored {stored} of {sent.sent_points}"
                print(f"mlflow stored all {stored} points sent to run {sent.run_id}", flush=True)

        print(
            "connections the servers closed between rounds, placed again: "
            f"vantage {vantage.replaced}, mlflow {mlflow_.replaced}",
            flush=True,
        )
        # 1,000-group batch latency (Vantage), steady state
        lat = VantageSender(vurl, args.group_size)
        # p99 needs about 100 samples to be more than the maximum of a few (the quick run's is)
        for _ in range(20 if args.quick else 130):
            lat.send(make_groups(rng, 1000, args.group_size))
        ls = sorted(lat.latencies[3:])
        p50, p99 = ls[len(ls) // 2] * 1000, ls[min(len(ls) - 1, int(0.99 * len(ls)))] * 1000
        print(f"vantage 1,000-group batch: p50 {p50:.1f} ms, p99 {p99:.1f} ms", flush=True)
        read_run = seed_run(vurl, 20_000)
        read = metrics_read_time(vurl, read_run)
        print(
            f"metrics of a 20,000-step run: p50 {read['p50_ms']:.1f} ms, "
            f"p99 {read['p99_ms']:.1f} ms ({read['points']} points)",
            flush=True,
        )
        # Freshly written steps have no visibility map until (auto)vacuum runs, so every
        # index-only scan visits the heap (and autovacuum is off on some machines, this one
        # included). A deployment's autovacuum vacuums such a table within about a minute; the
        # same reads after a VACUUM show that case.
        with psycopg.connect(f"{base}/{vdb}", autocommit=True) as conn:
            autovacuum = conn.execute("SHOW autovacuum").fetchone()[0]
            conn.execute("VACUUM (ANALYZE) steps")
        vacuumed = metrics_read_time(vurl, read_run)
        print(
            f"the same after VACUUM (autovacuum is {autovacuum} here): "
            f"p50 {vacuumed['p50_ms']:.1f} ms, p99 {vacuumed['p99_ms']:.1f} ms",
            flush=True,
        )

        median = {k: statistics.median(v) for k, v in rates.items()}
        cpu_use = {
            server: {
                part: round(statistics.median(c[part] for c in cpu[(server, args.concurrency)]), 2)
                for part in CpuMeter.PARTS
            }
            for server in ("vantage", "mlflow")
        }
        totals = {server: sum(cpu_use[server].values()) for server in ("vantage", "mlflow")}
        cpu_use["ratio"] = round(totals["mlflow"] / totals["vantage"], 1)
        v, m = median[("vantage", args.concurrency)], median[("mlflow", args.concurrency)]
        v1, m1 = median[("vantage", 1)], median[("mlflow", 1)]
        k, k1 = median[("stock", args.concurrency)], median[("stock", 1)]
        print(
            json.dumps(
                {
                    "vantage_groups_per_s": round(v),
                    "mlflow_groups_per_s": round(m),
                    "ratio": round(v / m, 1),
                    "senders": args.concurrency,
                    "lockstep": args.lockstep,
                    "workers": args.workers,
                    "one_sender": {
                        "vantage_groups_per_s": round(v1),
                        "mlflow_groups_per_s": round(m1),
                        "ratio": round(v1 / m1, 1),
                    },
                    "mlflow_own_client": {
                        "mlflow_groups_per_s": round(k),
                        "ratio": round(v / k, 1),
                        "one_sender_mlflow_groups_per_s": round(k1),
                        "one_sender_ratio": round(v1 / k1, 1),
                    },
                    "batch_1000_p50_ms": round(p50, 1),
                    "batch_1000_p99_ms": round(p99, 1),
                    "metrics_20k_p50_ms": round(read["p50_ms"], 1),
                    "metrics_20k_vacuumed_p50_ms": round(vacuumed["p50_ms"], 1),
                    "cpu_us_per_group": cpu_use,
                }
            )
        )
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        for db in (vdb, mdb):
            admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
