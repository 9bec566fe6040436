"""`vantage serve` processes for the tests: the launcher's ``start_server`` (every server the
suites start goes through it) and a server that a test can stop and start again.

``VANTAGE_CLIENT_TEST_POSTGRES=1`` runs the restartable servers on PostgreSQL (a fresh database
each, made on ``VANTAGE_TEST_POSTGRES_URL``) instead of SQLite files.
``VANTAGE_TEST_SERVER_PYTHONPATH`` runs them from another checkout (a snapshot of a known-good
commit) while the client under test is this one.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import httpx
from vantage.server.launcher import ServerProcess, free_port, start_server

from tests.helpers.postgres import new_postgres_database

__all__ = ["RestartableServer", "ServerProcess", "free_port", "server_env", "start_server"]


def server_env() -> dict[str, str]:
    """What a restartable server's environment adds to this one."""
    if os.environ.get("VANTAGE_TEST_SERVER_PYTHONPATH"):
        return {"PYTHONPATH": os.environ["VANTAGE_TEST_SERVER_PYTHONPATH"]}
    return {}


class RestartableServer:
    """One `vantage serve --insecure-no-auth` process on its own database; ``stop``/``start``
    keep the port and the database."""

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.database_url = f"sqlite:///{workdir / 'vantage.db'}"
        self._drop_database: Callable[[], None] | None = None
        if os.environ.get("VANTAGE_CLIENT_TEST_POSTGRES"):
            self.database_url, self._drop_database = new_postgres_database("vantage_client")
        self.workdir = workdir
        self.process: ServerProcess | None = None
        self.starts = 0

    def start(self, timeout: float = 90.0) -> RestartableServer:
        """Start the server (again) and wait until it is ready."""
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
        """SIGTERM the server (SIGKILL if it lingers)."""
        if self.process is not None:
            self.process.stop()

    def wipe_database(self) -> None:
        """Replace the (stopped) server's database by an empty one."""
        if self._drop_database is None:
            Path(self.database_url.removeprefix("sqlite:///")).unlink()
        else:
            self._drop_database()
            self.database_url, self._drop_database = new_postgres_database("vantage_client")

    def cleanup(self) -> None:
        """Stop the server and drop its PostgreSQL database, if it has one."""
        self.stop()
        if self._drop_database is not None:
            self._drop_database()

    def api(self) -> httpx.Client:
        """An HTTP client on the server (no key: auth is off)."""
        return httpx.Client(base_url=self.url, timeout=30)

    def metrics(self, run_id: str, **params: object) -> list[dict]:
        """Every metric point of the run (GET /api/v1/runs/{id}/metrics, no downsampling)."""
        with self.api() as api:
            r = api.get(f"/api/v1/runs/{run_id}/metrics", params={"max_points": 100000, **params})
            assert r.status_code == 200, r.text
            return r.json()["points"]
