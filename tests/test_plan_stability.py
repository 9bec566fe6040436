"""Ingest's work per batch must not grow with the run (PostgreSQL).

Without table statistics (before an ANALYZE; this machine's autovacuum is off) PostgreSQL
planned the read of a batch's step rows, whose condition ORed the batch's steps with the run's
unevaluated ones, as a scan of every step of the run; and psycopg prepares a statement at its
fifth execution on a connection, after which PostgreSQL may keep such a plan. The index entries
that ingest reads per batch are counted from PostgreSQL's statistics."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import text

STEP_INDEX_READS = text(
    "SELECT coalesce(sum(idx_tup_read), 0) FROM pg_stat_user_indexes WHERE relname = 'steps'"
)


def _send(client, run_id: str, steps: range) -> None:  # noqa: ANN001
    for step in steps:
        body = {"attempt": 1, "records": [{"step": step, "groups": [[1, 1], [0, 1]]}]}
        r = client.post(f"/api/v1/runs/{run_id}/steps", json=body)
        assert r.status_code == 200, r.text


def _index_reads(engine) -> int:  # noqa: ANN001
    """Steps' index entries read so far by every backend: each reports its counts when it has
    been idle, at most once a second (PostgreSQL 15), so wait until the sum stops moving."""
    last = -1
    for _ in range(20):
        time.sleep(1.2)
        with engine.connect() as conn:
            now = conn.execute(STEP_INDEX_READS).scalar()
        if now == last:
            return now
        last = now
    raise AssertionError("PostgreSQL's index statistics kept moving")


@pytest.mark.parametrize("app_client", ["postgres"], indirect=True)  # a PostgreSQL planner matter
def test_index_reads_per_batch_stay_flat_as_a_run_grows(app_client):
    engine = app_client.app.state.engine
    run_id = app_client.post("/api/v1/runs", json={"name": "grows"}).json()["run_id"]
    _send(app_client, run_id, range(1, 301))
    before = _index_reads(engine)
    _send(app_client, run_id, range(301, 341))
    per_batch = (_index_reads(engine) - before) / 40
    assert per_batch < 20, f"{per_batch:.0f} step index entries read per batch at 300 steps"
