"""mount(): cheap import, one Dash app per FastAPI app, each reading its own database."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

VANTAGE = str(Path(sys.executable).with_name("vantage"))


def test_importing_the_package_does_not_import_dash():
    code = "import sys, vantage.dashboard; assert 'dash' not in sys.modules, 'dash imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.fixture(scope="module")
def two_apps(tmp_path_factory):
    from vantage.server.main import create_app
    from vantage.server.settings import Settings

    apps = {}
    for name in ("alpha", "beta"):
        url = f"sqlite:///{tmp_path_factory.mktemp(name) / 'v.db'}"
        subprocess.run([VANTAGE, "db", "upgrade", "--database-url", url], check=True)
        settings = Settings(database_url=url, auth_enabled=False, alert_worker=False)
        apps[name] = create_app(settings)
    for name, app in apps.items():
        with TestClient(app) as c:
            c.post("/api/v1/runs", json={"name": f"run-{name}", "tags": [name]}).raise_for_status()
    return apps


def runs_callback(client: TestClient, runs_request: dict) -> dict:
    """The runs page's data callback, called as the browser calls it."""
    body = {**runs_request, "changedPropIds": ["runs-interval.n_intervals"], "state": []}
    r = client.post("/dashboard/_dash-update-component", json=body)
    assert r.status_code == 200, r.text[:500]
    return r.json()["response"]


def test_each_app_serves_its_own_runs(two_apps, runs_request):
    for name, app in two_apps.items():
        other = "beta" if name == "alpha" else "alpha"
        with TestClient(app) as c:
            assert c.get("/dashboard", follow_redirects=False).headers["location"] == "/dashboard/"
            assert c.get("/dashboard/runs/anything").status_code == 200
            response = runs_callback(c, runs_request)
            assert response["runs-tag"]["options"] == [name]
            assert f"run-{name}" in str(response["runs-body"]["children"])
            assert f"run-{other}" not in str(response["runs-body"]["children"])
