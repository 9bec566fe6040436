"""The dashboard tests' server (auth on, a key per role, seeded sample runs) and headless
Chromium.

The browser tests need Debian's chromium (``VANTAGE_TEST_CHROMIUM``, default /usr/bin/chromium)
and the playwright package; they skip when either is missing, unless
``VANTAGE_REQUIRE_BROWSER=1`` (set by .ci/run), where they fail.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.cli import create_key, run_cli
from tests.helpers.server import ServerProcess, start_server

CHROMIUM = os.environ.get("VANTAGE_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
REQUIRE_BROWSER = os.environ.get("VANTAGE_REQUIRE_BROWSER") == "1"

# key name -> (the key's name in the database, its scopes)
ROLES = {
    "ingest": ("trainer", "ingest,read"),
    "control": ("lead", "read,control"),
    "read": ("viewer", "read"),
    "admin": ("operator", "admin"),
}

# The runs page's refresh callback: its outputs and the filters it reads.
RUNS_OUTPUTS = [
    ("runs-body", "children"),
    ("runs-project", "options"),
    ("runs-tag", "options"),
    ("runs-count", "children"),
    ("runs-more", "style"),
]
RUNS_FILTERS = ("runs-project", "runs-tag", "runs-status", "runs-order")


@dataclass
class DashboardServer:
    """A `vantage serve` with auth on: ``keys`` maps a role (ingest, control, read, admin and
    those a test adds) to its key, ``runs`` a sample run's name to its id."""

    process: ServerProcess
    keys: dict[str, str]
    runs: dict[str, str]

    @property
    def url(self) -> str:
        return self.process.url

    @property
    def db_url(self) -> str:
        return self.process.database_url

    @property
    def log_path(self) -> Path | None:
        return self.process.log_path

    def api(self, key: str = "ingest") -> httpx.Client:
        """An HTTP client on the server sending the key of role ``key``."""
        headers = {"Authorization": f"Bearer {self.keys[key]}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)


def start_dashboard_server(folder: Path) -> DashboardServer:
    """A server on a SQLite file in ``folder``, with a key per role and the sample runs
    (120 steps each); its dashboard refreshes every 0.5 s."""
    from vantage.dashboard import sample_data

    db_url = f"sqlite:///{folder / 'vantage.db'}"
    run_cli("db", "upgrade", "--database-url", db_url)
    keys = {role: create_key(db_url, scopes, name) for role, (name, scopes) in ROLES.items()}
    process = start_server(
        db_url,
        folder,
        "--no-upgrade",
        env={"VANTAGE_DASHBOARD_REFRESH_S": "0.5"},
        log_name="server.log",
    )
    runs = sample_data.seed(process.url, keys["ingest"], steps=120)
    return DashboardServer(process, keys, runs)


def chromium_or_skip() -> Any:
    """playwright's sync API, when it and Chromium are there; else skip (fail under
    ``VANTAGE_REQUIRE_BROWSER=1``)."""
    missing = None
    try:
        import playwright.sync_api as playwright
    except ImportError as exc:
        missing = f"playwright is not installed: {exc}"
    else:
        if not shutil.which(CHROMIUM) and not Path(CHROMIUM).exists():
            missing = f"no Chromium at {CHROMIUM} (apt-get install chromium)"
    if missing and REQUIRE_BROWSER:
        pytest.fail(f"a browser is required (VANTAGE_REQUIRE_BROWSER=1) but {missing}")
    if missing:
        pytest.skip(missing)
    return playwright


def login(browser: Any, server: DashboardServer, key_name: str, path: str = "/dashboard/") -> Any:
    """A new browser page logged in with one of the server's keys, opened at ``path``."""
    page = browser.new_page(viewport={"width": 1400, "height": 1400})
    page.set_default_timeout(15_000)
    page.on("dialog", lambda dialog: dialog.accept())
    page.goto(server.url + path)
    page.wait_for_selector("#key")
    page.fill("#key", server.keys[key_name])
    page.click("#login")
    page.wait_for_url(f"**{path}")
    return page
