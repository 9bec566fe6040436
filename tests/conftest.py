"""Fixtures shared by every suite: real databases (a SQLite file, and a fresh PostgreSQL database
per test process) and a real `vantage serve` with auth on, plus the options of the test run.

The helpers the tests call live in ``tests.helpers``; see its modules for the environment
variables (PostgreSQL, Chromium) that they read.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import httpx
import pytest

from tests.helpers.cli import create_key, run_cli
from tests.helpers.isolation import isolate_user_folders
from tests.helpers.postgres import new_postgres_database, require_postgres
from tests.helpers.server import ServerProcess, start_server


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--runslow",
        action="store_true",
        default=False,
        help="also run the tests marked slow (over a minute each); VANTAGE_RUN_SLOW=1 does too",
    )


def pytest_configure(config: pytest.Config) -> None:
    config._vantage_restore_environment = isolate_user_folders()


def pytest_unconfigure(config: pytest.Config) -> None:
    restore = getattr(config, "_vantage_restore_environment", None)
    if restore is not None:
        restore()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked slow (SmolLM2, the collapse run) run only with --runslow, so the default
    suite stays within a few minutes."""
    if config.getoption("--runslow") or os.environ.get("VANTAGE_RUN_SLOW", "") not in ("", "0"):
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow (or VANTAGE_RUN_SLOW=1)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A fresh PostgreSQL database for this test process, dropped at the end."""
    require_postgres()
    url, drop = new_postgres_database()
    yield url
    drop()


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
        require_postgres()
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
    """A database for this test process's `auth_server`, SQLite and PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path_factory.mktemp('db') / 'vantage.db'}"
    return request.getfixturevalue("postgres_url")


@pytest.fixture(scope="session")
def auth_server(
    database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """A real server with auth on, and in ``keys`` one key per scope (named after it), one with
    every scope ("all") and one limited to project team-a ("team-a")."""
    run_cli("db", "upgrade", "--database-url", database_url)
    keys = {s: create_key(database_url, s) for s in ("ingest", "read", "control", "admin")}
    keys["all"] = create_key(database_url, "ingest,read,control,admin", "all")
    keys["team-a"] = create_key(database_url, "ingest,read,control", "team-a", project="team-a")
    srv = start_server(database_url, tmp_path_factory.mktemp("logs"))
    srv.keys = keys
    yield srv
    srv.stop()


@pytest.fixture
def api(auth_server: ServerProcess) -> Iterator[httpx.Client]:
    """An HTTP client on `auth_server` with the every-scope key."""
    with auth_server.client("all") as client:
        yield client
