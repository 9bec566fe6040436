"""Soak and chaos: many runs and ranks through server kills and database restarts, nothing lost
(docs/design.md §2, benchmarks; issue 45).

Each run is ``--ranks`` separate processes sharing a launch (benchmarks/soak_trainer.py, each its
own ``Monitor``), every rank logging ``--groups`` reward groups of 8 and scalars per step at a few
steps per second, into ``vantage serve --workers 2`` on a PostgreSQL cluster of the soak's own
(`soak_cluster`: initdb in a temporary folder, its own port; the machine's shared PostgreSQL is
never touched). One more run has a tiny spool (``--small-spool-bytes``): its disk fills during the
outages, and what it could not keep must be counted by the client and reported by the server.

While they train, a chaos loop repeats a cycle of faults (`CYCLE`): ``kill -9`` of the server
(its main process; then of all its processes) and a restart on the same port, a PostgreSQL
restart (``immediate``, a crash with WAL recovery; then ``fast``), bursts of malformed and
oversized requests, a webhook receiver that is down for a while (each run has a rule, `acr > 0.6`
for 3 steps, whose webhook fires on the collapsed phases the runs send), and commands issued to
random runs (rank 0 acks each at the step it polls it).

Afterwards (`soak_verify`): every group each client logged is stored exactly once or counted as
dropped by the client (lost 0, duplicated 0, conflicts 0), every step complete, every alert
episode notified exactly once, every command polled and acked once and applied, no spool left
behind, the drops reported in client health; and the numbers: ingest p50/p99 latency (the
clients' own ``POST .../steps``) in steady state and after each fault, time to recover after each
fault, server RSS over time (growth after warm-up), spool high-water marks, and bytes per stored
group side by side with MLflow's store keeping the same groups as two metric points each.

    python benchmarks/soak.py --quick     # about 3 minutes (20 runs x 2 ranks)
    python benchmarks/soak.py             # 21 minutes, the cycle every 150 s

The last line is JSON: {"runs", "ranks_per_run", "groups", "server_kills", "database_restarts",
"lost", "duplicated", "p99_ms", "rss_growth_pct", "bytes_per_group", ...}; the exit status is 1
when a check failed (``problems`` lists them).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx
import soak_verify as verify
from soak_chaos import Receiver, Sampler, Server, issue_command, malformed_burst
from soak_cluster import Cluster, pg_bin_dir
from soak_trainer import step_rewards
from vantage.server.launcher import vantage_command

HERE = Path(__file__).resolve().parent
# One chaos cycle: (share of the period, fault). Each runs when its time comes, after the last.
CYCLE = [
    (0.03, "burst"),
    (0.13, "kill_server"),
    (0.25, "receiver_down"),
    (0.40, "restart_database_immediate"),
    (0.55, "burst"),
    (0.62, "receiver_up"),
    (0.75, "kill_server_tree"),
    (0.90, "restart_database_fast"),
]
PROFILES = {  # runs, groups per rank-step, steps/s, seconds, cycle period, warm-up, phase steps
    "full": dict(runs=20, groups=64, steps_per_s=2.0, duration=1260, period=150, warmup=20,
                 phase_steps=60, close_timeout=180, cycle=CYCLE, small_spool=40_000),
    "quick": dict(runs=20, groups=64, steps_per_s=2.0, duration=180, period=150, warmup=20,
                  phase_steps=40, close_timeout=120, cycle=CYCLE, small_spool=40_000),
    "ci": dict(runs=2, groups=16, steps_per_s=4.0, duration=24, period=20, warmup=3,
               phase_steps=12, close_timeout=120, small_spool=12_000,
               cycle=[c for c in CYCLE[:6] if c[0] != 0.55]),
}  # fmt: skip


def vantage(*args: str) -> str:
    """Run `vantage ARGS`; its stdout (RuntimeError with stderr when it fails)."""
    done = subprocess.run([*vantage_command(), *args], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"vantage {' '.join(args[:2])} failed: {done.stderr[-2000:]}")
    return done.stdout


class Soak:
    """One soak: the cluster, the server, the receiver, the trainers and what happened."""

    def __init__(self, args: argparse.Namespace, profile: dict, folder: Path) -> None:
        self.args, self.p, self.folder = args, profile, folder
        self.rng = random.Random(0)
        self.faults: list[dict] = []
        self.bursts: dict[str, int] = {}
        self.commands_issued: set[str] = set()
        self.stop_commands = threading.Event()
        self.procs: list[subprocess.Popen] = []

    def setup(self) -> None:
        self.cluster = Cluster(self.bin)
        self.cluster.start()
        self.db = self.cluster.create_database("vantage")
        env = {"VANTAGE_PERIODIC_PASS_S": "1", "VANTAGE_STEP_COMPLETE_AFTER_S": "5"}
        self.server = Server(self.db, self.folder, self.args.workers, env)
        self.server.start()  # upgrades the schema
        self.key = vantage(
            "keys", "create", "--name", "soak", "--scopes", "ingest,read,control,admin",
            "--database-url", self.db,
        ).strip().splitlines()[-1]  # fmt: skip
        self.receiver = Receiver()
        self.api = httpx.Client(
            base_url=self.server.url, headers={"authorization": f"Bearer {self.key}"}, timeout=30
        )
        self.runs = []  # (index, run id, launch id, spool bytes)
        for i in range(self.p["runs"] + 1):  # the last: the small spool
            small = i == self.p["runs"]
            spool = (self.args.small_spool_bytes or self.p["small_spool"]) if small else 1 << 30
            run_id, launch = str(uuid.uuid4()), uuid.uuid4().hex
            body = {"run_id": run_id, "launch_id": launch, "name": f"soak-{i}", "project": "soak",
                    "world_size": self.args.ranks, "group_size": 8, "heartbeat_s": 2}  # fmt: skip
            self.api.post("/api/v1/runs", json=body).raise_for_status()
            rule = {"name": f"soak-{i}", "run_id": run_id, "metric": "acr", "op": ">",
                    "threshold": 0.6, "clear_threshold": 0.3, "for_steps": 3,
                    "notify": [self.receiver.url(str(i))]}  # fmt: skip
            self.api.post("/api/v1/alert-rules", json=rule).raise_for_status()
            self.runs.append((i, run_id, launch, spool))
        self.rules = {run_id: f"soak-{i}" for i, run_id, _, _ in self.runs}
        self.drop_runs = {self.runs[-1][1]}

    @property
    def bin(self) -> Path:
        found = pg_bin_dir()
        if found is None:
            raise SystemExit("no PostgreSQL binaries (initdb, pg_ctl) on PATH or under /usr/lib")
        return found

    def launch_trainers(self) -> list[tuple[subprocess.Popen, Path]]:
        self.t0 = time.time()
        self.end_at = self.t0 + self.p["duration"]
        self.stop_file = self.folder / "stop"
        spool_dir = self.folder / "spool"
        procs = []
        for i, run_id, launch, spool in self.runs:
            for rank in range(self.args.ranks):
                cfg = {
                    "server": self.server.url, "api_key": self.key, "run_name": f"soak-{i}",
                    "run_id": run_id, "launch_id": launch, "run_index": i, "rank": rank,
                    "world_size": self.args.ranks, "group_size": 8, "groups": self.p["groups"],
                    "steps_per_s": self.p["steps_per_s"], "phase_steps": self.p["phase_steps"],
                    "phase_offset": 7 * i, "spool_dir": str(spool_dir), "heartbeat_s": 2.0,
                    "spool_max_bytes": spool, "stop_file": str(self.stop_file),
                    "close_timeout_s": self.p["close_timeout"],
                    "result": str(self.folder / f"result-{i}-{rank}.json"),
                }  # fmt: skip
                path = self.folder / f"trainer-{i}-{rank}.json"
                path.write_text(json.dumps(cfg))
                log = (self.folder / f"trainer-{i}-{rank}.log").open("w")
                proc = subprocess.Popen(
                    [sys.executable, str(HERE / "soak_trainer.py"), str(path)],
                    stdout=log, stderr=subprocess.STDOUT,
                )  # fmt: skip
                procs.append((proc, Path(cfg["result"])))
        self.procs = [proc for proc, _ in procs]
        return procs

    def chaos(self) -> None:
        """Run the cycle of faults: the first whole, however late a slow restart makes it, then
        each that fits before the end."""
        p = self.p
        start = self.t0 + p["warmup"]
        kills = restarts = 0
        while start + p["period"] <= self.end_at - 5 or start == self.t0 + p["warmup"]:
            for share, fault in p["cycle"]:
                at = start + share * p["period"]
                first = start == self.t0 + p["warmup"]
                if not first and max(at, time.time()) > self.end_at - 3:
                    return
                time.sleep(max(0.0, at - time.time()))
                t = time.time()
                record = {"fault": fault, "t": round(t - self.t0, 1)}
                if fault == "burst":
                    ids = [r[1] for r in self.runs]
                    for status, n in malformed_burst(
                        self.server.url, self.key, ids, self.rng
                    ).items():
                        self.bursts[status] = self.bursts.get(status, 0) + n
                    continue
                if fault.startswith("kill_server"):
                    self.server.kill(whole_tree=fault.endswith("tree"))
                    time.sleep(2.0)  # down for a moment, as a supervisor restarts it
                    self.server.start()
                    kills += 1
                elif fault.startswith("restart_database"):
                    self.cluster.restart("immediate" if fault.endswith("immediate") else "fast")
                    restarts += 1
                elif fault == "receiver_down":
                    self.receiver.down()
                elif fault == "receiver_up":
                    self.receiver.up()
                record["back"] = round(time.time() - self.t0, 1)
                self.faults.append(record)
            start += p["period"]

    def wait_for_acks(self, timeout: float) -> None:
        """Until no run has a command waiting for its ack (or ``timeout`` seconds)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                logs = [
                    self.api.get(f"/api/v1/runs/{run_id}/commands").json()["commands"]
                    for _, run_id, _, _ in self.runs
                ]
            except (httpx.HTTPError, ValueError, KeyError):  # a restart's moment
                logs = [[{"status": "pending"}]]
            if not any(c["status"] in ("pending", "delivered") for log in logs for c in log):
                return
            time.sleep(1.0)

    def commands(self) -> None:
        """A command to a random run every period/15 seconds, until 15 s before the end."""
        every = self.p["period"] / 15
        while not self.stop_commands.wait(every):
            if time.time() > self.end_at - max(3.0, min(15.0, self.p["duration"] / 6)):
                return
            run_id = self.rng.choice(self.runs)[1]
            command_id = issue_command(self.server.url, self.key, run_id, self.rng)
            if command_id is not None:  # the same command again, unacked, answers the first
                self.commands_issued.add(command_id)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="about 3 minutes")
    ap.add_argument("--ci", action="store_true", help="2 runs for about 40 s (the pytest's)")
    ap.add_argument("--runs", type=int, help="runs with a spool of normal size (default 20)")
    ap.add_argument("--ranks", type=int, default=2, help="processes per run (default 2)")
    ap.add_argument("--duration", type=float, help="seconds of training")
    ap.add_argument("--workers", type=int, default=2, help="server processes (default 2)")
    ap.add_argument(
        "--small-spool-bytes",
        type=int,
        help="the spool limit of the extra run whose disk fills (default 40,000; "
        "--ci 12,000: about 3 s of its logging)",
    )
    ap.add_argument("--no-mlflow", action="store_true", help="skip the storage comparison")
    ap.add_argument("--keep", action="store_true", help="keep the folder (logs, results)")
    args = ap.parse_args()  # fmt: skip
    profile = dict(PROFILES["ci" if args.ci else "quick" if args.quick else "full"])
    if args.runs:
        profile["runs"] = args.runs
    if args.duration:
        profile["duration"] = args.duration
    folder = Path(tempfile.mkdtemp(prefix="vantage-soak-"))
    soak = Soak(args, profile, folder)
    problems: list[str] = []
    out: dict = {}
    try:
        soak.setup()
        print(f"server {soak.server.url}, PostgreSQL :{soak.cluster.port}, folder {folder}")
        procs = soak.launch_trainers()
        sampler = Sampler(soak.server)
        sampler.start()
        commander = threading.Thread(target=soak.commands, daemon=True)
        commander.start()
        soak.chaos()
        # training goes on past the faults: a fault late on a busy machine is still one the
        # trainers live through
        soak.stop_commands.set()
        commander.join()
        # and until rank 0 of every run acked its commands: a client still backing off after
        # the last fault would get them in its answers while closing, and never poll them
        time.sleep(max(0.0, max(soak.end_at, time.time() + 5.0) - time.time()))
        soak.wait_for_acks(profile["close_timeout"])
        soak.stop_file.touch()
        soak.end_at = time.time()
        for f in soak.faults:
            print(f"  {f['t']:7.1f} s  {f['fault']} (back at {f['back']:.1f} s)", flush=True)
        results = []
        wait_until = soak.end_at + profile["close_timeout"] + 60
        for proc, path in procs:
            try:
                proc.wait(max(1.0, wait_until - time.time()))
            except subprocess.TimeoutExpired:
                proc.kill()
                problems.append(f"trainer {path.name} hung at close (killed)")
            if path.is_file():
                results.append(json.loads(path.read_text()))
            else:
                problems.append(f"trainer {path.name} wrote no result (exit {proc.returncode})")
        soak.stop_commands.set()
        sampler.stopped.set()
        print(f"trainers done {time.time() - soak.t0:.0f} s after the start", flush=True)

        groups, found = verify.check_groups(results, soak.db, soak.drop_runs)
        problems += found
        normal = [r for r in results if r["run_id"] not in soak.drop_runs]
        small = [r for r in results if r["run_id"] in soak.drop_runs]
        incomplete, found = verify.check_steps(results, soak.db, soak.drop_runs)
        problems += found
        commands, found = verify.check_commands(soak.api, results)
        problems += found
        notes, found = verify.check_notifications(
            soak.api, soak.rules, soak.receiver.messages, wait_s=90
        )
        problems += found
        problems += verify.check_client_health(soak.api, results)
        spool_left = sorted(p.name for p in (folder / "spool").glob("*"))
        if spool_left:
            problems.append(f"spool files left behind: {spool_left[:5]}")
        # a log_* call that waited on the network or the disk, not a busy machine's time slice
        hung = [f"{r['run_index']}/{r['rank']}" for r in results if r["longest_log_call_ms"] > 1e3]
        if hung:
            problems.append(f"log_* calls over 1 s in trainers {hung}")
        bursts_5xx = sum(n for s, n in soak.bursts.items() if s.startswith("5"))
        if bursts_5xx:
            problems.append(f"{bursts_5xx} malformed request(s) answered 5xx: {soak.bursts}")
        lat = verify.latency_report(results, soak.faults, soak.t0, profile["warmup"])
        store = verify.storage(soak.db)
        if not args.no_mlflow:
            n = min(store["stored_groups"], 20_000)
            sample = []
            for step in range(1, n // profile["groups"] + 2):
                rows = step_rewards(0, 0, step, profile["groups"], 8, profile["phase_steps"], 0)
                sample += [(step, row) for row in rows]
            mlflow_db = soak.cluster.create_database("mlflow")
            store["mlflow_bytes_per_group"] = round(
                verify.mlflow_bytes_per_group(mlflow_db, sample[:n]), 1
            )
            store["storage_ratio"] = round(
                store["mlflow_bytes_per_group"] / store["bytes_per_group"], 1
            )
            # the step rows, runs, alerts, ... too: data MLflow's two points do not hold
            store["storage_ratio_all_tables"] = round(
                store["mlflow_bytes_per_group"] / store["all_tables_bytes_per_group"], 1
            )
        kills = sum(f["fault"].startswith("kill") for f in soak.faults)
        restarts = sum(f["fault"].startswith("restart") for f in soak.faults)
        print(f"steady state: {lat['steady']}")
        for f in lat["faults"]:
            print(f"  after {f['fault']} at {f['t']} s: {f}")
        out = {
            "runs": len({r["run_id"] for r in results}),
            "ranks_per_run": args.ranks,
            "groups": groups["stored"],
            "logged_groups": groups["logged"],
            "server_kills": kills,
            "database_restarts": restarts,
            "lost": groups["lost"],
            "duplicated": groups["duplicated"],
            "conflicts": groups["conflicts"],
            "incomplete_steps": incomplete,
            "p50_ms": lat["steady"]["p50_ms"],
            "p99_ms": lat["steady"]["p99_ms"],
            **verify.rss_report(sampler.samples),
            **store,
            "resent_duplicates": groups["resent_duplicates"],
            **commands,
            "commands_issued_by_soak": len(soak.commands_issued),
            **notes,
            "spool_left": len(spool_left),
            "spool_high_water_groups": max(
                (r["spool_high_water_groups"] for r in normal), default=0
            ),
            "small_spool_dropped_groups": sum(r["dropped_groups"] for r in small),
            "small_spool_high_water_groups": max(
                (r["spool_high_water_groups"] for r in small), default=0
            ),
            "longest_log_call_ms": max((r["longest_log_call_ms"] for r in results), default=0),
            "longest_close_s": max((r["close_s"] for r in results), default=0),
            "malformed_answers": soak.bursts,
            "faults": lat["faults"],
            "duration_s": profile["duration"],
            "trained_s": round(soak.end_at - soak.t0),
            "problems": problems,
        }
    except Exception as exc:  # the JSON line still says what happened
        problems.append(f"soak failed: {type(exc).__name__}: {exc}")
        out = {**out, "problems": problems}
        raise
    finally:
        for proc in soak.procs:  # after a failure: no trainer outlives the soak
            if proc.poll() is None:
                proc.kill()
        for name in ("server", "receiver"):
            part = getattr(soak, name, None)
            if part is not None:
                (part.stop if name == "server" else part.down)()
        if getattr(soak, "cluster", None) is not None:
            soak.cluster.remove()
        if args.keep or problems:
            print(f"folder kept: {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)
        print(json.dumps(out), flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
