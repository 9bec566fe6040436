"""The alerts and rules pages in headless Chromium: a rule made on the rules page fires on data
sent over HTTP, shows on the alerts page and is silenced from there; read-only keys see no
enabled control; an unknown page is a 404."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.helpers.alerts import Receiver


def field(name: str) -> str:
    """The selector of the rule form's input for ``name`` (Dash writes a dict id as JSON)."""
    return f"[id='{json.dumps({'field': name, 'type': 'rule-field'}, separators=(',', ':'))}']"


def test_a_rule_made_on_the_rules_page_fires_and_is_silenced_from_the_alerts_page(
    control_page, dashboard_server
):
    receiver = Receiver()
    with dashboard_server.api() as api:
        r = api.post("/api/v1/runs", json={"name": "rule-made-in-browser", "project": "demo"})
        run_id, attempt = r.json()["run_id"], r.json()["attempt"]
    page = control_page
    failed: list[str] = []  # a callback that answers 5xx (the page then shows a banner)
    page.on("response", lambda r: failed.append(r.url) if r.status >= 500 else None)
    try:
        page.goto(f"{dashboard_server.url}/dashboard/rules")
        # every error at once, beside the form, by label (a number too large to hold was
        # "threshold: Field required"; bad JSON with no command was saved)
        page.fill(field("threshold"), "1e400")
        page.fill(field("mitigation.params"), "{not json")
        page.click("#rules-save")
        said = page.inner_text("#rules-editor #rules-form-error")
        for says in ("Name: required", "Threshold: required: a finite number", "not JSON"):
            assert says in said, said
        page.fill(field("mitigation.params"), "")
        page.fill(field("name"), "browser_rule")
        page.fill(field("metric"), "acr_all_fail")
        page.fill(field("threshold"), "0.5")
        page.fill(field("run_id"), run_id)
        page.fill(field("notify"), receiver.url)
        page.fill(field("recommended_action"), "Lower the task difficulty.")
        page.click("#rules-save")
        assert "Created rule browser_rule" in page.inner_text("#rules-saved")
        row = page.locator("tr[data-rule='browser_rule']")
        row.get_by_text("Send test").click()
        page.wait_for_selector("#rules-test-sent")
        (test,) = receiver.wait_for(1)
        assert test["test"] is True and test["rule"] == "browser_rule"

        with dashboard_server.api() as api:
            records = [{"step": s, "groups": [[0, 0, 0, 0]] * 4} for s in range(3)]
            body = {"attempt": attempt, "records": records}
            api.post(f"/api/v1/runs/{run_id}/steps", json=body).raise_for_status()
        assert receiver.wait_for(2)[1]["state"] == "firing"  # the rule's own notification

        page.goto(f"{dashboard_server.url}/dashboard/alerts?rule=browser_rule")
        alert = page.locator("tr.alert-row[data-state='firing']")
        alert.wait_for()
        assert "Lower the task difficulty." in alert.inner_text()
        link = alert.locator("a").first.get_attribute("href")
        assert link == f"/dashboard/runs/{run_id}?step=0"
        alert.get_by_text("Silence").click()
        assert "until" in page.inner_text("#alerts-silenced")
        page.wait_for_function(
            "document.querySelector('tr.alert-row .muted-until')?.innerText.startsWith('muted')"
        )
        with dashboard_server.api("control") as lead:
            silences = lead.get("/api/v1/silences", params={"active": "true"}).json()["silences"]
        assert {"rule": "browser_rule", "run_id": run_id} in [s["matchers"] for s in silences]

        alert.locator("a").first.click()  # the run, its ACR chart around the alert's step
        page.wait_for_function(
            "document.querySelector('#run-acr-graph .js-plotly-plot')?.layout?.xaxis?.range"
            "?.join(',') === '-25,25'"
        )
        assert failed == []
    finally:
        receiver.close()


def test_a_rule_is_edited_disabled_and_deleted_on_the_rules_page(control_page, dashboard_server):
    with dashboard_server.api("control") as lead:
        body = {"name": "edited_in_browser", "metric": "acr", "op": ">", "threshold": 0.9}
        rule = lead.post("/api/v1/alert-rules", json=body).json()
    page = control_page
    page.goto(f"{dashboard_server.url}/dashboard/rules")
    row = page.locator(f"tr[data-rule-id='{rule['id']}']")
    row.get_by_role("button", name="Edit", exact=True).click()
    page.wait_for_function(
        "document.querySelector('#rules-form-title').innerText.includes('edited_in_browser')"
    )
    assert page.input_value(field("threshold")) == "0.9"
    page.fill(field("threshold"), "0.8")
    page.fill(field("for_steps"), "3")
    page.click("#rules-save")
    assert "Saved rule edited_in_browser" in page.inner_text("#rules-saved")
    row.get_by_role("button", name="Disable", exact=True).click()
    page.wait_for_selector("#rules-done")
    # the table is drawn again after the answer shows: wait for it, not for the answer
    sel = f"tr[data-rule-id='{rule['id']}']"
    page.wait_for_function(f"document.querySelector(\"{sel}\")?.innerText.includes('disabled')")
    assert "acr > 0.8 for 3 steps" in row.inner_text()
    with dashboard_server.api("control") as lead:
        saved = lead.get(f"/api/v1/alert-rules/{rule['id']}").json()
    assert (saved["threshold"], saved["for_steps"], saved["enabled"]) == (0.8, 3, False)

    row.get_by_role("button", name="Delete", exact=True).click()
    page.click("#rules-confirm button")
    assert f"Deleted rule {rule['id']}" in page.inner_text("#rules-done")
    page.wait_for_function(f"!document.querySelector(\"tr[data-rule-id='{rule['id']}']\")")


def test_read_only_keys_see_rules_and_alerts_without_controls(read_page, dashboard_server):
    page = read_page
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.goto(f"{dashboard_server.url}/dashboard/rules")
    page.wait_for_selector("#rules-table")
    assert page.locator("#rules-readonly").count() == 1
    assert page.locator("#rules-editor").is_hidden()
    assert page.locator("#rules-table button:enabled").count() == 0
    assert "acr_stall" in page.inner_text("#rules-table")
    page.click("#nav-alerts")
    page.wait_for_selector("#alerts-readonly")
    page.wait_for_selector("#alerts-table, #alerts-empty")
    assert page.locator("#alerts-table button:enabled").count() == 0
    assert errors == []


def test_an_unknown_dashboard_page_is_a_404(dashboard_server):
    cookies = {"vantage_dashboard_key": dashboard_server.keys["read"]}
    with httpx.Client(base_url=dashboard_server.url, cookies=cookies) as client:
        for path, status in (
            ("/dashboard/alerts", 200),
            ("/dashboard/rules", 200),
            ("/dashboard/runs/anything", 200),  # a run page waits for its run to appear
            ("/dashboard/no-such-page", 404),
            ("/dashboard/alerts/extra", 404),
        ):
            assert client.get(path).status_code == status, path


def test_the_rule_form_sends_what_was_given_or_changed_and_says_what_it_cannot_read():
    from vantage.dashboard.pages.rules import form

    fields = form.shown_fields()
    new = form.form_values(fields, None)
    new.update(name="r", metric="acr", threshold=0.5, notify="https://a.example/x\n\n")
    new.update({"mitigation": "set_mitigation", "mitigation.params": '{"mode": "avspo"}'})
    body = form.rule_body(fields, new, None)
    assert body["notify"] == ["https://a.example/x"] and body["op"] == ">"
    assert body["mitigation"] == {"type": "set_mitigation", "params": {"mode": "avspo"}}
    assert "clear_threshold" not in body and "project" not in body

    rule = {**body, "id": 7, "for_steps": 1, "clear_threshold": 0.4, "unknown_field": 3}
    edited = form.form_values(fields, rule)
    edited.update(threshold="0.6", clear_threshold="")
    assert form.rule_body(fields, edited, rule) == {"threshold": 0.6, "clear_threshold": None}

    for name, value, said in (
        ("for_steps", "1.5", "whole number"),
        ("mitigation.params", "{mode: avspo}", "not JSON"),
    ):
        with pytest.raises(ValueError, match=said):
            form.rule_body(fields, {**edited, name: value}, rule)
    # every error at once, by label; bad JSON refused with no command too (it was dropped)
    bad = {**edited, "for_steps": "1.5", "mitigation": None, "mitigation.params": "{not json"}
    with pytest.raises(ValueError) as said:
        form.rule_body(fields, bad, rule)
    assert str(said.value).splitlines() == [
        "For steps: must be a whole number",
        "Mitigation command: the parameters are not JSON (Expecting property name enclosed "
        "in double quotes)",
    ]
    # the API's 422s by the form's labels; a number the browser could not hold (1e400) came
    # as nothing: "threshold: Field required"
    detail = [
        {"type": "missing", "loc": ["body", "threshold"], "msg": "Field required"},
        {"type": "value_error", "loc": ["body", "severity"], "msg": "Value error, severity …"},
        {"type": "x", "loc": ["body", "mitigation", "params"], "msg": "bad"},
    ]
    assert form.api_errors(fields, detail) == [
        "Threshold: required: a finite number",
        "Severity: severity …",
        "Mitigation command params: bad",
    ]
    assert next(f for f in fields if f.name == "severity").kind == "choice"


def test_the_alerts_table_keeps_names_as_text_on_one_line():
    """The table goes to the browser as HTML text: a run or rule name is escaped, never markup,
    and a line break in a text stays out of the HTML (a blank line would end it)."""
    from vantage.dashboard.pages.alerts.table import alerts_table

    alert = {
        "alert_id": 7, "rule": "<img src=x onerror=alert(1)>", "metric": "acr", "run_id": "r1",
        "state": "firing", "severity": "critical", "value": 0.5, "pending_step": 3,
        "fired_step": 4, "resolved_step": None, "fired_at": "2026-12-07T21:00:00+00:00",
        "recommended_action": "first line\n\nsecond line",
    }  # fmt: skip
    runs = {"r1": {"name": '"><script>x</script>', "project": "p"}}
    table = alerts_table([alert], runs, {}, True)
    assert "<img" not in table and "<script>" not in table and "\n" not in table
    assert "&lt;img src=x onerror=alert(1)&gt;" in table
    assert 'href="/dashboard/runs/r1?step=4"' in table and 'data-alert-id="7"' in table
    # each step named ("3 → 4", and "0 → 0" for pending and fired at once, read as a range)
    assert "<td>pending 3, fired 4</td>" in table
    # a stale alert's value is seconds, and says so
    stale = {**alert, "metric": "stale", "value": 312.0, "resolved_step": 9}
    table = alerts_table([stale], runs, {}, True)
    assert "<td>312 s</td>" in table and "<td>pending 3, fired 4, resolved 9</td>" in table
