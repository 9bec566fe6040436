"""The HTTP API of docs/design.md §4 against a real server process, on SQLite and on PostgreSQL."""

from __future__ import annotations

import csv
import io
import json
import re
import socket
import time
import uuid
from datetime import UTC, datetime, timedelta, timezone
from urllib.parse import urlsplit

import httpx
import pytest
from vantage.client.acr import window_metrics

from tests.helpers.api import new_run, post_steps


def step_of(answer: dict, step: int, split: str = "train") -> dict:
    return next(s for s in answer["steps"] if s["step"] == step and s["split"] == split)


def test_health_and_readiness(auth_server):
    with auth_server.client(None) as c:
        assert c.get("/healthz").json() == {"status": "ok"}
        assert c.get("/readyz").status_code == 200
        assert c.get("/openapi.json").status_code == 200


def test_docs_pages_load_their_scripts_from_the_server_not_a_cdn(auth_server):
    """/docs and /redoc work without internet (found by a fresh-user trial: Swagger UI came
    from cdn.jsdelivr.net, so the page stayed blank on an air-gapped cluster)."""
    with auth_server.client(None) as c:
        for page in ("/docs", "/redoc"):
            html = c.get(page).text
            assets = re.findall(r'(?:src|href)="([^"]+)"', html) + re.findall(
                r"url: '([^']+)'", html
            )
            assert assets and not [a for a in assets if a.startswith(("http:", "https:", "//"))]
            for path in assets:
                r = c.get(path)
                assert r.status_code == 200 and len(r.content) > 1000, (page, path)


DOCUMENTED_BODIES = (
    "StepsBatch", "StepRecord", "Effective", "RawGroup", "StatsGroup", "GroupStats", "RunCreate",
    "RunPatch", "Heartbeat", "Finish", "CommandCreate", "CommandAck", "ACRRequest", "RuleCreate",
    "RulePatch", "SilenceCreate", "SilenceMatchers", "Mitigation", "SamplesBatch", "SampleIn",
)  # fmt: skip


def test_docs_describe_every_field_of_the_request_bodies(auth_server):
    with auth_server.client(None) as c:
        schemas = c.get("/openapi.json").json()["components"]["schemas"]
    undocumented = [
        f"{name}.{field}"
        for name in DOCUMENTED_BODIES
        for field, spec in schemas[name]["properties"].items()
        if not spec.get("description")
    ]
    assert undocumented == []


def test_design_examples_through_http(api):
    run = new_run(api)
    examples = {
        1: [[0, 0, 0, 0], [1, 1, 1, 1], [0.5, 0.5, 0.5, 0.5], [0, 0, 0, 1]],
        2: [[0.3], [0.9], [0.1]],
        3: [[1.0], [1, 0]],
        4: [[0, 0.95, 0.95, 0.95, 0.95, 0.95, 0.95, 0.95], [0.3499999940395355] * 8],
        6: [[1, 1], [0, 0], [0, 1], [0, 0], [0, 0]],
    }
    ans = post_steps(api, run, [{"step": s, "groups": g} for s, g in examples.items()])
    s1 = step_of(ans, 1)
    assert (s1["acr"], s1["acr_all_fail"], s1["acr_all_pass"], s1["acr_constant"]) == (
        0.75,
        0.25,
        0.25,
        0.25,
    )
    assert step_of(ans, 2)["acr"] is None and step_of(ans, 2)["n_degenerate"] == 3
    assert step_of(ans, 3)["acr"] == 0.0 and step_of(ans, 3)["n_valid"] == 1
    assert step_of(ans, 4)["acr"] == 0.5
    s6 = step_of(ans, 6)
    assert s6["acr"] == pytest.approx(0.8) and s6["pass_rate"] == pytest.approx(0.3)
    assert s6["expected_acr"] == pytest.approx(0.58) and s6["excess_acr"] == pytest.approx(0.22)


def test_non_finite_numbers_in_a_config_or_mitigation_are_kept_as_their_strings(api):
    """As scalars are (found by a fresh-user trial: a config's NaN came back null)."""
    body = '{"name": "cfg", "config": {"lr": NaN, "clip": [Infinity, -Infinity], "ok": 0.5}}'
    r = api.post("/api/v1/runs", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 201, r.text
    run = r.json()
    assert run["config"] == {"lr": "NaN", "clip": ["Infinity", "-Infinity"], "ok": 0.5}
    record = '{"step": 1, "groups": [[0, 1]], "mitigation": {"mode": "avspo", "tau": NaN}}'
    batch = '{"attempt": 1, "records": [' + record + "]}"
    headers = {"Content-Type": "application/json"}
    rid = run["run_id"]
    assert api.post(f"/api/v1/runs/{rid}/steps", content=batch, headers=headers).is_success
    reported = api.get(f"/api/v1/runs/{rid}").json()["mitigation_reported"]
    assert reported == {"mode": "avspo", "tau": "NaN"}


def test_non_finite_tokens_are_accepted_and_classed_invalid(api):
    run = new_run(api)
    body = (
        '{"attempt": 1, "records": [{"step": 5, "groups": '
        "[[1, 0, null, 1], [0, 0, 0, 0], [1, NaN, 1, 1], [Infinity, 1], [-Infinity, 0]]}]}"
    )
    r = api.post(
        f"/api/v1/runs/{run['run_id']}/steps",
        content=body,
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 200, r.text
    s = r.json()["steps"][0]
    assert s["n_invalid"] == 4 and s["acr"] == 1.0 and r.json()["invalid_groups"] == 4
    points = api.get(f"/api/v1/runs/{run['run_id']}/metrics").json()["points"]
    assert points[0]["acr"] == 1.0 and points[0]["n_invalid"] == 4


@pytest.mark.parametrize("bad", [[[True, 1]], [["1", 0]], [{"rewards": [1, 0], "mask": [1]}]])
def test_bad_groups_are_rejected_and_batch_is_atomic(api, bad):
    run = new_run(api)
    records = [{"step": 1, "groups": [[0, 1]]}, {"step": 2, "groups": bad}]
    post_steps(api, run, records, expect=422)
    points = api.get(f"/api/v1/runs/{run['run_id']}/metrics").json()["points"]
    assert points == []  # the good record was not stored either


@pytest.mark.parametrize(
    ("group", "errors"),
    [
        ([1, "a"], [("list", 1)]),
        ({"rewards": [1, "a"]}, [("with_rewards", "rewards", 1)]),
        (
            {"stats": {"n": 2, "mean": 1}},
            [("with_stats", "stats", f) for f in ("std", "min", "max")],
        ),
        ("1,0", [()]),
        (7, [()]),
        ({"rewards": [1, 0], "mask": [1, 5]}, [("with_rewards", "mask", 1)]),
        ({"group_id": 1.5, "rewards": [1, 0]}, [("with_rewards", "group_id")]),
        (
            {"group_id": True, "stats": {}},
            [("with_stats", "group_id")]
            + [("with_stats", "stats", f) for f in ("n", "mean", "std", "min", "max")],
        ),
    ],
)
def test_a_bad_group_gets_the_errors_of_its_own_form_only(api, group, errors):
    """A 422 names what is wrong with the form the group was sent in, not why it is not one of
    the other two forms either."""
    run = new_run(api)
    body = {"attempt": 1, "records": [{"step": 1, "groups": [[0, 1], group]}]}
    r = api.post(f"/api/v1/runs/{run['run_id']}/steps", json=body)
    assert r.status_code == 422
    detail = r.json()["detail"]
    assert [tuple(e["loc"][5:]) for e in detail] == errors, detail
    assert all(tuple(e["loc"][:5]) == ("body", "records", 0, "groups", 1) for e in detail)
    if errors == [()]:
        assert (
            detail[0]["msg"] == "a group is a list of rewards, or an object with rewards or stats"
        )


def test_a_rank_outside_its_world_size_is_422(api):
    run = new_run(api)
    records = [{"step": 1, "groups": [[0, 1]]}, {"step": 1, "rank": 2, "world_size": 2}]
    r = api.post(f"/api/v1/runs/{run['run_id']}/steps", json={"attempt": 1, "records": records})
    assert r.status_code == 422 and "rank 2 is outside world_size 2" in r.text
    assert api.get(f"/api/v1/runs/{run['run_id']}/metrics").json()["points"] == []
    records[1]["rank"] = 1
    post_steps(api, run, records)


def test_flat_rewards_forms(api):
    run = new_run(api)
    ans = post_steps(
        api,
        run,
        [
            {"step": 1, "rewards": [1, 1, 0, 1, 0, 0], "group_size": 2},
            {"step": 2, "rewards": [1, 0, 1, 1], "group_ids": ["a", "b", "a", "b"]},
        ],
    )
    assert step_of(ans, 1)["n_groups"] == 3 and step_of(ans, 1)["acr"] == pytest.approx(2 / 3)
    assert step_of(ans, 2)["acr"] == 0.5
    r = api.post(
        f"/api/v1/runs/{run['run_id']}/steps",
        json={"attempt": 1, "records": [{"step": 3, "rewards": [1] * 11, "group_size": 4}]},
    )
    assert r.status_code == 422 and "do not divide into groups of 4" in r.text


def test_stats_form_and_inconsistent_stats(api):
    run = new_run(api)
    good = {"stats": {"n": 4, "mean": 1.0, "std": 0.0, "min": 1.0, "max": 1.0, "n_pass": 4}}
    ans = post_steps(api, run, [{"step": 1, "groups": [good, [0, 1, 0, 1]]}])
    assert step_of(ans, 1)["acr_all_pass"] == 0.5 and step_of(ans, 1)["pass_rate"] == 0.75
    bad = {"group_id": "g7", "stats": {"n": 4, "mean": 0.5, "std": 0.1, "min": 1, "max": 0}}
    r = api.post(
        f"/api/v1/runs/{run['run_id']}/steps",
        json={"attempt": 1, "records": [{"step": 2, "groups": [bad]}]},
    )
    assert r.status_code == 422 and "g7" in r.text and "min" in r.text
    (error,) = r.json()["detail"]
    assert error["loc"] == ["body", "records", 0, "groups", 0, "with_stats", "stats"]
    assert error["type"] == "inconsistent_stats" and error["msg"].startswith("group_id 'g7': ")
    # binary stats (n_pass) that contradict themselves, in the second record of a batch
    liar = {"stats": {"n": 4, "mean": 0.5, "std": 0.57735, "min": 0, "max": 1, "n_pass": 4}}
    records = [{"step": 3, "groups": [[0, 1]]}, {"step": 4, "groups": [[1, 0], liar]}]
    r = api.post(f"/api/v1/runs/{run['run_id']}/steps", json={"attempt": 1, "records": records})
    assert r.status_code == 422 and "n_pass 4 of n 4" in r.text
    assert r.json()["detail"][0]["loc"] == [
        "body",
        "records",
        1,
        "groups",
        1,
        "with_stats",
        "stats",
    ]
    r = api.post("/api/v1/acr", json={"groups": [[0, 1], liar]})
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["body", "groups", 1, "with_stats", "stats"]
    points = api.get(f"/api/v1/runs/{run['run_id']}/metrics").json()["points"]
    assert [p["step"] for p in points] == [1]  # nothing of the refused batches


def test_duplicates_and_conflicts(api):
    run = new_run(api)
    groups = [{"group_id": "a", "rewards": [1, 1]}, {"group_id": "b", "rewards": [0, 1]}]
    first = post_steps(api, run, [{"step": 1, "groups": groups}])
    assert first["accepted"] == 2
    changed = [{"group_id": "a", "rewards": [1, 1]}, {"group_id": "b", "rewards": [0, 0]}]
    again = post_steps(api, run, [{"step": 1, "groups": changed}])
    assert (again["accepted"], again["duplicates"], again["conflicts"]) == (0, 1, 1)
    assert step_of(again, 1)["acr"] == 0.5  # the first write won
    within = post_steps(
        api,
        run,
        [
            {
                "step": 2,
                "groups": [
                    {"group_id": "x", "rewards": [1, 0]},
                    {"group_id": "x", "rewards": [1, 0]},
                    {"group_id": "x", "rewards": [1, 1]},
                ],
            }
        ],
    )
    assert (within["accepted"], within["duplicates"], within["conflicts"]) == (1, 1, 1)
    # the same rewards written otherwise are the same group: -0.0 is 0, and a mask of ones
    # drops nothing (both counted as conflicts: a trial)
    first = [{"group_id": "z", "rewards": [-0.0, 1]}, {"group_id": "m", "rewards": [0, 1]}]
    assert post_steps(api, run, [{"step": 3, "groups": first}])["accepted"] == 2
    again = [
        {"group_id": "z", "rewards": [0, 1]},
        {"group_id": "m", "rewards": [0, 1], "mask": [1, 1]},
    ]
    resent = post_steps(api, run, [{"step": 3, "groups": again}])
    assert (resent["accepted"], resent["duplicates"], resent["conflicts"]) == (0, 2, 0)


def test_groups_of_one_key_sent_in_pieces_are_deduplicated_across_them(api):
    """A (step, split, rank) may store its groups from several batches and from several
    records of one batch; a re-send of any piece is recognised, and an older attempt's late
    groups are checked against that attempt's own."""
    run = new_run(api, launch_id="one")
    a, b = {"group_id": "a", "rewards": [1, 1]}, {"group_id": "b", "rewards": [0, 1]}
    c, d = {"group_id": "c", "rewards": [0, 0]}, {"group_id": "d", "rewards": [1, 0]}
    two = post_steps(api, run, [{"step": 1, "groups": [a]}, {"step": 1, "groups": [b]}])
    assert two["accepted"] == 2
    third = post_steps(api, run, [{"step": 1, "groups": [c, b]}])  # c is new, b a re-send
    assert (third["accepted"], third["duplicates"], third["conflicts"]) == (1, 1, 0)
    clash = post_steps(api, run, [{"step": 1, "groups": [{"group_id": "a", "rewards": [0, 1]}]}])
    assert (clash["accepted"], clash["duplicates"], clash["conflicts"]) == (0, 0, 1)
    assert step_of(clash, 1)["n_groups"] == 3 and step_of(clash, 1)["n_collapsed"] == 2
    resumed = new_run(api, run_id=run["run_id"], launch_id="two")
    assert post_steps(api, resumed, [{"step": 1, "groups": [b]}])["accepted"] == 1
    late = post_steps(api, run, [{"step": 1, "groups": [a, d]}])  # attempt 1 again
    assert (late["accepted"], late["duplicates"], late["conflicts"]) == (1, 1, 0)
    assert step_of(late, 1)["n_groups"] == 1  # the newer attempt owns step 1


@pytest.mark.parametrize("n_steps", [3, 40])
def test_a_batch_of_many_steps_splits_and_ranks_resent_is_all_duplicates(api, n_steps):
    """Earlier blocks and step rows are read per (split, rank) and split: a batch of many
    keys, re-sent with one group changed, counts each key once (the batch of 40 steps is
    past the records for which ingest tries first blocks before reading)."""
    run = new_run(api, world_size=2)
    records = [
        {"step": step, "split": split, "rank": rank, "groups": [[1, 1], [step % 2, 1]]}
        for step in range(n_steps)
        for split in ("train", "eval")
        for rank in (0, 1)
    ]
    first = post_steps(api, run, records)
    assert (first["accepted"], first["duplicates"]) == (8 * n_steps, 0)
    records[-1] = {**records[-1], "groups": [[0, 0], [1, 0]]}
    again = post_steps(api, run, records)
    assert (again["accepted"], again["duplicates"], again["conflicts"]) == (0, 8 * n_steps - 2, 2)
    evals = api.get(f"/api/v1/runs/{run['run_id']}/metrics", params={"split": "eval"}).json()
    assert [p["n_groups"] for p in evals["points"]] == [4] * n_steps


def test_default_group_ids_do_not_collide_across_ranks(api):
    run = new_run(api, world_size=2)
    post_steps(api, run, [{"step": 5, "rank": 0, "groups": [[1, 1], [0, 1], [1, 0]]}])
    ans = post_steps(api, run, [{"step": 5, "rank": 1, "groups": [[0, 0]]}])
    assert step_of(ans, 5)["acr"] == 0.5 and step_of(ans, 5)["n_valid"] == 4


def test_window_pooled_over_steps(api):
    run = new_run(api)
    post_steps(
        api,
        run,
        [
            {"step": 1, "groups": [[1] * 8, [0, 1]]},
            {"step": 2, "groups": [[0, 0]] * 7 + [[0, 1]] * 3},
        ],
    )
    w = api.get(f"/api/v1/runs/{run['run_id']}/summary").json()["window"]
    assert w["acr_pooled"] == pytest.approx(8 / 12)


@pytest.mark.parametrize(
    "acrs",
    [[1, 1, 0], [1] * 25 + [0, 1, 0, 1, 0], [0] * 1100 + [1] * 100, [1] * 50 + [0] * 1150],
    ids=["short", "volatile", "long-rising", "long-falling"],
)
def test_summary_window_equals_the_pure_function_over_every_step(api, acrs):
    """The summary reads a bounded newest tail of a long run; it must be the newest one, in
    step order."""
    run = new_run(api)
    groups = {1: [[1, 1]], 0: [[0, 1]]}  # one group: collapsed (acr 1) or live (acr 0)
    records = [{"step": s, "groups": groups[a]} for s, a in enumerate(acrs)]
    post_steps(api, run, records)
    expected = window_metrics({"acr": a, "n_collapsed": a, "n_valid": 1} for a in acrs)
    window = api.get(f"/api/v1/runs/{run['run_id']}/summary").json()["window"]
    assert window["acr_streak"] == expected["acr_streak"]
    for name in ("acr_pooled", "acr_100", "acr_ema", "acr_volatility"):
        if expected[name] is None:
            assert window[name] is None, name
        else:
            assert window[name] == pytest.approx(expected[name], rel=1e-12, abs=1e-15), name


def test_resume_by_launch_id_and_newest_attempt_wins(api):
    run_id = str(uuid.uuid4())
    a1 = new_run(api, run_id=run_id, launch_id="launch-1")
    assert a1["attempt"] == 1
    again = api.post("/api/v1/runs", json={"name": "t", "run_id": run_id, "launch_id": "launch-1"})
    assert again.status_code == 200 and again.json()["attempt"] == 1  # every rank, every retry
    post_steps(api, a1, [{"step": s, "groups": [[1, 1], [0, 1]]} for s in range(190, 213)])
    a2 = new_run(api, run_id=run_id, launch_id="launch-2")
    assert a2["attempt"] == 2
    post_steps(api, a2, [{"step": s, "groups": [[0, 1], [0, 1]]} for s in range(201, 213)])
    pts = api.get(f"/api/v1/runs/{run_id}/metrics?from_step=201&to_step=212").json()["points"]
    assert [p["step"] for p in pts] == list(range(201, 213))
    assert all(p["acr"] == 0.0 and p["attempt"] == 2 for p in pts)
    # a late batch of the old attempt for an owned step is kept but not shown
    late = post_steps(api, a1, [{"step": 205, "groups": [{"group_id": "late", "rewards": [1, 1]}]}])
    assert late["accepted"] == 1 and step_of(late, 205)["acr"] == 0.0
    assert new_run(api, run_id=run_id)["attempt"] == 3  # no launch_id: a new attempt


def test_unknown_attempt_is_refused(api):
    run = new_run(api)
    post_steps(api, run, [{"step": 1, "groups": [[0, 1]]}], attempt=7, expect=409)


def test_effective_scalars_and_split(api):
    run = new_run(api)
    records = [
        {
            "step": 1,
            "groups": [[1, 1], [0, 1]],
            "effective": {"n_valid": 2, "n_zero_advantage": 0, "n_virtual": 3},
            "scalars": {"loss": 0.5, "kl": float("nan")},
        },
        {"step": 1, "split": "eval", "groups": [[1, 1], [1, 1]]},
    ]
    r = api.post(
        f"/api/v1/runs/{run['run_id']}/steps",
        headers={"content-type": "application/json"},
        content=json.dumps({"attempt": 1, "records": records}),
    )  # NaN token, as Python writes it
    assert r.status_code == 200, r.text
    ans = r.json()
    assert step_of(ans, 1)["acr"] == 0.5 and step_of(ans, 1)["acr_effective"] == 0.0
    assert step_of(ans, 1, "eval")["acr"] == 1.0
    p = api.get(f"/api/v1/runs/{run['run_id']}/metrics").json()["points"][0]
    # NaN is never stored, and never lost: a loss gone NaN shows as the string "NaN"
    assert p["scalars"] == {"loss": 0.5, "kl": "NaN"}
    csv_text = api.get(f"/api/v1/runs/{run['run_id']}/export.csv").text
    header, eval_row, row = csv_text.strip().splitlines()  # every split, each row saying which
    assert "acr_effective" in header and "scalars.loss" in header and row.startswith("1,train,1")
    assert row.endswith(",NaN,0.5") and header.endswith("scalars.kl,scalars.loss"), csv_text
    assert eval_row.startswith("1,eval,1,")
    only = api.get(f"/api/v1/runs/{run['run_id']}/export.csv", params={"split": "eval"}).text
    assert only.strip().splitlines()[1:] == [eval_row.removesuffix(",,")]  # no scalar columns
    # clients whose JSON has no NaN send the strings; other strings are refused
    tokens = {"a": "Infinity", "b": "-Infinity", "c": "NaN", "d": float("inf"), "e": None}
    body = json.dumps({"attempt": 1, "records": [{"step": 2, "scalars": tokens}]})
    assert api.post(f"/api/v1/runs/{run['run_id']}/steps", content=body).status_code == 200
    p = api.get(f"/api/v1/runs/{run['run_id']}/metrics").json()["points"][1]
    assert p["scalars"] == {**tokens, "d": "Infinity"}
    csv_text = api.get(f"/api/v1/runs/{run['run_id']}/export.csv").text
    assert csv_text.strip().splitlines()[-1].endswith(",Infinity,-Infinity,NaN,Infinity,,,")
    for bad in ("nan", "inf", "1.5", True):
        r = api.post(
            f"/api/v1/runs/{run['run_id']}/steps",
            json={"attempt": 1, "records": [{"step": 3, "scalars": {"loss": bad}}]},
        )
        assert r.status_code == 422, (bad, r.text)


def test_export_streams_long_runs_and_scalars_are_bounded_per_record(api):
    run = new_run(api)
    too_many = {f"s{i}": 1.0 for i in range(1001)}
    r = api.post(
        f"/api/v1/runs/{run['run_id']}/steps",
        json={"attempt": 1, "records": [{"step": 1, "scalars": too_many}]},
    )
    assert r.status_code == 422 and "1000" in r.text
    # more steps than one streamed piece (1,000), scalar names that differ between steps
    records = [
        {"step": s, "groups": [[0, 1], [1, 1]] if s % 2 else [[0, 0], [1, 1]]}
        | {"scalars": {f"m{s % 3}": s / 2}}
        for s in range(1, 2101)
    ]
    post_steps(api, run, records)
    r = api.get(f"/api/v1/runs/{run['run_id']}/export.csv")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    table = list(csv.reader(io.StringIO(r.text)))
    header, rows = table[0], table[1:]
    assert header[-3:] == ["scalars.m0", "scalars.m1", "scalars.m2"]
    assert [int(row[0]) for row in rows] == list(range(1, 2101))
    for row in rows[::97]:
        step = int(row[0])
        acr = float(row[header.index("acr")])
        assert acr == (0.5 if step % 2 else 1.0)
        assert row[-3:] == [str(step / 2) if step % 3 == k else "" for k in range(3)]


def test_points_count_the_completions_of_valid_groups(api):
    """`n_completions` (the wasted share's denominator) counts what valid groups really hold:
    groups of any size, masked completions left out, degenerate and invalid groups too."""
    run = new_run(api, group_size=2)
    groups = [
        [1] * 8,
        {"rewards": [0, 1, 1, 0], "mask": [1, 1, 0, 0]},
        [1],  # degenerate
        [0, None, 1],  # invalid
        [0, 1, 0, 1, 0, 1, 0, 1],
    ]
    post_steps(api, run, [{"step": 1, "groups": groups}])
    (point,) = api.get(f"/api/v1/runs/{run['run_id']}/metrics").json()["points"]
    assert (point["n_completions"], point["wasted_rollouts"], point["n_valid"]) == (18, 8, 3)


def test_downsampling_keeps_extremes(api):
    run = new_run(api)
    records = [
        {"step": s, "groups": [[1, 1], [0, 1]] if s != 777 else [[1, 1], [1, 1]]}
        for s in range(1, 2001)
    ]
    post_steps(api, run, records)
    body = api.get(f"/api/v1/runs/{run['run_id']}/metrics?max_points=100").json()
    assert body["downsampled"] and len(body["points"]) <= 100
    assert any(p["step"] == 777 and p["acr"] == 1.0 for p in body["points"])
    steps = [p["step"] for p in body["points"]]
    assert steps == sorted(steps)
    assert steps[-1] == 2000  # a live chart ends at the newest step
    assert len(api.get(f"/api/v1/runs/{run['run_id']}/metrics?max_points=1").json()["points"]) == 1
    # window metrics of a run longer than the EMA tail equal the pure function over every step
    full = api.get(f"/api/v1/runs/{run['run_id']}/metrics?max_points=5000").json()["points"]
    expected = window_metrics(full)
    window = api.get(f"/api/v1/runs/{run['run_id']}/summary").json()["window"]
    assert window["acr_streak"] == expected["acr_streak"] == 2000
    for name in ("acr_pooled", "acr_100", "acr_ema", "acr_volatility"):
        assert window[name] == pytest.approx(expected[name], rel=1e-12, abs=1e-15), name


def test_prompts_by_collapse(api):
    run = new_run(api)
    post_steps(
        api,
        run,
        [
            {
                "step": s,
                "groups": [
                    {"prompt_id": "easy", "rewards": [1, 1]},
                    {"prompt_id": "hard", "rewards": [0, 0]},
                    {"prompt_id": "ok", "rewards": [0, 1]},
                ],
            }
            for s in (1, 2, 3)
        ],
    )
    prompts = api.get(f"/api/v1/runs/{run['run_id']}/prompts").json()["prompts"]
    by_id = {p["prompt_id"]: p for p in prompts}
    assert by_id["easy"]["all_pass"] == 3 and by_id["hard"]["all_fail"] == 3
    assert by_id["ok"]["collapsed"] == 0 and by_id["easy"]["last_seen_step"] == 3
    fails = api.get(f"/api/v1/runs/{run['run_id']}/prompts?side=all_fail").json()["prompts"]
    assert [p["prompt_id"] for p in fails] == ["hard"]
    assert "prompt_id" in api.get(f"/api/v1/runs/{run['run_id']}/prompts?format=csv").text
    # one split, or all of them (eval groups were always mixed in: a trial)
    evals = [{"prompt_id": "hard", "rewards": [1, 1]}, {"prompt_id": "held-out", "rewards": [0, 0]}]
    post_steps(api, run, [{"step": 3, "split": "eval", "groups": evals}])
    url = f"/api/v1/runs/{run['run_id']}/prompts"
    every = {p["prompt_id"]: p for p in api.get(url).json()["prompts"]}
    train = {p["prompt_id"]: p for p in api.get(url, params={"split": "train"}).json()["prompts"]}
    evaluated = api.get(url, params={"split": "eval"}).json()["prompts"]
    assert set(every) == {"easy", "hard", "ok", "held-out"} and set(train) == {"easy", "hard", "ok"}
    assert every["hard"]["all_pass"] == 1 and train["hard"]["all_pass"] == 0
    assert sorted(p["prompt_id"] for p in evaluated) == ["hard", "held-out"]
    assert api.get(url, params={"split": "no such"}).status_code == 422


def test_prompt_ids_that_look_like_formulas_are_defused_in_csv(api):
    run = new_run(api)
    ids = ['=HYPERLINK("http://x")', "@SUM(1)", "-2+3", "plain"]
    groups = [{"prompt_id": pid, "rewards": [1, 1]} for pid in ids]
    post_steps(api, run, [{"step": 1, "groups": groups}])
    text = api.get(f"/api/v1/runs/{run['run_id']}/prompts?format=csv").text
    cells = {line.split(",")[0] for line in text.splitlines()[1:]}
    assert cells == {'"\'=HYPERLINK(""http://x"")"', "'@SUM(1)", "'-2+3", "plain"}, text
    as_json = api.get(f"/api/v1/runs/{run['run_id']}/prompts").json()["prompts"]
    assert {p["prompt_id"] for p in as_json} == set(ids)  # stored and answered as sent


def test_commands_delivered_to_rank0_until_acked(api):
    run = new_run(api)
    rid = run["run_id"]
    cmd = api.post(
        f"/api/v1/runs/{rid}/commands",
        json={"type": "set_mitigation", "params": {"mode": "avspo"}, "reason": "test"},
    )
    assert cmd.status_code == 201 and cmd.json()["status"] == "pending"
    cid = cmd.json()["command_id"]
    rank1 = post_steps(api, run, [{"step": 1, "rank": 1, "groups": [[0, 1]]}])
    assert rank1["commands"] == []
    for _ in range(2):  # at-least-once: re-delivered until acked
        got = post_steps(api, run, [{"step": 1, "groups": [[0, 1]]}])["commands"]
        assert [c["command_id"] for c in got] == [cid]
    hb = api.post(
        f"/api/v1/runs/{rid}/heartbeat",
        json={"attempt": 1, "rank": 0, "spooled_groups": 3, "dropped_groups": 1},
    )
    assert [c["command_id"] for c in hb.json()["commands"]] == [cid]
    ack = api.post(f"/api/v1/runs/{rid}/commands/{cid}/ack", json={"status": "applied", "step": 2})
    assert ack.status_code == 200 and ack.json()["status"] == "applied"
    again = api.post(
        f"/api/v1/runs/{rid}/commands/{cid}/ack", json={"status": "applied", "step": 2}
    )
    assert again.status_code == 200 and again.json()["acked_step"] == 2  # a retry
    # another step is another ack, not a retry: it answered 200 and kept the first step
    later = api.post(
        f"/api/v1/runs/{rid}/commands/{cid}/ack", json={"status": "applied", "step": 3}
    )
    assert later.status_code == 409 and "(step 2)" in later.text, later.text
    other = api.post(f"/api/v1/runs/{rid}/commands/{cid}/ack", json={"status": "rejected"})
    assert other.status_code == 409 and "already acked 'applied'" in other.text
    assert post_steps(api, run, [{"step": 2, "groups": [[0, 1]]}])["commands"] == []
    log = api.get(f"/api/v1/runs/{rid}/commands").json()["commands"]
    assert log[0]["acked_step"] == 2 and log[0]["issued_by"] == "key:all"
    r = api.get(f"/api/v1/runs/{rid}").json()
    assert r["mitigation_applied"]["mode"] == "avspo"
    assert r["client"]["spooled_groups"] == 3 and r["client"]["dropped_groups"] == 1
    bad = api.post(f"/api/v1/runs/{rid}/commands", json={"type": "set_sampling", "params": {}})
    assert bad.status_code == 422


def test_the_same_command_sent_twice_at_once_is_one_command(api, auth_server):
    """Two identical stops sent back to back were both delivered and applied: the trainer
    saved two checkpoints (a trial). Sent again before it is acked, a command answers the
    first; another command, or the same one after the ack, is a new one."""
    from concurrent.futures import ThreadPoolExecutor

    rid = new_run(api)["run_id"]
    path, stop = f"/api/v1/runs/{rid}/commands", {"type": "stop", "params": {}}

    def send(_i: int) -> httpx.Response:
        with auth_server.client("all") as client:
            return client.post(path, json=stop)

    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(send, range(6)))
    assert {r.status_code for r in answers} == {201}
    (cid,) = {r.json()["command_id"] for r in answers}
    checkpoint = api.post(path, json={"type": "checkpoint", "params": None}).json()["command_id"]
    assert checkpoint != cid
    api.post(f"{path}/{cid}/ack", json={"status": "applied", "step": 1}).raise_for_status()
    assert api.post(path, json=stop).json()["command_id"] != cid  # the first was applied
    assert len(api.get(path).json()["commands"]) == 3


def test_the_timeline_shows_mitigations_no_command_started(api):
    """A mitigation the trainer's config started (or a local command) was missing from the
    timeline, so the dashboard drew no band for it."""
    run = new_run(api)
    rid = run["run_id"]
    avspo, aapo, none = ({"mode": m} for m in ("avspo", "aapo", "none"))
    modes = [avspo] * 3 + [none] * 3 + [aapo] * 2  # steps 0-2 by config, 3-5 a local change
    records = [{"step": s, "groups": [[0, 1]], "mitigation": m} for s, m in enumerate(modes)]
    post_steps(api, run, records[:6])
    cmd = api.post(f"/api/v1/runs/{rid}/commands", json={"type": "set_mitigation", "params": aapo})
    cid = cmd.json()["command_id"]
    ack = api.post(f"/api/v1/runs/{rid}/commands/{cid}/ack", json={"status": "applied", "step": 5})
    assert ack.status_code == 200
    post_steps(api, run, [*records[6:], {"step": 8, "groups": [[0, 1]]}])  # 8: none reported
    timeline = api.get(f"/api/v1/runs/{rid}/summary").json()["mitigation_timeline"]
    seen = [(e["step"], e["params"]["mode"], e["issued_by"], e["command_id"]) for e in timeline]
    # step 6, the first to report aapo, is the command's: not a change of its own
    assert seen == [(0, "avspo", "trainer", None), (3, "none", "trainer", None),
                    (5, "aapo", "key:all", cid)], seen  # fmt: skip
    pending = api.post(
        f"/api/v1/runs/{rid}/commands", json={"type": "set_mitigation", "params": none}
    )
    timeline = api.get(f"/api/v1/runs/{rid}/summary").json()["mitigation_timeline"]
    assert (
        timeline[-1]["command_id"] == pending.json()["command_id"] and timeline[-1]["step"] is None
    )


def test_a_finished_run_refuses_commands_until_it_is_relaunched(api):
    run = new_run(api, launch_id="first")
    rid = run["run_id"]
    api.post(f"/api/v1/runs/{rid}/finish", json={"status": "finished"}).raise_for_status()
    stop = {"type": "stop", "params": {}}
    r = api.post(f"/api/v1/runs/{rid}/commands", json=stop)
    assert r.status_code == 409 and f"run {rid} has finished" in r.text, r.text
    assert api.get(f"/api/v1/runs/{rid}/commands").json()["commands"] == []  # nothing stored
    relaunch = new_run(api, run_id=rid, launch_id="second")
    assert relaunch["attempt"] == 2 and relaunch["status"] == "running"
    assert api.post(f"/api/v1/runs/{rid}/commands", json=stop).status_code == 201


def test_finishing_expires_open_commands_and_a_run_ends_once(api):
    """Commands still open when the run finishes expire (no trainer reads them; a heartbeat got
    them back before) and a second finish with the other status is refused (found by a trial)."""
    rid = new_run(api)["run_id"]
    cmd = api.post(f"/api/v1/runs/{rid}/commands", json={"type": "checkpoint", "params": {}})
    command_id = cmd.json()["command_id"]
    api.post(f"/api/v1/runs/{rid}/finish", json={"status": "finished"}).raise_for_status()
    beat = api.post(f"/api/v1/runs/{rid}/heartbeat", json={"attempt": 1})
    assert beat.json()["commands"] == []
    (logged,) = api.get(f"/api/v1/runs/{rid}/commands").json()["commands"]
    assert logged["status"] == "expired" and "finished before" in logged["detail"]
    again = api.post(f"/api/v1/runs/{rid}/finish", json={"status": "finished"})
    assert again.status_code == 200 and again.json()["status"] == "finished"
    other = api.post(f"/api/v1/runs/{rid}/finish", json={"status": "failed"})
    assert other.status_code == 409 and "already finished" in other.text
    assert api.get(f"/api/v1/runs/{rid}").json()["status"] == "finished"
    late = {"status": "applied", "step": 3}  # a trainer's late ack is still recorded
    acked = api.post(f"/api/v1/runs/{rid}/commands/{command_id}/ack", json=late)
    assert acked.json()["status"] == "applied"


def test_a_superseded_attempt_cannot_end_the_run(api):
    """An old launch closing after a relaunch made the run failed and refused the live
    trainer's commands (found by a fresh-user trial)."""
    rid = new_run(api, launch_id="L1")["run_id"]
    assert new_run(api, run_id=rid, launch_id="L2")["attempt"] == 2
    old = api.post(f"/api/v1/runs/{rid}/finish", json={"status": "failed", "attempt": 1})
    assert old.status_code == 409 and "superseded by attempt 2" in old.text
    # an attempt the run never had is refused as steps and heartbeat refuse it (it ended the run)
    unknown = api.post(f"/api/v1/runs/{rid}/finish", json={"status": "failed", "attempt": 7})
    assert unknown.status_code == 409 and "attempt 7 is unknown" in unknown.text
    assert api.get(f"/api/v1/runs/{rid}").json()["status"] == "running"
    new = api.post(f"/api/v1/runs/{rid}/finish", json={"status": "finished", "attempt": 2})
    assert new.json()["status"] == "finished"


def test_a_superseded_attempt_is_told_and_takes_no_commands(api):
    """An old launch still sending after a relaunch got 200s and nothing else (a trial), and it
    took the commands meant for the relaunch, which then never saw them."""
    rid = new_run(api, launch_id="L1")["run_id"]
    relaunch = new_run(api, run_id=rid, launch_id="L2")
    command = {"type": "set_sampling", "params": {"temperature": 0.7}, "reason": "t"}
    assert api.post(f"/api/v1/runs/{rid}/commands", json=command).status_code == 201
    zombie = post_steps(api, relaunch, [{"step": 1, "groups": [[0, 1]]}], attempt=1)
    assert (zombie["accepted"], zombie["newest_attempt"], zombie["commands"]) == (1, 2, [])
    beat = api.post(f"/api/v1/runs/{rid}/heartbeat", json={"attempt": 1}).json()
    assert beat == {"commands": [], "newest_attempt": 2}
    live = post_steps(api, relaunch, [{"step": 1, "groups": [[0, 1]]}])
    assert live["newest_attempt"] == 2
    assert [c["type"] for c in live["commands"]] == ["set_sampling"]


def test_a_silence_until_with_an_offset_is_kept_in_utc(api):
    """SQLite keeps no offset: 06:31-05:00 was stored as 06:31 UTC, five hours early."""
    soon = datetime.now(UTC) + timedelta(hours=2)
    local = soon.astimezone(timezone(timedelta(hours=-5))).isoformat()
    r = api.post("/api/v1/silences", json={"until": local})
    assert r.status_code == 201, r.text
    silences = api.get("/api/v1/silences").json()["silences"]
    (listed,) = [x for x in silences if x["id"] == r.json()["id"]]
    assert abs(datetime.fromisoformat(listed["until"]) - soon) < timedelta(seconds=1)
    assert listed["active"] is True


def test_run_settings_finish_and_delete(api):
    run = new_run(api, project="p1", tags=["a"])
    rid = run["run_id"]
    assert run["mitigation_mode"] == "auto" and run["status"] == "running"
    r = api.patch(f"/api/v1/runs/{rid}", json={"mitigation_mode": "suggest", "notes": "n"})
    assert r.json()["mitigation_mode"] == "suggest"
    assert api.patch(f"/api/v1/runs/{rid}", json={"mitigation_mode": "bogus"}).status_code == 422
    assert any(x["run_id"] == rid for x in api.get("/api/v1/runs?tag=a").json()["runs"])
    assert api.post(f"/api/v1/runs/{rid}/finish", json={"status": "finished"}).json()["status"] == (
        "finished"
    )
    assert api.delete(f"/api/v1/runs/{rid}").status_code == 204
    assert api.get(f"/api/v1/runs/{rid}").status_code == 404


def test_stateless_acr_endpoint(api):
    r = api.post("/api/v1/acr", json={"rewards": [1, 0, 1, 1], "group_ids": ["b", "a", "b", "a"]})
    body = r.json()
    assert [g["group_id"] for g in body["groups"]] == ["b", "a"]
    assert body["groups"][0]["class"] == "collapsed" and body["groups"][0]["side"] == "all_pass"
    assert body["step"]["acr"] == 0.5
    empty = api.post("/api/v1/acr", json={"groups": []}).json()
    assert empty["step"]["n_groups"] == 0 and empty["step"]["acr"] is None
    r = api.post("/api/v1/acr", json={"groups": [[2, 2], [0, 2]], "reward_max": 2})
    assert r.json()["groups"][0]["side"] == "all_pass"


def test_limits_answer_413(api):
    run = new_run(api)
    r = api.post(
        f"/api/v1/runs/{run['run_id']}/steps",
        json={"attempt": 1, "records": [{"step": 1, "groups": [[0, 1]] * 10_001}]},
    )
    assert r.status_code == 413 and "10000" in r.text
    big = json.dumps(
        {
            "attempt": 1,
            "records": [{"step": 1, "rewards": [0.123456789] * 900_000, "group_size": 100}],
        }
    )
    r = api.post(
        f"/api/v1/runs/{run['run_id']}/steps",
        content=big,
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 413 and "limit" in r.text
    many = [{"step": s, "scalars": {"loss": 1.0}} for s in range(10_001)]
    r = api.post(f"/api/v1/runs/{run['run_id']}/steps", json={"attempt": 1, "records": many})
    assert r.status_code == 413 and "10001 records" in r.text and "10000" in r.text
    assert api.get(f"/api/v1/runs/{run['run_id']}/metrics").json()["points"] == []
    r = api.post(f"/api/v1/runs/{run['run_id']}/steps", json={"attempt": 1, "records": many[1:]})
    assert r.status_code == 200 and len(r.json()["steps"]) == 10_000


def test_every_route_refuses_a_body_over_8_mib(api):
    """Only the ingest routes had the limit: a 50 MB config was stored, and every run list
    carried it (a trial). Declared or chunked, every body past 8 MiB is a 413 and stores
    nothing; a run's config is at most 64 KiB."""
    before = len(api.get("/api/v1/runs").json()["runs"])
    big = json.dumps({"name": "big", "config": {"x": "a" * 9_000_000}}).encode()

    def chunked():
        yield from (big[i : i + 65_536] for i in range(0, len(big), 65_536))

    for path in ("/api/v1/runs", "/api/v1/alert-rules", "/dashboard/login"):
        for body in (big, chunked()):
            r = api.post(path, content=body, headers={"content-type": "application/json"})
            assert r.status_code == 413 and "8,388,608 bytes" in r.text, (path, r.text)
    r = api.post("/api/v1/runs", json={"name": "wide", "config": {"x": "a" * 70_000}})
    assert r.status_code == 422 and "at most 65,536" in r.text
    assert len(api.get("/api/v1/runs").json()["runs"]) == before
    r = api.post("/api/v1/runs", json={"config": {}})  # docs/design.md §4: name is required
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "name"]
    assert len(api.get("/api/v1/runs").json()["runs"]) == before


def test_auth_matrix(auth_server):
    with auth_server.client("all") as admin:
        rid = new_run(admin)["run_id"]
    routes = {
        "ingest": ("POST", f"/api/v1/runs/{rid}/heartbeat", {"attempt": 1}),
        "read": ("GET", f"/api/v1/runs/{rid}/metrics", None),
        "control": ("POST", f"/api/v1/runs/{rid}/commands", {"type": "checkpoint"}),
        "admin": ("DELETE", f"/api/v1/runs/{str(uuid.uuid4())}", None),
    }
    for scope in ("ingest", "read", "control", "admin"):
        with auth_server.client(scope) as c:
            for needed, (method, path, body) in routes.items():
                r = c.request(method, path, json=body)
                if needed == scope:
                    assert r.status_code in (200, 201, 204, 404), (scope, path, r.text)
                else:
                    assert r.status_code == 403, (scope, path, r.status_code)
    # docs/design.md §4: ingest may "read and ack the run's commands" (it was 403, a trial)
    log = f"/api/v1/runs/{rid}/commands"
    for scope, status in (("ingest", 200), ("read", 200), ("control", 403), ("admin", 403)):
        with auth_server.client(scope) as c:
            r = c.get(log)
            assert r.status_code == status, (scope, r.text)
    assert "lacks the 'read' or 'ingest' scope" in r.text
    with auth_server.client(None) as anon:
        assert anon.get(f"/api/v1/runs/{rid}").status_code == 401
        bad = anon.get(f"/api/v1/runs/{rid}", headers={"Authorization": "Bearer vtg_nope"})
        assert bad.status_code == 401
        assert anon.get("/healthz").status_code == 200


def test_prometheus_metrics(auth_server, api):
    run = new_run(api, name='quo"ted')
    post_steps(api, run, [{"step": 1, "groups": [[1, 1], [0, 1]]}])
    with auth_server.client(None) as anon:
        text = anon.get("/metrics").text
    assert "# TYPE vantage_ingested_groups_total counter" in text
    assert "# TYPE vantage_run_latest_acr gauge" in text
    assert f'run_id="{run["run_id"]}"' in text and 'quo\\"ted' in text


def test_nul_characters_and_impossible_stats_are_422(api):
    run = new_run(api)
    rid = run["run_id"]
    bad_groups = [
        [{"group_id": "a\u0000", "rewards": [1, 0]}],
        [{"prompt_id": "p\u0000", "rewards": [1, 0]}],
        [{"stats": {"n": 4, "mean": 5, "std": 0.1, "min": 0, "max": 1}}],
        [{"stats": {"n": 4, "mean": 0.5, "std": 3, "min": 0, "max": 1}}],
        [{"stats": {"n": 0, "mean": 0.5, "std": 0, "min": 0.5, "max": 0.5}}],
        [{"stats": {"n": 4, "mean": 1, "std": 0}}],  # min and max are required
        [{"stats": {"n": 4, "mean": 0.5, "std": -0.1, "min": 0, "max": 1}}],
    ]
    for groups in bad_groups:
        r = api.post(
            f"/api/v1/runs/{rid}/steps",
            json={"attempt": 1, "records": [{"step": 1, "groups": groups}]},
        )
        assert r.status_code == 422, (groups, r.status_code, r.text)
    flat = {"attempt": 1, "records": [{"step": 1, "rewards": [1.0] * 4, "group_size": 70_000}]}
    assert api.post(f"/api/v1/runs/{rid}/steps", json=flat).status_code == 422
    huge = {"step": 1, "effective": {"n_valid": 2**63, "n_zero_advantage": 0}}
    body = {"attempt": 1, "records": [huge]}
    assert api.post(f"/api/v1/runs/{rid}/steps", json=body).status_code == 422
    too_late = {"attempt": 2**63, "records": [{"step": 1, "groups": [[1, 0]]}]}
    assert api.post(f"/api/v1/runs/{rid}/steps", json=too_late).status_code == 422
    assert api.post("/api/v1/runs", json={"name": "x\u0000"}).status_code == 422
    r = api.post("/api/v1/runs", json={"name": "cfg", "config": {"note": "a\u0000b"}})
    assert r.status_code in (201, 422), r.text  # SQLite stores it; PostgreSQL refuses: never 500
    assert api.get(f"/api/v1/runs/{rid}/metrics").json()["points"] == []


def test_concurrent_launches_of_one_run_get_distinct_attempts(auth_server):
    """Eight ranks of eight new launches register at once: each gets its own attempt, no 5xx
    (SQLite used to answer 500 on the race; found by a fresh-user trial)."""
    from concurrent.futures import ThreadPoolExecutor

    with auth_server.client() as c:
        run = new_run(c)

    def register(i: int) -> httpx.Response:
        with auth_server.client() as own:
            body = {"run_id": run["run_id"], "name": "x", "launch_id": f"launch-{i}"}
            return own.post("/api/v1/runs", json=body)

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(register, range(8)))
    assert [r.status_code for r in answers] == [200] * 8
    assert sorted(r.json()["attempt"] for r in answers) == list(range(2, 10))


def test_concurrent_batches_of_one_key_store_each_group_once(auth_server):
    """Twelve batches for one (step, rank) at once: six copies of one batch (a client's retry
    racing the original) and six with ids of their own. Each group is stored once, the copies
    count as duplicates, and no batch fails (on PostgreSQL they collide on the key's block
    number and are redone)."""
    from concurrent.futures import ThreadPoolExecutor

    with auth_server.client() as c:
        run = new_run(c)
    copy = [{"group_id": f"c{i}", "rewards": [i % 2, 1]} for i in range(40)]

    def send(k: int) -> httpx.Response:
        own = [{"group_id": f"n{k}-{i}", "rewards": [0, 0]} for i in range(40)]
        body = {
            "attempt": run["attempt"],
            "records": [{"step": 1, "groups": copy if k % 2 else own}],
        }
        with auth_server.client() as client:
            return client.post(f"/api/v1/runs/{run['run_id']}/steps", json=body)

    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(send, range(12)))
    assert [r.status_code for r in answers] == [200] * 12, [r.text for r in answers]
    counts = [(r.json()["accepted"], r.json()["duplicates"]) for r in answers]
    assert sorted(counts[1::2]) == [(0, 40)] * 5 + [(40, 0)]  # one copy stored, five repeats
    assert counts[0::2] == [(40, 0)] * 6
    with auth_server.client() as c:
        (point,) = c.get(f"/api/v1/runs/{run['run_id']}/metrics").json()["points"]
    assert point["n_groups"] == 7 * 40 and point["n_collapsed"] == 6 * 40 + 20


BAD_BODIES = [
    # (path, raw JSON body) that used to reach the database and answer 500 (fresh-user trial)
    ("/api/v1/runs", '{"name": "a", "config": {"x": 100000000000000000000000}}'),
    ("/api/v1/runs", '{"name": "a", "config": {"x": ' + "[" * 300 + "]" * 300 + "}}"),
    # 480 to 999 levels reached Python's recursion limit: a RecursionError and 500 (a trial)
    ("/api/v1/runs", '{"name": "a", "config": {"x": ' + "[" * 500 + "]" * 500 + "}}"),
    ("/api/v1/runs", '{"name": "a", "config": {"x": ' + "[" * 700 + "]" * 700 + "}}"),
    ("/api/v1/runs", '{"name": "a", "run_id": "a\\ud800"}'),
    ("/api/v1/runs", '{"name": "a", "tags": ["\\ud800"]}'),
    ("/api/v1/runs", '{"name": "a", "config": {"k": "\\udfff"}}'),
    ("/api/v1/runs", '{"name": "a", "run_id": "a/b"}'),
    ("/api/v1/runs", '{"name": "a", "run_id": ".."}'),
]


@pytest.mark.parametrize("path,body", BAD_BODIES)
def test_unstorable_values_are_422_not_500(api, path, body):
    r = api.post(path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text


def test_unstorable_values_in_records_heartbeats_and_acks_are_422(api):
    run = new_run(api)
    rid = run["run_id"]
    huge = 10**30
    record = {"step": 1, "groups": [[1, 0]], "mitigation": {"mode": "a", "x": huge}}
    steps = {"attempt": 1, "records": [record]}
    assert api.post(f"/api/v1/runs/{rid}/steps", json=steps).status_code == 422
    # a mitigation is a mode and its settings; a 100 KB one was stored with every step (a trial)
    wordy = {"step": 1, "groups": [[1, 0]], "mitigation": {"mode": "avspo", "note": "m" * 5000}}
    r = api.post(f"/api/v1/runs/{rid}/steps", json={"attempt": 1, "records": [wordy]})
    assert r.status_code == 422 and "at most 4,096" in r.text, r.text
    # {mode, ...} (docs/design.md §4): without a mode it was shown as "none" on the dashboard
    for bad in ({"alpha": 0.5}, {"mode": ""}, {"mode": 3}, {"mode": "m" * 65}):
        record = {"step": 1, "groups": [[1, 0]], "mitigation": bad}
        r = api.post(f"/api/v1/runs/{rid}/steps", json={"attempt": 1, "records": [record]})
        assert r.status_code == 422 and "needs mode" in r.text, (bad, r.text)
    own = {"step": 1, "groups": [[1, 0]], "mitigation": {"mode": "my-own-clip", "c": 1}}
    assert api.post(f"/api/v1/runs/{rid}/steps", json={"attempt": 1, "records": [own]}).is_success
    beat = {"attempt": 1, "dropped_groups": huge}
    assert api.post(f"/api/v1/runs/{rid}/heartbeat", json=beat).status_code == 422
    cmd = api.post(f"/api/v1/runs/{rid}/commands", json={"type": "stop"}).json()
    ack = {"status": "applied", "step": huge}
    r = api.post(f"/api/v1/runs/{rid}/commands/{cmd['command_id']}/ack", json=ack)
    assert r.status_code == 422 and "database" not in r.text
    # the detail is shown in the command log: "a\u202eb" was stored as given (a trial)
    ack = {"status": "rejected", "step": 1, "detail": "no \u202edetaerc"}
    r = api.post(f"/api/v1/runs/{rid}/commands/{cmd['command_id']}/ack", json=ack)
    assert r.status_code == 422 and "bidirectional control" in r.text, r.text
    assert api.get(f"/api/v1/runs/{rid}/commands").json()["commands"][0]["status"] == "pending"
    rule = {"name": "flappy", "metric": "acr", "op": ">", "threshold": 0.5, "clear_threshold": 0.9}
    r = api.post("/api/v1/alert-rules", json=rule)
    assert r.status_code == 422 and "clear_threshold" in r.text
    assert r.json()["detail"][0]["loc"] == ["body", "clear_threshold"]  # it was [] (a trial)
    rule = api.post("/api/v1/alert-rules", json={**rule, "clear_threshold": 0.4}).json()
    for field in ("threshold", "name", "metric"):
        r = api.put(f"/api/v1/alert-rules/{rule['id']}", json={field: None})
        assert r.status_code == 422 and r.json()["detail"] == [
            {"type": "value_error", "loc": ["body", field], "msg": f"'{field}' cannot be null"}
        ], r.text
    api.delete(f"/api/v1/alert-rules/{rule['id']}").raise_for_status()
    acr = {"groups": [[1, 0]], "reward_min": 1, "reward_max": 0}
    assert api.post("/api/v1/acr", json=acr).status_code == 422


def test_registering_a_run_again_with_other_reward_bounds_is_409(api):
    run = new_run(api, reward_max=5.0)
    again = {"run_id": run["run_id"], "name": "x", "launch_id": "second", "reward_max": 1.0}
    r = api.post("/api/v1/runs", json=again)
    assert r.status_code == 409 and "reward_max" in r.json()["detail"]
    same = {"run_id": run["run_id"], "name": "x", "launch_id": "second", "reward_max": 5.0}
    assert api.post("/api/v1/runs", json=same).json()["attempt"] == 2
    # a known run keeps its name: a launch of it may leave the name out
    assert api.post("/api/v1/runs", json={"run_id": run["run_id"]}).json()["attempt"] == 3


def test_registering_a_run_again_in_another_project_is_409(api, auth_server):
    """It answered 200 and kept the run where it was, so the launch reported to a run outside
    the project it named (a trial)."""
    run = new_run(api, project="team-b")
    again = {"run_id": run["run_id"], "launch_id": "second"}
    r = api.post("/api/v1/runs", json={**again, "project": "team-c"})
    assert r.status_code == 409 and "project cannot change" in r.json()["detail"], r.text
    assert api.get(f"/api/v1/runs/{run['run_id']}").json()["project"] == "team-b"
    assert api.post("/api/v1/runs", json={**again, "project": "team-b"}).json()["attempt"] == 2
    assert api.post("/api/v1/runs", json=again).json()["attempt"] == 2  # left out: kept
    with auth_server.client("team-a") as team:  # another project's key learns no project name
        r = team.post("/api/v1/runs", json={**again, "project": "team-a"})
        assert r.status_code == 409 and "team-b" not in r.text, r.text


def test_prompts_count_valid_groups_only(api):
    run = new_run(api)
    groups = [{"prompt_id": "q", "rewards": [1, 1]}, {"prompt_id": "q", "rewards": [1, None]}]
    post_steps(api, run, [{"step": 1, "groups": groups}])
    (row,) = api.get(f"/api/v1/runs/{run['run_id']}/prompts").json()["prompts"]
    assert (row["groups"], row["collapsed"], row["collapse_rate"]) == (1, 1, 1.0)


def test_command_params_are_bounded(api):
    run = new_run(api)
    big = {"type": "stop", "params": {"note": list(range(100_000))}}
    r = api.post(f"/api/v1/runs/{run['run_id']}/commands", json=big)
    assert r.status_code == 422 and "stop takes no params" in r.text
    big = {"type": "set_mitigation", "params": {"mode": "avspo", "note": list(range(100_000))}}
    r = api.post(f"/api/v1/runs/{run['run_id']}/commands", json=big)
    assert r.status_code == 422 and "note" in r.text


def test_a_run_deleted_and_created_again_is_scored_with_its_new_bounds(api):
    """The server keeps each run's fixed fields per process; a run deleted and created again
    under the same id must not be scored with the old ones."""
    run = new_run(api, run_id=f"again-{uuid.uuid4().hex[:8]}")
    rid = run["run_id"]
    assert post_steps(api, run, [{"step": 1, "groups": [[1, 1]]}])["steps"][0]["acr_all_pass"] == 1
    assert api.delete(f"/api/v1/runs/{rid}").status_code == 204
    body = {"attempt": 1, "records": [{"step": 2, "groups": [[1, 1]]}]}
    assert api.post(f"/api/v1/runs/{rid}/steps", json=body).status_code == 404
    run = new_run(api, run_id=rid, reward_max=2.0)
    step = post_steps(api, run, [{"step": 3, "groups": [[1, 1], [2, 2]]}])["steps"][0]
    assert (step["acr_constant"], step["acr_all_pass"]) == (0.5, 0.5)


def test_the_api_takes_its_key_from_the_authorization_header_only(auth_server):
    """A key in a cookie is not a credential for the API (another site's form could send it)."""
    key = auth_server.keys["all"]
    with httpx.Client(base_url=auth_server.url, cookies={"vantage_key": key}) as c:
        assert c.get("/api/v1/runs").status_code == 401
        assert c.post("/api/v1/runs", json={"name": "x"}).status_code == 401
    with httpx.Client(base_url=auth_server.url, headers={"authorization": f"Bearer {key}"}) as c:
        assert c.get("/api/v1/runs").status_code == 200


def test_a_client_that_leaves_mid_body_stores_nothing_and_logs_no_traceback(auth_server, api):
    run = new_run(api)
    logged_before = len(auth_server.log_path.read_text())
    where = urlsplit(auth_server.url)
    head = (
        f"POST /api/v1/runs/{run['run_id']}/steps HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {auth_server.keys['all']}\r\n"
        "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    )
    with socket.create_connection((where.hostname, where.port)) as sock:
        sock.sendall(head.encode() + b'{"attempt": 1, "records": ')
    time.sleep(0.5)
    assert api.get(f"/api/v1/runs/{run['run_id']}/metrics").json()["points"] == []
    log = auth_server.log_path.read_text()[logged_before:]
    assert "ClientDisconnect" not in log and "Exception in ASGI application" not in log


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/v1/runs", {"name": "b", "reward_min": True}),
        ("/api/v1/runs", {"name": "b", "world_size": "2"}),
        ("/api/v1/runs", {"name": "b", "heartbeat_s": False}),
        ("/api/v1/acr", {"groups": [[0, 1]], "tol": True}),
        ("/api/v1/alert-rules", {"name": "b", "metric": "acr", "op": ">", "threshold": True}),
        (
            "/api/v1/alert-rules",
            {"name": "b", "metric": "acr", "op": ">", "threshold": 0.5, "for_steps": "3"},
        ),
        (
            "/api/v1/alert-rules",
            {"name": "b", "metric": "acr", "op": ">", "threshold": 0.5, "enabled": "yes"},
        ),
    ],
)
def test_numbers_and_flags_are_not_read_from_booleans_or_strings(api, path, body):
    """As rewards are: `true` is no reward_min and "3" no step count (lax parsing would read
    them as 1.0 and 3)."""
    r = api.post(path, json=body)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["type"] in ("float_type", "int_type", "bool_type"), r.text


@pytest.mark.parametrize("method", ["GET", "DELETE"])
def test_an_id_with_nul_in_the_path_is_not_found(api, method):
    for path in ("/api/v1/runs/a%00b", "/api/v1/runs/a%00b/metrics", "/api/v1/alert-rules/1%00"):
        if method == "DELETE" and path.endswith("metrics"):
            continue
        r = api.request(method, path)
        assert r.status_code in (404, 422), (path, r.text)  # never 500
        assert "database" not in r.text
    for path in ("/api/v1/runs/a%00b", "/api/v1/runs/a%00b/metrics"):
        r = api.get(path)  # the same answer on both databases (PostgreSQL refuses NUL in text)
        assert (r.status_code, r.json()) == (404, {"detail": "run a\x00b not found"}), r.text
    r = api.post("/api/v1/runs/a%00b/steps", json={"attempt": 1, "records": []})
    assert r.status_code == 404, r.text


def test_unknown_api_routes_are_json_404_and_every_422_lists_its_errors(api):
    """Not the dashboard's HTML with 200 (a client's typo must not look like success)."""
    for method, path in [("GET", "/api/v1/nonexistent"), ("POST", "/api/v2/runs")]:
        r = api.request(method, path)
        assert r.status_code == 404 and r.json()["detail"].startswith("no such API route")
    run = new_run(api)
    assert api.post(f"/api/v1/runs/{run['run_id']}/metrics").status_code == 405
    # outside /api/ too (Dash's own catch-all answered any GET with its page and 200)
    for method, path in [("GET", "/robots.txt"), ("GET", "/nope"), ("POST", "/nope")]:
        r = api.request(method, path)
        assert r.status_code == 404 and r.json()["detail"].startswith("not found: /"), r.text
    assert api.post("/healthz").status_code == api.post("/dashboard/logout").status_code == 405
    # HEAD is answered as GET without a body, on every GET route (probes, link checkers)
    for path in ("/healthz", "/readyz", "/metrics", f"/api/v1/runs/{run['run_id']}/metrics"):
        head, get = api.head(path), api.get(path)
        assert (head.status_code, head.content) == (200, b""), path
        assert head.headers["content-length"] == str(len(get.content)), path
    assert api.head("/nope").status_code == 404
    root = api.get("/", follow_redirects=False)
    assert (root.status_code, root.headers["location"]) == (307, "/dashboard/")
    assert api.post("/").status_code == 405
    # 422s raised with one message have the list shape too; a NUL in a query is named
    bad_target = {"name": "w", "metric": "acr", "op": ">", "threshold": 1}
    bad_target["notify"] = ["http://169.254.169.254/x"]
    for r, loc in (
        (api.post("/api/v1/alert-rules", json=bad_target), []),
        # a query value names its place, as pydantic's query errors do
        (api.get("/api/v1/alerts", params={"since": "9999-12-31T23:59:59+23:59"}),
         ["query", "since"]),
    ):  # fmt: skip
        assert r.status_code == 422, r.text
        (error,) = r.json()["detail"]
        assert error["loc"] == loc and error["msg"], error
    r = api.get("/api/v1/runs", params={"project": "a\x00b"})
    # refused on every database: PostgreSQL cannot hold it, SQLite listed no run (helper 67)
    assert r.status_code == 422, r.text
    (error,) = r.json()["detail"]
    assert error["loc"] == ["query", "project"] and "NUL" in error["msg"]


def test_too_long_text_is_named_in_characters(api):
    """A text field's length error counts characters (it used to read "at most N items")."""
    run = new_run(api)
    rid = run["run_id"]
    cmd = api.post(f"/api/v1/runs/{rid}/commands", json={"type": "checkpoint", "params": {}})
    cid = cmd.json()["command_id"]
    for method, path, body, field in (
        ("post", "/api/v1/runs", {"name": "x", "project": "p" * 201}, "project"),
        ("patch", f"/api/v1/runs/{rid}", {"notes": "n" * 10_001}, "notes"),
        ("patch", f"/api/v1/runs/{rid}", {"name": ""}, "name"),
        (
            "post",
            f"/api/v1/runs/{rid}/commands/{cid}/ack",
            {"status": "applied", "step": 1, "detail": "d" * 2001},
            "detail",
        ),  # fmt: skip
        ("post", "/api/v1/silences", {"reason": "r" * 1001, "until_s": 60}, "reason"),
    ):
        r = api.request(method, path, json=body)
        assert r.status_code == 422, (path, r.text)
        (error,) = [e for e in r.json()["detail"] if e["loc"][-1] == field]
        assert "character" in error["msg"] and "items" not in error["msg"], error


def test_a_blank_or_bidi_spoofed_run_name_is_refused(api):
    r = api.post("/api/v1/runs", json={"name": " \t "})
    assert r.status_code == 422 and "visible character" in r.text, r.text
    r = api.post("/api/v1/runs", json={"name": "rtl \u202e gnp.exe"})  # reads "rtl exe.png"
    assert r.status_code == 422 and "bidirectional control" in r.text, r.text
    assert api.post("/api/v1/runs", json={"name": "עברית run"}).status_code == 201
    # invisible characters: "run\u200b" looked the same as "run" everywhere (a trial); the
    # joiners that Persian words and emoji sequences need stay
    for name in ("run\u200b", "\ufeffrun", "r\u00adun", "r\u2060un"):
        r = api.post("/api/v1/runs", json={"name": name})
        assert r.status_code == 422 and "invisible characters" in r.text, (name, r.text)
    for name in ("\u3164", "a\U000e0041b", "\u115f\u1160", "\u034fx"):  # fillers, tags
        r = api.post("/api/v1/runs", json={"name": name})
        assert r.status_code == 422 and "invisible characters" in r.text, (name, r.text)
    for name in ("\u200d", " \u200c ", "\u2800", "\ufe0f", "\u0301"):  # nothing to see
        r = api.post("/api/v1/runs", json={"name": name})
        assert r.status_code == 422 and "visible character" in r.text, (name, r.text)
    for name in (
        "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645",
        "\U0001f468\u200d\U0001f4bb run",
        "\u2764\ufe0f",
        "\U0001f3f4\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f",  # a flag
    ):
        assert api.post("/api/v1/runs", json={"name": name}).status_code == 201, name
    for body in ({"project": "p\u200b"}, {"tags": ["\ufeff"]}):
        r = api.post("/api/v1/runs", json={"name": "x", **body})
        assert r.status_code == 422 and "invisible characters" in r.text, (body, r.text)
    rule = {"name": "r\u200b", "metric": "acr", "op": ">", "threshold": 0.5}
    r = api.post("/api/v1/alert-rules", json=rule)
    assert r.status_code == 422 and "invisible characters" in r.text, r.text
    for name in ("a\u0007b", "two\nlines", "a\tb", "a\x85b", "a\u2028b"):  # as key names
        r = api.post("/api/v1/runs", json={"name": name})
        assert r.status_code == 422 and "control characters" in r.text, (name, r.text)
    # a project or tag too (no key could be made for a run of project "a\tb": a trial)
    for body in ({"project": "p\nq"}, {"tags": ["t\u0007"]}):
        r = api.post("/api/v1/runs", json={"name": "x", **body})
        assert r.status_code == 422 and "control characters" in r.text, (body, r.text)
    rule = {"name": "r", "metric": "acr", "op": ">", "threshold": 0.5, "project": "a\tb"}
    r = api.post("/api/v1/alert-rules", json=rule)
    assert r.status_code == 422 and "control characters" in r.text, r.text
    # a project, tag or alert severity shown in chat and on the dashboard: no bidi spoofing
    # (a severity "\u202elacitirc" read as "critical" in a chat message: a trial)
    for body in ({"project": "p\u202eq"}, {"tags": ["t\u2066"]}):
        r = api.post("/api/v1/runs", json={"name": "x", **body})
        assert r.status_code == 422 and "bidirectional control" in r.text, (body, r.text)
    rule = {"name": "r", "metric": "acr", "op": ">", "threshold": 0.5}
    for severity, says in (
        ("\u202elacitirc", "bidirectional control"),
        ("a\nb", "control characters"),
        ("", "at least 1 character"),
        (" ", "visible character"),  # "[ ]" in chat
        (" warning", "cannot start or end with a blank"),
        ("a\u200fb", "bidirectional control"),  # a mark reorders its neighbours too
        ("extreme", "must be one of info, warning, critical"),  # only these change a verdict
        ("bananas", "must be one of info, warning, critical"),
    ):
        r = api.post("/api/v1/alert-rules", json={**rule, "severity": severity})
        assert r.status_code == 422 and says in r.text, (severity, r.text)
    r = api.post("/api/v1/alert-rules", json={**rule, "name": "sev", "severity": "Critical"})
    assert r.status_code in (200, 201) and r.json()["severity"] == "critical", r.text
    run = new_run(api)
    r = api.patch(f"/api/v1/runs/{run['run_id']}", json={"name": "x\ny"})
    assert r.status_code == 422 and "control characters" in r.text, r.text
    # text people read: line breaks are fine, bidi controls not ("evil \u202edetaerc" read
    # "evil created" on the run page, a trial)
    r = api.patch(f"/api/v1/runs/{run['run_id']}", json={"notes": "two\nlines"})
    assert r.status_code == 200, r.text
    for path, body in (
        (f"/api/v1/runs/{run['run_id']}", {"notes": "evil \u202edetaerc"}),
        (f"/api/v1/runs/{run['run_id']}/commands", {"type": "stop", "reason": "\u2067x"}),
        ("/api/v1/alert-rules", {**rule, "description": "a\u061cb"}),
    ):
        r = api.request("PATCH" if "notes" in body else "POST", path, json=body)
        assert r.status_code == 422 and "bidirectional control" in r.text, (body, r.text)


def test_a_body_nested_too_deeply_is_a_422_on_every_route(api):
    """FastAPI's parser answered a bare 400 "There was an error parsing the body" where ingest's
    answered a 422 json_invalid (a trial); a body that is not UTF-8 is said to be so."""
    run = new_run(api)
    deep = "[" * 3000 + "]" * 3000
    for path, body in (
        ("/api/v1/runs", '{"name": "x", "config": ' + deep + "}"),
        ("/api/v1/alert-rules", deep),
        (f"/api/v1/runs/{run['run_id']}/steps", '{"attempt": 1, "records": ' + deep + "}"),
    ):
        r = api.post(path, content=body)
        assert r.status_code == 422, (path, r.text)
        (error,) = r.json()["detail"]
        assert error["type"] == "json_invalid" and error["loc"] == ["body"], (path, error)
        assert "Invalid JSON" in error["msg"], (path, error)
    # a UTF-16 byte-order mark made the parser try UTF-16: "'utf-16-le' codec can't decode
    # byte 0x7b in position 2: truncated data" (a trial)
    for path in ("/api/v1/runs", "/api/v1/alert-rules"):
        r = api.post(path, content=b"\xff\xfe{", headers={"content-type": "application/json"})
        assert r.status_code == 422, (path, r.text)
        assert r.json()["detail"][0]["msg"] == "Invalid JSON: the body is not UTF-8 text"


def test_bodies_are_json_whatever_their_content_type_and_body_errors_say_so(api):
    """`curl -d` sends a form's Content-Type; the raw-read ingest route always read JSON, and
    now every route does, with plain words for a body that is not a JSON object."""
    form = {"content-type": "application/x-www-form-urlencoded"}
    for headers in (form, {"content-type": "text/plain"}, {}):
        r = api.post("/api/v1/runs", content=b'{"name": "curl-d"}', headers=headers)
        assert r.status_code == 201 and r.json()["name"] == "curl-d", (headers, r.text)
    run = r.json()
    steps = b'{"attempt": 1, "records": [{"step": 0, "groups": [[1, 0]]}]}'
    r = api.post(f"/api/v1/runs/{run['run_id']}/steps", content=steps, headers=form)
    assert r.status_code == 200 and r.json()["accepted"] == 1
    for path in ("/api/v1/runs", f"/api/v1/runs/{run['run_id']}/steps"):  # both parsers
        for body, says in (
            (b"[1]", "the request body must be a JSON object"),
            (b"", "no body" if path == "/api/v1/runs" else "Invalid JSON"),
            (b"name=x", "Invalid JSON"),
        ):
            r = api.post(path, content=body, headers=form)
            (error,) = r.json()["detail"]
            assert r.status_code == 422 and error["loc"] == ["body"], (path, body, r.text)
            assert says in error["msg"], (path, body, r.text)


def test_a_compressed_body_gets_415_naming_its_encoding(api):
    import gzip

    run = new_run(api)
    body = gzip.compress(b'{"attempt": 1, "records": [{"step": 0, "groups": [[1, 0]]}]}')
    headers = {"content-type": "application/json", "content-encoding": "gzip"}
    r = api.post(f"/api/v1/runs/{run['run_id']}/steps", content=body, headers=headers)
    assert r.status_code == 415 and "Content-Encoding gzip" in r.json()["detail"], r.text
    r = api.post("/api/v1/runs", content=gzip.compress(b'{"name": "z"}'), headers=headers)
    assert r.status_code == 415
    assert api.get(f"/api/v1/runs/{run['run_id']}/metrics").json()["points"] == []  # nothing


@pytest.mark.parametrize(
    ("kind", "params", "says"),
    [
        ("set_mitigation", {"mode": "avspo", "alpha": -5}, "alpha must be a number above 0"),
        ("set_mitigation", {"mode": "aapo", "delta_low": "abc"}, "delta_low must be a number"),
        (
            "set_mitigation",
            {"mode": "aapo", "delta_low": 0.5, "delta_high": 0.1},
            "must not exceed",
        ),
        ("set_mitigation", {"mode": "avspo", "threshold": "sometimes"}, "threshold must be one of"),
        # one setting under two names: the trainer applied the threshold silently (a trial)
        (
            "set_mitigation",
            {"mode": "avspo", "threshold": "fixed", "variant": "adaptive"},
            "threshold and variant name one setting",
        ),
        ("set_mitigation", {"mode": "avspo", "beta": 1}, "unknown ['beta']"),
        ("set_sampling", {"temperature": 0.5, "top_p": 2}, "unknown ['top_p']"),
        # 1e-50 was stored and applied, and failed the run with NaN weights (a trial)
        ("set_sampling", {"temperature": 1e-50}, "a number from 0.01 to 10; got 1e-50"),
        ("checkpoint", {"x": 1}, "checkpoint takes no params"),
        ("stop", {"now": True}, "stop takes no params"),
    ],
)
def test_command_params_the_trainer_would_refuse_or_ignore_get_422(api, kind, params, says):
    """Checked when the command is issued, as the trainer's own config checks them (they were
    stored, then applied as they were, ignored, or rejected by the trainer with a raw error)."""
    run = new_run(api)
    r = api.post(f"/api/v1/runs/{run['run_id']}/commands", json={"type": kind, "params": params})
    assert r.status_code == 422 and says in r.text, r.text
    assert r.json()["detail"][0]["loc"] == ["body", "params"]  # the field to look at
    assert api.get(f"/api/v1/runs/{run['run_id']}/commands").json()["commands"] == []
    good = {"mode": "avspo", "threshold": "adaptive", "alpha": 0.5, "eta": 0.01, "tau": 0.4}
    ok = api.post(f"/api/v1/runs/{run['run_id']}/commands",
                  json={"type": "set_mitigation", "params": good})  # fmt: skip
    assert ok.status_code == 201


def test_a_long_unknown_run_id_is_not_repeated_whole(api):
    """A 404 names the run by its first 80 characters (a 5,000-character id was echoed whole)."""
    long_id = "r" * 5000
    steps = {"attempt": 1, "records": [{"step": 1, "groups": [[1, 0]]}]}
    for r in (
        api.get(f"/api/v1/runs/{long_id}/metrics"),
        api.post(f"/api/v1/runs/{long_id}/steps", json=steps),
        api.post(f"/api/v1/runs/{long_id}/commands", json={"type": "stop"}),
    ):
        assert r.status_code == 404, r.text
        assert r.json()["detail"] == f"run {'r' * 80}… not found"


def test_a_project_key_asking_for_another_project_is_told_so(auth_server, api):
    """A team's key (limited to project team-a): `GET /runs?project=team-b` listed team-a's
    runs as if they were team-b's, and creating a run under an id another project holds said
    404 'not found' (a trial)."""
    taken = new_run(api, project="team-b", run_id=f"taken-{uuid.uuid4().hex[:8]}")
    with auth_server.client("team-a") as team:
        mine = new_run(team, name="mine")
        assert mine["project"] == "team-a"
        typo = team.get("/api/v1/runs", params={"projct": "team-a"})  # listed every run
        assert typo.status_code == 422 and typo.json()["detail"][0]["loc"] == ["query", "projct"]
        r = team.get("/api/v1/runs", params={"project": "team-b"})
        assert r.status_code == 403 and "limited to project 'team-a'" in r.text, r.text
        listed = team.get("/api/v1/runs", params={"project": "team-a"}).json()["runs"]
        assert mine["run_id"] in {run["run_id"] for run in listed}
        everything = team.get("/api/v1/runs").json()["runs"]
        assert taken["run_id"] not in {run["run_id"] for run in everything}
        r = team.post("/api/v1/runs", json={"name": "x", "run_id": taken["run_id"]})
        assert r.status_code == 409 and "taken by a run of another project" in r.text, r.text
        assert team.get(f"/api/v1/runs/{taken['run_id']}").status_code == 404  # still unseen
    assert api.get(f"/api/v1/runs/{taken['run_id']}").json()["attempt"] == 1  # untouched


def test_a_blank_project_is_no_project(api):
    """An empty `$PROJECT` made a project "" of its own, apart from runs without one (a trial)."""
    for blank in ("", "   "):
        run = api.post("/api/v1/runs", json={"name": "b", "project": blank}).json()
        assert run["project"] is None, run


def test_a_new_attempt_brings_its_group_size_and_config(api):
    """A relaunch with another group size or lr kept showing the first launch's (a trial); a
    rank of a known launch registering again changes nothing."""
    first = {"group_size": 4, "config": {"lr": 1e-4}}
    rid = new_run(api, launch_id="L1", **first)["run_id"]
    second = new_run(api, run_id=rid, launch_id="L2", group_size=8, config={"lr": 1e-5})
    assert second["attempt"] == 2
    assert (second["group_size"], second["config"]) == (8, {"lr": 1e-5})
    rank = new_run(api, run_id=rid, launch_id="L1", group_size=2, config={"lr": 1.0})
    assert rank["attempt"] == 1
    run = api.get(f"/api/v1/runs/{rid}").json()
    assert (run["group_size"], run["config"]) == (8, {"lr": 1e-5})


def test_a_launch_that_began_before_the_newest_attempt_is_refused(api):
    """`vantage sync` of a spool written while the server was down, after a relaunch had
    registered, made the old launch the newest attempt: its old steps replaced the relaunch's
    and the finished run turned failed. It is refused (409), and nothing changes."""
    now = time.time()
    rid = new_run(api, launch_id="L1", started_at=now - 7200)["run_id"]
    relaunch = new_run(api, run_id=rid, launch_id="L2", started_at=now - 3600)
    assert relaunch["attempt"] == 2
    post_steps(api, relaunch, [{"step": s, "groups": [[0, 1]]} for s in range(3)])
    old = {"name": "t", "run_id": rid, "launch_id": "L0", "started_at": now - 5000}
    r = api.post("/api/v1/runs", json=old)
    assert r.status_code == 409 and "before attempt 2" in r.json()["detail"], r.text
    run = api.get(f"/api/v1/runs/{rid}").json()
    assert run["attempt"] == 2 and run["last_step"] == 2
    # a known launch registering again is never refused; nor a clock a few minutes behind
    assert new_run(api, run_id=rid, launch_id="L1", started_at=now - 7200)["attempt"] == 1
    assert new_run(api, run_id=rid, launch_id="L3", started_at=now - 3700)["attempt"] == 3
    # without started_at (older clients), or on a launch registered without one: as before
    assert new_run(api, run_id=rid, launch_id="L4")["attempt"] == 4
    r = api.post("/api/v1/runs", json={**old, "launch_id": "L5", "started_at": now - 60})
    assert r.status_code == 200 and r.json()["attempt"] == 5
    r = api.post("/api/v1/runs", json={**old, "launch_id": "L6", "started_at": now - 3600})
    assert r.status_code == 409  # L5 began a minute ago by its clock
    for bad in (0, -1, "soon", float("inf"), 1e12):
        body = {**old, "launch_id": "L7", "started_at": bad}
        r = api.post("/api/v1/runs", content=json.dumps(body))
        assert r.status_code == 422, (bad, r.text)


def test_a_heartbeat_too_short_and_a_url_given_twice(api):
    """`heartbeat_s` 1e-9 was taken and the run was "stale" from its start; one URL given 100
    times was "more than 20 URLs" (trials)."""
    r = api.post("/api/v1/runs", json={"name": "x", "heartbeat_s": 1e-9})
    assert r.status_code == 422 and "greater than or equal to 0.1" in r.text, r.text
    url = "http://127.0.0.1:9/hook"
    rule = {"name": "once-each", "metric": "acr", "op": ">", "threshold": 0.5,
            "notify": [url] * 100}  # fmt: skip
    r = api.post("/api/v1/alert-rules", json=rule)
    assert r.status_code == 201 and r.json()["notify"] == [url], r.text
    assert api.delete(f"/api/v1/alert-rules/{r.json()['id']}").status_code == 204
    # one target spelled several ways got every message as many times (a trial); another
    # path or port is another target
    spellings = ["HTTP://127.0.0.1:9/hook#chat", url, "http://127.0.0.1:9/hook#ops",
                 "http://127.0.0.1:9/Hook", "http://127.0.0.1:19/hook"]  # fmt: skip
    r = api.post("/api/v1/alert-rules", json={**rule, "notify": spellings})
    assert r.status_code == 201, r.text
    assert r.json()["notify"] == [spellings[0], *spellings[3:]], r.text
    r = api.put(f"/api/v1/alert-rules/{r.json()['id']}", json={"notify": [url, url.upper()]})
    assert r.status_code == 200 and r.json()["notify"] == [url, url.upper()], r.text
    # so do a percent-encoded letter, an empty query and the host's trailing dot (a trial); an
    # encoded slash is no slash
    more = ["http://127.0.0.1:9/%68ook", "http://127.0.0.1:9/hook?", "http://127.0.0.1.:9/hook",
            "HTTP://127.0.0.1:9/ho%6Fk#x", "http://127.0.0.1:9/a%2fb", "http://127.0.0.1:9/a/b",
            "http://127.0.0.1:9/a%2Fb"]  # fmt: skip
    r = api.put(f"/api/v1/alert-rules/{r.json()['id']}", json={"notify": [url, *more]})
    assert r.status_code == 200 and r.json()["notify"] == [url, more[4], more[5]], r.text
    assert api.delete(f"/api/v1/alert-rules/{r.json()['id']}").status_code == 204


def test_tags_are_kept_once_and_never_empty(api):
    """`["ok", "ok"]` was stored twice and `[""]` as an empty tag (a trial)."""
    r = api.post("/api/v1/runs", json={"name": "tagged", "tags": ["ok", "b", "ok"]})
    assert r.status_code == 201 and r.json()["tags"] == ["ok", "b"], r.text
    r = api.patch(f"/api/v1/runs/{r.json()['run_id']}", json={"tags": ["c", "c"]})
    assert r.status_code == 200 and r.json()["tags"] == ["c"], r.text
    r = api.post("/api/v1/runs", json={"name": "tagged", "tags": [""]})
    assert r.status_code == 422 and "at least 1 character" in r.text, r.text


def test_every_api_read_refuses_a_parameter_it_does_not_take(auth_server, api):
    """`prompts?sid=all_pass` listed every side and `export.csv?splt=eval` every split: only the
    runs list and alerts refused an unknown parameter (a trial). Every GET under /api/v1/ now
    answers 422 naming each unknown one, and one of its own given twice (`?project=a&project=b`
    took b), and still takes its own; the health routes, which probes and scrapers call with
    parameters of their own, are left alone."""
    run = new_run(api)
    rid = run["run_id"]
    steps = {"attempt": 1, "records": [{"step": 1, "groups": [[1, 0], [1, 1]]}]}
    assert api.post(f"/api/v1/runs/{rid}/steps", json=steps).status_code == 200
    reads = {
        "/api/v1/runs": {"tag": "x"},
        f"/api/v1/runs/{rid}": {},
        f"/api/v1/runs/{rid}/metrics": {"split": "train", "max_points": 5},
        f"/api/v1/runs/{rid}/summary": {},
        f"/api/v1/runs/{rid}/prompts": {"side": "all_pass", "format": "csv"},
        f"/api/v1/runs/{rid}/export.csv": {"split": "train"},
        f"/api/v1/runs/{rid}/commands": {},
        "/api/v1/alert-rules": {},
        "/api/v1/alerts": {"run_id": rid},
        "/api/v1/silences": {"active": "true"},
    }
    for path, own in reads.items():
        assert api.get(path, params=own).status_code == 200, path
        r = api.get(path, params=[*own.items(), ("sid", "1"), ("splt", "a"), ("sid", "2")])
        assert r.status_code == 422, (path, r.text)
        assert [e["loc"] for e in r.json()["detail"]] == [["query", "sid"], ["query", "splt"]]
        for name, value in own.items():  # a one-value parameter given twice: which one?
            r = api.get(path, params=[(name, value), (name, value)])
            assert r.status_code == 422, (path, r.text)
            assert r.json()["detail"][0]["loc"] == ["query", name], r.text
            assert "given 2 times" in r.json()["detail"][0]["msg"]
            # a NUL: PostgreSQL refused it (422) where SQLite matched nothing (200): helper 67
            r = api.get(path, params={**own, name: f"{value}\x00"})
            assert r.status_code == 422, (path, r.text)
            assert r.json()["detail"][0]["loc"] == ["query", name], r.text
            assert r.json()["detail"][0]["msg"] == "cannot contain NUL characters", r.text
    r = api.get("/api/v1/runs", params={"project": "a\x00"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "project"], r.text
    csv = api.get(f"/api/v1/runs/{rid}/export.csv", params={"split": "eval"})
    assert csv.status_code == 200 and csv.text.count("\n") == 1  # the header: no eval steps
    assert api.get("/healthz", params={"probe": "1"}).status_code == 200
    assert api.get("/readyz", params={"probe": "1"}).status_code == 200


def test_an_empty_filter_value_is_refused_not_matched(api):
    """`GET /runs?project=` listed no run and `/alerts?run_id=` said "run  not found" (a
    trial): an empty filter is a 422 naming it; leaving the parameter out lists everything."""
    new_run(api)
    for path, name in (
        ("/api/v1/runs", "project"),
        ("/api/v1/runs", "tag"),
        ("/api/v1/alerts", "run_id"),
        ("/api/v1/alerts", "rule"),
    ):
        r = api.get(path, params={name: ""})
        assert r.status_code == 422, (path, name, r.text)
        assert r.json()["detail"][0]["loc"] == ["query", name], r.text
        assert "at least 1 character" in r.text
    assert api.get("/api/v1/runs").json()["runs"]


def test_latest_acr_is_that_of_the_newest_step_that_has_one(api):
    """A step of scalars only (or of invalid groups only) made the run's latest ACR null: the
    runs list showed none while the run was collapsing (a trial)."""
    rid = new_run(api)["run_id"]
    records = [
        {"step": 1, "groups": [[1, 1], [0, 1]]},
        {"step": 2, "scalars": {"loss": 0.5}},
        {"step": 3, "groups": [[1, None]]},
    ]
    for record in records:
        r = api.post(f"/api/v1/runs/{rid}/steps", json={"attempt": 1, "records": [record]})
        assert r.status_code == 200, r.text
        run = api.get(f"/api/v1/runs/{rid}").json()
        assert run["last_step"] == record["step"] and run["latest_acr"] == 0.5, run
    steps = {"attempt": 1, "records": [{"step": 4, "groups": [[0, 0], [0, 0], [1, 0], [1, 1]]}]}
    assert api.post(f"/api/v1/runs/{rid}/steps", json=steps).status_code == 200
    assert api.get(f"/api/v1/runs/{rid}").json()["latest_acr"] == 0.75
    # several steps in one batch, as the Monitor sends them: the newest that has an ACR counts
    # (step 5's, not step 4's nor none: a trial)
    records = [{"step": 5, "groups": [[1, 1, 1, 1]]}, {"step": 6, "scalars": {"x": 1}}]
    assert api.post(f"/api/v1/runs/{rid}/steps", json={"attempt": 1, "records": records}).is_success
    run = api.get(f"/api/v1/runs/{rid}").json()
    assert (run["last_step"], run["latest_acr"]) == (6, 1.0), run
    fresh = new_run(api)["run_id"]
    records = [{"step": 1, "groups": [[0, 1], [1, 1]]}, {"step": 2, "groups": [[None, 1]]}]
    batch = {"attempt": 1, "records": records}
    assert api.post(f"/api/v1/runs/{fresh}/steps", json=batch).is_success
    run = api.get(f"/api/v1/runs/{fresh}").json()
    assert (run["last_step"], run["latest_acr"]) == (2, 0.5), run
    assert run["latest_acr_step"] == 1
    # a late rank's groups for the step the ACR is from update it, though a newer step (of
    # scalars only) came in between; an older step's do not (a trial)
    ranks = new_run(api, world_size=2)["run_id"]
    for records in (
        [{"step": 5, "rank": 0, "groups": [[1, 1], [0, 1]]}],
        [{"step": 6, "rank": 0, "scalars": {"loss": 1.0}}],
        [{"step": 5, "rank": 1, "groups": [[0, 0], [0, 0]]}],
        [{"step": 4, "rank": 1, "groups": [[0, 1]]}],
    ):
        batch = {"attempt": 1, "records": records}
        assert api.post(f"/api/v1/runs/{ranks}/steps", json=batch).is_success
    run = api.get(f"/api/v1/runs/{ranks}").json()
    assert (run["last_step"], run["latest_acr"], run["latest_acr_step"]) == (6, 0.75, 5), run


def test_a_newer_attempt_that_takes_the_latest_acrs_step_over_without_one_hands_it_down(api):
    """A relaunch that repeats the step the run's latest ACR came from, with scalars only or
    invalid groups only, leaves that step without an ACR: the latest ACR is then the newest
    step's below that still has one (the runs list kept the replaced ACR: a trial)."""
    run_id = str(uuid.uuid4())
    body = {"run_id": run_id, "name": "relaunch", "launch_id": "a"}
    assert api.post("/api/v1/runs", json=body).status_code == 201
    live, collapsed = [0, 1, 0, 1], [1, 1, 1, 1]
    records = [
        {"step": 1, "groups": [collapsed, live]},
        {"step": 2, "groups": [collapsed, live, live, live]},
        {"step": 3, "groups": [collapsed, collapsed]},
    ]
    assert api.post(f"/api/v1/runs/{run_id}/steps", json={"attempt": 1, "records": records})
    run = api.get(f"/api/v1/runs/{run_id}").json()
    assert (run["latest_acr"], run["latest_acr_step"]) == (1.0, 3)
    for launch, records, expected in (
        ("b", [{"step": 3, "scalars": {"loss": 1.0}}], (0.25, 2)),
        # the batch's own step 2 without an ACR too, and step 1 taken over with a new one
        (
            "b",
            [{"step": 2, "groups": [[None, 1]]}, {"step": 1, "groups": [live, live]}],
            (0.0, 1),
        ),
        ("c", [{"step": 1, "groups": [[1]]}], (None, None)),  # degenerate: none is left
        ("c", [{"step": 4, "groups": [collapsed, live]}], (0.5, 4)),
    ):
        attempt = api.post("/api/v1/runs", json=body | {"launch_id": launch}).json()["attempt"]
        batch = {"attempt": attempt, "records": records}
        r = api.post(f"/api/v1/runs/{run_id}/steps", json=batch)
        assert r.status_code == 200, r.text
        run = api.get(f"/api/v1/runs/{run_id}").json()
        assert (run["latest_acr"], run["latest_acr_step"]) == expected, (records, run)
