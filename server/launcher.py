"""Start a real `vantage serve` process and wait until it answers.

One launcher for `vantage demo`, the test suites and the benchmarks. It imports only the standard
library and httpx (no server module), so a test or a benchmark can use it without the server's
extra being importable in its own process.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx

VANTAGE = str(Path(sys.executable).with_name("vantage"))


def vantage_command() -> list[str]:
    """The command that runs `vantage`: the executable installed beside this interpreter, else
    the interpreter itself. ``-P``: the current folder is not on the import path, so a local file
    such as dash.py cannot shadow a package the server imports."""
    if Path(VANTAGE).is_file():
        return [VANTAGE]
    return [sys.executable, "-P", "-m", "vantage.server.cli"]


def free_port(host: str = "127.0.0.1") -> int:
    """A port of ``host`` that is free now (the operating system's choice)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def bind_problem(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be bound now (the operating system's words), or None when it can.
    Binds as uvicorn does (SO_REUSEADDR, so a port left in TIME_WAIT counts as free) and lets go."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            return exc.strerror or str(exc)
        except (TypeError, UnicodeError):  # bytes that are no text (an undecodable argument)
            return "Name or service not known"
    return None


def url_host(host: str) -> str:
    """``host`` as a URL writes it: an IPv6 address in brackets (``[::1]``)."""
    return f"[{host}]" if ":" in host else host


@dataclass
class ServerProcess:
    """A running `vantage serve`. ``keys`` maps a name (such as ``"all"``) to an API key that
    `client` sends; the caller fills it."""

    url: str
    database_url: str
    proc: subprocess.Popen
    keys: dict[str, str] = field(default_factory=dict)
    log_path: Path | None = None

    @property
    def port(self) -> int:
        """The port the server listens on."""
        return int(self.url.rsplit(":", 1)[1])

    def client(self, scopes: str | None = "all", timeout: float = 30.0) -> httpx.Client:
        """An HTTP client on the server, sending the key named ``scopes`` (none when no key has
        that name, or for None)."""
        headers = {}
        if scopes in self.keys:
            headers["Authorization"] = f"Bearer {self.keys[scopes]}"
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the server's output, for an error message."""
        if self.log_path is None or not self.log_path.is_file():
            return ""
        return self.log_path.read_text(errors="replace")[-chars:]

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM, then SIGKILL if it has not exited within ``timeout`` seconds."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_server(
    database_url: str,
    log_dir: Path | str,
    *extra: str,
    port: int | None = None,
    host: str = "127.0.0.1",
    env: Mapping[str, str] | None = None,
    log_name: str | None = None,
    timeout: float = 90.0,
    nice: int = 0,
) -> ServerProcess:
    """Start `vantage serve` on ``host:port`` (default: a free port) and wait until /readyz
    answers 200 (the schema is upgraded). ``extra``: more options, such as
    ``--insecure-no-auth``, ``--no-upgrade`` or ``--workers 2``. Its output goes to
    ``log_dir / log_name`` (default ``server-<port>.log``); ``env`` is added to this process's
    environment; ``nice`` lowers the server's priority (a benchmark's client measures itself).
    Raises RuntimeError, with the end of the log, when it exits or is not ready in time."""
    port = port or free_port(host)
    log = Path(log_dir) / (log_name or f"server-{port}.log")
    command = [*vantage_command(), "serve", "--host", host, "--port", str(port)]
    with log.open("w") as out:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(
            [*command, "--database-url", database_url, *extra],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            preexec_fn=(lambda: os.nice(nice)) if nice else None,
        )
    server = ServerProcess(f"http://{url_host(host)}:{port}", database_url, proc, log_path=log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited {proc.returncode} (log {log}): {server.log_tail()}")
        try:
            if httpx.get(f"{server.url}/readyz", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    server.stop(timeout=0)
    raise RuntimeError(
        f"server did not become ready in {timeout:.0f} s (log {log}): {server.log_tail()}"
    )
