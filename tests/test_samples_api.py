"""Completion samples over real HTTP (docs/design.md §4 'Samples'), on SQLite and PostgreSQL:
stored once, read back by prompt and step, refused with a reason, and dropped by retention."""

from __future__ import annotations

import json
from datetime import timedelta

from sqlalchemy import func, select, update
from vantage.client.samples import MAX_SAMPLE_CHARS
from vantage.server.db import make_engine, session_factory
from vantage.server.models import Sample, utcnow
from vantage.server.samples import prune_samples

from tests.helpers.api import new_run


def sample(step: int, prompt_id: str = "p1", seq: int = 0, **extra: object) -> dict:
    return {
        "step": step,
        "seq": seq,
        "prompt_id": prompt_id,
        "prompt": f"what is {step}+1?",
        "completions": [str(step + 1), "no idea"],
        "rewards": [1.0, 0.0],
        **extra,
    }


def post(api, run: dict, samples: list[dict], attempt: int | None = None):  # noqa: ANN001, ANN201
    body = json.dumps({"attempt": attempt or run["attempt"], "samples": samples})  # NaN as NaN
    headers = {"Content-Type": "application/json"}
    return api.post(f"/api/v1/runs/{run['run_id']}/samples", content=body, headers=headers)


def test_samples_are_stored_once_and_read_back_by_prompt_and_step(api, auth_server):
    run = new_run(api)
    first = [sample(1), sample(2), sample(2, "p2", seq=1), sample(3, rewards=[float("nan"), 1])]
    r = post(api, run, first)
    assert r.status_code == 200, r.text
    assert r.json() == {"stored": 4, "duplicates": 0}
    assert post(api, run, first[:2]).json() == {"stored": 0, "duplicates": 2}  # a retry

    url = f"/api/v1/runs/{run['run_id']}/samples"
    got = api.get(url, params={"prompt_id": "p1"}).json()["samples"]
    assert [s["step"] for s in got] == [3, 2, 1]  # newest step first
    assert got[0]["rewards"] == ["NaN", 1.0]  # never a NaN in JSON or the database
    assert got[1]["completions"] == ["3", "no idea"] and got[1]["prompt"] == "what is 2+1?"
    at_2 = api.get(url, params={"step": 2}).json()["samples"]
    assert sorted(s["prompt_id"] for s in at_2) == ["p1", "p2"]
    assert len(api.get(url, params={"limit": 1}).json()["samples"]) == 1
    with auth_server.client("read") as reader:
        assert reader.get(url).status_code == 200
        assert post(reader, run, [sample(9)]).status_code == 403  # sending takes ingest


def test_bad_samples_are_refused_with_the_reason(api):
    run = new_run(api)
    assert post(api, run, [sample(1, rewards=[1.0])]).status_code == 422
    r = post(api, run, [sample(1, prompt="x" * (MAX_SAMPLE_CHARS + 1))])
    assert r.status_code == 422 and "4000 characters" in r.text
    r = post(api, run, [sample(1)], attempt=run["attempt"] + 1)
    assert r.status_code == 409 and "unknown" in r.text
    missing = {"run_id": "no-such-run", "attempt": 1}
    assert post(api, missing, [sample(1)]).status_code == 404
    assert api.get(f"/api/v1/runs/{run['run_id']}/samples", params={"stp": 1}).status_code == 422


def test_retention_drops_old_samples_by_age_and_by_steps(api, database_url):
    run = new_run(api)
    assert post(api, run, [sample(s) for s in range(1, 6)]).json()["stored"] == 5
    url = f"/api/v1/runs/{run['run_id']}/samples"
    engine = make_engine(database_url)
    try:
        with session_factory(engine)() as session:
            # other tests' runs share the database: their old steps go too
            assert prune_samples(session, keep_days=30, keep_steps=2) >= 3
            session.commit()
            assert [s["step"] for s in api.get(url).json()["samples"]] == [5, 4]
            old = utcnow() - timedelta(days=40)
            at_5 = (Sample.run_id == run["run_id"]) & (Sample.step == 5)
            session.execute(update(Sample).where(at_5).values(created_at=old))
            session.commit()
            assert prune_samples(session, keep_days=30) == 1
            session.commit()
    finally:
        engine.dispose()
    assert [s["step"] for s in api.get(url).json()["samples"]] == [4]
    assert api.delete(f"/api/v1/runs/{run['run_id']}").status_code == 204
    engine = make_engine(database_url)
    try:
        with session_factory(engine)() as session:  # the run's samples went with it
            left = session.scalar(select(func.count()).where(Sample.run_id == run["run_id"]))
            assert left == 0
    finally:
        engine.dispose()
