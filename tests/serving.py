"""Start a real `vantage serve` process on a loopback port and wait until /readyz answers.

Shared by the test suites (``tests.serving``) and the benchmarks, which put the repository root on
``sys.path`` to import it. Only the standard library, httpx and the installed ``vantage`` command.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

VANTAGE = str(Path(sys.executable).with_name("vantage"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ServerProcess:
    url: str
    database_url: str
    proc: subprocess.Popen
    keys: dict[str, str] = field(default_factory=dict)
    log_path: Path | None = None

    def client(self, scopes: str = "all", timeout: float = 30.0) -> httpx.Client:
        headers = {}
        if scopes in self.keys:
            headers["Authorization"] = f"Bearer {self.keys[scopes]}"
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it has not exited within 15 s."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_server(
    database_url: str,
    log_dir: Path,
    *extra: str,
    port: int | None = None,
    env: dict | None = None,
    log_name: str | None = None,
    timeout: float = 90.0,
) -> ServerProcess:
    """Start `vantage serve` (``extra``: more options, such as ``--insecure-no-auth``) and wait
    until /readyz answers (schema upgraded). Its output goes to ``log_dir / log_name`` (default
    ``server-<port>.log``); ``env`` is added to this process's environment."""
    port = port or free_port()
    log = Path(log_dir) / (log_name or f"server-{port}.log")
    with log.open("w") as out:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(
            [VANTAGE, "serve", "--host", "127.0.0.1", "--port", str(port),
             "--database-url", database_url, *extra],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited {proc.returncode}: {log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return ServerProcess(url, database_url, proc, log_path=log)
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    proc.wait()
    raise RuntimeError(f"server did not become ready in {timeout:.0f} s: {log.read_text()[-3000:]}")
