"""A real `vantage serve` (auth on, SQLite) with keys and seeded runs, and a headless Chromium.

The browser tests need Debian's chromium (/usr/bin/chromium) and the playwright package; they
skip when either is missing. Everything here is session-scoped: one server, one browser.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

VANTAGE = str(Path(sys.executable).with_name("vantage"))
CHROMIUM = os.environ.get("VANTAGE_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def create_key(db_url: str, name: str, scopes: str) -> str:
    out = subprocess.run(
        [VANTAGE, "keys", "create", "--name", name, "--scopes", scopes, "--database-url", db_url],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip().splitlines()[-1]


class Server:
    def __init__(self, url: str, keys: dict[str, str], runs: dict[str, str], db_url: str):
        self.url, self.keys, self.runs, self.db_url = url, keys, runs, db_url

    def api(self, key: str = "ingest") -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.keys[key]}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> Server:
    from vantage.dashboard import sample_data

    folder = tmp_path_factory.mktemp("vantage")
    db_url = f"sqlite:///{folder / 'vantage.db'}"
    subprocess.run([VANTAGE, "db", "upgrade", "--database-url", db_url], check=True)
    keys = {
        "ingest": create_key(db_url, "trainer", "ingest,read"),
        "control": create_key(db_url, "lead", "read,control"),
        "read": create_key(db_url, "viewer", "read"),
        "admin": create_key(db_url, "operator", "admin"),
    }
    port = free_port()
    env = {**os.environ, "VANTAGE_DASHBOARD_REFRESH_S": "0.5"}
    log = open(folder / "server.log", "w")  # noqa: SIM115 - closed at teardown
    proc = subprocess.Popen(
        [VANTAGE, "serve", "--host", "127.0.0.1", "--port", str(port), "--database-url", db_url,
         "--no-upgrade"],
        stdout=log, stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            log.close()
            raise RuntimeError((folder / "server.log").read_text()[-3000:])
        time.sleep(0.2)
    runs = sample_data.seed(url, keys["ingest"], steps=120)
    srv = Server(url, keys, runs, db_url)
    srv.log_path = folder / "server.log"
    yield srv
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


@pytest.fixture(scope="session")
def browser():
    playwright = pytest.importorskip("playwright.sync_api")
    if not shutil.which(CHROMIUM) and not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


def login(browser, server: Server, key_name: str, path: str = "/dashboard/"):
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


@pytest.fixture
def login_as(browser, server):
    """login_as(key_name, path) -> a logged-in page (closed by the test)."""
    return lambda key_name, path="/dashboard/": login(browser, server, key_name, path)


@pytest.fixture
def control_page(browser, server):
    page = login(browser, server, "control")
    yield page
    page.close()


@pytest.fixture
def read_page(browser, server):
    page = login(browser, server, "read")
    yield page
    page.close()


@pytest.fixture
def make_key(server):
    """make_key(name, scopes) adds a key to the server's (``server.keys[name]``); it returns a
    function that revokes it."""

    def make(name: str, scopes: str):  # noqa: ANN202
        server.keys[name] = create_key(server.db_url, name, scopes)
        revoke = [VANTAGE, "keys", "revoke", name, "--database-url", server.db_url]
        return lambda: subprocess.run(revoke, check=True, capture_output=True)

    return make


RUNS_OUTPUTS = [
    ("runs-body", "children"),
    ("runs-project", "options"),
    ("runs-tag", "options"),
    ("runs-count", "children"),
    ("runs-more", "style"),
]
RUNS_FILTERS = ("runs-project", "runs-tag", "runs-status", "runs-order")


@pytest.fixture(scope="session")
def runs_request():
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
