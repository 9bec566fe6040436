"""`vantage serve --workers N`: the worker processes end with their parent."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.helpers.server import start_server

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/task").is_dir(), reason="finds the workers through Linux /proc"
)


def _workers(pid: int) -> list[int]:
    """The processes uvicorn spawned under ``pid``."""
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            if b"multiprocessing.spawn" in Path(f"/proc/{child}/cmdline").read_bytes():
                out.append(int(child))
    return out


def _running(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie waiting for its new parent to reap it does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _answers(url: str) -> bool:
    try:
        httpx.get(f"{url}/healthz", timeout=1)
    except httpx.HTTPError:
        return False
    return True


def test_workers_exit_when_the_parent_is_killed(tmp_path):
    """A `kill -9` of a multi-worker `vantage serve` left its workers serving the port (a
    trial); each worker now gets SIGTERM from the kernel when its parent dies."""
    srv = start_server(
        f"sqlite:///{tmp_path}/w.db", tmp_path, "--insecure-no-auth", "--workers", "2"
    )
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 30
        while len(workers := _workers(srv.proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(workers) == 2
        assert _answers(srv.url)
        srv.proc.send_signal(signal.SIGKILL)
        srv.proc.wait(5)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (any(map(_running, workers)) or _answers(srv.url)):
            time.sleep(0.1)
        assert not [pid for pid in workers if _running(pid)], srv.log_tail()
        assert not _answers(srv.url)
    finally:
        srv.stop()
        for pid in filter(_running, workers):  # what a failure left behind
            os.kill(pid, signal.SIGKILL)
