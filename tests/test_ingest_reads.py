"""What ingest reads under a run's lock, in-process against a real database (SQLite and
PostgreSQL): a batch of steps the run has no row for reads no step rows, and a process that
evaluated the run keeps its rules and alert states while the run's `alert_epoch` stays; the
triggers move the epoch for every change of them, also one made behind the server's back."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from fastapi.testclient import TestClient
from sqlalchemy import event, select, text
from vantage.server.models import Run, Step


@contextmanager
def _statements(client: TestClient) -> Iterator[list[str]]:
    """The SQL statements the server runs inside the block."""
    seen: list[str] = []

    def record(conn, cursor, statement, *_args) -> None:  # noqa: ANN001
        seen.append(" ".join(statement.split()))

    engine = client.app.state.engine
    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


def _send(client: TestClient, run_id: str, step: int, groups: list, **record) -> dict:
    body = {"attempt": 1, "records": [{"step": step, "groups": groups, **record}]}
    r = client.post(f"/api/v1/runs/{run_id}/steps", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def _reads(statements: list[str], table: str) -> list[str]:
    """The reads of whole rows of ``table`` (of steps: ingest's, not the alert window's)."""
    column = {"steps": "steps.effective_by_rank", "alert_rules": "alert_rules.threshold"}[table]
    return [s for s in statements if s.startswith("SELECT") and column in s]


def _alerts(client: TestClient, run_id: str) -> list[tuple[str, str]]:
    alerts = client.get("/api/v1/alerts", params={"run_id": run_id}).json()["alerts"]
    return sorted((a["rule"], a["state"]) for a in alerts)


def test_a_batch_of_new_steps_reads_neither_step_rows_nor_rules(app_client):
    run_id = app_client.post("/api/v1/runs", json={"name": "lean"}).json()["run_id"]
    with _statements(app_client) as first:
        _send(app_client, run_id, 1, [[1, 1], [0, 1]])
    assert _reads(first, "steps") == [] and len(_reads(first, "alert_rules")) == 1
    with _statements(app_client) as steady:
        answer = _send(app_client, run_id, 2, [[1, 1], [0, 1]])
    assert answer["steps"][0]["acr"] == 0.5
    assert _reads(steady, "steps") == [] and _reads(steady, "alert_rules") == []
    # PostgreSQL writes the new step row in the statement that saves the run's state
    writes = [s for s in steady if "INSERT INTO steps" in s]
    postgres = app_client.app.state.engine.dialect.name == "postgresql"
    assert [s.startswith("WITH new_step AS") for s in writes] == [postgres]
    # A step the run has a row for is read, and merged into.
    with _statements(app_client) as again:
        answer = _send(app_client, run_id, 2, [[0, 0]], rank=1, world_size=2)
    assert len(_reads(again, "steps")) == 1
    assert answer["steps"][0]["n_groups"] == 3 and answer["steps"][0]["acr"] == 2 / 3


def test_an_unevaluated_step_is_read_until_it_is_evaluated(app_client):
    body = {"name": "ranks", "world_size": 2}
    run_id = app_client.post("/api/v1/runs", json=body).json()["run_id"]
    _send(app_client, run_id, 1, [[1, 1]], rank=0)  # rank 1 still owes step 1
    with _statements(app_client) as waiting:
        _send(app_client, run_id, 1, [[0, 1]], rank=1)  # step 1 complete: evaluated
    assert len(_reads(waiting, "steps")) == 1
    with _statements(app_client) as done:
        _send(app_client, run_id, 2, [[0, 1]], rank=0)
    assert _reads(done, "steps") == []
    with app_client.app.state.session_factory() as session:
        rows = session.execute(select(Step.step, Step.evaluated).where(Step.run_id == run_id))
        assert sorted(rows) == [(1, True), (2, False)]
        run = session.get(Run, run_id)
        assert run.has_unevaluated and run.newest_steps == {"train": 2}


def test_a_run_whose_steps_are_not_known_reads_its_step_rows(app_client):
    """A run made without the API (a seeded database) does not tell which steps have rows;
    nor does one whose `newest_steps` is null. Ingest then reads them, and merges the batch
    into the row rather than inserting a second one."""
    with app_client.app.state.session_factory() as session:
        session.add(Run(id="seeded", name="seeded", tags=[], client_health={}))
        session.commit()
        assert session.get(Run, "seeded").newest_steps is None
    _send(app_client, "seeded", 5, [[1, 1]], scalars={"loss": 1.0}, world_size=2)
    with app_client.app.state.engine.begin() as conn:
        conn.execute(text("UPDATE runs SET newest_steps = NULL, has_unevaluated = false"))
    with _statements(app_client) as seen:
        answer = _send(app_client, "seeded", 5, [[0, 1]], rank=1, world_size=2)
    assert len(_reads(seen, "steps")) == 1 and answer["steps"][0]["n_groups"] == 2
    points = app_client.get("/api/v1/runs/seeded/metrics").json()["points"]
    assert [(p["step"], p["n_groups"], p["scalars"]) for p in points] == [(5, 2, {"loss": 1.0})]


def test_a_rule_changed_behind_the_servers_back_is_evaluated_as_changed(app_client):
    run_id = app_client.post("/api/v1/runs", json={"name": "rule"}).json()["run_id"]
    rule = {"name": "half", "run_id": run_id, "metric": "acr", "op": ">", "threshold": 0.9}
    rule_id = app_client.post("/api/v1/alert-rules", json=rule).json()["id"]
    _send(app_client, run_id, 1, [[1, 1], [0, 1]])  # acr 0.5: the process keeps the rules
    assert ("half", "firing") not in _alerts(app_client, run_id)
    with app_client.app.state.engine.begin() as conn:  # as another process would
        conn.execute(text("UPDATE alert_rules SET threshold = 0.4 WHERE id = :id"), {"id": rule_id})
    _send(app_client, run_id, 2, [[1, 1], [0, 1]])
    assert ("half", "firing") in _alerts(app_client, run_id)


def test_a_state_changed_behind_the_servers_back_is_evaluated_as_changed(app_client):
    run_id = app_client.post("/api/v1/runs", json={"name": "state"}).json()["run_id"]
    rule = {"name": "three", "run_id": run_id, "metric": "acr", "op": ">", "threshold": 0.4}
    app_client.post("/api/v1/alert-rules", json=rule | {"for_steps": 3})
    _send(app_client, run_id, 1, [[1, 1], [0, 1]])
    _send(app_client, run_id, 2, [[1, 1], [0, 1]])  # two steps of three
    with app_client.app.state.engine.begin() as conn:
        conn.execute(text("UPDATE alert_states SET streak = 0 WHERE run_id = :r"), {"r": run_id})
    _send(app_client, run_id, 3, [[1, 1], [0, 1]])
    assert ("three", "firing") not in _alerts(app_client, run_id)  # one step of three
    _send(app_client, run_id, 4, [[1, 1], [0, 1]])
    _send(app_client, run_id, 5, [[1, 1], [0, 1]])
    assert ("three", "firing") in _alerts(app_client, run_id)


def test_the_alert_epoch_moves_with_the_rules_that_apply_and_the_runs_states(app_client):
    def epoch(run_id: str) -> int:
        with app_client.app.state.session_factory() as session:
            return session.scalar(select(Run.alert_epoch).where(Run.id == run_id))

    def rule(**scope) -> int:
        body = {"name": f"r{len(made)}", "metric": "acr", "op": ">", "threshold": 2, **scope}
        made.append(app_client.post("/api/v1/alert-rules", json=body).json()["id"])
        return made[-1]

    made: list[int] = []
    runs = {}
    for name, project in (("a", "p"), ("b", "q")):
        body = {"name": name, "project": project}
        runs[name] = app_client.post("/api/v1/runs", json=body).json()["run_id"]
    before = {name: epoch(run_id) for name, run_id in runs.items()}
    rule(project="q")  # not a's
    rule(run_id=runs["b"], project="q")
    assert epoch(runs["a"]) == before["a"] and epoch(runs["b"]) > before["b"]
    before = {name: epoch(run_id) for name, run_id in runs.items()}
    global_rule = rule()
    assert all(epoch(run_id) > before[name] for name, run_id in runs.items())
    before = {name: epoch(run_id) for name, run_id in runs.items()}
    app_client.put(f"/api/v1/alert-rules/{global_rule}", json={"threshold": 3})
    assert all(epoch(run_id) > before[name] for name, run_id in runs.items())
    # a step evaluated against a new rule stores a state of it for the run: a's epoch moves
    before = epoch(runs["a"])
    _send(app_client, runs["a"], 1, [[1, 0], [0, 1]])
    assert epoch(runs["a"]) > before
    # a step that changes no state leaves it (ACR 0 moves no streak)
    before = epoch(runs["a"])
    _send(app_client, runs["a"], 2, [[1, 0], [0, 1]])
    assert epoch(runs["a"]) == before
    assert app_client.delete(f"/api/v1/runs/{runs['a']}").status_code == 204  # cascades
