"""The faults and probes of benchmarks/soak.py: the server (``kill -9`` and a restart), a webhook
receiver that goes down and comes back, bursts of malformed and oversized requests, commands to
random runs, and the server's memory over time."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import psutil
from vantage.server.launcher import ServerProcess, start_server


class Server:
    """`vantage serve --workers N` on the soak's database, killed and restarted on one port.
    ``generation`` counts the starts; ``started_at`` is each start's time (``time.time()``)."""

    def __init__(self, database_url: str, folder: Path, workers: int, env: dict[str, str]):
        self.database_url, self.folder, self.workers, self.env = database_url, folder, workers, env
        self.process: ServerProcess | None = None
        self.port: int | None = None
        self.started_at: list[float] = []

    @property
    def url(self) -> str:
        assert self.process is not None
        return self.process.url

    def start(self, timeout: float = 120.0) -> float:
        """Start it (again, on the same port) and wait until it is ready; the seconds it took.
        A port still held by the old workers (they exit on their parent's death, gracefully)
        is retried until ``timeout``."""
        t0 = time.monotonic()
        while True:
            try:
                self.process = start_server(
                    self.database_url, self.folder, "--workers", str(self.workers),
                    port=self.port, env=self.env, timeout=timeout,
                    log_name=f"server-{len(self.started_at) + 1}.log",
                )  # fmt: skip
                break
            except RuntimeError:
                if time.monotonic() - t0 > timeout:
                    raise
                time.sleep(0.5)
        self.port = self.process.port
        self.started_at.append(time.time())
        return time.monotonic() - t0

    def tree(self) -> list[psutil.Process]:
        if self.process is None or self.process.proc.poll() is not None:
            return []
        try:
            parent = psutil.Process(self.process.proc.pid)
            return [parent, *parent.children(recursive=True)]
        except psutil.Error:
            return []

    def rss_bytes(self) -> int:
        total = 0
        for p in self.tree():
            with contextlib.suppress(psutil.Error):
                total += p.memory_info().rss
        return total

    def kill(self, whole_tree: bool) -> None:
        """``kill -9`` of `vantage serve` (its workers then end with it), or of every process
        of it at once (a container's OOM kill)."""
        assert self.process is not None
        victims = self.tree() if whole_tree else self.tree()[:1]
        for p in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGKILL)
        self.process.proc.wait()

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


class _Listener(ThreadingHTTPServer):
    """Closing waits for the requests in progress (each answers before the port closes)."""

    daemon_threads = False
    block_on_close = True
    allow_reuse_address = True


class Receiver:
    """A webhook target that records every message it acknowledged (answered 200), with the
    time, and can be taken down (its port closed: connections refused) and brought back on the
    same port. A message is recorded only once its answer is written: one whose connection
    broke first is not delivered, and the server rightly sends it again."""

    def __init__(self) -> None:
        self.messages: list[dict] = []
        self.times: list[float] = []
        self._httpd: ThreadingHTTPServer | None = None
        self.port = 0
        self.up()

    def up(self) -> None:
        messages, times = self.messages, self.times

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                self.send_response(200)
                self.end_headers()
                self.wfile.flush()
                message = json.loads(body)
                # the outbox's id for the message, the same on every try (a redelivery)
                message["_message_id"] = self.headers.get("X-Vantage-Message-Id")
                messages.append(message)
                times.append(time.time())

            def log_message(self, *args: object) -> None:
                pass

        self._httpd = _Listener(("127.0.0.1", self.port), Handler)
        self.port = self._httpd.server_address[1]
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()

    def down(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/hook/{name}"


def malformed_burst(url: str, key: str, run_ids: list[str], rng: random.Random) -> dict[str, int]:
    """About 60 requests the server must refuse without storing anything or failing: bodies
    that are no JSON, records of the wrong shape, rewards that do not divide into groups, a body
    over the 8 MiB limit, 10,001 groups, an unknown run, no key, a wrong key. Returns the count
    of each answer (``status``, or ``error`` for a failed connection)."""
    counts: dict[str, int] = {}
    big = b'{"attempt":1,"records":[{"step":1,"groups":[' + b"[0.5]," * 1_500_000 + b"[0]]}]}"
    many = {"attempt": 1, "records": [{"step": 1, "groups": [[0, 1]] * 10_001}]}
    bad_bodies: list[bytes] = [
        b"{not json",
        b"",
        b"[]",
        b'{"attempt": 1, "records": "nope"}',
        b'{"attempt": 1, "records": [{"step": -1, "groups": [[0, 1]]}]}',
        b'{"attempt": 1, "records": [{"step": 1, "rewards": [0,1,0], "group_size": 2}]}',
        b'{"attempt": 1, "records": [{"step": 1, "groups": [["a", 1]]}]}',
        b'{"attempt": 1, "records": [{"step": 1, "groups": [[true, 1]]}]}',
        b'{"attempt": 99, "records": [{"step": 1, "groups": [[0, 1]]}]}',
        b'{"attempt": 1, "records": [{"step": 1, "groups": [[0, 1]]}], "extra": ' + b"[" * 5000,
        json.dumps(many).encode(),
        big,
    ]
    auth = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    with httpx.Client(base_url=url, timeout=15) as http:
        for i in range(60):
            run_id = rng.choice(run_ids)
            headers = auth
            path = f"/api/v1/runs/{run_id}/steps"
            body = bad_bodies[i % len(bad_bodies)]
            if i % 15 == 13:
                path = "/api/v1/runs/no-such-run/steps"
                body = b'{"attempt": 1, "records": [{"step": 1, "groups": [[0, 1]]}]}'
            elif i % 15 == 14:
                headers = {"authorization": "Bearer vtg_wrong", "content-type": "application/json"}
            try:
                status = str(http.post(path, content=body, headers=headers).status_code)
            except httpx.HTTPError:
                status = "error"
            counts[status] = counts.get(status, 0) + 1
    return counts


def issue_command(url: str, key: str, run_id: str, rng: random.Random) -> str | None:
    """Issue a command to ``run_id`` (a checkpoint or a sampling temperature); its id, or None
    when the server did not take it (it is down)."""
    body = rng.choice(
        [
            {"type": "checkpoint", "params": {}, "reason": "soak"},
            {"type": "set_sampling", "params": {"temperature": 0.9}, "reason": "soak"},
        ]
    )
    try:
        r = httpx.post(
            f"{url}/api/v1/runs/{run_id}/commands",
            json=body,
            headers={"authorization": f"Bearer {key}"},
            timeout=15,
        )
    except httpx.HTTPError:
        return None
    return r.json()["command_id"] if r.status_code == 201 else None


class Sampler(threading.Thread):
    """The server's resident memory (its whole process tree), every ``every`` seconds:
    ``samples`` holds (time, server generation, bytes)."""

    def __init__(self, server: Server, every: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.server, self.every = server, every
        self.samples: list[tuple[float, int, int]] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.every):
            rss = self.server.rss_bytes()
            if rss:
                self.samples.append((time.time(), len(self.server.started_at), rss))
