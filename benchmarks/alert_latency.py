"""Alert latency: from sending the step that completes a rule's condition to (a) the webhook's
arrival and (b) the rule's command reaching a polling `Monitor`.

A `vantage serve` process (auth off, loopback) runs on a fresh SQLite file, or on a fresh
PostgreSQL database with ``--postgres``. Each of ``--episodes`` episodes is its own run with its
own rule (`acr >= 0.9`, a `set_mitigation` command, a webhook URL of its own, so the one-message-
per-second-per-URL limit never delays a message) and its own `Monitor`:

1. the Monitor logs a live step and flushes (the run exists), the rule is created;
2. t0: the Monitor logs a step whose groups all fail (ACR 1.0), which fires the rule;
3. the webhook receiver (an http.server in this process) stamps the arrival; the training
   thread polls ``Monitor.poll_commands()`` every millisecond and stamps the command.

t0 is the `log_groups` call, so both latencies include the Monitor's batching delay
(``--batch-interval``, 0.01 s by default) on top of the POST: they bound the POST-to-arrival
latency from above.

    python benchmarks/alert_latency.py                 # SQLite, 100 episodes, about a minute
    python benchmarks/alert_latency.py --postgres      # PostgreSQL (VANTAGE_BENCH_POSTGRES_URL)

The last line is JSON: {"webhook_p50_ms", "webhook_p99_ms", "command_p50_ms", "command_p99_ms",
...}.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
from vantage.client import Monitor
from vantage.server.launcher import free_port, start_server

PG_ADMIN = os.environ.get(
    "VANTAGE_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


class Receiver:
    """Records the arrival time of the first webhook on each path."""

    def __init__(self) -> None:
        self.port = free_port()
        self.arrivals: dict[str, float] = {}
        self.events: dict[str, threading.Event] = {}
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                now = time.monotonic()
                self.rfile.read(int(self.headers.get("content-length") or 0))
                outer.arrivals.setdefault(self.path, now)
                outer.events.setdefault(self.path, threading.Event()).set()
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


def episode(
    i: int, url: str, receiver: Receiver, api: httpx.Client, spool: Path, batch_interval: float
) -> tuple[float, float]:
    """One episode; returns (webhook latency s, command latency s)."""
    path = f"/hook/{i}"
    event = receiver.events.setdefault(path, threading.Event())
    mon = Monitor(
        server=url,
        run_name=f"latency-{i}",
        spool_dir=spool,
        batch_interval_s=batch_interval,
        heartbeat_s=60,
    )
    try:
        mon.log_groups(1, [[0, 1, 0, 1]] * 8)
        if not mon.flush(30):
            raise SystemExit(f"episode {i}: the Monitor could not send ({mon.last_error})")
        r = api.post(
            "/api/v1/alert-rules",
            json={
                "name": f"latency-{i}",
                "run_id": mon.run_id,
                "metric": "acr",
                "op": ">=",
                "threshold": 0.9,
                "notify": [receiver.url(path)],
                "mitigation": {"type": "set_mitigation", "params": {"mode": "avspo"}},
            },
        )
        r.raise_for_status()
        t0 = time.monotonic()
        mon.log_groups(2, [[0, 0, 0, 0]] * 8)
        command_at = None
        deadline = t0 + 30
        while command_at is None and time.monotonic() < deadline:
            if any(c.type == "set_mitigation" for c in mon.poll_commands()):
                command_at = time.monotonic()
            else:
                time.sleep(0.001)
        if command_at is None or not event.wait(max(0.0, deadline - time.monotonic())):
            raise SystemExit(f"episode {i}: no command or no webhook within 30 s")
        return receiver.arrivals[path] - t0, command_at - t0
    finally:
        mon.close(timeout=10)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--episodes", type=int, default=100)
    p.add_argument("--postgres", action="store_true", help="a fresh PostgreSQL database")
    p.add_argument(
        "--batch-interval", type=float, default=0.01, help="the Monitor's batch interval, seconds"
    )
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="vantage-alert-latency-"))
    drop = None
    if args.postgres:
        import psycopg

        admin = psycopg.connect(PG_ADMIN, autocommit=True)
        name = f"vantage_bench_{uuid.uuid4().hex[:8]}"
        admin.execute(f'CREATE DATABASE "{name}"')
        database_url = f"{PG_ADMIN.rsplit('/', 1)[0]}/{name}"

        def drop() -> None:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    else:
        database_url = f"sqlite:///{work / 'vantage.db'}"
    receiver = Receiver()
    server = start_server(database_url, work, "--insecure-no-auth", timeout=120)
    url = server.url
    webhook, command = [], []
    try:
        with httpx.Client(base_url=url, timeout=30) as api:
            for i in range(args.episodes):
                w, c = episode(i, url, receiver, api, work / "spool", args.batch_interval)
                webhook.append(w)
                command.append(c)
    finally:
        server.stop()
        receiver.httpd.shutdown()
        if drop is not None:
            drop()
    result = {
        "webhook_p50_ms": round(percentile(webhook, 50) * 1000, 1),
        "webhook_p99_ms": round(percentile(webhook, 99) * 1000, 1),
        "command_p50_ms": round(percentile(command, 50) * 1000, 1),
        "command_p99_ms": round(percentile(command, 99) * 1000, 1),
        "episodes": len(webhook),
        "database": "postgresql" if args.postgres else "sqlite",
        "monitor_batch_interval_s": args.batch_interval,
    }
    print(
        f"webhook latency: p50 {result['webhook_p50_ms']} ms, p99 {result['webhook_p99_ms']} ms",
        file=sys.stderr,
    )
    print(
        f"command latency: p50 {result['command_p50_ms']} ms, p99 {result['command_p99_ms']} ms",
        file=sys.stderr,
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
