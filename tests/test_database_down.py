"""A server whose PostgreSQL database stops taking connections: the API answers JSON 503s with
Retry-After (not plain-text 500s), /metrics still serves the process's counters, the background
loops back off instead of logging a traceback per poll, and all of it recovers when the database
is back (a trial's finding)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import psycopg
import pytest

from tests.helpers.cli import create_key, run_cli
from tests.helpers.postgres import PG_ADMIN_URL, new_postgres_database
from tests.helpers.server import start_server


def _set_connections(database_url: str, allowed: bool) -> None:
    """Let the database take connections or not; when not, end the ones it has."""
    name = database_url.rsplit("/", 1)[1]
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {str(allowed).lower()}')
        if not allowed:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (name,),
            )


@pytest.fixture
def server_on_pg(postgres_url: str, tmp_path) -> Iterator:  # noqa: ANN001
    url, drop = new_postgres_database()
    run_cli("db", "upgrade", "--database-url", url)
    key = create_key(url, "ingest,read,control,admin", "all")
    srv = start_server(url, tmp_path)
    srv.keys = {"all": key}  # every scope: the dashboard's read too
    try:
        yield srv
    finally:
        srv.stop()
        _set_connections(url, True)
        drop()


def test_an_unreachable_database_gets_json_503s_and_the_server_recovers(server_on_pg):
    srv = server_on_pg
    with srv.client() as api:
        run = api.post("/api/v1/runs", json={"name": "down"}).json()
        batch = {"attempt": 1, "records": [{"step": 0, "groups": [{"rewards": [0, 1]}]}]}
        steps = f"/api/v1/runs/{run['run_id']}/steps"
        assert api.post(steps, json=batch).status_code == 200

        cookie = {"Cookie": f"vantage_dashboard_key={srv.keys['all']}"}
        export = f"/dashboard/export/{run['run_id']}/metrics.csv"
        assert api.get(export, headers=cookie).status_code == 200  # the key is now cached

        _set_connections(srv.database_url, False)
        started = time.monotonic()
        # the dashboard too: an open page's updates got plain-text 500s and a traceback each
        # (a trial); first with the key's check cached, then (below) with it expired
        r = api.get(export, headers=cookie)
        assert r.status_code == 503 and r.headers["retry-after"] == "5", r.text
        for method, path, body in (("GET", "/api/v1/runs", None), ("POST", steps, batch)):
            r = api.request(method, path, json=body)
            assert r.status_code == 503, r.text
            assert r.headers["content-type"] == "application/json"
            assert r.headers["retry-after"] == "5"
            assert "database is unavailable" in r.json()["detail"]
            assert "127.0.0.1" not in r.text  # no host or port in the answer
        assert api.get("/readyz").status_code == 503
        scrape = api.get("/metrics")
        assert scrape.status_code == 200, scrape.text
        assert "vantage_database_up 0" in scrape.text
        assert re.search(r"^vantage_ingest_requests_total 1\.0$", scrape.text, re.M), scrape.text

        time.sleep(max(0.0, 6.0 - (time.monotonic() - started)))  # the key's check expired
        for path in (export, "/dashboard/", "/dashboard/_dash-layout"):
            r = api.get(path, headers=cookie)
            assert r.status_code == 503 and r.headers["retry-after"] == "5", (path, r.text)
            assert "database is unavailable" in r.json()["detail"]
        log = srv.log_path.read_text()
        # a traceback (with its chained cause) for the first failure of each loop, none else
        first_failures = log.count("failed; retrying with back-off")
        assert first_failures <= 2 and log.count("Traceback") <= 2 * first_failures, log[-3000:]

        _set_connections(srv.database_url, True)
        assert api.get("/api/v1/runs").status_code == 200
        assert (
            api.post(steps, json={**batch, "records": [{**batch["records"][0], "step": 1}]}).json()[
                "accepted"
            ]
            == 1
        )
        scrape = api.get("/metrics").text
        assert "vantage_database_up 1" in scrape
        assert f'run_id="{run["run_id"]}"' in scrape
