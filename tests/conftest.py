"""Shared fixtures: real databases (SQLite file, and a fresh PostgreSQL database per test run) and
real `vantage serve` processes over HTTP (started by tests/serving.py).

PostgreSQL: ``VANTAGE_TEST_POSTGRES_URL`` (default ``postgresql://postgres@127.0.0.1:5432/postgres``)
is the maintenance database used to create and drop a database per run. When it is unreachable
the PostgreSQL tests skip, unless ``VANTAGE_REQUIRE_POSTGRES=1`` (set by .ci/run), where they fail.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator

import httpx
import pytest

# free_port and start_server are re-exported: the test modules import them from here.
from tests.serving import VANTAGE, ServerProcess, free_port, start_server  # noqa: F401

PG_ADMIN_URL = os.environ.get(
    "VANTAGE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
REQUIRE_PG = os.environ.get("VANTAGE_REQUIRE_POSTGRES") == "1"


def _pg_admin():  # noqa: ANN202
    import psycopg

    return psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=3)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A fresh PostgreSQL database for this test run, dropped at the end."""
    try:
        admin = _pg_admin()
    except Exception as exc:  # noqa: BLE001
        if REQUIRE_PG:
            pytest.fail(f"PostgreSQL is required (VANTAGE_REQUIRE_POSTGRES=1) but: {exc}")
        pytest.skip(f"PostgreSQL not reachable at {PG_ADMIN_URL}: {exc}")
    name = f"vantage_test_{uuid.uuid4().hex[:10]}"
    admin.execute(f'CREATE DATABASE "{name}"')
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def new_postgres_database() -> tuple[str, callable]:
    """Another fresh database (for tests that need an empty one); returns (url, drop)."""
    admin = _pg_admin()
    name = f"vantage_test_{uuid.uuid4().hex[:10]}"
    admin.execute(f'CREATE DATABASE "{name}"')
    base = PG_ADMIN_URL.rsplit("/", 1)[0]

    def drop() -> None:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()

    return f"{base}/{name}", drop


@pytest.fixture(params=["sqlite", "postgres"])
def app_client(request: pytest.FixtureRequest, tmp_path) -> Iterator:  # noqa: ANN001
    """The app in-process (auth off, no alert worker) on a fresh database, SQLite and
    PostgreSQL, through Starlette's TestClient: for tests that reach into the server's state."""
    from fastapi.testclient import TestClient
    from vantage.server.main import create_app
    from vantage.server.migrate import upgrade
    from vantage.server.settings import Settings

    drop = None
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'app.db'}"
    else:
        request.getfixturevalue("postgres_url")  # skips (or fails in CI) without PostgreSQL
        url, drop = new_postgres_database()
    upgrade(url)
    app = create_app(Settings(database_url=url, auth_enabled=False, alert_worker=False))
    try:
        with TestClient(app) as client:
            yield client
    finally:
        app.state.engine.dispose()
        if drop:
            drop()


@pytest.fixture(scope="session", params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path_factory.mktemp('db') / 'vantage.db'}"
    return request.getfixturevalue("postgres_url")


def run_cli(*args: str, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [VANTAGE, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"vantage {' '.join(args)} failed: {proc.stderr}")
    return proc


def create_key(
    database_url: str, scopes: str, name: str | None = None, project: str | None = None
) -> str:
    limited = ("--project", project) if project is not None else ()
    out = run_cli(
        "keys",
        "create",
        "--name",
        name or f"k-{scopes}",
        "--scopes",
        scopes,
        *limited,
        "--database-url",
        database_url,
    )
    return out.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def server(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A real server with auth on, and one key per scope plus one with every scope."""
    run_cli("db", "upgrade", "--database-url", database_url)
    keys = {s: create_key(database_url, s) for s in ("ingest", "read", "control", "admin")}
    keys["all"] = create_key(database_url, "ingest,read,control,admin", "all")
    keys["team-a"] = create_key(database_url, "ingest,read,control", "team-a", project="team-a")
    srv = start_server(database_url, tmp_path_factory.mktemp("logs"))
    srv.keys = keys
    yield srv
    srv.stop()


@pytest.fixture
def api(server: ServerProcess) -> Iterator[httpx.Client]:
    with server.client("all") as client:
        yield client


def new_run(client: httpx.Client, **body) -> dict:
    r = client.post("/api/v1/runs", json={"name": "test", **body})
    assert r.status_code in (200, 201), r.text
    return r.json()


def post_steps(
    client: httpx.Client,
    run: dict,
    records: list[dict],
    attempt: int | None = None,
    expect: int = 200,
) -> dict:
    r = client.post(
        f"/api/v1/runs/{run['run_id']}/steps",
        json={"attempt": attempt or run["attempt"], "records": records},
    )
    assert r.status_code == expect, r.text
    return r.json()
