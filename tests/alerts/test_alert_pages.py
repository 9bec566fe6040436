"""`GET /api/v1/alerts` in pages (limit, cursor, filters and order in the database) and a rule's
"send a test message", in process on SQLite and PostgreSQL (docs/design.md §4, §6)."""

from __future__ import annotations

import pytest

from tests.helpers.alerts import Receiver, make_rule
from tests.helpers.api import new_run, post_steps

ALL_FAIL = [[0, 0, 0, 0]] * 4
LIVE = [[0, 1, 0, 1]] * 4


@pytest.fixture
def alerts_made(app_client):
    """Three rules × four runs (two in project p1, two in p2) fired at step 0; the `minor`
    rule then disabled, which resolves its alert on every run: 8 firing episodes and 4
    resolved ones. The built-in rules are disabled first, so that only these fire."""
    for rule in app_client.get("/api/v1/alert-rules").json()["rules"]:
        app_client.put(f"/api/v1/alert-rules/{rule['id']}", json={"enabled": False})
    for name, severity, metric in (
        ("major", "critical", "acr"),
        ("second", "warning", "acr_all_fail"),
        ("minor", "info", "acr_all_fail"),
    ):
        make_rule(app_client, name=name, metric=metric, op=">", threshold=0.5, severity=severity)
    runs = [new_run(app_client, name=f"r{i}", project=f"p{1 + i // 2}") for i in range(4)]
    for run in runs:
        post_steps(app_client, run, [{"step": 0, "groups": ALL_FAIL}])
    rules = app_client.get("/api/v1/alert-rules").json()["rules"]
    minor = next(r["id"] for r in rules if r["name"] == "minor")
    app_client.put(f"/api/v1/alert-rules/{minor}", json={"enabled": False}).raise_for_status()
    return runs


def pages(client, **params) -> list[list[dict]]:
    """Every page of `GET /alerts` with ``params``, following `next_cursor`."""
    out, cursor = [], None
    while True:
        query = {**params, **({"cursor": cursor} if cursor else {})}
        r = client.get("/api/v1/alerts", params=query)
        assert r.status_code == 200, r.text
        out.append(r.json()["alerts"])
        cursor = r.json()["next_cursor"]
        if cursor is None:
            return out


def test_alerts_come_in_pages_filtered_and_ordered_in_the_database(app_client, alerts_made):
    whole = app_client.get("/api/v1/alerts").json()
    assert len(whole["alerts"]) == 12 and whole["next_cursor"] is None
    newest = [a["alert_id"] for a in whole["alerts"]]

    paged = pages(app_client, limit=5)
    assert [len(p) for p in paged] == [5, 5, 2]
    assert [a["alert_id"] for p in paged for a in p] == newest  # same order, none twice

    firing_first = [a for p in pages(app_client, order="firing_first", limit=3) for a in p]
    states = [a["state"] for a in firing_first]
    assert states == ["firing"] * 8 + ["resolved"] * 4, states
    firing_ids = [a["alert_id"] for a in firing_first[:8]]
    assert firing_ids == [i for i in newest if i in set(firing_ids)]  # newest first within

    filtered = pages(app_client, project="p2", severity="critical", state="firing", limit=1)
    assert [len(p) for p in filtered] == [1, 1]
    assert {a["run_id"] for p in filtered for a in p} == {r["run_id"] for r in alerts_made[2:]}
    assert all(a["rule"] == "major" for p in filtered for a in p)
    assert (
        app_client.get("/api/v1/alerts", params={"rule": "minor"}).json()["alerts"][0]["state"]
        == "resolved"
    )


def test_a_bad_page_request_is_a_422_naming_the_parameter(app_client, alerts_made):
    cursor = app_client.get("/api/v1/alerts", params={"limit": 2}).json()["next_cursor"]
    for params, field in (
        ({"cursor": "not-a-cursor"}, "cursor"),
        ({"cursor": cursor, "order": "firing_first"}, "cursor"),  # handed out for another order
        ({"limit": 0}, "limit"),
        ({"limit": 1001}, "limit"),
        ({"order": "oldest"}, "order"),
    ):
        r = app_client.get("/api/v1/alerts", params=params)
        assert r.status_code == 422, (params, r.text)
        assert r.json()["detail"][0]["loc"] == ["query", field], r.text


def test_a_test_message_goes_to_one_target_now_and_refusals_stay(app_client):
    ok, failing = Receiver(), Receiver(status=500)
    try:
        rule = make_rule(
            app_client, name="tested", metric="acr", op=">", threshold=0.9,
            notify=[ok.url, f"slack+{failing.url}"], description="lower the temperature",
        )  # fmt: skip
        url = f"/api/v1/alert-rules/{rule['id']}/test-message"
        r = app_client.post(url, json={"target": ok.url})
        assert r.status_code == 200, r.text
        shown = f"http://127.0.0.1:{ok.port}/…"  # redacted, as read keys see targets
        assert r.json() == {"target": shown, "sent": True, "error": None}
        (body,) = ok.messages
        assert body["test"] is True and body["alert_id"] is None and body["rule"] == "tested"
        assert body["recommended_action"] == "lower the temperature"
        assert "TEST" in body["text"] and "no alert fired" in body["text"]

        again = app_client.post(url, json={"target": ok.url})  # one message a second per target
        assert again.status_code == 429 and again.headers["retry-after"] == "1"

        said = app_client.post(url, json={"target": f"slack+{failing.url}"}).json()
        assert said["sent"] is False and said["error"].startswith("HTTP 500"), said
        assert failing.messages[0]["text"].startswith(":rotating_light: TEST")  # Slack's format

        other = app_client.post(url, json={"target": "https://elsewhere.example/hook"})
        assert other.status_code == 422 and "not a notify target" in other.text

        app_client.app.state.settings.webhook_allow = "https://only.example.com"
        refused = app_client.post(url, json={"target": ok.url})
        assert refused.status_code == 422 and "VANTAGE_WEBHOOK_ALLOW" in refused.text
        assert len(ok.messages) == 1
    finally:
        ok.close()
        failing.close()
