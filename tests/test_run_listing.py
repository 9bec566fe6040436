"""Health verdicts, the cost of collapse and the paginated runs list (issue 42, items 1, 2, 8),
through the API on SQLite and PostgreSQL (docs/design.md §9)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from vantage.server.health import WORST_FIRST, HealthInputs, verdict

COLLAPSED = [[1.0] * 4] * 4  # every group all-pass: ACR 1
LIVE = [[1.0, 0.0, 1.0, 0.0]] * 4  # no group collapsed: ACR 0


@pytest.mark.parametrize(
    ("inputs", "expected"),
    [
        (HealthInputs("running", 0.1), "healthy"),
        (HealthInputs("running", None), "starting"),
        (HealthInputs("running", 0.9), "collapsing"),
        (HealthInputs("running", 0.9, 0.5), "collapsing"),  # the mitigation does not hold it
        (HealthInputs("running", 0.9, 0.0), "mitigated"),
        (HealthInputs("running", 0.9, None, [("acr_stall", "warning")]), "stalled"),
        (HealthInputs("running", 0.9, 0.0, [("acr_stall", "warning")]), "mitigated"),
        (HealthInputs("running", 0.1, None, [("kl_spike", "warning")]), "warning"),
        (HealthInputs("running", 0.9, 0.0, [("kl_spike", "warning")]), "mitigated"),
        (HealthInputs("running", 0.1, None, [("loss_non_finite", "critical")]), "critical"),
        (HealthInputs("stale", 0.9, None, [("loss_non_finite", "critical")]), "critical"),
        (HealthInputs("stale", 0.9), "stale"),
        (HealthInputs("finished", 0.9, None, [("acr_stall", "critical")]), "finished"),
        (HealthInputs("failed", 0.1), "failed"),
    ],
)
def test_each_rule_of_the_verdict(inputs, expected):
    found = verdict(inputs)
    assert found["health"] == expected, found
    assert found["reason"]


def _run(client, name: str, groups=None, effective: int | None = None, **extra) -> str:
    body = client.post("/api/v1/runs", json={"name": name, "project": "p", **extra}).json()
    if groups is not None:
        record = {"step": 0, "groups": [{"rewards": g} for g in groups]}
        if effective is not None:
            record["effective"] = {"n_valid": len(groups), "n_zero_advantage": effective}
        record["scalars"] = {"step_s": 36.0}
        body_steps = {"attempt": body["attempt"], "records": [record]}
        client.post(f"/api/v1/runs/{body['run_id']}/steps", json=body_steps).raise_for_status()
    return body["run_id"]


def _fire(client, run_id: str, rule: str, severity: str) -> None:
    from vantage.server.alerts.models import AlertEpisode, AlertRule

    with client.app.state.session_factory() as s:
        rule_id = s.query(AlertRule.id).filter(AlertRule.name == rule).first()[0]
        s.add(AlertEpisode(rule_id=rule_id, run_id=run_id, state="firing", severity=severity))
        s.commit()


def test_health_is_ordered_and_filtered_in_the_database_as_the_rules_say(app_client):
    c = app_client
    expected = {
        "healthy": _run(c, "healthy", LIVE),
        "collapsing": _run(c, "collapsing", COLLAPSED),
        "mitigated": _run(c, "mitigated", COLLAPSED, effective=0),
        "stalled": _run(c, "stalled", COLLAPSED),
        "starting": _run(c, "starting"),
        "critical": _run(c, "critical", LIVE),
        "warning": _run(c, "warning", LIVE),
        "stale": _run(c, "stale", LIVE),
        "finished": _run(c, "finished", COLLAPSED),
        "failed": _run(c, "failed", LIVE),
    }
    _fire(c, expected["stalled"], "acr_stall", "warning")
    _fire(c, expected["mitigated"], "acr_stall", "warning")  # held by the mitigation
    _fire(c, expected["critical"], "acr_stall", "critical")
    _fire(c, expected["warning"], "acr_volatility", "warning")
    for status in ("finished", "failed"):
        c.post(f"/api/v1/runs/{expected[status]}/finish", json={"status": status})
    from vantage.server.models import Run

    with c.app.state.session_factory() as s:
        s.get(Run, expected["stale"]).last_seen_at = datetime.now(UTC) - timedelta(minutes=5)
        s.commit()

    runs = c.get("/api/v1/runs", params={"order": "health"}).json()["runs"]
    assert {r["name"]: r["health"] for r in runs} == {v: v for v in expected}
    assert [r["health"] for r in runs] == [h for h in WORST_FIRST if h in expected]
    for health, run_id in expected.items():  # the SQL rules agree with the Python ones
        found = c.get("/api/v1/runs", params={"health": health}).json()["runs"]
        assert [r["run_id"] for r in found] == [run_id], health
    detail = c.get(f"/api/v1/runs/{expected['mitigated']}").json()
    assert detail["health"] == "mitigated" and detail["latest_effective"] == 0.0
    assert "effective 0.00" in detail["health_reason"]
    stale = c.get("/api/v1/runs", params={"status": "stale"}).json()["runs"]
    assert [r["run_id"] for r in stale] == [expected["stale"]]


def test_pages_follow_their_cursor_and_costs_add_up(app_client):
    c = app_client
    ids = [_run(c, f"r{i}", COLLAPSED if i % 2 else LIVE, config={"gpus": 2}) for i in range(5)]
    c.post("/api/v1/runs", json={"name": "other", "project": "q", "tags": ["x"]})
    for order in ("newest", "acr", "health", "alerts"):
        seen, cursor = [], None
        while True:
            params = {"order": order, "limit": 2, "project": "p"}
            if cursor:
                params["cursor"] = cursor
            page = c.get("/api/v1/runs", params=params).json()
            assert len(page["runs"]) <= 2 and all("cost" not in r for r in page["runs"])
            seen += [r["run_id"] for r in page["runs"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert sorted(seen) == sorted(ids), order
    newest = c.get("/api/v1/runs", params={"project": "p", "cost": "true"}).json()
    assert [r["run_id"] for r in newest["runs"]] == ids[::-1] and newest["next_cursor"] is None
    assert [r["name"] for r in c.get("/api/v1/runs?tag=x").json()["runs"]] == ["other"]
    first = c.get("/api/v1/runs", params={"limit": 1}).json()["next_cursor"]
    bad = c.get("/api/v1/runs", params={"limit": 1, "cursor": first, "order": "acr"})
    assert bad.status_code == 422 and "another order" in bad.text
    assert c.get("/api/v1/runs", params={"cursor": "nonsense"}).status_code == 422
    assert c.get("/api/v1/runs", params={"limit": 1001}).status_code == 422
    # 4 groups of 4 all-pass completions wasted of 16, at 36 s a step on 2 GPUs: 36 × 1 × 2 s
    cost = c.get(f"/api/v1/runs/{ids[1]}").json()  # the detail has no cost: the list has
    listed = {r["run_id"]: r for r in newest["runs"]}
    assert "cost" not in cost
    assert listed[ids[1]]["cost"] == {
        "wasted_rollouts": 16,
        "completions": 16,
        "wasted_share": 1.0,
        "gpus": 2.0,
        "wasted_gpu_hours": pytest.approx(2 * 36 / 3600),
    }
    assert listed[ids[0]]["cost"]["wasted_share"] == 0.0
    from vantage.server.cost import project_costs

    with c.app.state.session_factory() as s:
        totals = project_costs(s, ["p"])["p"]
    assert totals["wasted_rollouts"] == 32 and totals["completions"] == 80
    assert totals["wasted_gpu_hours"] == pytest.approx(2 * 2 * 36 / 3600)
