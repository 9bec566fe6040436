"""On PostgreSQL, ingest commits under the run's lock without waiting for its WAL to reach the
disk, and answers only after a transaction of its own, taken once the lock is released, found
that WAL flushed (`vantage.server.locks.wait_until_durable`): an answered batch is on disk, and
the run's lock is not held through the disk's write. In-process against real databases."""

from __future__ import annotations

import pytest
from sqlalchemy import event, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session
from vantage.server.ingest import transaction as ingest_route
from vantage.server.locks import wait_until_durable

from tests.test_ingest_reads import _send


def _events(client):  # noqa: ANN001, ANN202
    """Record the statements and commits of the app's engine, each with whether its
    connection was in autocommit, in order; returns the list and a function that stops."""
    seen: list[tuple[str, str, bool]] = []
    engine = client.app.state.engine

    def statement(conn, _cursor, sql, *_args) -> None:  # noqa: ANN001
        autocommit = getattr(conn.connection.driver_connection, "autocommit", False)
        seen.append(("execute", " ".join(sql.split()), autocommit is True))

    def commit(conn) -> None:  # noqa: ANN001
        seen.append(("commit", "", False))

    event.listen(engine, "before_cursor_execute", statement)
    event.listen(engine, "commit", commit)

    def stop() -> None:
        event.remove(engine, "before_cursor_execute", statement)
        event.remove(engine, "commit", commit)

    return seen, stop


def _postgres(client) -> bool:  # noqa: ANN001
    return client.app.state.engine.dialect.name == "postgresql"


def test_ingest_commits_asynchronously_and_answers_after_the_flush(app_client):
    run_id = app_client.post("/api/v1/runs", json={"name": "durable"}).json()["run_id"]
    _send(app_client, run_id, 1, [[1, 1], [0, 1]])
    seen, stop = _events(app_client)
    try:
        answer = _send(app_client, run_id, 2, [[1, 1], [0, 1]])
    finally:
        stop()
    assert answer["accepted"] == 2
    kinds = [(kind, sql) for kind, sql, _ in seen]
    flushes = [i for i, (_, sql) in enumerate(kinds) if "pg_logical_emit_message" in sql]
    if not _postgres(app_client):  # SQLite commits durably at once
        assert flushes == [] and "synchronous_commit" not in str(kinds)
        return
    lock = [i for i, (_, sql) in enumerate(kinds) if "FOR UPDATE" in sql]
    commits = [i for i, (kind, _) in enumerate(kinds) if kind == "commit"]
    assert len(lock) == 1 and "set_config" in kinds[lock[0]][1]
    # the batch's commit comes after the lock read, and the flush, alone and in autocommit (its
    # own transaction, which waits for the disk), after that commit and last
    executed = [i for i, (kind, _) in enumerate(kinds) if kind == "execute"]
    assert len(flushes) == 1 and flushes[0] == executed[-1] and seen[flushes[0]][2] is True
    assert lock[0] < commits[0] < flushes[0]
    assert all(not autocommit for _, sql, autocommit in seen[: flushes[0]])


def test_wait_until_durable_flushes_the_wal_past_an_asynchronous_commit(app_client):
    """PostgreSQL flushes the WAL at commit only for a transaction that has an id and wrote
    WAL: the flush was ``SELECT pg_current_xact_id()`` (an id, no WAL), which committed
    without flushing, so that a crash of the database (``pg_ctl restart -m immediate``) lost
    batches answered 200 (benchmarks/soak.py). The WAL writer flushes on its own every 200 ms:
    each try reads the positions within milliseconds, and the old flush failed nearly all."""
    if not _postgres(app_client):
        pytest.skip("PostgreSQL's WAL")
    run_id = app_client.post("/api/v1/runs", json={"name": "on-disk"}).json()["run_id"]
    behind = 0
    with Session(app_client.app.state.engine) as session:
        for _ in range(20):
            session.execute(text("SELECT set_config('synchronous_commit', 'off', true)"))
            session.execute(text("UPDATE runs SET notes = 'x' WHERE id = :id"), {"id": run_id})
            session.commit()
            # every WAL record so far (the commit's, and others' before it) must reach the disk
            inserted = session.execute(text("SELECT pg_current_wal_insert_lsn()")).scalar()
            session.commit()
            wait_until_durable(session)
            flushed = session.execute(
                text("SELECT pg_current_wal_flush_lsn() >= CAST(:lsn AS pg_lsn)"), {"lsn": inserted}
            ).scalar()
            session.commit()
            behind += not flushed
    assert behind == 0


def test_the_asynchronous_commit_stays_in_its_transaction(app_client):
    if not _postgres(app_client):
        pytest.skip("PostgreSQL's synchronous_commit")
    run_id = app_client.post("/api/v1/runs", json={"name": "scoped"}).json()["run_id"]
    for step in range(3):
        _send(app_client, run_id, step, [[0, 1]])
    engine = app_client.app.state.engine
    held = [engine.connect() for _ in range(engine.pool.checkedin() or 1)]
    try:  # every pooled connection: the setting and the driver's autocommit are back
        for conn in held:
            assert conn.execute(text("SHOW synchronous_commit")).scalar() == "on"
            assert conn.connection.driver_connection.autocommit is False
    finally:
        for conn in held:
            conn.close()


def test_a_batch_whose_flush_fails_is_not_answered_and_its_resend_stores_nothing_twice(
    app_client, monkeypatch
):
    run_id = app_client.post("/api/v1/runs", json={"name": "unflushed"}).json()["run_id"]

    def lost(_session) -> None:  # noqa: ANN001
        raise OperationalError("SELECT pg_logical_emit_message()", {}, Exception("closed"))

    monkeypatch.setattr(ingest_route, "wait_until_durable", lost)
    body = {"attempt": 1, "records": [{"step": 1, "groups": [[1, 1], [0, 1], [0, 0]]}]}
    refused = app_client.post(f"/api/v1/runs/{run_id}/steps", json=body)
    assert refused.status_code == 503 and refused.headers["retry-after"]
    monkeypatch.undo()
    # the client sends it again: what the first try committed counts once
    again = app_client.post(f"/api/v1/runs/{run_id}/steps", json=body).json()
    assert (again["accepted"], again["duplicates"]) == (0, 3)
    points = app_client.get(f"/api/v1/runs/{run_id}/metrics").json()["points"]
    assert [(p["step"], p["n_groups"], p["acr"]) for p in points] == [(1, 3, 2 / 3)]
