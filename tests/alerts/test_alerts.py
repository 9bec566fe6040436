"""Alerts, webhooks and automatic mitigation (docs/design.md §6) against a real server process, on
SQLite and PostgreSQL. Webhooks go to a real HTTP receiver on 127.0.0.1.

The module has a database and server of its own: rules and silences are global state, and other
suites (a schemathesis run) may delete the built-in rules or add a silence for everything."""

from __future__ import annotations

import random
import threading
import time
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from tests.helpers.alerts import Receiver, alerts_of, make_rule
from tests.helpers.api import new_run, post_steps
from tests.helpers.cli import create_key, run_cli
from tests.helpers.postgres import database_for
from tests.helpers.server import start_server

ALL_FAIL = [[0, 0, 0, 0]] * 4
LIVE = [[0, 1, 0, 1]] * 4


def groups_with_acr(acr: float) -> list[list[int]]:
    """Four groups of four, round(4·acr) of them all failing."""
    k = round(4 * acr)
    return [[0, 0, 0, 0]] * k + [[0, 1, 0, 1]] * (4 - k)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def alerts_server(request, tmp_path_factory):
    url, drop = database_for(request.param, tmp_path_factory.mktemp("alerts-db"))
    run_cli("db", "upgrade", "--database-url", url)
    keys = {
        "read": create_key(url, "read"),
        "all": create_key(url, "ingest,read,control,admin", "all"),
    }
    project_key = ("keys", "create", "--name", "vision-lead", "--scopes", "read,control")
    out = run_cli(*project_key, "--project", "vision", "--database-url", url)
    keys["vision"] = out.stdout.strip().splitlines()[-1]
    srv = start_server(url, tmp_path_factory.mktemp("alerts-logs"))
    srv.keys = keys
    yield srv
    srv.stop()
    if drop is not None:
        drop()


@pytest.fixture
def api(alerts_server):
    with alerts_server.client("all") as client:
        yield client


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def test_default_rules_exist_and_are_editable(api):
    rules = {r["name"]: r for r in api.get("/api/v1/alert-rules").json()["rules"]}
    for name in (
        "acr_stall",
        "acr_early",
        "acr_volatility",
        "reward_drop",
        "non_finite_rewards",
        "reward_broken",
        "stale",
    ):
        assert rules[name]["builtin"] and rules[name]["mitigation"] is None
    # the ACR the run trains on: the effective ACR when the trainer reports it (migration 0014)
    assert (rules["acr_stall"]["metric"], rules["acr_stall"]["op"]) == ("acr_trained", ">")
    assert (rules["acr_stall"]["threshold"], rules["acr_stall"]["for_steps"]) == (0.35, 51)
    stall = rules["acr_stall"]
    r = api.put(f"/api/v1/alert-rules/{stall['id']}", json={"severity": "critical"})
    assert r.status_code == 200 and r.json()["severity"] == "critical"
    assert r.json()["threshold"] == 0.35
    api.put(f"/api/v1/alert-rules/{stall['id']}", json={"severity": "warning"})


def test_rule_crud_defaults_and_scopes(alerts_server, api):
    rule = make_rule(api, name="crud", metric="acr", op=">", threshold=0.5)
    assert rule["id"] and rule["for_steps"] == 1 and rule["min_valid_groups"] == 1
    assert rule["cooldown_steps"] == 0 and rule["severity"] == "warning"
    assert rule["clear_threshold"] is None and rule["notify"] == [] and rule["mitigation"] is None
    twice = ["http://127.0.0.1:9/a", "http://127.0.0.1:9/b", "http://127.0.0.1:9/a"]
    r = api.put(f"/api/v1/alert-rules/{rule['id']}", json={"notify": twice})
    assert r.status_code == 200 and r.json()["notify"] == twice[:2], r.text  # each URL once
    assert api.put(f"/api/v1/alert-rules/{rule['id']}", json={"notify": []}).status_code == 200
    with alerts_server.client("read") as reader:
        assert (
            reader.post(
                "/api/v1/alert-rules",
                json={"name": "x", "metric": "acr", "op": ">", "threshold": 1},
            ).status_code
            == 403
        )
        assert any(r["id"] == rule["id"] for r in reader.get("/api/v1/alert-rules").json()["rules"])
    for bad in (
        {"metric": "nope"},
        {"op": "=="},
        {"for_steps": 0},
        {"mitigation": {"type": "set_mitigation", "params": {"mode": "magic"}}},
        {"split": "../"},  # no record could carry it
        {"metric": "scalars." + "x" * 129},  # nor this scalar name (over 128 characters)
        {"name": "   "},  # no name a person could tell from another
        {"name": "crud "},  # nor one a silence of "crud" would miss (a trial)
    ):
        r = api.post(
            "/api/v1/alert-rules",
            json={"name": "bad", "metric": "acr", "op": ">", "threshold": 1, **bad},
        )
        assert r.status_code == 422, (bad, r.text)
    # text a database cannot hold is refused at the edge, naming the field (PostgreSQL's own
    # refusal of a NUL gave no field)
    nul_fields = (
        ("name", "a\u0000"),
        ("severity", "s\u0000"),
        ("notify", ["\u0000"]),
        ("metric", "scalars.lo\u0000ss"),
    )
    for field, value in nul_fields:
        body = {"name": "nul", "metric": "acr", "op": ">", "threshold": 1, field: value}
        r = api.post("/api/v1/alert-rules", json=body)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"][:2] == ["body", field], r.text
    # a mitigation's bad params are named as such, not the mitigation as a whole (a trial)
    for mitigation in (
        {"type": "set_mitigation", "params": {"mode": "x"}},
        {"type": "set_mitigation"},
    ):
        body = {"name": "m", "metric": "acr", "op": ">", "threshold": 1, "mitigation": mitigation}
        r = api.post("/api/v1/alert-rules", json=body)
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["loc"] == ["body", "mitigation", "params"], r.text
        assert "params.mode" in r.json()["detail"][0]["msg"]
    # a number param far out of range is told its range, not to be sent as a string, which it
    # cannot be; null params are none (both trials)
    tau = {"type": "set_mitigation", "params": {"mode": "avspo", "tau": 2**70}}
    body = {"name": "t", "metric": "acr", "op": ">", "threshold": 1, "mitigation": tau}
    r = api.post("/api/v1/alert-rules", json=body)
    assert r.status_code == 422 and "tau must be a number from 0 to 1" in r.text, r.text
    body["mitigation"] = {"type": "checkpoint", "params": None}
    r = api.post("/api/v1/alert-rules", json=body)
    assert r.status_code == 201 and r.json()["mitigation"]["params"] == {}, r.text
    assert api.delete(f"/api/v1/alert-rules/{r.json()['id']}").status_code == 204
    r = api.post("/api/v1/silences", json={"until": "2100-01-01T00:00:00Z", "reason": "\u0000"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "reason"], r.text
    past = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()  # it would mute nothing
    r = api.post("/api/v1/silences", json={"until": past, "reason": "too late"})
    assert r.status_code == 422 and "is not in the future" in r.text, r.text
    # a silence naming a rule that does not exist mutes nothing until one does: said (a typo?)
    later = "2100-01-01T00:00:00Z"
    r = api.post("/api/v1/silences", json={"until": later, "matchers": {"rule": "crdu"}})
    assert r.status_code == 201 and "no alert rule is named 'crdu' yet" in r.json()["warning"]
    assert api.delete(f"/api/v1/silences/{r.json()['id']}").status_code == 204
    r = api.post("/api/v1/silences", json={"until": later, "matchers": {"run_id": "no-such"}})
    assert r.status_code == 404, r.text
    r = api.post("/api/v1/silences", json={"until": later, "matchers": {"rule": "crud"}})
    assert r.status_code == 201 and "warning" not in r.json(), r.text
    assert api.delete(f"/api/v1/silences/{r.json()['id']}").status_code == 204
    for body in ({"until": later}, {"until": later, "matchers": {}}):  # allowed, and said
        r = api.post("/api/v1/silences", json=body)
        assert r.status_code == 201 and "of every alert" in r.json()["warning"], r.text
        assert api.delete(f"/api/v1/silences/{r.json()['id']}").status_code == 204
    # a matcher nothing can have is refused, not a silence that mutes nothing (a trial)
    for matchers in ({"rule": ""}, {"rule": " crud "}, {"project": ""}, {"run_id": ""}):
        r = api.post("/api/v1/silences", json={"until": later, "matchers": matchers})
        assert r.status_code == 422, (matchers, r.text)
    r = api.put(f"/api/v1/alert-rules/{rule['id']}", json={"threshold": 0.7, "for_steps": 3})
    assert (r.json()["threshold"], r.json()["for_steps"]) == (0.7, 3)
    # one name per scope: a second "crud" for every run would fire and notify twice
    same = {"name": "crud", "metric": "acr_eps", "op": ">", "threshold": 0.9}
    r = api.post("/api/v1/alert-rules", json=same)
    assert r.status_code == 409 and f"alert rule {rule['id']} is already named 'crud'" in r.text
    project_rule = make_rule(api, **same, project="crud-project")  # another scope: fine
    r = api.post("/api/v1/alert-rules", json={**same, "project": "crud-project"})
    assert r.status_code == 409 and "for project 'crud-project'" in r.text
    r = api.put(f"/api/v1/alert-rules/{project_rule['id']}", json={"project": None})
    assert r.status_code == 409, r.text  # moving it into the taken scope
    # a run's rule, named with or without the run's project (a project key adds it), is one
    # scope: two of one name both fired for the same run (a trial)
    run = new_run(api, project="crud-project")
    run_rule = make_rule(api, **same, run_id=run["run_id"])
    r = api.post("/api/v1/alert-rules", json={**same, "run_id": run["run_id"],
                                              "project": "crud-project"})  # fmt: skip
    assert r.status_code == 409 and f"for run {run['run_id']}" in r.text, r.text
    assert api.delete(f"/api/v1/alert-rules/{run_rule['id']}").status_code == 204
    assert api.put(f"/api/v1/alert-rules/{rule['id']}", json={"name": "crud"}).status_code == 200
    assert api.delete(f"/api/v1/alert-rules/{project_rule['id']}").status_code == 204
    assert api.delete(f"/api/v1/alert-rules/{rule['id']}").status_code == 204
    assert api.get(f"/api/v1/alert-rules/{rule['id']}").status_code == 404


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data",
        "http://[fe80::1]/hook",
        "http://metadata.google.internal/x",
        "http://100.100.100.200/",
        "ftp://example.com/x",
        "http://127.0.0.1:99999/x",
        "http://127.0.0.1:9/" + "b" * 2000,  # longer than the outbox stores
    ],
)
def test_link_local_and_metadata_targets_are_refused(api, url):
    r = api.post(
        "/api/v1/alert-rules",
        json={"name": "r", "metric": "acr", "op": ">", "threshold": 1, "notify": [url]},
    )
    assert r.status_code == 422 and ("webhook" in r.text or "at most 2000" in r.text), r.text


def test_reward_crash_fires_once_and_resolves_once(api, receiver):
    """ACR 0.25, 0.5, 0.75, then 1.0 twice (every group failing), then recovery, under
    `acr >= 0.9 for 2 steps`: firing at the second 1.0 step, resolved at recovery, one webhook
    each, and the rule's mitigation in the answer to the very request that fired it."""
    run = new_run(api, name="crash")
    rule = make_rule(
        api,
        name="crash",
        run_id=run["run_id"],
        metric="acr",
        op=">=",
        threshold=0.9,
        for_steps=2,
        notify=[receiver.url],
        severity="critical",
        mitigation={"type": "set_mitigation", "params": {"mode": "avspo"}},
    )
    answers = []
    for step, acr in enumerate([0.25, 0.5, 0.75, 1.0, 1.0, 0.25, 0.0, 1.0], start=1):
        answers.append(post_steps(api, run, [{"step": step, "groups": groups_with_acr(acr)}]))
        if step == 4:
            pending = alerts_of(api, run["run_id"], "crash")
            assert [(a["state"], a["pending_step"]) for a in pending] == [("pending", 4)]
    assert [a["commands"] for a in answers[:4]] == [[]] * 4
    fired_cmds = answers[4]["commands"]
    assert len(fired_cmds) == 1 and fired_cmds[0]["params"]["mode"] == "avspo"
    episodes = alerts_of(api, run["run_id"], "crash")
    # Step 8 (1.0 once) is pending, then the run ends: only the first episode fired.
    firing_or_resolved = [a for a in episodes if a["state"] != "pending"]
    assert len(firing_or_resolved) == 1
    ep = firing_or_resolved[0]
    assert (ep["state"], ep["pending_step"], ep["fired_step"], ep["resolved_step"]) == (
        "resolved",
        4,
        5,
        6,
    )
    assert ep["rule_id"] == rule["id"] and ep["severity"] == "critical"
    assert ep["fired_at"] and ep["resolved_at"]
    log = api.get(f"/api/v1/runs/{run['run_id']}/commands").json()["commands"]
    assert [(c["issued_by"], c["alert_id"]) for c in log] == [("alert:crash", ep["alert_id"])]
    # Re-delivered to rank 0 until acked.
    command_id = fired_cmds[0]["command_id"]
    assert [c["command_id"] for c in answers[5]["commands"]] == [command_id]
    ack = api.post(
        f"/api/v1/runs/{run['run_id']}/commands/{command_id}/ack",
        json={"status": "applied", "step": 6},
    )
    assert ack.status_code == 200
    assert post_steps(api, run, [{"step": 9, "groups": LIVE}])["commands"] == []
    messages = receiver.wait_for(2, timeout=10)
    time.sleep(1.5)  # nothing more arrives
    assert [(m["state"], m["step"]) for m in receiver.messages] == [("firing", 5), ("resolved", 6)]
    firing, resolved = messages
    assert firing["rule"] == "crash" and firing["run_id"] == run["run_id"]
    assert firing["run_name"] == "crash" and firing["value"] == 1.0
    assert firing["severity"] == "critical" and "dashboard_url" in firing
    assert "FIRING" in firing["text"] and "RESOLVED" not in firing["text"]
    assert "RESOLVED" in resolved["text"] and "FIRING" not in resolved["text"]
    assert resolved["value"] == 0.25
    assert receiver.times[1] - receiver.times[0] >= 0.9  # one message per second per URL
    assert alerts_of(api, run["run_id"], "crash", state="resolved")[0]["alert_id"] == ep["alert_id"]
    assert alerts_of(api, run["run_id"], "crash", state="firing") == []
    later = (datetime.now(UTC) + timedelta(minutes=5)).isoformat()
    assert alerts_of(api, run["run_id"], "crash", since=later) == []
    earlier = (datetime.now(UTC) - timedelta(minutes=5)).isoformat()
    assert alerts_of(api, run["run_id"], "crash", since=earlier) == alerts_of(
        api, run["run_id"], "crash"
    )
    far = api.get("/api/v1/alerts", params={"since": "0001-01-01T00:00:00Z"})
    assert far.status_code == 422 and far.json()["detail"][0]["loc"] == ["query", "since"]
    # a misspelt filter is a 422 naming it: it listed every alert (a trial)
    typo = api.get("/api/v1/alerts", params={"run": run["run_id"]})
    assert typo.status_code == 422 and typo.json()["detail"][0]["loc"] == ["query", "run"]
    bad_state = api.get("/api/v1/alerts", params={"state": "open"})
    assert bad_state.status_code == 422 and bad_state.json()["detail"][0]["loc"][-1] == "state"
    everything = api.get("/api/v1/alerts").json()["alerts"]
    assert any(a["alert_id"] == ep["alert_id"] for a in everything)
    created = [a["alert_id"] for a in everything]
    assert created == sorted(created, reverse=True)  # newest first


def test_min_valid_groups_blocks_small_steps(api):
    run = new_run(api)
    make_rule(
        api,
        name="needs8",
        run_id=run["run_id"],
        metric="acr",
        op=">=",
        threshold=0.5,
        min_valid_groups=8,
    )
    for step in range(1, 6):
        post_steps(api, run, [{"step": step, "groups": ALL_FAIL}])
    assert alerts_of(api, run["run_id"], "needs8") == []


def test_two_rank_step_is_evaluated_once_after_both_ranks(api):
    """Rank 0 alone has ACR 1/3; pooled with rank 1 it is 0.5. The rule only fires if the step
    was evaluated after both ranks reported."""
    run = new_run(api, world_size=2)
    make_rule(
        api,
        name="pooled",
        run_id=run["run_id"],
        metric="acr",
        op=">=",
        threshold=0.5,
        mitigation={"type": "checkpoint", "params": {}},
    )
    make_rule(api, name="whole", run_id=run["run_id"], metric="n_groups", op=">=", threshold=4)
    ans = post_steps(
        api, run, [{"step": 1, "rank": 0, "world_size": 2, "groups": [[1, 1], [0, 1], [1, 0]]}]
    )
    assert ans["commands"] == [] and alerts_of(api, run["run_id"], "pooled") == []
    ans = post_steps(api, run, [{"step": 1, "rank": 1, "world_size": 2, "groups": [[0, 0]]}])
    assert ans["commands"] == []  # commands go to rank 0 only
    (ep,) = alerts_of(api, run["run_id"], "pooled")
    assert (ep["state"], ep["fired_step"], ep["value"]) == ("firing", 1, 0.5)
    assert alerts_of(api, run["run_id"], "whole")[0]["value"] == 4
    hb = api.post(f"/api/v1/runs/{run['run_id']}/heartbeat", json={"attempt": 1, "rank": 0})
    assert [c["type"] for c in hb.json()["commands"]] == ["checkpoint"]
    # Rank 0 runs ahead: step 2 waits for rank 1 (a known rank) although step 3 arrived.
    post_steps(
        api,
        run,
        [
            {"step": 2, "rank": 0, "world_size": 2, "groups": [[1, 1], [0, 1], [1, 0]]},
            {"step": 3, "rank": 0, "world_size": 2, "groups": [[1, 1], [0, 1], [1, 0]]},
        ],
    )
    post_steps(api, run, [{"step": 2, "rank": 1, "world_size": 2, "groups": [[0, 0]]}])
    (whole,) = alerts_of(api, run["run_id"], "whole")
    assert (whole["state"], whole["value"]) == ("firing", 4)  # never evaluated with 3 groups


def test_groups_gathered_to_rank_0_are_evaluated_when_the_next_step_arrives(api):
    """An integration that gathers groups to rank 0 sends world_size 2 from rank 0 only: a step
    is evaluated when the next one arrives, and its command is in that answer."""
    run = new_run(api, world_size=2)
    make_rule(
        api,
        name="gathered",
        run_id=run["run_id"],
        metric="acr",
        op=">=",
        threshold=0.9,
        mitigation={"type": "stop", "params": {}},
    )
    first = post_steps(api, run, [{"step": 1, "world_size": 2, "groups": ALL_FAIL}])
    assert first["commands"] == [] and alerts_of(api, run["run_id"], "gathered") == []
    second = post_steps(api, run, [{"step": 2, "world_size": 2, "groups": LIVE}])
    assert [c["type"] for c in second["commands"]] == ["stop"]
    (ep,) = alerts_of(api, run["run_id"], "gathered")
    assert (ep["state"], ep["fired_step"]) == ("firing", 1)


def flap(api, run: dict, pattern: str) -> list[dict]:
    """Post one step per character: 'C' all groups failing (ACR 1), 'L' live groups (ACR 0)."""
    return [
        post_steps(api, run, [{"step": i, "groups": ALL_FAIL if c == "C" else LIVE}])
        for i, c in enumerate(pattern, start=1)
    ]


def test_auto_mitigation_respects_cooldown_steps(api):
    run = new_run(api)
    make_rule(
        api,
        name="cool",
        run_id=run["run_id"],
        metric="acr",
        op=">=",
        threshold=0.9,
        cooldown_steps=5,
        # a checkpoint: repeated at each episode, unlike settings already asked for
        mitigation={"type": "checkpoint", "params": {}},
    )
    answers = flap(api, run, "CLCLLLCL")  # fires at 1, 3 and 7
    fired = [e["fired_step"] for e in alerts_of(api, run["run_id"], "cool")]
    assert sorted(fired) == [1, 3, 7]
    issued = [
        i
        for i, a in enumerate(answers, start=1)
        if any(c["type"] == "checkpoint" for c in a["commands"])
    ]
    assert issued[0] == 1  # in the answer to the request whose step fired
    log = api.get(f"/api/v1/runs/{run['run_id']}/commands").json()["commands"]
    assert len(log) == 2  # step 3 is within 5 steps of step 1; step 7 is not
    by_step = {e["alert_id"]: e["fired_step"] for e in alerts_of(api, run["run_id"], "cool")}
    assert sorted(by_step[c["alert_id"]] for c in log) == [1, 7]


def test_a_mitigation_already_requested_is_not_issued_again(api):
    """Each new episode of a rule whose mitigation is already asked for (pending, delivered or
    applied) issues nothing; once another mitigation is asked for, it issues again."""
    run = new_run(api)
    rid = run["run_id"]
    avspo = {"type": "set_mitigation", "params": {"mode": "avspo"}}
    make_rule(api, name="again", run_id=rid, metric="acr", op=">=", threshold=0.9,
              mitigation=avspo)  # fmt: skip
    flap(api, run, "CLCLC")  # three episodes: fired at 1, 3 and 5
    assert sorted(e["fired_step"] for e in alerts_of(api, rid, "again")) == [1, 3, 5]

    def log() -> list[dict]:
        return api.get(f"/api/v1/runs/{rid}/commands").json()["commands"]

    (first,) = log()
    assert first["params"] == {"mode": "avspo"} and first["issued_by"] == "alert:again"
    r = api.post(f"/api/v1/runs/{rid}/commands/{first['command_id']}/ack",
                 json={"status": "applied", "step": 1})  # fmt: skip
    assert r.status_code == 200
    post_steps(api, run, [{"step": 6, "groups": LIVE}])
    post_steps(api, run, [{"step": 7, "groups": ALL_FAIL}])  # applied: still nothing new
    assert len(log()) == 1
    none = {"type": "set_mitigation", "params": {"mode": "none"}, "reason": "by hand"}
    assert api.post(f"/api/v1/runs/{rid}/commands", json=none).status_code == 201
    post_steps(api, run, [{"step": 8, "groups": LIVE}])
    post_steps(api, run, [{"step": 9, "groups": ALL_FAIL}])
    newest = log()[0]
    assert len(log()) == 3 and newest["params"] == {"mode": "avspo"}, log()


def test_a_sampling_or_stop_already_asked_for_is_not_issued_again(api):
    """The same for set_sampling (also while applied) and stop (while not yet acked); a
    checkpoint is issued at every episode."""

    def issued(kind: str, params: dict) -> list[dict]:
        run = new_run(api)
        rule = {"type": kind, "params": params}
        make_rule(api, name=f"again-{kind}", run_id=run["run_id"], metric="acr", op=">=",
                  threshold=0.9, mitigation=rule)  # fmt: skip
        flap(api, run, "CLCLC")  # three episodes
        return api.get(f"/api/v1/runs/{run['run_id']}/commands").json()["commands"]

    assert len(issued("set_sampling", {"temperature": 1.3})) == 1
    assert len(issued("stop", {})) == 1
    assert len(issued("checkpoint", {})) == 3


def test_a_run_that_has_ended_gets_no_alert_until_it_is_relaunched(api, receiver):
    """Steps stored after the run finished (a rank's late steps, a `vantage sync`) fire no
    alert and issue no command: the finish resolved the run's alerts, and one fired after it
    stayed firing for ever, as nothing resolves an ended run's alert (a fresh-user trial); a
    pending command would reach a relaunch as new (a trial found one left pending). A
    relaunch acts again."""
    run = new_run(api, launch_id="first")
    rid = run["run_id"]
    avspo = {"type": "set_mitigation", "params": {"mode": "avspo"}}
    make_rule(api, name="ended", run_id=rid, metric="acr", op=">=", threshold=0.9,
              mitigation=avspo, notify=[receiver.url])  # fmt: skip
    post_steps(api, run, [{"step": 0, "groups": LIVE}])
    assert api.post(f"/api/v1/runs/{rid}/finish", json={"status": "finished"}).status_code == 200
    answer = post_steps(api, run, [{"step": 1, "groups": ALL_FAIL}])
    assert alerts_of(api, rid, "ended") == []
    assert answer["commands"] == []
    time.sleep(1.2)
    assert receiver.messages == []
    assert api.get(f"/api/v1/runs/{rid}/commands").json()["commands"] == []
    again = new_run(api, run_id=rid, launch_id="second")
    assert again["attempt"] == 2
    answer = post_steps(api, again, [{"step": 2, "groups": ALL_FAIL}])
    assert [c["params"] for c in answer["commands"]] == [{"mode": "avspo"}]
    assert [e["fired_step"] for e in alerts_of(api, rid, "ended")] == [2]


def test_an_alert_that_fires_and_resolves_in_one_batch_tells_both(api, receiver):
    """One POST whose steps made an alert fire and then resolve sent the firing message only:
    the resolution looked for the firing's messages in the database before they were written,
    so chat showed the alert firing for ever (a fresh-user trial)."""
    run = new_run(api)
    make_rule(api, name="one-batch", run_id=run["run_id"], metric="acr", op=">", threshold=0.8,
              for_steps=2, notify=[receiver.url])  # fmt: skip
    steps = [{"step": s, "groups": ALL_FAIL} for s in (1, 2)] + [{"step": 3, "groups": LIVE}]
    post_steps(api, run, steps)
    (alert,) = alerts_of(api, run["run_id"], "one-batch")
    assert (alert["state"], alert["fired_step"], alert["resolved_step"]) == ("resolved", 2, 3)
    messages = receiver.wait_for(2)
    assert [(m["state"], m["step"]) for m in messages] == [("firing", 2), ("resolved", 3)]


@pytest.mark.parametrize("mode", ["suggest", "off"])
def test_suggest_and_off_modes_issue_no_command(api, mode):
    run = new_run(api)
    r = api.patch(f"/api/v1/runs/{run['run_id']}", json={"mitigation_mode": mode})
    assert r.status_code == 200 and r.json()["mitigation_mode"] == mode
    mitigation = {"type": "set_mitigation", "params": {"mode": "avspo"}}
    make_rule(
        api,
        name="modes",
        run_id=run["run_id"],
        metric="acr",
        op=">=",
        threshold=0.9,
        mitigation=mitigation,
    )
    answers = flap(api, run, "C")
    assert answers[0]["commands"] == []
    assert api.get(f"/api/v1/runs/{run['run_id']}/commands").json()["commands"] == []
    (ep,) = alerts_of(api, run["run_id"], "modes")
    assert ep["state"] == "firing"
    assert ep["mitigation"] == (mitigation if mode == "suggest" else None)


def test_silence_mutes_notifications_but_not_evaluation(api, receiver):
    run = new_run(api)
    until = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    r = api.post(
        "/api/v1/silences",
        json={
            "matchers": {"run_id": run["run_id"], "rule": "hush"},
            "until": until,
            "reason": "maintenance",
        },
    )
    assert r.status_code == 201, r.text
    silence = r.json()
    assert any(s["id"] == silence["id"] for s in api.get("/api/v1/silences").json()["silences"])
    make_rule(
        api,
        name="hush",
        run_id=run["run_id"],
        metric="acr",
        op=">=",
        threshold=0.9,
        notify=[receiver.url],
    )
    flap(api, run, "CL")
    assert [a["state"] for a in alerts_of(api, run["run_id"], "hush")] == ["resolved"]
    time.sleep(1.5)
    assert receiver.messages == []
    assert api.delete(f"/api/v1/silences/{silence['id']}").status_code == 204
    post_steps(api, run, [{"step": 3, "groups": ALL_FAIL}])
    assert [m["state"] for m in receiver.wait_for(1)] == ["firing"]


def test_a_silence_begun_while_firing_lets_the_resolution_through(api, receiver):
    """An alert told as firing is told as resolved though a silence began in between (chat
    showed it firing for ever: a trial); the silence mutes the next episode."""
    run = new_run(api)
    make_rule(api, name="late-hush", run_id=run["run_id"], metric="acr", op=">=",
              threshold=0.9, notify=[receiver.url])  # fmt: skip
    flap(api, run, "C")
    assert [m["state"] for m in receiver.wait_for(1)] == ["firing"]
    until = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    silence = {"matchers": {"run_id": run["run_id"]}, "until": until}
    assert api.post("/api/v1/silences", json=silence).status_code == 201
    post_steps(api, run, [{"step": 2, "groups": LIVE}, {"step": 3, "groups": ALL_FAIL}])
    post_steps(api, run, [{"step": 4, "groups": LIVE}])
    assert len(alerts_of(api, run["run_id"], "late-hush")) == 2
    time.sleep(1.5)
    assert [m["state"] for m in receiver.wait_for(2)] == ["firing", "resolved"]


@pytest.mark.parametrize(
    "change", ["disable", "delete", "other metric", "other split", "other project"]
)
def test_a_rule_that_stops_watching_a_firing_alert_resolves_it(api, receiver, change):
    """Disabling a rule, deleting it, pointing it at another metric or moving it to another
    project left its firing alert firing for ever, with no resolved message (a trial): it
    resolves now, at no step, and the chat that heard of it hears why. Runs still in the
    rule's scope keep their alert."""
    mine, other = new_run(api, project="proj-a"), new_run(api, project="proj-b")
    rule = make_rule(api, name=f"stop-{change}", project=None, metric="acr", op=">=",
                     threshold=0.9, notify=[receiver.url])  # fmt: skip
    for run in (mine, other):
        flap(api, run, "C")
    assert [m["state"] for m in receiver.wait_for(2)] == ["firing", "firing"]
    path = f"/api/v1/alert-rules/{rule['id']}"
    if change == "delete":
        assert api.delete(path).status_code == 204
    else:
        body = {"disable": {"enabled": False}, "other metric": {"metric": "acr_all_fail"},
                "other split": {"split": "eval"},
                "other project": {"project": "proj-b"}}[change]  # fmt: skip
        assert api.put(path, json=body).status_code == 200, body
    messages = receiver.wait_for(4 if change != "other project" else 3)
    time.sleep(1.2)  # nothing more comes
    ended = [m for m in receiver.messages if m["state"] == "resolved"]
    ended_runs = {m["run_id"] for m in ended}
    assert ended_runs == ({mine["run_id"]} if change == "other project" else
                          {mine["run_id"], other["run_id"]}), messages  # fmt: skip
    why = {"disable": "disabled", "delete": "deleted", "other metric": "another metric",
           "other split": "another split",
           "other project": "no longer applies"}[change]  # fmt: skip
    assert all(why in m["text"] and m["step"] is None for m in ended), ended
    # which rule said it, scope included (rules of one name in several scopes looked alike)
    assert all((m["rule_id"], m["rule_project"], m["rule_run_id"]) == (rule["id"], None, None)
               for m in receiver.messages), receiver.messages  # fmt: skip
    firing_ids = {m["alert_id"] for m in receiver.messages if m["state"] == "firing"}
    assert {m["alert_id"] for m in ended} <= firing_ids
    if change == "delete":
        return
    (alert,) = alerts_of(api, mine["run_id"], rule["name"])
    assert alert["state"] == "resolved" and alert["resolved_step"] is None
    (kept,) = alerts_of(api, other["run_id"], rule["name"])
    assert kept["state"] == ("firing" if change == "other project" else "resolved")
    if change == "disable":  # enabled again, the rule starts over on the next step
        assert api.put(path, json={"enabled": True}).status_code == 200
        post_steps(api, mine, [{"step": 2, "groups": ALL_FAIL}])
        states = [a["state"] for a in alerts_of(api, mine["run_id"], rule["name"])]
        assert sorted(states) == ["firing", "resolved"]


def test_rules_changed_while_their_runs_ingest_never_fail(alerts_server, api):
    """Rules disabled, re-enabled, re-pointed and moved between projects while their runs
    ingest: no request fails (a change that locked its runs one by one between writes met
    ingest and other changes in deadlocks on PostgreSQL, and "database is locked" on SQLite:
    a trial), and a rule left disabled has no alert still firing."""
    runs = [new_run(api, name=f"race-{i}", project=("pa", "pb")[i % 2]) for i in range(4)]
    rules = [make_rule(api, name=f"race-{j}", metric="acr", op=">", threshold=0.5)
             for j in range(4)]  # fmt: skip
    changes = [{"enabled": False}, {"enabled": True}, {"metric": "acr_eps"}, {"metric": "acr"},
               {"project": "pa", "run_id": None}, {"project": None, "run_id": None},
               *({"run_id": r["run_id"], "project": None} for r in runs)]  # fmt: skip
    failures: list[str] = []
    stop = threading.Event()

    def ingest(run: dict) -> None:
        with alerts_server.client("all") as client:
            for step in range(1, 1000):
                if stop.is_set():
                    return
                groups = LIVE if step % 5 == 0 else ALL_FAIL
                body = {"attempt": 1, "records": [{"step": step, "groups": groups}]}
                r = client.post(f"/api/v1/runs/{run['run_id']}/steps", json=body)
                if r.status_code != 200:
                    failures.append(f"ingest {r.status_code}: {r.text[:300]}")

    def change(rule: dict, seed: int) -> None:
        rng = random.Random(seed)
        with alerts_server.client("all") as client:
            while not stop.is_set():
                body = rng.choice(changes)
                r = client.put(f"/api/v1/alert-rules/{rule['id']}", json=body)
                if r.status_code != 200:
                    failures.append(f"PUT {body} {r.status_code}: {r.text[:300]}")

    threads = [threading.Thread(target=ingest, args=(r,)) for r in runs]
    threads += [threading.Thread(target=change, args=(r, i)) for i, r in enumerate(rules)]
    for t in threads:
        t.start()
    time.sleep(8)
    stop.set()
    for t in threads:
        t.join(60)
    assert failures == []
    for rule in rules:
        off = api.put(f"/api/v1/alert-rules/{rule['id']}", json={"enabled": False})
        assert off.status_code == 200
        for run in runs:
            assert alerts_of(api, run["run_id"], rule["name"], state="firing") == []


def test_scalars_and_reward_drop_metrics(api):
    run = new_run(api)
    make_rule(api, name="loss", run_id=run["run_id"], metric="scalars.loss", op=">", threshold=5)
    make_rule(api, name="drop", run_id=run["run_id"], metric="reward_drop", op=">=", threshold=0.5)
    good = [[1, 1, 1, 0]] * 4  # reward_mean 0.75
    bad = [[0, 0, 0, 1]] * 4  # reward_mean 0.25
    records = [{"step": s, "groups": good, "scalars": {"loss": 1.0}} for s in range(1, 11)]
    post_steps(api, run, records)
    assert alerts_of(api, run["run_id"], "drop") == []
    post_steps(api, run, [{"step": 11, "groups": bad, "scalars": {"loss": 9.0}}])
    post_steps(api, run, [{"step": 12, "groups": bad}])  # no loss: neither advances nor resets
    (loss,) = alerts_of(api, run["run_id"], "loss")
    assert (loss["state"], loss["fired_step"], loss["value"]) == ("firing", 11, 9.0)
    assert alerts_of(api, run["run_id"], "drop") == []  # 5-step mean 0.55: drop 0.27
    post_steps(api, run, [{"step": 13, "groups": bad}])  # mean 0.45: drop 0.4
    assert alerts_of(api, run["run_id"], "drop") == []
    post_steps(api, run, [{"step": 14, "groups": bad}])  # mean 0.35: (0.75 − 0.35) / 0.75
    (drop,) = alerts_of(api, run["run_id"], "drop")
    assert drop["fired_step"] == 14 and drop["value"] == pytest.approx(0.4 / 0.75)


def test_huge_rewards_leave_every_rule_evaluated(api):
    """Rewards of 1e308 once made reward_drop raise, which failed the whole evaluation of the
    run on every batch: no rule of that run ever fired again."""
    run = new_run(api, reward_min=-1e308, reward_max=1e308)
    make_rule(api, name="huge_acr", run_id=run["run_id"], metric="acr", op=">", threshold=0.5)
    make_rule(
        api, name="huge_drop", run_id=run["run_id"], metric="reward_drop", op=">", threshold=0.45
    )
    huge = [{"step": s, "groups": [[1e308, 1e308], [1e308, 1e308]]} for s in range(1, 11)]
    post_steps(api, run, huge)  # acr 1.0, reward_mean 1e308
    small = [[1, 1], [0, 1], [0, 1]]  # acr 1/3, reward_mean 2/3
    post_steps(api, run, [{"step": s, "groups": small} for s in range(11, 17)])
    (acr,) = alerts_of(api, run["run_id"], "huge_acr")
    assert (acr["state"], acr["fired_step"], acr["resolved_step"]) == ("resolved", 1, 11)
    (drop,) = alerts_of(api, run["run_id"], "huge_drop")
    # (1e308 − 2/3) / (1e308 − (−1e308)) once the latest 5 steps are all small
    assert drop["fired_step"] == 15 and drop["value"] == pytest.approx(0.5, rel=1e-12)


def test_resumed_run_replaying_steps_does_not_notify_again(api, receiver):
    """A new launch re-sends steps 1–2: the episode that already notified at step 1 is not
    announced again; a new collapse after the replay is."""
    run = new_run(api, launch_id="first")
    make_rule(
        api,
        name="replay",
        run_id=run["run_id"],
        metric="acr",
        op=">=",
        threshold=0.9,
        notify=[receiver.url],
    )
    flap(api, run, "CL")
    receiver.wait_for(2)
    resumed = new_run(api, run_id=run["run_id"], launch_id="second")
    assert resumed["attempt"] == 2
    flap(api, resumed, "CLC")
    messages = receiver.wait_for(3, timeout=10)
    time.sleep(1.5)
    assert [(m["state"], m["step"]) for m in receiver.messages] == [
        ("firing", 1),
        ("resolved", 2),
        ("firing", 3),
    ]
    assert messages


def test_a_replayed_step_counts_once_toward_for_steps(api):
    """A resumed launch re-sent steps 5-8 of an 8-step collapse: the rule counted them again
    and fired at 6 with only 8 steps behind a `for_steps` of 10 (a trial). Each step counts
    once; the streak goes on from the replay."""
    run = new_run(api, launch_id="L1")
    make_rule(api, name="ten", run_id=run["run_id"], metric="acr", op=">", threshold=0.5,
              for_steps=10)  # fmt: skip
    post_steps(api, run, [{"step": s, "groups": ALL_FAIL} for s in range(1, 9)])
    resumed = new_run(api, run_id=run["run_id"], launch_id="L2")
    post_steps(api, resumed, [{"step": s, "groups": ALL_FAIL} for s in range(5, 9)])
    (ep,) = alerts_of(api, run["run_id"], "ten")
    assert (ep["state"], ep["pending_step"], ep["fired_step"]) == ("pending", 1, None)
    post_steps(api, resumed, [{"step": s, "groups": ALL_FAIL} for s in (9, 10)])
    (ep,) = alerts_of(api, run["run_id"], "ten")
    assert (ep["state"], ep["pending_step"], ep["fired_step"]) == ("firing", 1, 10)
    # a replay whose steps no longer meet the condition ends the pending episode there, and
    # one that meets it from an earlier step starts the streak again at that step
    run2 = new_run(api, launch_id="M1")
    make_rule(api, name="three", run_id=run2["run_id"], metric="acr", op=">", threshold=0.5,
              for_steps=3)  # fmt: skip
    post_steps(api, run2, [{"step": s, "groups": LIVE if s < 3 else ALL_FAIL} for s in range(1, 5)])
    again = new_run(api, run_id=run2["run_id"], launch_id="M2")
    post_steps(api, again, [{"step": 2, "groups": ALL_FAIL}])
    (ep,) = alerts_of(api, run2["run_id"], "three")
    assert (ep["state"], ep["pending_step"]) == ("pending", 2)
    post_steps(api, again, [{"step": 3, "groups": ALL_FAIL}, {"step": 4, "groups": ALL_FAIL}])
    (ep,) = alerts_of(api, run2["run_id"], "three")
    assert (ep["state"], ep["pending_step"], ep["fired_step"]) == ("firing", 2, 4)


def test_builtin_rules_fire_on_their_conditions(api):
    """acr_stall: ACR > 0.35 for 51 steps; non_finite_rewards: clears after 10 clean steps;
    reward_broken: most groups constant."""
    run = new_run(api)
    stalled = [[0, 0, 0, 0]] * 3 + [[0, 1, 0, 1]]  # ACR 0.75
    post_steps(api, run, [{"step": s, "groups": stalled} for s in range(1, 52)])
    (stall,) = alerts_of(api, run["run_id"], "acr_stall")
    assert (stall["state"], stall["pending_step"], stall["fired_step"]) == ("firing", 1, 51)
    body = '{"attempt": 1, "records": [{"step": 52, "groups": [[1, NaN, 0, 1], [0, 1, 0, 1]]}]}'
    r = api.post(
        f"/api/v1/runs/{run['run_id']}/steps",
        content=body,
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 200, r.text
    (bad,) = alerts_of(api, run["run_id"], "non_finite_rewards")
    assert (bad["state"], bad["fired_step"], bad["value"]) == ("firing", 52, 1)
    post_steps(api, run, [{"step": s, "groups": LIVE} for s in range(53, 62)])  # 9 clean steps
    assert alerts_of(api, run["run_id"], "non_finite_rewards")[0]["state"] == "firing"
    post_steps(api, run, [{"step": 62, "groups": LIVE}])
    (bad,) = alerts_of(api, run["run_id"], "non_finite_rewards")
    assert (bad["state"], bad["resolved_step"]) == ("resolved", 62)
    post_steps(api, run, [{"step": 63, "groups": [[0.5, 0.5]] * 3 + [[0, 1]]}])
    assert alerts_of(api, run["run_id"], "reward_broken")[0]["fired_step"] == 63


def test_non_finite_rewards_fires_when_every_group_is_non_finite(api):
    """A step without a single valid group is the worst case of broken rewards: the built-in
    rule evaluates it (min_valid_groups 0), while a rule with the default of 1 skips it."""
    run = new_run(api)
    make_rule(
        api, name="strict_invalid", run_id=run["run_id"], metric="n_invalid", op=">", threshold=0
    )
    body = '{"attempt": 1, "records": [{"step": 1, "groups": [[NaN, 1], [null, 0, 1]]}]}'
    r = api.post(
        f"/api/v1/runs/{run['run_id']}/steps",
        content=body,
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 200 and r.json()["steps"][0]["n_valid"] == 0, r.text
    (bad,) = alerts_of(api, run["run_id"], "non_finite_rewards")
    assert (bad["state"], bad["fired_step"], bad["value"]) == ("firing", 1, 2)
    assert alerts_of(api, run["run_id"], "strict_invalid") == []
    rules = {r["name"]: r for r in api.get("/api/v1/alert-rules").json()["rules"]}
    assert rules["non_finite_rewards"]["min_valid_groups"] == 0
    assert rules["strict_invalid"]["min_valid_groups"] == 1


def test_clear_threshold_hysteresis_and_discarded_pending(api):
    run = new_run(api)
    make_rule(
        api,
        name="hyst",
        run_id=run["run_id"],
        metric="acr",
        op=">=",
        threshold=0.9,
        clear_threshold=0.5,
    )
    make_rule(
        api, name="twice", run_id=run["run_id"], metric="acr", op=">=", threshold=0.9, for_steps=2
    )
    for step, acr in enumerate([1.0, 0.75, 0.5, 0.25], start=1):
        post_steps(api, run, [{"step": step, "groups": groups_with_acr(acr)}])
        if step == 1:  # `twice` is pending after one step at 1.0
            assert alerts_of(api, run["run_id"], "twice", state="pending")
    (ep,) = alerts_of(api, run["run_id"], "hyst")
    # 0.75 lies between the clear threshold and the threshold, 0.5 is not strictly past 0.5.
    assert (ep["state"], ep["fired_step"], ep["resolved_step"]) == ("resolved", 1, 4)
    assert alerts_of(api, run["run_id"], "twice") == []  # discarded, never listed


def test_project_rules_apply_to_their_project_only(api):
    mine = new_run(api, project="vision")
    other = new_run(api, project="language")
    make_rule(api, name="vision-only", project="vision", metric="acr", op=">=", threshold=0.9)
    for run in (mine, other):
        post_steps(api, run, [{"step": 1, "groups": ALL_FAIL}])
    (episode,) = alerts_of(api, mine["run_id"], "vision-only")
    assert (episode["rule_project"], episode["rule_run_id"]) == ("vision", None)  # its scope
    assert alerts_of(api, other["run_id"], "vision-only") == []
    # A rule naming a run and another project: the project was ignored (a trial); refused.
    body = {"name": "both", "metric": "acr", "op": ">", "threshold": 0.5}
    crossed = {**body, "run_id": other["run_id"], "project": "vision"}
    r = api.post("/api/v1/alert-rules", json=crossed)
    assert r.status_code == 422 and "is in project language" in r.text, r.text
    agreed = make_rule(api, **body, run_id=mine["run_id"], project="vision")  # they agree
    # changing one of them alone is checked against the other (a PUT of the project alone
    # was 200: a trial)
    put = api.put(f"/api/v1/alert-rules/{agreed['id']}", json={"project": "language"})
    assert put.status_code == 422 and "is in project vision" in put.text, put.text
    put = api.put(f"/api/v1/alert-rules/{agreed['id']}", json={"run_id": other["run_id"]})
    assert put.status_code == 422 and "is in project language" in put.text, put.text
    # Deleting a run deletes its episodes and evaluation state with it.
    assert api.delete(f"/api/v1/runs/{mine['run_id']}").status_code == 204
    everything = api.get("/api/v1/alerts", params={"rule": "vision-only"}).json()["alerts"]
    assert everything == []


def test_a_project_key_changes_and_mutes_its_projects_alerts_only(alerts_server, api):
    """A key limited to a project reads the rules of every run but changes only its
    project's; its silences mute its project's alerts only; it sees no other project's."""
    rule = {"metric": "acr", "op": ">", "threshold": 0.9}
    everyone = make_rule(api, name="pk-global", **rule)
    language = make_rule(api, name="pk-language", project="language", **rule)
    vision = make_rule(api, name="pk-vision", project="vision", **rule)
    other_run = new_run(api, project="language")
    until = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    global_silence = api.post("/api/v1/silences", json={"until": until}).json()
    language_silence = api.post(
        "/api/v1/silences", json={"matchers": {"project": "language"}, "until": until}
    ).json()
    with alerts_server.client("vision") as key:
        rules = f"/api/v1/alert-rules/{everyone['id']}"
        assert key.get(rules).status_code == 200
        r = key.put(rules, json={"enabled": False})
        assert r.status_code == 403 and "(it applies to every run)" in r.text, r.text
        assert key.delete(rules).status_code == 403
        assert api.get(rules).json()["enabled"] is True  # unchanged
        assert key.put(f"/api/v1/alert-rules/{language['id']}", json={}).status_code == 404
        # a rule of another project's run, made by a key of every project: hidden as the run
        # is (it was listed, run id and all, to every project key: a trial)
        of_run = make_rule(api, name="pk-their-run", run_id=other_run["run_id"], **rule)
        assert of_run["project"] is None
        assert key.get(f"/api/v1/alert-rules/{of_run['id']}").status_code == 404
        listed = {r["name"] for r in key.get("/api/v1/alert-rules").json()["rules"]}
        assert "pk-their-run" not in listed and {"pk-global", "pk-vision"} <= listed
        r = key.put(f"/api/v1/alert-rules/{vision['id']}", json={"project": None})
        assert r.status_code == 200 and r.json()["project"] == "vision"
        # a rule of its project's run, made by a key of every project without naming the
        # project: the project's to change (a 403 said it applied to a run of that project)
        own_run = new_run(api, project="vision")
        hook = "http://127.0.0.1:9/services/s3cr3t"
        of_own = make_rule(api, name="pk-our-run", run_id=own_run["run_id"], notify=[hook], **rule)
        assert of_own["project"] is None
        path = f"/api/v1/alert-rules/{of_own['id']}"
        assert key.get(path).json()["notify"] == [hook]
        r = key.put(path, json={"threshold": 0.8})
        assert r.status_code == 200 and r.json()["threshold"] == 0.8, r.text
        assert key.delete(path).status_code == 204
        body = {"matchers": {"run_id": own_run["run_id"]}, "until": until}
        of_own = api.post("/api/v1/silences", json=body).json()  # its run's only: its own
        assert key.delete(f"/api/v1/silences/{of_own['id']}").status_code == 204
        created = key.post("/api/v1/alert-rules", json={"name": "pk-own", **rule}).json()
        assert created["project"] == "vision"
        assert key.delete(f"/api/v1/alert-rules/{created['id']}").status_code == 204

        r = key.post("/api/v1/silences", json={"until": until})
        assert r.status_code == 201 and r.json()["matchers"] == {"project": "vision"}, r.text
        assert "warning" not in r.json()  # its project's alerts only, not every alert
        own = r.json()
        # another project's rule is no rule to this key: no telling its names apart (a trial)
        body = {"matchers": {"rule": "pk-language"}, "until": until}
        r = key.post("/api/v1/silences", json=body)
        assert "no alert rule is named 'pk-language'" in r.json()["warning"], r.text
        assert key.delete(f"/api/v1/silences/{r.json()['id']}").status_code == 204
        body = {"matchers": {"project": "language"}, "until": until}
        assert key.post("/api/v1/silences", json=body).status_code == 403
        body = {"matchers": {"run_id": other_run["run_id"]}, "until": until}
        assert key.post("/api/v1/silences", json=body).status_code == 404
        seen = {s["id"] for s in key.get("/api/v1/silences").json()["silences"]}
        assert {own["id"], global_silence["id"]} <= seen and language_silence["id"] not in seen
        path = "/api/v1/silences/{}".format
        assert key.delete(path(language_silence["id"])).status_code == 404
        assert key.delete(path(global_silence["id"])).status_code == 403
        assert key.delete(path(own["id"])).status_code == 204
    for silence in (global_silence, language_silence):
        assert api.delete(f"/api/v1/silences/{silence['id']}").status_code == 204
    for made in (everyone, language, vision):
        assert api.delete(f"/api/v1/alert-rules/{made['id']}").status_code == 204


def test_webhook_urls_are_shown_in_full_only_to_keys_that_may_change_the_rule(alerts_server, api):
    """A webhook URL often holds a secret in its path (Slack's do): a read key, and a project
    key reading a global rule, see its scheme, host and port only (a trial: every read key,
    the dashboard's included, read them)."""
    secret = "http://127.0.0.1:9/services/T000/B000/s3cr3t?token=x#f"
    body = {"metric": "acr", "op": ">", "threshold": 0.9, "notify": [secret]}
    everyone = make_rule(api, name="secret-global", **body)
    vision = make_rule(api, name="secret-vision", project="vision", **body)
    ipv6 = make_rule(api, name="secret-v6", **{**body, "notify": ["http://[::1]:8080/p/q"]})
    shown = "http://127.0.0.1:9/…"
    assert api.get(f"/api/v1/alert-rules/{everyone['id']}").json()["notify"] == [secret]
    with alerts_server.client("read") as reader:
        for rule in (everyone, vision):
            assert reader.get(f"/api/v1/alert-rules/{rule['id']}").json()["notify"] == [shown]
        listed = {r["id"]: r["notify"] for r in reader.get("/api/v1/alert-rules").json()["rules"]}
        assert listed[everyone["id"]] == listed[vision["id"]] == [shown]
        assert listed[ipv6["id"]] == ["http://[::1]:8080/…"]
        assert secret not in reader.get("/api/v1/alert-rules").text
    with alerts_server.client("vision") as key:  # read and control, limited to project vision
        listed = {r["id"]: r["notify"] for r in key.get("/api/v1/alert-rules").json()["rules"]}
        assert listed[vision["id"]] == [secret] and listed[everyone["id"]] == [shown]
    for made in (everyone, vision, ipv6):
        assert api.delete(f"/api/v1/alert-rules/{made['id']}").status_code == 204


def test_window_metrics_follow_late_data_for_earlier_steps(api):
    """Window values walk on from the window kept at the last evaluated step; data that changes
    an earlier step (a late rank here) makes the server read the window again."""
    run = new_run(api)
    make_rule(api, name="pooled", run_id=run["run_id"], metric="acr_pooled", op=">=", threshold=0)

    def pooled_value() -> float:
        (alert,) = alerts_of(api, run["run_id"], "pooled")
        return alert["value"]

    post_steps(api, run, [{"step": 1, "groups": ALL_FAIL}])  # 4 of 4 collapsed
    post_steps(api, run, [{"step": 2, "groups": LIVE}])
    assert pooled_value() == pytest.approx(4 / 8)
    post_steps(api, run, [{"step": 1, "rank": 1, "groups": LIVE}])  # step 1 is now 4 of 8
    post_steps(api, run, [{"step": 3, "groups": LIVE}])
    assert pooled_value() == pytest.approx(4 / 16)
    post_steps(api, run, [{"step": 4, "groups": LIVE}])
    assert pooled_value() == pytest.approx(4 / 20)
    # Scalars for an evaluated step change no window input (tests/test_alert_windows.py checks
    # that the kept window stays); the values stay right.
    post_steps(api, run, [{"step": 4, "scalars": {"loss": 1.0}}])
    post_steps(api, run, [{"step": 5, "groups": ALL_FAIL}])
    assert pooled_value() == pytest.approx(8 / 24)


@pytest.mark.parametrize("late", ["newer_attempt_skips_a_step", "older_attempt_step_arrives"])
def test_window_metrics_after_a_resume_replays_an_earlier_step(api, late):
    """A resumed run that replays step 2 moves the rules back to it while the old attempt's
    later steps stay in the view: the window must count them, not walk past them."""
    run = new_run(api, launch_id="first")
    make_rule(api, name="pooled", run_id=run["run_id"], metric="acr_pooled", op=">=", threshold=0)

    def pooled_value() -> float:
        (alert,) = alerts_of(api, run["run_id"], "pooled")
        return alert["value"]

    post_steps(api, run, [{"step": s, "groups": LIVE} for s in range(1, 5)])
    resumed = new_run(api, run_id=run["run_id"], launch_id="second")
    post_steps(api, resumed, [{"step": 2, "groups": ALL_FAIL}])
    assert pooled_value() == pytest.approx(4 / 8)  # steps 1 and 2
    if late == "newer_attempt_skips_a_step":
        post_steps(api, resumed, [{"step": 4, "groups": ALL_FAIL}])  # step 3 stays attempt 1's
        assert pooled_value() == pytest.approx(8 / 16)
        post_steps(api, resumed, [{"step": 5, "groups": LIVE}])
        assert pooled_value() == pytest.approx(8 / 20)
    else:
        post_steps(api, run, [{"step": 5, "groups": LIVE}])  # the old launch's spooled step
        assert pooled_value() == pytest.approx(4 / 20)
        post_steps(api, resumed, [{"step": 6, "groups": LIVE}])
        assert pooled_value() == pytest.approx(4 / 24)


def test_switching_to_auto_acts_on_an_alert_already_firing(api):
    """A rule that fired in suggest mode issues its mitigation at the next step that meets its
    condition once the run is switched to auto, once per episode: a user who turns it off by
    hand is not overruled while the alert keeps firing (found by a fresh-user trial)."""
    run = new_run(api)
    rid = run["run_id"]
    api.patch(f"/api/v1/runs/{rid}", json={"mitigation_mode": "suggest"}).raise_for_status()
    avspo = {"type": "set_mitigation", "params": {"mode": "avspo"}}
    make_rule(api, name="late-auto", run_id=rid, metric="acr", op=">=", threshold=0.9,
              mitigation=avspo)  # fmt: skip
    flap(api, run, "CC")
    assert api.get(f"/api/v1/runs/{rid}/commands").json()["commands"] == []
    api.patch(f"/api/v1/runs/{rid}", json={"mitigation_mode": "auto"}).raise_for_status()
    answer = post_steps(api, run, [{"step": 3, "groups": ALL_FAIL}])
    (cmd,) = answer["commands"]
    assert cmd["params"] == {"mode": "avspo"} and "firing since step 1" in cmd["reason"]
    none = {"type": "set_mitigation", "params": {"mode": "none"}, "reason": "by hand"}
    assert api.post(f"/api/v1/runs/{rid}/commands", json=none).status_code == 201
    post_steps(api, run, [{"step": 4, "groups": ALL_FAIL}])
    log = api.get(f"/api/v1/runs/{rid}/commands").json()["commands"]
    assert [c["params"]["mode"] for c in log] == ["none", "avspo"]
    (ep,) = alerts_of(api, rid, "late-auto")
    assert ep["state"] == "firing" and ep["fired_step"] == 1


def test_an_offer_disappears_once_the_run_asks_for_it(api):
    """In suggest mode a firing alert offers its rule's command until the run asks for the same
    thing (by a click or by hand): a dashboard offered set_sampling while an identical one was
    pending (found by a fresh-user trial)."""
    run = new_run(api)
    rid = run["run_id"]
    api.patch(f"/api/v1/runs/{rid}", json={"mitigation_mode": "suggest"}).raise_for_status()
    sampling = {"type": "set_sampling", "params": {"temperature": 1.3}}
    make_rule(api, name="offer", run_id=rid, metric="acr", op=">=", threshold=0.9,
              mitigation=sampling)  # fmt: skip
    flap(api, run, "C")
    (ep,) = alerts_of(api, rid, "offer")
    assert ep["mitigation"] == sampling
    assert api.post(f"/api/v1/runs/{rid}/commands", json=sampling).status_code == 201
    (ep,) = alerts_of(api, rid, "offer")
    assert ep["state"] == "firing" and ep["mitigation"] is None


def test_names_at_their_limit_issue_commands(alerts_server, api):
    """A rule and a key named with the 200 characters their names may have issue commands: the
    command's issued_by ("alert:" or "key:" and the name) overflowed its column on PostgreSQL,
    which failed the alert pass of every run the rule covered (a trial)."""
    name = "r" * 200
    run = new_run(api, name="long-names")
    make_rule(
        api,
        name=name,
        run_id=run["run_id"],
        metric="acr",
        op=">",
        threshold=0.5,
        mitigation={"type": "checkpoint", "params": {}},
    )
    answer = post_steps(api, run, [{"step": 1, "groups": ALL_FAIL}])
    assert [c["type"] for c in answer["commands"]] == ["checkpoint"]
    log = api.get(f"/api/v1/runs/{run['run_id']}/commands").json()["commands"]
    assert [c["issued_by"] for c in log] == [f"alert:{name}"]
    assert [a["state"] for a in alerts_of(api, run["run_id"], name)] == ["firing"]

    key = create_key(alerts_server.database_url, "control,read", name="k" * 200)
    with httpx.Client(
        base_url=alerts_server.url, headers={"Authorization": f"Bearer {key}"}
    ) as client:
        r = client.post(f"/api/v1/runs/{run['run_id']}/commands", json={"type": "stop"})
        assert r.status_code == 201, r.text
    log = api.get(f"/api/v1/runs/{run['run_id']}/commands").json()["commands"]
    assert log[0]["issued_by"] == "key:" + "k" * 200


def test_parallel_writes_of_one_rule_name_store_it_once(alerts_server, api):
    """16 parallel creates of one name stored it 5 times on PostgreSQL, and two rules renamed
    to one name in parallel both got a 200 (a trial): each request had found the name free."""
    from concurrent.futures import ThreadPoolExecutor

    body = {"name": "raced", "metric": "acr", "op": ">", "threshold": 0.5}

    def create(_i: int) -> int:
        with alerts_server.client("all") as client:
            return client.post("/api/v1/alert-rules", json=body).status_code

    with ThreadPoolExecutor(16) as pool:
        codes = sorted(pool.map(create, range(16)))
    assert codes == [201] + [409] * 15, codes
    ids = [make_rule(api, **{**body, "name": f"raced-{i}"})["id"] for i in range(2)]

    def rename(rule_id: int) -> int:
        with alerts_server.client("all") as client:
            return client.put(
                f"/api/v1/alert-rules/{rule_id}", json={"name": "renamed"}
            ).status_code

    with ThreadPoolExecutor(2) as pool:
        assert sorted(pool.map(rename, ids)) == [200, 409]
    rules = api.get("/api/v1/alert-rules").json()["rules"]
    names = sorted(r["name"] for r in rules if r["name"].startswith(("raced", "renamed")))
    assert names in (["raced", "raced-0", "renamed"], ["raced", "raced-1", "renamed"]), names
    for rule in rules:
        if rule["name"].startswith(("raced", "renamed")):
            assert api.delete(f"/api/v1/alert-rules/{rule['id']}").status_code == 204


@pytest.mark.parametrize("end", ["finished", "failed", "deleted"])
def test_a_run_that_ends_resolves_its_alerts(api, receiver, end):
    """A run stopped with its alerts firing kept them firing for ever, and a deleted run's
    vanished: chat never heard they were over (a trial). Its firing alerts resolve at no step
    and say why; a pending one is dropped."""
    project = f"ends-{end}"
    run = new_run(api, project=project)
    make_rule(api, name=f"end-{end}", project=project, metric="acr", op=">=", threshold=0.9,
              notify=[receiver.url])  # fmt: skip
    make_rule(api, name=f"end-{end}-slow", project=project, metric="acr", op=">=",
              threshold=0.9, for_steps=5, notify=[receiver.url])  # fmt: skip
    flap(api, run, "C")
    assert [m["state"] for m in receiver.wait_for(1)] == ["firing"]
    assert alerts_of(api, run["run_id"], f"end-{end}-slow")[0]["state"] == "pending"
    if end == "deleted":
        assert api.delete(f"/api/v1/runs/{run['run_id']}").status_code == 204
    else:
        r = api.post(f"/api/v1/runs/{run['run_id']}/finish", json={"status": end})
        assert r.status_code == 200, r.text
    firing, resolved = receiver.wait_for(2)
    assert resolved["state"] == "resolved" and resolved["alert_id"] == firing["alert_id"]
    assert resolved["step"] is None and f"its run {end}" in resolved["text"].replace(
        "was deleted", "deleted"
    ), resolved
    time.sleep(1.2)
    assert len(receiver.messages) == 2  # nothing about the pending one
    if end != "deleted":
        (alert,) = alerts_of(api, run["run_id"], f"end-{end}")
        assert alert["state"] == "resolved" and alert["resolved_step"] is None
        assert alerts_of(api, run["run_id"], f"end-{end}-slow") == []


def test_a_run_deleted_just_after_its_alert_fired_tells_both(api, receiver):
    """Deleting a run a moment after its alert fired dropped the firing message, not sent yet,
    and so the resolution found nowhere to go: chat heard nothing (a trial)."""
    run = new_run(api, project="deleted-at-once")
    make_rule(api, name="deleted-at-once", project="deleted-at-once", metric="acr", op=">",
              threshold=0.5, for_steps=2, notify=[receiver.url])  # fmt: skip
    post_steps(api, run, [{"step": s, "groups": ALL_FAIL} for s in (1, 2)])
    assert api.delete(f"/api/v1/runs/{run['run_id']}").status_code == 204
    firing, resolved = receiver.wait_for(2)
    assert (firing["state"], resolved["state"]) == ("firing", "resolved")
    assert resolved["alert_id"] == firing["alert_id"] and "its run was deleted" in resolved["text"]


def test_an_alert_that_resolves_right_after_its_silence_ends_is_told_both(api, receiver):
    """Its silence deleted, the alert resolved at the next batch, before the periodic pass (5 s
    here) told its firing: neither message was sent (a trial). The batch tells the firing
    first, then the resolution."""
    run = new_run(api)
    until = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    r = api.post("/api/v1/silences", json={
        "matchers": {"run_id": run["run_id"]}, "until": until})  # fmt: skip
    make_rule(api, name="unmuted-at-once", run_id=run["run_id"], metric="acr", op=">=",
              threshold=0.9, notify=[receiver.url])  # fmt: skip
    post_steps(api, run, [{"step": 0, "groups": ALL_FAIL}])
    assert api.delete(f"/api/v1/silences/{r.json()['id']}").status_code == 204
    post_steps(api, run, [{"step": 1, "groups": LIVE}])  # before the periodic pass
    messages = receiver.wait_for(2)
    assert [(m["state"], m["step"]) for m in messages] == [("firing", 0), ("resolved", 1)]


def test_a_resolution_goes_where_the_firing_went(api, receiver):
    """A rule re-pointed while its alert fired sent "firing" to the old URL and "resolved" to
    the new one, so neither chat saw the whole episode (a trial)."""
    later = Receiver()
    try:
        run = new_run(api)
        rule = make_rule(api, name="re-pointed", run_id=run["run_id"], metric="acr", op=">=",
                         threshold=0.9, notify=[receiver.url])  # fmt: skip
        flap(api, run, "C")
        assert [m["state"] for m in receiver.wait_for(1)] == ["firing"]
        r = api.put(f"/api/v1/alert-rules/{rule['id']}", json={"notify": [later.url]})
        assert r.status_code == 200, r.text
        post_steps(api, run, [{"step": 2, "groups": LIVE}])
        assert [m["state"] for m in receiver.wait_for(2)] == ["firing", "resolved"]
        post_steps(api, run, [{"step": 3, "groups": ALL_FAIL}])  # a new episode: the new URL
        assert [m["state"] for m in later.wait_for(1)] == ["firing"]
        time.sleep(1.2)
        assert len(receiver.messages) == 2 and len(later.messages) == 1
    finally:
        later.close()


@pytest.mark.parametrize(
    ("condition", "says"),
    [({"metric": "acr", "op": ">", "threshold": 7}, "acr lies in [0, 1]: acr > 7 never holds"),
     ({"metric": "stale", "op": "<", "threshold": -1}, "stale lies in 0 or more: stale < -1 never"),
     ({"metric": "acr", "op": ">", "threshold": -5}, "always holds, so this rule fires at every"),
     ({"metric": "n_invalid", "op": ">=", "threshold": 0}, "always holds"),
     ({"metric": "acr", "op": ">", "threshold": 0.35}, None),
     ({"metric": "reward_mean", "op": "<", "threshold": -1e9}, None)],  # unbounded: no word
)  # fmt: skip
def test_a_rule_its_metrics_range_decides_is_taken_with_a_warning(api, condition, says):
    """`acr > -5` fired at every step of every run, and `acr > 7` never: both were taken
    without a word (a trial)."""
    name = f"ranged-{condition['metric']}-{condition['threshold']}"
    rule = make_rule(api, name=name, **condition)
    assert rule.get("warning") is None if says is None else says in rule["warning"], rule
    changed = api.put(f"/api/v1/alert-rules/{rule['id']}", json={"threshold": 0.5}).json()
    assert "warning" not in changed, changed
    assert api.delete(f"/api/v1/alert-rules/{rule['id']}").status_code == 204
