"""`GET /metrics` answers from the points stored with the step rows (`steps.point`): every
ingest path leaves each stored point equal to the one its row's columns give, and rows without
one (written before migration 0004) are answered from their columns. In-process against a real
database (SQLite and PostgreSQL)."""

from __future__ import annotations

import orjson
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import select, update
from vantage.server.ingest.steps import dump_exact, load_exact
from vantage.server.models import Step
from vantage.server.queries import point_json


def send(client: TestClient, run: dict, records: list[dict], attempt: int | None = None) -> None:
    body = {"attempt": attempt or run["attempt"], "records": records}
    r = client.post(f"/api/v1/runs/{run['run_id']}/steps", json=body)
    assert r.status_code == 200, r.text


def stored_rows(client: TestClient, run_id: str) -> list[Step]:
    with client.app.state.session_factory() as s:
        return list(s.scalars(select(Step).where(Step.run_id == run_id).order_by(Step.step)))


def test_every_ingest_path_stores_the_point_its_columns_give(app_client: TestClient) -> None:
    client = app_client
    run = client.post("/api/v1/runs", json={"name": "p", "world_size": 2, "launch_id": "a"}).json()
    send(client, run, [{"step": s, "groups": [[0, 1], [1, 1]], "time": 5.0} for s in range(1, 4)])
    send(client, run, [{"step": 2, "rank": 1, "groups": [[0, 0]], "scalars": {"loss": 0.5}}])
    send(client, run, [{"step": 2, "groups": [[0, 1], [1, 1]]}])  # duplicates change nothing
    send(client, run, [{"step": 3, "effective": {"n_valid": 2, "n_zero_advantage": 1}}])
    resumed = client.post("/api/v1/runs", json={"run_id": run["run_id"], "name": "p"}).json()
    send(client, resumed, [{"step": 3, "groups": [[1, 1, 1]]}])  # a newer attempt takes step 3
    rows = stored_rows(client, run["run_id"])
    assert [r.step for r in rows] == [1, 2, 3]
    for row in rows:
        assert orjson.loads(row.point) == orjson.loads(point_json(row)), row.step
    points = client.get(f"/api/v1/runs/{run['run_id']}/metrics").json()["points"]
    assert points[1]["scalars"] == {"loss": 0.5} and points[1]["n_groups"] == 3
    assert points[2]["attempt"] == 2 and points[2]["acr"] == 1.0
    assert points == [orjson.loads(point_json(r)) for r in rows]


def test_rows_without_a_stored_point_are_answered_from_their_columns(app_client) -> None:  # noqa: ANN001
    client = app_client
    run = client.post("/api/v1/runs", json={"name": "old"}).json()
    send(client, run, [{"step": s, "groups": [[0, 1], [s % 2, s % 2]]} for s in range(10)])
    before = client.get(f"/api/v1/runs/{run['run_id']}/metrics").json()
    with client.app.state.session_factory() as s:
        s.execute(update(Step).where(Step.step % 3 == 0).values(point=None))
        s.commit()
    for max_points in (5000, 4):  # every row, and the downsampled path
        got = client.get(
            f"/api/v1/runs/{run['run_id']}/metrics", params={"max_points": max_points}
        ).json()
        if max_points == 5000:
            assert got == before
        else:
            assert got["downsampled"] and 0 < len(got["points"]) <= 4
            by_step = {p["step"]: p for p in before["points"]}
            assert all(p == by_step[p["step"]] for p in got["points"])


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=-(2**1200), max_value=2**1200), st.integers(0, 1100))
def test_exact_sums_are_stored_short_and_read_back(odd: int, shift: int) -> None:
    value = odd << shift
    text = dump_exact(value)
    assert load_exact(text) == value
    assert load_exact(str(value)) == value  # the plain decimals of rows written before
    assert len(text) <= len(str(value)) + 6


def test_a_step_row_with_a_decimal_sum_merges_with_new_groups(app_client) -> None:  # noqa: ANN001
    client = app_client
    run = client.post("/api/v1/runs", json={"name": "sums", "world_size": 2}).json()
    send(client, run, [{"step": 1, "groups": [[0, 1], [1, 1]]}])
    with client.app.state.session_factory() as s:  # as a row written before dump_exact
        row = s.scalars(select(Step).where(Step.run_id == run["run_id"])).one()
        stored = row.acc["reward_sum"]
        assert "<<" in stored and len(stored) < 20
        row.acc = {**row.acc, "reward_sum": str(load_exact(stored))}
        s.commit()
    send(client, run, [{"step": 1, "rank": 1, "groups": [[0.5, 0.25]]}])
    point = client.get(f"/api/v1/runs/{run['run_id']}/metrics").json()["points"][0]
    assert point["reward_mean"] == (0 + 1 + 1 + 1 + 0.5 + 0.25) / 6
    assert "<<" in stored_rows(client, run["run_id"])[0].acc["reward_sum"]


def test_downsampled_steps_reach_postgresql_as_a_constant_array(app_client) -> None:  # noqa: ANN001
    """The kept steps of a downsampled read must be a bigint[] the planner sees as a constant
    (hashed lookup); a text parameter cast in SQL made it test each row against the whole
    array, 2.5 s for 5,000 of 20,000 steps."""
    from sqlalchemy import select as select_
    from vantage.server.queries import steps_in_array

    with app_client.app.state.session_factory() as session:
        conn = session.connection()
        if conn.dialect.name != "postgresql":
            return  # SQLite reads in chunks of IN lists
        compiled = select_(Step.step).where(steps_in_array([3, 5, 8])).compile(conn)
        with conn.connection.cursor() as cur:
            cur.execute(f"EXPLAIN {compiled}", compiled.params)
            plan = "\n".join(row[0] for row in cur.fetchall())
    assert "ANY ('{3,5,8}'::bigint[])" in plan, plan


def test_downsampled_reads_are_never_prepared(app_client) -> None:  # noqa: ANN001
    """psycopg prepares a statement that a connection runs five times, and PostgreSQL may then
    plan it once for any parameters: the kept steps would no longer be a constant array (a
    read of 5,000 of 20,000 steps took 200 ms instead of 17 once a connection had done it
    five times)."""
    from sqlalchemy import text
    from vantage.server.queries import _rows_at_steps

    with app_client.app.state.session_factory() as session:
        if session.get_bind().dialect.name != "postgresql":
            return  # SQLite reads in chunks of IN lists
        for _ in range(8):
            _rows_at_steps(session, [Step.step], "no-such-run", "train", [3, 5, 8])
        prepared = session.execute(text("SELECT statement FROM pg_prepared_statements")).all()
    assert not [s for (s,) in prepared if "ANY" in s.upper()], prepared


def test_downsampled_answers_choose_from_the_stored_series(app_client: TestClient) -> None:
    """The (step, acr) series that downsampling chooses from, and the points it reads, are the
    run's in step order whatever order the rows come in (on PostgreSQL, read also with index
    scans off so that rows arrive in the heap's order): steps sent out of order, null acr (a
    step of only degenerate groups) and step bounds give the points the plain rule picks from
    the full answer."""
    from sqlalchemy import text
    from vantage.server.queries import _downsample, run_metrics

    client = app_client
    run = client.post("/api/v1/runs", json={"name": "series"}).json()
    steps = [*range(300, -1, -1), *range(301, 420)]  # newest first, then in order
    groups = {0: [[1, 1], [0, 1]], 1: [[0, 0], [0, 0]], 2: [[1]], 3: [[0, 1], [1, 0]]}
    for i in range(0, len(steps), 100):
        send(
            client, run, [{"step": s, "groups": groups[s * 7 % 11 % 4]} for s in steps[i : i + 100]]
        )
    with client.app.state.session_factory() as session:
        if session.get_bind().dialect.name == "postgresql":
            session.execute(text("SET LOCAL enable_indexscan = off"))
            session.execute(text("SET LOCAL enable_indexonlyscan = off"))
            session.execute(text("SET LOCAL enable_bitmapscan = off"))
        for window in ({}, {"from_step": 5, "to_step": 250}, {"from_step": 400}):
            full = client.get(
                f"/api/v1/runs/{run['run_id']}/metrics", params={**window, "max_points": 10_000}
            ).json()["points"]
            assert [p["step"] for p in full] == sorted(p["step"] for p in full)
            assert any(p["acr"] is None for p in full) or window == {"from_step": 400}
            by_step = {p["step"]: p for p in full}
            for max_points in (1, 2, 3, 17, 60, 10_000):
                body = run_metrics(session, run["run_id"], **window, max_points=max_points)
                want = _downsample([p["step"] for p in full], [p["acr"] for p in full], max_points)
                assert body["downsampled"] == (len(full) > max_points)
                assert [p["step"] for p in body["points"]] == want, (window, max_points)
                assert all(p == by_step[p["step"]] for p in body["points"])
        empty = run_metrics(session, run["run_id"], from_step=10_000)
    assert empty == {"run_id": run["run_id"], "downsampled": False, "points": []}


def test_reported_mitigation_changes_after_a_step_are_the_tail_of_all(app_client) -> None:
    """A live dashboard asks for the changes after the steps it has: each answer must be the
    whole run's changes after that step, whatever the modes before it."""
    from vantage.server.queries import reported_mitigation_changes

    client = app_client
    run = client.post("/api/v1/runs", json={"name": "m"}).json()
    modes = ["none", "none", "avspo", "avspo", None, "avspo", "aapo", "none", None, "none"]
    records = [
        {"step": s, "groups": [[0, 1]], **({"mitigation": {"mode": m}} if m else {})}
        for s, m in enumerate(modes)
    ]
    send(client, run, records)
    with client.app.state.session_factory() as s:
        every = reported_mitigation_changes(s, run["run_id"])
        assert [(step, p["mode"]) for step, p in every] == [(2, "avspo"), (6, "aapo"), (7, "none")]
        for after in range(-1, len(modes)):
            tail = reported_mitigation_changes(s, run["run_id"], after_step=after)
            assert tail == [c for c in every if c[0] > after], after
