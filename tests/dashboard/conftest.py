"""Fixtures of the dashboard tests: one seeded server and one headless Chromium per test process
(``tests.helpers.dashboard``), and logged-in pages."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.helpers.cli import create_key, revoke_key
from tests.helpers.dashboard import (
    CHROMIUM,
    CHROMIUM_ARGS,
    RUNS_FILTERS,
    RUNS_OUTPUTS,
    DashboardServer,
    chromium_or_skip,
    login,
    start_dashboard_server,
)


@pytest.fixture(scope="session")
def dashboard_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DashboardServer]:
    """A server with auth on, a key per role and the sample runs."""
    server = start_dashboard_server(tmp_path_factory.mktemp("vantage"))
    yield server
    server.process.stop()


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    playwright = chromium_or_skip()
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def login_as(browser: Any, dashboard_server: DashboardServer) -> Callable[..., Any]:
    """login_as(key_name, path) -> a logged-in page (closed by the test)."""
    return lambda key_name, path="/dashboard/": login(browser, dashboard_server, key_name, path)


@pytest.fixture
def control_page(browser: Any, dashboard_server: DashboardServer) -> Iterator[Any]:
    page = login(browser, dashboard_server, "control")
    yield page
    page.close()


@pytest.fixture
def read_page(browser: Any, dashboard_server: DashboardServer) -> Iterator[Any]:
    page = login(browser, dashboard_server, "read")
    yield page
    page.close()


@pytest.fixture
def make_key(dashboard_server: DashboardServer) -> Callable[[str, str], Callable[[], None]]:
    """make_key(name, scopes) adds a key to the server's (``dashboard_server.keys[name]``); it
    returns a function that revokes it."""

    def make(name: str, scopes: str) -> Callable[[], None]:
        dashboard_server.keys[name] = create_key(dashboard_server.db_url, scopes, name)
        return lambda: revoke_key(dashboard_server.db_url, name)

    return make


@pytest.fixture(scope="session")
def runs_request() -> dict:
    """The body of the runs page's refresh callback as the browser posts it to
    /dashboard/_dash-update-component (filters unset), with its parts to vary."""
    outputs = [{"id": c, "property": p} for c, p in RUNS_OUTPUTS]
    inputs = [
        {"id": "runs-interval", "property": "n_intervals", "value": 1},
        *({"id": c, "property": "value", "value": None} for c in RUNS_FILTERS),
        {"id": "runs-more", "property": "n_clicks", "value": 0},
    ]
    output = "...".join(f"{c}.{p}" for c, p in RUNS_OUTPUTS).join(["..", ".."])
    return {"output": output, "outputs": outputs, "inputs": inputs}
