"""The dashboard in a real headless Chromium against a real `vantage serve` (issue 6, item 6)."""

from __future__ import annotations

import re
import time

import pytest
from vantage.dashboard import sample_data

pytestmark = pytest.mark.browser


def test_runs_page_lists_the_seeded_runs(control_page, dashboard_server):
    page = control_page
    page.wait_for_selector("#runs-table")
    for name, run_id in dashboard_server.runs.items():
        row = page.locator(f"tr[data-run-id='{run_id}']")
        row.wait_for()
        assert name in row.inner_text()
    # Column titles explain themselves on hover.
    assert "same reward" in page.locator("th", has_text="Latest ACR").get_attribute("title")


def test_run_page_shows_the_acr_the_api_reports(control_page, dashboard_server):
    run_id = dashboard_server.runs["qwen-grpo"]
    with dashboard_server.api() as api:
        run = api.get(f"/api/v1/runs/{run_id}").json()
    page = control_page
    page.goto(f"{dashboard_server.url}/dashboard/runs/{run_id}")
    value = page.locator("#kpi-acr-value")
    value.wait_for()
    assert value.inner_text() == f"{run['latest_acr']:.2f}"
    assert f"step {run['last_step']}" in page.inner_text("#kpi-acr")
    # The ACR chart drew every series, and the card explains the number.
    page.wait_for_function(
        "document.querySelector('#run-acr-graph .js-plotly-plot')?.data?.length >= 8"
    )
    assert "taught" in page.inner_text("#run-acr-graph")
    assert "AVSPO" in page.locator("#kpi-acr").get_attribute("title")
    # each chart keeps its height: one sized by its content was resized by Plotly to a thin
    # strip under the charts below it (three trials)
    for graph in ("run-acr-graph", "run-reward-graph", "run-scalars-graph"):
        box = page.locator(f"#{graph}").bounding_box()
        svg = page.locator(f"#{graph} svg.main-svg").first.bounding_box()
        assert box["height"] >= 300 and abs(box["height"] - svg["height"]) < 2, (graph, box, svg)


def test_new_steps_appear_without_a_reload(control_page, dashboard_server):
    with dashboard_server.api() as api:
        run_id, attempt = sample_data.create_run(api, "live-run", tags=("live",))
        sample_data.send_steps(api, run_id, attempt, sample_data.step_records(0, 30, seed=7))
        page = control_page
        page.goto(f"{dashboard_server.url}/dashboard/runs/{run_id}")
        page.wait_for_selector("#kpi-acr-value")
        page.wait_for_function("document.querySelector('#kpi-acr').innerText.includes('step 29')")
        page.evaluate("window.__not_reloaded = true")
        count = "document.querySelector('#run-acr-graph .js-plotly-plot')?.data?.[6]?.x?.length"
        page.wait_for_function(f"{count} == 30")
        answer = sample_data.send_steps(
            api, run_id, attempt, sample_data.step_records(30, 5, seed=7)
        )
        acr_34 = answer["steps"][-1]["acr"]
    page.wait_for_function(
        "document.querySelector('#kpi-acr').innerText.includes('step 34')", timeout=10_000
    )
    assert page.evaluate(count) == 35
    assert page.evaluate("window.__not_reloaded") is True
    assert page.inner_text("#kpi-acr-value") == f"{acr_34:.2f}"


def test_avspo_click_with_a_control_key_creates_the_command(control_page, dashboard_server):
    run_id = dashboard_server.runs["qwen-avspo"]
    page = control_page
    page.goto(f"{dashboard_server.url}/dashboard/runs/{run_id}")
    button = page.locator("button.action", has_text="Enable AVSPO")
    button.wait_for()
    assert button.is_enabled()
    page.fill("#cmd-reason", "collapse above 0.5")
    button.click()
    page.click("#cmd-confirm-send")
    page.wait_for_selector("#cmd-sent")
    with dashboard_server.api() as api:
        commands = api.get(f"/api/v1/runs/{run_id}/commands").json()["commands"]
    assert commands[0]["reason"] == "collapse above 0.5"
    assert page.input_value("#cmd-reason") == ""  # the next command gets a reason of its own
    assert commands[0]["type"] == "set_mitigation"
    assert commands[0]["params"]["mode"] == "avspo"
    assert commands[0]["status"] == "pending"
    assert commands[0]["issued_by"] == "dashboard:lead"
    # The command log shows it with its live status.
    row = page.locator(f"tr[data-command-id='{commands[0]['command_id']}']")
    row.wait_for()
    assert "pending" in row.inner_text()
    # When the trainer acks it, the log follows without a reload.
    with dashboard_server.api() as api:
        api.post(
            f"/api/v1/runs/{run_id}/commands/{commands[0]['command_id']}/ack",
            json={"status": "applied", "step": 119},
        ).raise_for_status()
    deadline = time.monotonic() + 10
    while "applied" not in row.inner_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "applied" in row.inner_text()
    assert "collapse above 0.5" in row.inner_text()  # the reason stays beside the ack


def test_each_click_asks_once_and_cancel_sends_nothing(control_page, dashboard_server):
    """Dash's ConfirmDialog sometimes stayed shut on the first click after live updates, and a
    later click then opened two (a trial): the confirmation is now part of the page."""
    run_id = dashboard_server.runs["qwen-aapo"]
    page = control_page
    page.goto(f"{dashboard_server.url}/dashboard/runs/{run_id}")
    page.wait_for_function("document.querySelector('#kpi-acr') !== null")
    time.sleep(3)  # a few live updates
    with dashboard_server.api() as api:
        count = len(api.get(f"/api/v1/runs/{run_id}/commands").json()["commands"])
    checkpoint = page.locator("button.action", has_text="Save checkpoint")
    for _ in range(2):
        checkpoint.click()
        page.wait_for_selector("#cmd-confirm:not([hidden])", timeout=3_000)
        assert "save a checkpoint" in page.inner_text("#cmd-confirm-message")
        page.click("#cmd-confirm-cancel")
        page.wait_for_selector("#cmd-confirm[hidden]", state="attached")
    checkpoint.click()
    page.click("#cmd-confirm-send")
    page.wait_for_selector("#cmd-sent")
    with dashboard_server.api() as api:
        commands = api.get(f"/api/v1/runs/{run_id}/commands").json()["commands"]
    assert len(commands) == count + 1 and commands[0]["type"] == "checkpoint"


def test_a_temperature_that_cannot_work_is_said_before_any_confirmation(
    control_page, dashboard_server
):
    """-1 was confirmed and then refused with pydantic's dump; an empty box said nothing (a
    trial). Both are said under the form, and nothing is asked or sent."""
    run_id = dashboard_server.runs["qwen-grpo"]
    page = control_page
    page.goto(f"{dashboard_server.url}/dashboard/runs/{run_id}")
    button = page.locator("button.action", has_text="Set temperature")
    button.wait_for()
    with dashboard_server.api() as api:
        count = len(api.get(f"/api/v1/runs/{run_id}/commands").json()["commands"])
    for typed, said in (("-1", "must be a number from 0.01 to 10"), ("", "enter a temperature")):
        page.fill("#temperature-value", typed)
        page.press("#temperature-value", "Tab")  # the box reports its value when left
        button.click()
        page.wait_for_function(
            f"document.querySelector('#cmd-input-error').innerText.includes('{said}')"
        )
        assert page.locator("#cmd-confirm").get_attribute("hidden") is not None
    with dashboard_server.api() as api:
        assert len(api.get(f"/api/v1/runs/{run_id}/commands").json()["commands"]) == count


def test_a_read_only_key_sees_no_enabled_action(read_page, dashboard_server):
    run_id = dashboard_server.runs["qwen-grpo"]
    page = read_page
    page.goto(f"{dashboard_server.url}/dashboard/runs/{run_id}")
    page.wait_for_selector("#cmd-readonly")
    buttons = page.locator("button.action")
    assert buttons.count() >= 6
    assert all(not buttons.nth(i).is_enabled() for i in range(buttons.count()))
    assert "viewer (read)" in page.inner_text("#whoami")


def test_a_run_deleted_while_its_page_is_open_leaves_nothing_stale(
    read_page, dashboard_server, make_key
):
    """The heading said "Run not found" while the alerts banner, the KPIs and the charts stayed
    below it (a trial)."""
    make_key("deleter", "admin")
    with dashboard_server.api() as api:
        run_id, attempt = sample_data.create_run(api, "to-delete")
        sample_data.send_steps(api, run_id, attempt, sample_data.step_records(0, 10))
    page = read_page
    page.goto(f"{dashboard_server.url}/dashboard/runs/{run_id}")
    page.wait_for_selector("#kpi-acr")
    with dashboard_server.api("deleter") as admin:
        assert admin.delete(f"/api/v1/runs/{run_id}").status_code == 204
    page.wait_for_selector("#run-missing", timeout=10_000)
    assert page.locator("#kpi-acr").count() == 0 and page.inner_text("#run-banner") == ""
    traces = page.evaluate("document.querySelector('#run-acr-graph .js-plotly-plot').data.length")
    assert traces == 0


def test_a_run_page_opened_before_its_run_exists_shows_it_when_it_registers(
    read_page, dashboard_server
):
    """The demo prints its run's link before the warm start; the page said "Run not found" and
    never recovered without a reload (a trial)."""
    import uuid

    run_id = str(uuid.uuid4())
    page = read_page
    page.goto(f"{dashboard_server.url}/dashboard/runs/{run_id}")
    page.wait_for_selector("#run-missing")
    with dashboard_server.api() as api:
        body = {"run_id": run_id, "name": "late-run", "project": "demo"}
        run = api.post("/api/v1/runs", json=body).json()
        sample_data.send_steps(api, run_id, run["attempt"], sample_data.step_records(0, 5))
    page.wait_for_selector("#kpi-acr", timeout=15_000)
    assert page.locator("#run-missing").count() == 0


def test_a_finished_runs_actions_are_disabled_and_say_why(control_page, dashboard_server):
    with dashboard_server.api() as api:
        body = {"name": "finished-page", "config": {"temperature": 0.7, "aapo_delta_low": -0.1}}
        run_id = api.post("/api/v1/runs", json=body).json()["run_id"]
        api.post(f"/api/v1/runs/{run_id}/finish", json={"status": "finished"}).raise_for_status()
    page = control_page
    page.goto(f"{dashboard_server.url}/dashboard/runs/{run_id}")
    note = page.wait_for_selector("#cmd-ended")
    assert "This run has finished" in note.inner_text()
    buttons = page.locator("button.action")
    assert buttons.count() >= 6
    assert all(not buttons.nth(i).is_enabled() for i in range(buttons.count()))
    assert "no trainer reads" in (buttons.first.get_attribute("title") or "")
    assert page.input_value("#temperature-value") == "0.7"  # the run's, not the default
    assert page.input_value("#aapo-delta-low") == "-0.1"


def open_new_run(page, dashboard_server, name: str, steps: int = 3) -> str:
    """Register a run named ``name`` with ``steps`` steps and open its page; returns its id."""
    with dashboard_server.api() as api:
        run_id = api.post("/api/v1/runs", json={"name": name}).json()["run_id"]
        if steps:
            sample_data.send_steps(api, run_id, 1, sample_data.step_records(0, steps))
    page.goto(f"{dashboard_server.url}/dashboard/runs/{run_id}")
    page.wait_for_selector("#kpi-acr")
    return run_id


def test_a_run_that_ends_while_its_page_is_open_disables_its_actions(
    control_page, dashboard_server
):
    """The actions stayed enabled after the run ended under an open page, until a reload."""
    page = control_page
    run_id = open_new_run(page, dashboard_server, "ends-while-open")
    assert page.locator("#cmd-ended").count() == 0
    assert page.locator("button.action").first.is_enabled()
    with dashboard_server.api() as api:
        api.post(f"/api/v1/runs/{run_id}/finish", json={"status": "failed"}).raise_for_status()
    note = page.wait_for_selector("#cmd-ended", timeout=15_000)
    assert "This run has failed" in note.inner_text()
    buttons = page.locator("button.action")
    assert all(not buttons.nth(i).is_enabled() for i in range(buttons.count()))


def test_compare_page_overlays_chosen_runs(login_as, dashboard_server):
    first = next(iter(dashboard_server.runs.values()))
    # each run once however often the link names it; an unknown id is said, not dropped silently
    unknown = [f"gone-{i}" for i in range(12)]  # past 10, counted (2,000 were all listed)
    ids = ",".join([*dashboard_server.runs.values(), first, "no-such-run", *unknown])
    page = login_as("read", f"/dashboard/compare?runs={ids}")
    try:
        page.wait_for_selector("#compare-tbl")
        text = page.inner_text("#compare-tbl")
        assert all(name in text for name in dashboard_server.runs)
        assert page.locator("#compare-tbl tbody tr").count() == len(dashboard_server.runs)
        missing = page.inner_text("#compare-missing")
        assert "no-such-run" in missing and missing.endswith(" and 3 more"), missing
        # a reward trace a run (its ACR too, and, where the run has them, its effective ACR
        # and mitigation marks, which other tests' commands may have given it)
        plot = "document.querySelector('#compare-graph .js-plotly-plot')"
        page.wait_for_function(f"{plot}?.data?.filter(t => t.yaxis == 'y2').length == 3")
        assert page.evaluate(f"{plot}.data.filter(t => t.showlegend).length") == 3
    finally:
        page.close()


def test_the_compare_page_follows_live_runs(login_as, dashboard_server):
    """The compare page drew its runs once: a run that went on training stayed at the step the
    page was opened at."""
    with dashboard_server.api() as api:
        run_id = api.post("/api/v1/runs", json={"name": "compared-live"}).json()["run_id"]
        sample_data.send_steps(api, run_id, 1, sample_data.step_records(0, 3))
        page = login_as("read", f"/dashboard/compare?runs={run_id}")
        try:
            cell = "document.querySelector('#compare-tbl tbody tr td:nth-child(3)')?.innerText"
            page.wait_for_function(f"{cell} == '2'")
            sample_data.send_steps(api, run_id, 1, sample_data.step_records(3, 5))
            page.wait_for_function(f"{cell} == '7'", timeout=15_000)
            points = "document.querySelector('#compare-graph .js-plotly-plot').data[0].x.length"
            assert page.evaluate(points) == 8
        finally:
            page.close()


def test_filters_are_kept_in_the_address(login_as, dashboard_server):
    """A filtered runs list or a comparison can be bookmarked and shared: the page reads its
    filters from the address and writes them back as they change (they were lost on reload)."""
    rows = "document.querySelectorAll('#runs-table tbody tr[data-run-id=\"{}\"]').length"
    avspo, grpo = (rows.format(dashboard_server.runs[n]) for n in ("qwen-avspo", "qwen-grpo"))
    page = login_as("read", "/dashboard/?tag=avspo")
    try:
        page.wait_for_function(f"{avspo} == 1 && {grpo} == 0")  # other tests' runs: no avspo tag
        page.evaluate("window.dash_clientside.set_props('runs-project', {value: 'demo'})")
        page.wait_for_function("location.search == '?tag=avspo&project=demo'")
        page.evaluate("window.dash_clientside.set_props('runs-tag', {value: null})")
        page.wait_for_function("location.search == '?project=demo'")
        page.wait_for_function(f"{avspo} == 1 && {grpo} == 1")
        page.reload()
        page.wait_for_function(f"{avspo} == 1 && {grpo} == 1")
        assert page.evaluate("location.search") == "?project=demo"

        page.goto(f"{dashboard_server.url}/dashboard/?project=nowhere")
        said = page.inner_text("#runs-unknown-filter")
        assert "project 'nowhere'" in said and "that filter is left out" in said

        first, second = dashboard_server.runs["qwen-grpo"], dashboard_server.runs["qwen-aapo"]
        page.goto(f"{dashboard_server.url}/dashboard/compare?runs={first}")
        page.wait_for_selector("#compare-tbl")
        page.evaluate(
            f"window.dash_clientside.set_props('compare-runs', {{value: ['{first}', '{second}']}})"
        )
        page.wait_for_function(f"location.search == '?runs={first}%2C{second}'")
        page.reload()
        page.wait_for_function("document.querySelectorAll('#compare-tbl tbody tr').length == 2")
    finally:
        page.close()


def test_odd_addresses_are_said_not_answered_500(login_as, dashboard_server):
    """A repeated parameter (`?order=a&order=b`, `?runs=A&runs=B`: a hand-edited or merged
    link) answered 500; an unknown order was dropped without a word; a short id two runs
    share said "not found", and so did a run page addressed by a run's short id (trials)."""
    first, second = dashboard_server.runs["qwen-grpo"], dashboard_server.runs["qwen-aapo"]
    with dashboard_server.api() as api:
        for suffix in ("a", "b"):
            body = {"run_id": f"twinprefix-{suffix}", "name": f"twin-{suffix}"}
            api.post("/api/v1/runs", json=body).raise_for_status()
    page = login_as("read", "/dashboard/?order=acr&order=sideways&status=bogus&status=running")
    try:
        said = page.inner_text("#runs-unknown-order")
        assert "No order 'sideways'" in said and "newest first" in said, said
        assert page.locator("#runs-unknown-filter").count() == 0  # the last status: running
        page.goto(
            f"{dashboard_server.url}/dashboard/compare?runs={first}&runs={second}&runs=twinpref"
        )
        page.wait_for_function("document.querySelectorAll('#compare-tbl tbody tr').length == 2")
        assert "twinpref" in page.inner_text("#compare-ambiguous")
        page.goto(f"{dashboard_server.url}/dashboard/runs/twinpref")
        assert "Several runs match" in page.inner_text("#run-missing")
        page.goto(f"{dashboard_server.url}/dashboard/runs/{first[:8]}")
        page.wait_for_selector("#kpi-acr")
        assert "qwen-grpo" in page.inner_text("#run-header")
    finally:
        page.close()


def test_pages_load_without_script_errors(login_as, dashboard_server):
    """Straight to each page, as a bookmark does, with no JavaScript error on the way."""
    page = login_as("read")
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    try:
        run_id = dashboard_server.runs["qwen-aapo"]
        for path, ready in (
            (f"/dashboard/compare?runs={run_id}", "#compare-tbl"),
            (f"/dashboard/runs/{run_id}", "#kpi-acr-value"),
            ("/dashboard/runs/no-such-run", "#run-missing"),
            ("/dashboard/", "#runs-table"),
        ):
            page.goto(dashboard_server.url + path)
            page.wait_for_selector(ready)
            page.wait_for_timeout(500)
            if ready == "#run-missing":  # nothing to act on for a run that is not there
                assert page.locator("button.action").count() == 0
        assert page.title() == "Vantage · runs"
        assert errors == []
    finally:
        page.close()


def test_a_suggested_mitigation_is_one_click_away(control_page, dashboard_server):
    """A firing rule with a mitigation, on a run in 'suggest' mode, offers it on the run page;
    accepting it creates the command, linked to the alert."""
    lead = dashboard_server.api("control")
    with dashboard_server.api() as api, lead:
        run_id, attempt = sample_data.create_run(api, "suggest-run", tags=("suggest",))
        lead.patch(f"/api/v1/runs/{run_id}", json={"mitigation_mode": "suggest"}).raise_for_status()
        lead.post(
            "/api/v1/alert-rules",
            json={"name": "any_collapse", "run_id": run_id, "metric": "acr", "op": ">",
                  "threshold": 0.0, "for_steps": 1,
                  "mitigation": {"type": "set_mitigation", "params": {"mode": "aapo"}}},
        ).raise_for_status()  # fmt: skip
        sample_data.send_steps(api, run_id, attempt, sample_data.step_records(0, 5, seed=3))
        alerts = lead.get("/api/v1/alerts", params={"run_id": run_id, "state": "firing"}).json()
    assert alerts["alerts"], "the rule should fire on the seeded steps"
    page = control_page
    page.goto(f"{dashboard_server.url}/dashboard/runs/{run_id}")
    page.wait_for_selector("#run-alerts")
    assert "any_collapse" in page.inner_text("#run-alerts")
    button = page.locator("button.action", has_text="Apply AAPO")
    button.click()
    page.click("#cmd-confirm-send")
    page.wait_for_selector("#cmd-sent")
    with dashboard_server.api() as api:
        command = api.get(f"/api/v1/runs/{run_id}/commands").json()["commands"][0]
    assert command["params"]["mode"] == "aapo"
    assert command["alert_id"] == alerts["alerts"][0]["alert_id"]


def test_prompts_tab_lists_prompts_that_keep_collapsing(control_page, dashboard_server):
    run_id = dashboard_server.runs["qwen-grpo"]
    page = control_page
    page.goto(f"{dashboard_server.url}/dashboard/runs/{run_id}")
    page.locator("#run-tabs").get_by_text("Prompts").click()
    page.wait_for_selector("#prompts-table")
    assert "prompt-" in page.inner_text("#prompts-table")
    page.locator("#prompts-side").get_by_text("all-fail").click()
    page.wait_for_function(
        "document.querySelector('#prompts-csv').getAttribute('href')"
        ".endsWith('side=all_fail&split=train')"
    )
    page.locator("#prompts-split").get_by_text("every split").click()
    page.wait_for_function(
        "document.querySelector('#prompts-csv').getAttribute('href').endsWith('side=all_fail')"
    )


def test_api_docs_render_without_internet(browser, dashboard_server):
    """/docs renders the API with its field descriptions from files the server ships (this
    machine's Chromium reaches no CDN; found by a fresh-user trial)."""
    page = browser.new_page()
    try:
        page.goto(dashboard_server.url + "/docs")
        page.wait_for_selector(".opblock", timeout=20_000)
        assert page.locator(".opblock-summary-path", has_text="/api/v1/runs/{run_id}/steps").count()
        assert page.locator("button.authorize").count()  # the key as a bearer token
        record = page.locator("section.models article", has_text="StepRecord").first
        record.locator(".json-schema-2020-12-expand-deep-button").first.click()  # "Expand all"
        record.get_by_text("Trainer scalars by name").wait_for()
    finally:
        page.close()


def test_a_page_whose_key_is_revoked_goes_to_the_login_page(login_as, make_key, dashboard_server):
    """Its live updates are refused (401): the page says so instead of showing its last data
    for good (found by a fresh-user trial)."""
    revoke = make_key("short-lived", "read")
    run_id = dashboard_server.runs["qwen-grpo"]
    page = login_as("short-lived", f"/dashboard/runs/{run_id}")
    try:
        page.wait_for_selector("#kpi-acr-value")
        revoke()
        page.wait_for_url("**/dashboard/login?*expired=1*", timeout=20_000)
        assert "no longer works" in page.inner_text("#login-error")
        assert f"/dashboard/runs/{run_id}" in page.input_value("input[name=next]")
    finally:
        page.close()


def test_a_page_that_loses_the_server_says_so_and_recovers(read_page, dashboard_server):
    """With the server unreachable the page froze on its last numbers without a word, which
    reads as a quiet run (a trial): a banner says since when, and goes when updates return."""
    page = read_page
    open_new_run(page, dashboard_server, "loses-server")
    assert page.locator("#connection-lost").count() == 0
    page.route("**/_dash-update-component*", lambda route: route.abort())
    banner = page.wait_for_selector("#connection-lost", timeout=15_000)
    said = banner.inner_text()
    # in UTC, as every other time on the dashboard (it was the browser's local time, a trial)
    assert re.search(r"No contact with the Vantage server since \d\d:\d\d:\d\d UTC", said), said
    page.unroute("**/_dash-update-component*")
    page.wait_for_selector("#connection-lost", state="detached", timeout=15_000)


def test_long_names_and_tags_wrap_in_the_runs_table(login_as, dashboard_server):
    """A 100-character tag without a space widened the runs table past the page."""
    long = "x" * 100
    body = {"name": "n" * 200, "project": "p" * 100, "tags": [long, long[1:] + "y"]}
    with dashboard_server.api() as api:
        run_id = api.post("/api/v1/runs", json=body).json()["run_id"]
    page = login_as("read", "/dashboard/")
    try:
        page.set_viewport_size({"width": 1280, "height": 800})
        page.wait_for_selector(f'#runs-table tr[data-run-id="{run_id}"]')
        table = "document.querySelector('#runs-table')"
        fits = f"[{table}.scrollWidth, {table}.parentElement.clientWidth]"
        scroll, room = page.evaluate(fits)
        assert scroll <= room, (scroll, room)  # the table fits its card: nothing to scroll
        # narrower: the page never scrolls sideways (the table does, in its card), and the name
        # keeps a readable width (it was squeezed to three letters a line: a trial)
        page.set_viewport_size({"width": 1000, "height": 800})
        widths = "[document.documentElement.scrollWidth, document.documentElement.clientWidth]"
        page.wait_for_function(f"{widths}[0] <= {widths}[1]")
        name_cell = f'#runs-table tr[data-run-id="{run_id}"] td'
        assert page.eval_on_selector(name_cell, "td => td.getBoundingClientRect().width") >= 140
    finally:
        page.close()


def test_a_run_without_steps_says_so_until_its_first_step(read_page, dashboard_server):
    """A registered run's page showed blank charts without a word."""
    page = read_page
    run_id = open_new_run(page, dashboard_server, "no-steps-yet", steps=0)
    note = "#run-acr-graph .annotation"
    page.wait_for_selector(note, state="attached")
    assert "No steps yet" in page.text_content(note)
    with dashboard_server.api() as api:
        sample_data.send_steps(api, run_id, 1, sample_data.step_records(0, 3))
    page.wait_for_selector(note, state="detached", timeout=15_000)
    points = "document.querySelector('#run-acr-graph .js-plotly-plot').data[0].x.length"
    assert page.evaluate(points) == 3


def test_the_run_page_shows_evaluation_steps_once_there_are_some(read_page, dashboard_server):
    """Groups sent with split 'eval' (the TRL integration's evaluation) were stored and shown
    nowhere on the page."""
    page = read_page
    run_id = open_new_run(page, dashboard_server, "with-eval")
    assert page.locator("#run-eval-graph").count() == 0
    evals = sample_data.step_records(0, 4, seed=7)
    for record in evals:
        record["split"] = "eval"
    with dashboard_server.api() as api:
        sample_data.send_steps(api, run_id, 1, evals)
        expected = api.get(f"/api/v1/runs/{run_id}/metrics", params={"split": "eval"}).json()
    page.wait_for_selector("#run-eval-graph .js-plotly-plot", timeout=15_000)
    acr = page.evaluate(
        "[...document.querySelector('#run-eval-graph .js-plotly-plot').data]"
        ".find(t => t.name == 'ACR').y"
    )
    assert acr == pytest.approx([round(p["acr"], 4) for p in expected["points"]])


def test_a_runs_notes_show_on_its_page_as_typed(read_page, dashboard_server):
    """Notes set through the API ("shown on the run page", says its schema) were shown nowhere."""
    notes = "lr 3e-6 <b>not bold</b>\nsecond line"
    with dashboard_server.api() as api:
        run_id = api.post("/api/v1/runs", json={"name": "noted"}).json()["run_id"]
    with dashboard_server.api("control") as lead:
        assert lead.patch(f"/api/v1/runs/{run_id}", json={"notes": notes}).status_code == 200
    page = read_page
    page.goto(f"{dashboard_server.url}/dashboard/runs/{run_id}")
    page.wait_for_selector("#run-notes")
    assert page.inner_text("#run-notes") == notes
    assert page.locator("#run-notes b").count() == 0  # text, not markup


def test_the_runs_list_shows_the_first_runs_then_more_and_filters_by_status(
    login_as, dashboard_server
):
    """Every run was listed (and read) on each refresh, with no status filter (a trial)."""
    with dashboard_server.api() as api:
        ids = [
            api.post("/api/v1/runs", json={"name": f"paged-{i}", "project": "paged"}).json()[
                "run_id"
            ]
            for i in range(52)
        ]
        api.post(f"/api/v1/runs/{ids[0]}/finish", json={"status": "failed"}).raise_for_status()
    rows = "document.querySelectorAll('#runs-table tbody tr').length"
    page = login_as("read", "/dashboard/?project=paged")
    try:
        page.wait_for_function(f"{rows} == 50")
        assert page.inner_text("#runs-count") == "50 of 52 runs"
        page.click("#runs-more")
        page.wait_for_function(f"{rows} == 52")
        assert not page.locator("#runs-more").is_visible()
        page.goto(f"{dashboard_server.url}/dashboard/?project=paged&status=failed")
        page.wait_for_function(f"{rows} == 1")
        assert page.locator(f'#runs-table tr[data-run-id="{ids[0]}"]').count() == 1
        page.evaluate("window.dash_clientside.set_props('runs-status', {value: 'finished'})")
        page.wait_for_selector("#runs-empty")
        assert page.inner_text("#runs-empty") == "No run matches these filters."
        assert page.evaluate("location.search") == "?project=paged&status=finished"
        page.evaluate("window.dash_clientside.set_props('runs-order', {value: 'acr'})")
        page.wait_for_function("location.search.endsWith('&order=acr')")
    finally:
        page.close()
        # the other tests look for their runs among the newest 50
        with dashboard_server.api("admin") as api:
            for run_id in ids:
                api.delete(f"/api/v1/runs/{run_id}").raise_for_status()
