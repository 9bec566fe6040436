"""Fixtures for the client tests: a real `vantage serve --insecure-no-auth` process on a free port
with its own SQLite database, which a test can stop (SIGTERM) and start again on the same port and
database."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

VANTAGE = str(Path(sys.executable).with_name("vantage"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _new_postgres_database() -> tuple[str, object]:
    """``VANTAGE_CLIENT_TEST_POSTGRES=URL`` (a maintenance database such as
    ``postgresql://postgres@127.0.0.1:5432/postgres``) runs these servers on PostgreSQL, one fresh
    database per server."""
    import uuid

    import psycopg

    admin_url = os.environ["VANTAGE_CLIENT_TEST_POSTGRES"]
    name = f"vantage_client_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    base = admin_url.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    return f"{base}/{name}", drop


def server_env() -> dict[str, str]:
    """The server's environment; ``VANTAGE_TEST_SERVER_PYTHONPATH`` runs the server from another
    checkout (a snapshot of a known-good commit) while the client under test is this one."""
    env = {**os.environ}
    if os.environ.get("VANTAGE_TEST_SERVER_PYTHONPATH"):
        env["PYTHONPATH"] = os.environ["VANTAGE_TEST_SERVER_PYTHONPATH"]
    return env


class Server:
    """One `vantage serve` process; ``stop``/``start`` keep the port and the database."""

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.database_url = f"sqlite:///{workdir / 'vantage.db'}"
        self._drop_database = None
        if os.environ.get("VANTAGE_CLIENT_TEST_POSTGRES"):
            self.database_url, self._drop_database = _new_postgres_database()
        self.workdir = workdir
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self, timeout: float = 90.0) -> Server:
        self.starts += 1
        log = (self.workdir / f"server-{self.starts}.log").open("w")
        self.proc = subprocess.Popen(
            [
                VANTAGE,
                "serve",
                "--insecure-no-auth",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--database-url",
                self.database_url,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=server_env(),
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}: {self.log()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.proc.kill()
        raise RuntimeError(f"server did not become ready: {self.log()[-3000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def wipe_database(self) -> None:
        """Replace the (stopped) server's database by an empty one."""
        if self._drop_database is None:
            Path(self.database_url.removeprefix("sqlite:///")).unlink()
        else:
            self._drop_database()
            self.database_url, self._drop_database = _new_postgres_database()

    def cleanup(self) -> None:
        self.stop()
        if self._drop_database is not None:
            self._drop_database()

    def log(self) -> str:
        return "".join(p.read_text() for p in sorted(self.workdir.glob("server-*.log")))

    def api(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30)

    def metrics(self, run_id: str, **params: object) -> list[dict]:
        with self.api() as api:
            r = api.get(f"/api/v1/runs/{run_id}/metrics", params={"max_points": 100000, **params})
            assert r.status_code == 200, r.text
            return r.json()["points"]


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server shared by the tests that never stop it (each test uses its own run)."""
    srv = Server(tmp_path_factory.mktemp("server")).start()
    yield srv
    srv.cleanup()


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[Server]:
    """A server of the test's own, for tests that stop and restart it."""
    folder = tmp_path / "own-server"
    folder.mkdir()
    srv = Server(folder).start()
    yield srv
    srv.cleanup()
