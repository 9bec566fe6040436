"""The client tests' server: a real `vantage serve --insecure-no-auth` process on a free port with
its own SQLite database, which a test can stop (SIGTERM) and start again on the same port and
database.

A uniquely named module rather than the conftest, so that the test modules (and the torchrun
script of test_trl_integration) import it by name whatever other conftest pytest loaded.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import httpx

from tests.serving import ServerProcess, free_port, start_server

__all__ = ["Server", "free_port", "queue_refused_record"]


def queue_refused_record(mon: Any, step: int) -> None:
    """Queue a record for ``step`` that the server refuses (422), past the checks of the log_*
    calls, which catch all that this version of the server refuses: a stand-in for what a newer,
    stricter server may refuse."""
    mon._enqueue(("s", step, "not a split", 0, time.time(), 0, {"loss": 1.0}), 0)


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
    """What the server's environment adds to this one: ``VANTAGE_TEST_SERVER_PYTHONPATH`` runs the
    server from another checkout (a snapshot of a known-good commit) while the client under test
    is this one."""
    if os.environ.get("VANTAGE_TEST_SERVER_PYTHONPATH"):
        return {"PYTHONPATH": os.environ["VANTAGE_TEST_SERVER_PYTHONPATH"]}
    return {}


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
        self.process: ServerProcess | None = None
        self.starts = 0

    def start(self, timeout: float = 90.0) -> Server:
        self.starts += 1
        self.process = start_server(
            self.database_url,
            self.workdir,
            "--insecure-no-auth",
            port=self.port,
            env=server_env(),
            log_name=f"server-{self.starts}.log",
            timeout=timeout,
        )
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

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

    def api(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30)

    def metrics(self, run_id: str, **params: object) -> list[dict]:
        with self.api() as api:
            r = api.get(f"/api/v1/runs/{run_id}/metrics", params={"max_points": 100000, **params})
            assert r.status_code == 200, r.text
            return r.json()["points"]
