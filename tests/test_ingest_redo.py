"""Ingest's redo paths, in-process against a real database (SQLite and PostgreSQL): a failing
alert evaluation never costs the batch, and a stale per-process cache of a run's fixed fields
(another process deleted and re-created the run) is caught under the run's lock."""

from __future__ import annotations

from fastapi.testclient import TestClient
from sqlalchemy import select, update
from vantage.client.acr import ACRSettings
from vantage.server.alerts import evaluation as alerts
from vantage.server.alerts.models import WebhookMessage
from vantage.server.ingest import groups as ingest
from vantage.server.models import GroupBlock, Run, Step


def _steps(client: TestClient, run_id: str, step: int) -> dict:
    body = {"attempt": 1, "records": [{"step": step, "groups": [[1, 1], [0, 1]]}]}
    r = client.post(f"/api/v1/runs/{run_id}/steps", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_failing_alert_evaluation_keeps_the_batch(app_client, monkeypatch):
    run_id = app_client.post("/api/v1/runs", json={"name": "redo"}).json()["run_id"]

    def broken(*_args, **_kwargs):  # noqa: ANN002, ANN003
        raise RuntimeError("rule store unavailable")

    monkeypatch.setattr(alerts, "evaluate_locked", broken)
    answer = _steps(app_client, run_id, 1)
    assert answer["accepted"] == 2 and answer["steps"][0]["acr"] == 0.5
    points = app_client.get(f"/api/v1/runs/{run_id}/metrics").json()["points"]
    assert [(p["step"], p["n_groups"]) for p in points] == [(1, 2)]
    with app_client.app.state.session_factory() as session:  # left for the periodic pass
        assert session.scalar(select(Step.evaluated).where(Step.run_id == run_id)) is False


def test_a_stale_cached_run_is_read_again(app_client):
    run_id = app_client.post("/api/v1/runs", json={"name": "stale"}).json()["run_id"]
    _steps(app_client, run_id, 1)
    # as if another process had cached a run of this id that was deleted and created again
    ingest._RUN_INFO[run_id] = ingest.RunInfo(key=999_999, project=None, settings=ACRSettings())
    assert _steps(app_client, run_id, 2)["accepted"] == 2
    with app_client.app.state.session_factory() as session:
        key = session.scalar(select(Run.key).where(Run.id == run_id))
        keys = set(session.scalars(select(GroupBlock.run_key)))
    assert keys == {key} and ingest._RUN_INFO[run_id].key == key


def test_deleting_a_run_deletes_its_group_blocks(app_client):
    """Group blocks carry no foreign key: run deletion removes them itself, and a run created
    again under the same id stores its groups afresh (not as duplicates of the old ones)."""
    run_id = app_client.post("/api/v1/runs", json={"name": "gone"}).json()["run_id"]
    _steps(app_client, run_id, 1)
    with app_client.app.state.session_factory() as session:
        key = session.scalar(select(Run.key).where(Run.id == run_id))
    assert app_client.delete(f"/api/v1/runs/{run_id}").status_code == 204
    with app_client.app.state.session_factory() as session:
        assert session.scalar(select(GroupBlock.run_key).where(GroupBlock.run_key == key)) is None
    app_client.post("/api/v1/runs", json={"run_id": run_id, "name": "again"})
    assert _steps(app_client, run_id, 1)["accepted"] == 2


def test_deleting_a_run_drops_its_unsent_webhook_messages(app_client):
    """A message to a failing target was retried for a day about a run that no longer existed
    (a trial): deleting the run drops its alerts' pending messages to targets that failed them
    (the resolution it queues to one too), and only those."""
    run_id = app_client.post("/api/v1/runs", json={"name": "gone"}).json()["run_id"]
    other = app_client.post("/api/v1/runs", json={"name": "kept"}).json()["run_id"]
    rule = {
        "name": "all-pass",
        "metric": "acr",
        "op": ">",
        "threshold": 0.5,
        "notify": ["http://127.0.0.1:9/hook"],
    }  # fmt: skip (nothing listens on port 9)
    assert app_client.post("/api/v1/alert-rules", json=rule).status_code == 201
    for rid in (run_id, other):
        records = [{"step": 1, "groups": [[1, 1]]}]
        r = app_client.post(f"/api/v1/runs/{rid}/steps", json={"attempt": 1, "records": records})
        assert r.status_code == 200, r.text

    def pending() -> int:
        with app_client.app.state.session_factory() as session:
            q = select(WebhookMessage.id).where(WebhookMessage.status == "pending")
            return len(session.scalars(q).all())

    assert pending() == 2
    with app_client.app.state.session_factory() as session:  # both tried once, and failed
        session.execute(update(WebhookMessage).values(attempts=1))
        session.commit()
    assert app_client.delete(f"/api/v1/runs/{run_id}").status_code == 204
    assert pending() == 1


def test_a_batch_that_keeps_colliding_gets_503_with_retry_after(app_client, monkeypatch):
    """Many concurrent senders of one step's groups can outrun the redo; the 503 tells the
    client's sender how long to wait (a trial saw 27 of 80 such 503s without a Retry-After)."""
    from vantage.server.ingest import GroupsExist
    from vantage.server.ingest import transaction as ingest_route

    run_id = app_client.post("/api/v1/runs", json={"name": "busy"}).json()["run_id"]

    def collide(*_args, **_kwargs):  # noqa: ANN002, ANN003
        raise GroupsExist

    monkeypatch.setattr(ingest_route, "_ingest_once", collide)
    body = {"attempt": 1, "records": [{"step": 1, "groups": [[1, 1]]}]}
    r = app_client.post(f"/api/v1/runs/{run_id}/steps", json=body)
    assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
    assert "send it again" in r.json()["detail"]
