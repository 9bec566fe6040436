"""Ingest keeps or drops the alert window kept with the run's progress (`runs.eval_progress`,
server/alerts.py `_walk`): data that changes an earlier step's window inputs drops it, other data
for that step keeps it. In-process against a real database (SQLite and PostgreSQL)."""

from __future__ import annotations

from fastapi.testclient import TestClient
from sqlalchemy import select
from vantage.server.models import Run


def send(client: TestClient, run_id: str, records: list[dict]) -> None:
    r = client.post(f"/api/v1/runs/{run_id}/steps", json={"attempt": 1, "records": records})
    assert r.status_code == 200, r.text


def progress(client: TestClient, run_id: str) -> list:
    with client.app.state.session_factory() as s:
        return s.scalar(select(Run.eval_progress).where(Run.id == run_id))["train"]


def test_only_changed_window_inputs_drop_the_kept_window(app_client):
    run_id = app_client.post("/api/v1/runs", json={"name": "w"}).json()["run_id"]
    send(app_client, run_id, [{"step": 1, "groups": [[0, 1]]}, {"step": 2, "groups": [[1, 1]]}])
    step, attempt, frontier, window = progress(app_client, run_id)
    assert (step, attempt, frontier) == (2, 1, 2) and window["valid"] == 2
    send(app_client, run_id, [{"step": 1, "scalars": {"loss": 0.5}}])  # no window input
    assert len(progress(app_client, run_id)) == 4
    send(app_client, run_id, [{"step": 1, "rank": 1, "groups": [[0, 0]]}])  # a late rank
    assert progress(app_client, run_id) == [2, 1, 2]
    send(app_client, run_id, [{"step": 3, "groups": [[0, 1]]}])  # rebuilt from the database
    *_, window = progress(app_client, run_id)
    assert (window["collapsed"], window["valid"]) == (2, 4)


def test_run_state_writes_none_as_sql_null(app_client):
    run_id = app_client.post("/api/v1/runs", json={"name": "n"}).json()["run_id"]
    send(app_client, run_id, [{"step": 1, "groups": [[0, 1]]}])
    with app_client.app.state.session_factory() as s:
        reported = select(Run.id).where(Run.id == run_id, Run.mitigation_reported.is_(None))
        assert s.scalar(reported) == run_id
