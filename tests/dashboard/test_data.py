"""The dashboard's data layer and callbacks' logic against the test server's database, in
process: scopes and projects, filters, live updates."""

from __future__ import annotations

import json
from types import SimpleNamespace

import plotly.graph_objects as go
import pytest
from dash import Patch, no_update
from dash.html import Div
from vantage.dashboard import context, data, sample_data
from vantage.dashboard.pages.run import banner as run_banner
from vantage.dashboard.pages.run import figures
from vantage.dashboard.pages.run import scalars as run_scalars
from vantage.dashboard.pages.run import series as run_series
from vantage.dashboard.pages.run import shapes as run_shapes
from vantage.dashboard.pages.run import view as run_view
from vantage.dashboard.pages.runs.table import runs_table
from vantage.server.db import make_engine, session_factory
from vantage.server.health import WORST_FIRST
from vantage.server.keys import KeyInfo


@pytest.fixture
def dashboard(dashboard_server):
    settings = SimpleNamespace(auth_enabled=True, public_url=None, dashboard_refresh_s=2.0)
    engine = make_engine(dashboard_server.db_url)
    context.configure(settings, session_factory(engine))
    yield dashboard_server
    engine.dispose()


READ = KeyInfo("viewer", frozenset({"read"}))
CONTROL = KeyInfo("lead", frozenset({"read", "control"}))


def test_actions_need_the_control_scope(dashboard):
    run_id = dashboard.runs["qwen-aapo"]
    with pytest.raises(PermissionError, match="control scope"):
        data.issue_command(READ, run_id, "stop", {}, None)
    with pytest.raises(PermissionError):
        data.issue_command(None, run_id, "stop", {}, None)
    with pytest.raises(ValueError, match="temperature"):
        data.issue_command(CONTROL, run_id, "set_sampling", {"temperature": 99}, None)
    other_project = KeyInfo("other", frozenset({"read", "control"}), project="elsewhere")
    with pytest.raises(PermissionError, match="not visible"):
        data.issue_command(other_project, run_id, "stop", {}, None)


def test_a_double_click_on_send_sends_one_command(dashboard):
    """Send clicked twice within a second made two set_sampling commands, applied at two steps
    (a trial). Another value, or the same once the first is taken, is a command of its own."""
    with dashboard.api() as api:
        run_id, _attempt = sample_data.create_run(api, "double-send")
        first = data.issue_command(CONTROL, run_id, "set_sampling", {"temperature": 1.1}, None)
        again = data.issue_command(CONTROL, run_id, "set_sampling", {"temperature": 1.1}, None)
        assert again["command_id"] == first["command_id"]
        other = data.issue_command(CONTROL, run_id, "set_sampling", {"temperature": 1.2}, None)
        assert other["command_id"] != first["command_id"]
        api.post(f"/api/v1/runs/{run_id}/commands/{first['command_id']}/ack",
                 json={"status": "applied", "step": 1}).raise_for_status()  # fmt: skip
        later = data.issue_command(CONTROL, run_id, "set_sampling", {"temperature": 1.1}, None)
        assert later["command_id"] not in (first["command_id"], other["command_id"])
        log = api.get(f"/api/v1/runs/{run_id}/commands").json()["commands"]
        assert len(log) == 3


def test_a_finished_run_takes_no_commands_until_relaunched(dashboard):
    with dashboard.api() as api:
        run_id, attempt = sample_data.create_run(api, "finished-commands")
        api.post(f"/api/v1/runs/{run_id}/finish", json={"status": "failed"}).raise_for_status()
        with pytest.raises(ValueError, match="has failed, so no trainer reads its commands"):
            data.issue_command(CONTROL, run_id, "stop", {}, None)
        run = data.visible_run(READ, run_id)
        assert run is not None and run_banner.suggestions(run, [], {"streak": 80}) == []
        api.post("/api/v1/runs", json={"run_id": run_id, "name": "finished-commands"})
        run = data.visible_run(READ, run_id)  # relaunched: running again, offers and takes them
        assert run["status"] == "running" and run_banner.suggestions(run, [], {"streak": 80})
        assert data.issue_command(CONTROL, run_id, "stop", {}, None)["status"] == "pending"


def test_keys_limited_to_a_project_see_only_its_runs(dashboard):
    assert {r["name"] for r in data.runs_overview(READ)[0]} >= set(dashboard.runs)
    limited = KeyInfo("other", frozenset({"read"}), project="elsewhere")
    assert data.runs_overview(limited)[0] == []
    assert run_view.first_load(limited, dashboard.runs["qwen-grpo"]) is None
    assert data.metrics_csv(limited, dashboard.runs["qwen-grpo"]) is None


def test_runs_filters_and_sparklines(dashboard):
    runs = data.runs_overview(READ, tag="avspo")[0]
    assert [r["name"] for r in runs] == ["qwen-avspo"]
    assert 0 < len(runs[0]["spark"]) <= data.SPARK_POINTS
    assert data.runs_overview(READ, project="no-such-project")[0] == []
    projects, tags = data.filter_options(READ)
    assert "demo" in projects and {"grpo", "avspo", "aapo", "math"} <= set(tags)


def test_the_runs_list_filters_by_status_orders_and_shows_the_first_runs(dashboard):
    """The runs list had no status filter, one order and no limit: every run's sparkline was
    read on each refresh (a trial)."""
    with dashboard.api() as api:
        failed, _attempt = sample_data.create_run(api, "listed-failed")
        api.post(f"/api/v1/runs/{failed}/finish", json={"status": "failed"}).raise_for_status()
    everything, total = data.runs_overview(READ)
    assert total == len(everything) >= 4
    first, total_again = data.runs_overview(READ, limit=2)
    assert total_again == total and [r["run_id"] for r in first] == [
        r["run_id"] for r in everything[:2]
    ]
    assert all("spark" in r for r in first)
    by_status = {s: data.runs_overview(READ, status=s)[0] for s in data.RUN_STATUSES}
    assert failed in {r["run_id"] for r in by_status["failed"]}
    assert all(r["status"] == s for s, runs in by_status.items() for r in runs)
    assert sum(len(runs) for runs in by_status.values()) == total
    acrs = [r["latest_acr"] for r in data.runs_overview(READ, order="acr")[0]]
    scored = [a for a in acrs if a is not None]  # highest first, runs without an ACR last
    assert len(set(scored)) > 1 and acrs[: len(scored)] == sorted(scored, reverse=True)
    alerts = [len(r["alerts"]) for r in data.runs_overview(READ, order="alerts")[0]]
    assert alerts == sorted(alerts, reverse=True)
    ranks = [WORST_FIRST.index(r["health"]) for r in data.runs_overview(READ, order="health")[0]]
    assert ranks == sorted(ranks) and "failed" in {r["health"] for r in everything}


def test_the_runs_list_shows_a_mitigated_runs_effective_acr(dashboard):
    """A run AVSPO brought to an effective ACR of 0 showed only its raw ACR, in red: the
    reddest run on the list (a trial). Both are labelled, each in its own colour, and the
    verdict says mitigated; a run whose trainer sent no effective ACR keeps its raw colour."""

    def cell(runs, run_id):
        table = runs_table(runs).children
        [row] = [r for r in table.children[1].children if r.to_plotly_json()["props"].get(
            "data-run-id") == run_id]  # fmt: skip
        return row.children[5]

    collapsed = [[1, 1, 1, 1]] * 4
    effective = {"n_valid": 4, "n_zero_advantage": 0}
    with dashboard.api() as api:
        runs = {}
        for name, mode in (("eff-avspo", "avspo"), ("eff-plain", "none")):
            run_id, attempt = sample_data.create_run(api, name)
            said = {"effective": effective} if mode == "avspo" else {}
            records = [{"step": s, "groups": collapsed, **said,
                        "mitigation": {"mode": mode}} for s in range(3)]  # fmt: skip
            sample_data.send_steps(api, run_id, attempt, records)
            runs[mode] = run_id
    overview = data.runs_overview(READ)[0]
    avspo = cell(overview, runs["avspo"])
    raw, effective = avspo.children
    assert raw.className == "acr-bad" and raw.children == "raw 1.00"
    assert effective.className == "acr-ok" and effective.children == "effective 0.00"
    plain = cell(overview, runs["none"])
    assert plain.className == "acr-bad" and plain.children == "1.00"
    health = {r["run_id"]: r["health"] for r in overview}
    assert (health[runs["avspo"]], health[runs["none"]]) == ("mitigated", "collapsing")


def test_live_update_appends_only_new_steps(dashboard):
    with dashboard.api() as api:
        run_id, attempt = sample_data.create_run(api, "live-logic")
        sample_data.send_steps(api, run_id, attempt, sample_data.step_records(0, 10))
        first = run_view.first_load(READ, run_id)
        state = first.state
        assert state["last_step"] == 9 and first.interval_disabled is False  # still running
        quiet = run_view.live_update(READ, run_id, state)
        assert quiet.acr_figure is no_update
        sample_data.send_steps(api, run_id, attempt, sample_data.step_records(10, 3))
        update = run_view.live_update(READ, run_id, state)
        patch = update.acr_figure
        assert isinstance(patch, Patch)
        steps = [op for op in patch.to_plotly_json()["operations"]
                 if op["location"] == ["data", 6, "x"]]  # fmt: skip
        assert steps[0]["params"]["value"] == [10, 11, 12]
        assert update.state["last_step"] == 12
        # A finished run turns the interval off.
        api.post(f"/api/v1/runs/{run_id}/finish", json={"status": "finished"})
        done = run_view.live_update(READ, run_id, update.state)
        assert done.interval_disabled is True


def shapes_of(figure_or_patch) -> list[dict]:
    """The ACR chart's shapes: a first draw's, or those a live update's Patch sets."""
    if isinstance(figure_or_patch, Patch):
        ops = figure_or_patch.to_plotly_json()["operations"]
        return next(op["params"]["value"] for op in ops if op["location"] == ["layout", "shapes"])
    return figure_or_patch["layout"]["shapes"]


def test_a_mitigation_no_command_started_gets_its_band(dashboard):
    """A run whose config started AVSPO had no band on its chart (the timeline held commands
    only); a change the trainer reports later gets one on the next tick."""

    def bands(figure_or_patch) -> list[tuple[int, str]]:
        return [(b["x0"], b["label"]["text"].split(" ")[0]) for b in shapes_of(figure_or_patch)
                if b.get("fillcolor") in run_shapes.MITIGATION_COLORS.values()]  # fmt: skip

    def reporting(start: int, count: int, mode: str) -> list[dict]:
        records = sample_data.step_records(start, count)
        return [{**r, "mitigation": {"mode": mode}} for r in records]

    with dashboard.api() as api:
        run_id, attempt = sample_data.create_run(api, "config-avspo")
        sample_data.send_steps(api, run_id, attempt, reporting(0, 10, "avspo"))
        first = run_view.first_load(READ, run_id)
        figure = first.acr_figure
        assert bands(figure) == [(0, "AVSPO")]
        [band] = [s for s in figure["layout"]["shapes"] if s.get("fillcolor")]
        assert band["label"]["text"] == "AVSPO · reported by the trainer"
        green = "rgb(0, 158, 115)"
        [edge] = [s for s in figure["layout"]["shapes"] if s["line"].get("color") == green]
        assert edge["x0"] == edge["x1"] == 0  # a line where it starts
        state = json.loads(json.dumps(first.state))  # as the browser
        sample_data.send_steps(api, run_id, attempt, reporting(10, 3, "none"))
        sample_data.send_steps(api, run_id, attempt, reporting(13, 3, "aapo"))
        out = run_view.live_update(READ, run_id, state)
        assert bands(out.acr_figure) == [(0, "AVSPO"), (13, "AAPO")]
        state = json.loads(json.dumps(out.state))
        sample_data.send_steps(api, run_id, attempt, reporting(16, 2, "aapo"))
        out = run_view.live_update(READ, run_id, state)
        assert bands(out.acr_figure) == [(0, "AVSPO"), (13, "AAPO")]


def test_temperature_checkpoint_and_stop_commands_are_marked_where_applied(dashboard):
    """The ACR chart showed mitigation bands only: where a temperature change, a checkpoint or
    a stop took effect could not be seen (a trial). Each applied one gets a dotted line at its
    step, labelled, on the first draw and on a live update; a pending one none."""

    def marks(figure_or_patch) -> list[tuple[int, str]]:
        return [(s["x0"], s["label"]["text"]) for s in shapes_of(figure_or_patch)
                if s.get("name") == "command"]  # fmt: skip

    def applied(api, run_id: str, kind: str, params: dict, step: int) -> None:
        cmd = data.issue_command(CONTROL, run_id, kind, params, None)
        api.post(f"/api/v1/runs/{run_id}/commands/{cmd['command_id']}/ack",
                 json={"status": "applied", "step": step}).raise_for_status()  # fmt: skip

    with dashboard.api() as api:
        run_id, attempt = sample_data.create_run(api, "marked-commands")
        sample_data.send_steps(api, run_id, attempt, sample_data.step_records(0, 6))
        applied(api, run_id, "set_sampling", {"temperature": 1.3}, 2)
        applied(api, run_id, "checkpoint", {}, 4)
        data.issue_command(CONTROL, run_id, "stop", {}, None)  # pending: not marked yet
        first = run_view.first_load(READ, run_id)
        figure = first.acr_figure
        assert marks(figure) == [(2, "temperature 1.3"), (4, "checkpoint")]
        go.Figure(figure)
        state = json.loads(json.dumps(first.state))
        stop = [c for c in api.get(f"/api/v1/runs/{run_id}/commands").json()["commands"]
                if c["type"] == "stop"][0]  # fmt: skip
        api.post(f"/api/v1/runs/{run_id}/commands/{stop['command_id']}/ack",
                 json={"status": "applied", "step": 7}).raise_for_status()  # fmt: skip
        sample_data.send_steps(api, run_id, attempt, sample_data.step_records(6, 2))
        out = run_view.live_update(READ, run_id, state)
        assert marks(out.acr_figure) == [
            (2, "temperature 1.3"), (4, "checkpoint"), (7, "stop")
        ]  # fmt: skip


def test_a_pending_alert_gets_no_triangle_until_it_fires(dashboard):
    """The chart's triangles mark where alerts fired, but a pending one had its own (a trial)."""
    marks = len(run_series.ACR_SERIES)  # the alert markers' trace

    def marker_steps(out) -> list:
        patch = out.acr_figure
        ops = patch.to_plotly_json()["operations"] if isinstance(patch, Patch) else []
        return [v for op in ops if op["location"] == ["data", marks, "x"]
                for v in op["params"]["value"]]  # fmt: skip

    collapsed = [[1, 1, 1, 1], [0, 0, 0, 0]]
    with dashboard.api() as api:
        run_id, attempt = sample_data.create_run(api, "pending-marker")
        rule = {"name": "pm", "run_id": run_id, "metric": "acr", "op": ">", "threshold": 0.5,
                "for_steps": 3}  # fmt: skip
        with dashboard.api("control") as lead:
            lead.post("/api/v1/alert-rules", json=rule).raise_for_status()
        send = [{"step": s, "groups": collapsed} for s in (0, 1)]
        sample_data.send_steps(api, run_id, attempt, send)
        first = run_view.first_load(READ, run_id)
        assert first.acr_figure["data"][marks]["x"] == []
        state = first.state
        sample_data.send_steps(api, run_id, attempt, [{"step": 2, "groups": collapsed}])
        out = run_view.live_update(READ, run_id, state)
        assert marker_steps(out) == [2]  # fired at step 2
        sample_data.send_steps(api, run_id, attempt, [{"step": 3, "groups": collapsed}])
        out = run_view.live_update(READ, run_id, out.state)
        assert marker_steps(out) == []  # drawn once


def test_a_live_update_names_a_scalar_gone_non_finite(dashboard):
    with dashboard.api() as api:
        run_id, attempt = sample_data.create_run(api, "diverged")
        sample_data.send_steps(api, run_id, attempt, sample_data.step_records(0, 3))
        state = run_view.first_load(READ, run_id).state
        assert state["non_finite"] is None
        records = sample_data.step_records(3, 2)
        records[0]["scalars"]["loss"] = float("nan")
        body = json.dumps({"attempt": attempt, "records": records})  # the NaN token
        r = api.post(f"/api/v1/runs/{run_id}/steps", content=body)
        assert r.status_code == 200, r.text
        out = run_view.live_update(READ, run_id, state)
        patch = out.scalars_figure.to_plotly_json()["operations"]
        (title,) = [op for op in patch if op["location"] == ["layout", "title", "text"]]
        assert title["params"]["value"].endswith("non-finite: loss NaN at step 3</sup>")
        assert out.state["non_finite"] == "loss NaN at step 3"


def test_the_no_scalars_note_goes_when_scalars_arrive(dashboard):
    with dashboard.api() as api:
        run_id, attempt = sample_data.create_run(api, "late-scalars")
        bare = sample_data.step_records(0, 2)
        for record in bare:
            del record["scalars"]
        sample_data.send_steps(api, run_id, attempt, bare)
        state = run_view.first_load(READ, run_id).state
        assert state["scalars"] == []
        sample_data.send_steps(api, run_id, attempt, sample_data.step_records(2, 1))
        out = run_view.live_update(READ, run_id, state)
        fig = out.scalars_figure  # drawn again, with its charts
        assert figures.NO_SCALARS_NOTE not in fig["layout"].get("annotations", [])
        assert [t["name"] for t in fig["data"]][:2] == ["loss", "KL"]
        assert out.state["scalars"][:2] == ["loss", "kl"]


def test_a_new_attempt_reloads_the_page_data(dashboard):
    with dashboard.api() as api:
        run_id, attempt = sample_data.create_run(api, "resumed")
        sample_data.send_steps(api, run_id, attempt, sample_data.step_records(0, 10))
        state = run_view.first_load(READ, run_id).state
        r = api.post("/api/v1/runs", json={"run_id": run_id, "name": "resumed"})
        new_attempt = r.json()["attempt"]
        assert new_attempt == attempt + 1
        sample_data.send_steps(api, run_id, new_attempt, sample_data.step_records(5, 2, seed=9))
        out = run_view.live_update(READ, run_id, state)
        fig = out.acr_figure
        assert isinstance(fig, dict) and fig["data"][6]["x"] == list(range(10))
        assert out.state["attempt"] == new_attempt


def test_a_long_open_page_reloads_downsampled(dashboard, monkeypatch):
    monkeypatch.setattr(run_view, "APPEND_LIMIT", 4)
    with dashboard.api() as api:
        run_id, attempt = sample_data.create_run(api, "long-open")
        sample_data.send_steps(api, run_id, attempt, sample_data.step_records(0, 3))
        state = run_view.first_load(READ, run_id).state
        sample_data.send_steps(api, run_id, attempt, sample_data.step_records(3, 3))
        state = run_view.live_update(READ, run_id, state).state
        assert state["appended"] == 3
        sample_data.send_steps(api, run_id, attempt, sample_data.step_records(6, 2))
        out = run_view.live_update(READ, run_id, state)
        assert isinstance(out.acr_figure, dict)  # a fresh figure
        assert out.state.get("appended", 0) == 0


def test_a_run_without_steps_yet_fills_in_live(dashboard):
    with dashboard.api() as api:
        run_id, attempt = sample_data.create_run(api, "empty-at-first")
        first = run_view.first_load(READ, run_id)
        state = first.state
        assert state["last_step"] is None
        kpis = str(first.kpis)
        assert "—" in kpis  # missing values show a dash, never a made-up 0
        sample_data.send_steps(api, run_id, attempt, sample_data.step_records(0, 4))
        out = run_view.live_update(READ, run_id, state)
        assert out.state["last_step"] == 3


def test_a_stalled_run_is_offered_avspo_unless_its_mode_is_off_or_one_is_asked_for():
    stalled, calm = {"streak": 53}, {"streak": 12}
    for mode in ("auto", "suggest"):
        (offer,) = run_banner.suggestions({"mitigation_mode": mode}, [], stalled)
        assert offer["params"]["mode"] == "avspo" and "53 steps" in offer["why"]
    assert run_banner.suggestions({"mitigation_mode": "off"}, [], stalled) == []
    assert run_banner.suggestions({"mitigation_mode": "auto"}, [], calm) == []
    asked = {"mitigation_mode": "auto", "mitigation_requested": {"mode": "aapo"}}
    assert run_banner.suggestions(asked, [], stalled) == []
    # AVSPO from the trainer's config: reported with its steps, never requested (it was offered
    # AVSPO again, as raw ACR stays high under it)
    running = {"mitigation_mode": "auto", "mitigation_reported": {"mode": "avspo", "alpha": 0.5}}
    assert run_banner.suggestions(running, [], stalled) == []
    acked = {"mitigation_mode": "auto", "mitigation_applied": {"mode": "aapo"}}
    assert run_banner.suggestions(acked, [], stalled) == []
    # a relaunch that reports none after an acked AVSPO runs none: offered again
    dropped = {**acked, "mitigation_reported": {"mode": "none"}}
    (offer,) = run_banner.suggestions(dropped, [], stalled)


def test_a_suggested_setting_shows_its_values():
    sampling = {"type": "set_sampling", "params": {"temperature": 1.3}}
    alert = {"state": "firing", "mitigation": sampling, "alert_id": 1, "rule": "hot", "value": 0.9}
    run = {"status": "running", "mitigation_mode": "suggest"}
    (chips, offer) = run_banner.banner(run, [alert], {}, True)
    text = json.dumps(offer.to_plotly_json(), default=lambda c: c.to_plotly_json())
    assert "set_sampling temperature=1.3 because alert hot is firing" in text
    assert "Apply set_sampling temperature=1.3" in text
    # a mitigation's own values too (AVSPO with an adaptive trigger read as plain AVSPO)
    avspo = {"type": "set_mitigation", "params": {"mode": "avspo", "threshold": "adaptive"}}
    (chips, offer) = run_banner.banner(run, [{**alert, "mitigation": avspo}], {}, True)
    text = json.dumps(offer.to_plotly_json(), default=lambda c: c.to_plotly_json())
    assert "set_mitigation AVSPO (threshold=adaptive) because alert hot" in text


def test_alerts_of_an_ended_run_are_said_to_be_from_its_end():
    alert = {"state": "firing", "alert_id": 2, "rule": "acr_stall", "value": 0.6, "fired_step": 9}
    for status, words, chip in (("running", "Alerts firing: ", "alert-chip"),
                                ("finished", "Alerts firing when the run ended: ",
                                 "alert-chip alert-chip-ended")):  # fmt: skip
        (chips,) = run_banner.banner({"status": status}, [alert], {}, True)
        text = json.dumps(chips.to_plotly_json(), default=lambda c: c.to_plotly_json())
        assert words in text and f'"className": "{chip}"' in text, text


def test_a_taken_offer_leaves_the_banner_without_new_steps(dashboard):
    """The "Suggested: Apply" banner stayed after its command was sent, until a reload (a
    trial): the banner follows its alerts and offers at each tick, new steps or not."""
    collapsed = [[1, 1, 1, 1], [0, 0, 0, 0]]
    with dashboard.api() as api:
        run_id, attempt = sample_data.create_run(api, "offer-taken")
        with dashboard.api("control") as lead:
            lead.patch(f"/api/v1/runs/{run_id}", json={"mitigation_mode": "suggest"})
            rule = {"name": "offer", "run_id": run_id, "metric": "acr", "op": ">",
                    "threshold": 0.5, "mitigation": {"type": "set_mitigation",
                                                     "params": {"mode": "avspo"}}}  # fmt: skip
            lead.post("/api/v1/alert-rules", json=rule).raise_for_status()
        sample_data.send_steps(api, run_id, attempt, [{"step": 0, "groups": collapsed}])
    first = run_view.first_load(CONTROL, run_id, can_control=True)
    state = first.state
    assert "Suggested" in json.dumps(first.banner, default=str)
    quiet = run_view.live_update(CONTROL, run_id, state)
    assert quiet.banner is no_update  # nothing changed
    data.issue_command(CONTROL, run_id, "set_mitigation", {"mode": "avspo"}, "taken")
    out = run_view.live_update(CONTROL, run_id, state)
    banner = out.banner
    assert banner is not no_update and "Suggested" not in json.dumps(banner, default=str)
    assert "offer" in json.dumps(banner, default=str)  # the alert still fires


def test_an_alert_on_a_mitigated_run_says_the_rules_read_the_raw_acr():
    """acr_stall fired on a run AVSPO had brought to an effective ACR of 0, and the red banner
    read as the run failing (a trial)."""
    alert = {"alert_id": 1, "state": "firing", "rule_name": "acr_stall", "value": 0.9}

    def text(run: dict) -> str:
        return json.dumps(Div(run_banner.banner(run, [alert], {}, False, [])).to_plotly_json(),
                          default=lambda c: c.to_plotly_json())  # fmt: skip

    mitigated = {"run_id": "r", "status": "running", "mitigation_reported": {"mode": "avspo"}}
    assert "AVSPO is on: it leaves the raw ACR that rules read" in text(mitigated)
    assert "is on:" not in text({"run_id": "r", "status": "running"})


def test_a_live_update_draws_scalars_that_came_after_their_steps_groups(dashboard):
    """The bundled trainer logs the held-out accuracy after the step's groups: a page that had
    drawn the step showed no eval point for it until a reload (a trial)."""
    with dashboard.api() as api:
        run_id, attempt = sample_data.create_run(api, "late-eval")
        records = sample_data.step_records(0, 3)
        for record in records:
            record["scalars"] = {"loss": 0.1}
        records[0]["scalars"]["eval_accuracy"] = 0.4
        sample_data.send_steps(api, run_id, attempt, records)
        state = run_view.first_load(READ, run_id).state
        trace = state["scalars"].index("eval_accuracy")
        late = {"step": 2, "groups": [], "scalars": {"eval_accuracy": 0.6}}
        sample_data.send_steps(api, run_id, attempt, [late])

        def appended(out) -> list:
            patch = out.scalars_figure.to_plotly_json()["operations"]
            return [(op["location"][-1], op["params"]["value"]) for op in patch
                    if op["location"][:2] == ["data", trace]]  # fmt: skip

        out = run_view.live_update(READ, run_id, state)  # no new step: the late scalar alone
        assert appended(out) == [("x", 2), ("y", 0.6)]
        state = out.state
        assert run_view.live_update(READ, run_id, state)[6] is no_update  # drawn once
        step_3, step_4 = ({**r, "scalars": {"loss": 0.1}} for r in sample_data.step_records(3, 2))
        sample_data.send_steps(api, run_id, attempt, [step_3])
        state = run_view.live_update(READ, run_id, state).state
        # step 3's accuracy and step 4's groups in one tick: the late point, then the new step
        sample_data.send_steps(api, run_id, attempt, [{**late, "step": 3}, step_4])
        out = run_view.live_update(READ, run_id, state)
        assert appended(out) == [("x", 3), ("y", 0.6), ("x", [4]), ("y", [None])]


def test_refresh_intervals_stay_within_a_browsers_timer():
    """At the longest `VANTAGE_DASHBOARD_REFRESH_S` the compare page's twice-as-long interval
    overflowed a browser's timer, which then fires at once, every time (a trial)."""
    longest = SimpleNamespace(auth_enabled=True, public_url=None, dashboard_refresh_s=2_147_483)
    context.configure(longest, lambda: None)
    assert context.refresh_ms() == 2_147_483_000
    assert context.refresh_ms(times=2) == context.MAX_INTERVAL_MS == 2**31 - 1
    context.configure(SimpleNamespace(dashboard_refresh_s=2.0), lambda: None)
    assert context.refresh_ms(times=2) == 4000


def test_a_chosen_scalar_view_redraws_then_live_appends_to_it(dashboard):
    with dashboard.api() as api:
        run_id, attempt = sample_data.create_run(api, "scalar-view")
        sample_data.send_steps(api, run_id, attempt, sample_data.step_records(0, 5))
        state = run_view.first_load(READ, run_id).state
        view = run_scalars.normal_view(["kl"], 0.5, [], "step")
        out = run_view.scalars_reload(READ, run_id, state, view)
        assert [t["name"] for t in out.scalars_figure["data"]] == ["KL", "KL, smoothed"]
        assert out.acr_figure is no_update and out.state["scalars"] == ["kl"]
        ema = out.state["scalar_ema"]["kl"]
        records = sample_data.step_records(5, 1)
        sample_data.send_steps(api, run_id, attempt, records)
        live = run_view.live_update(READ, run_id, out.state)
    ops = {tuple(op["location"]): op["params"]["value"]
           for op in live.scalars_figure.to_plotly_json()["operations"]}  # fmt: skip
    kl = records[0]["scalars"]["kl"]
    assert ops[("data", 0, "y")] == [kl]  # raw, then the line continued from its average
    assert ops[("data", 1, "y")] == [pytest.approx(0.5 * ema + 0.5 * kl)]


def test_the_compare_totals_count_steps_wasted_rollouts_and_pool_the_effective_acr(dashboard):
    with dashboard.api() as api:
        run_id, attempt = sample_data.create_run(api, "compare-totals")
        records = sample_data.step_records(0, 3)
        for record, zero in zip(records, (4, 8, 0), strict=True):
            record["effective"] = {"n_valid": 16, "n_zero_advantage": zero}
        answer = sample_data.send_steps(api, run_id, attempt, records)
    result = data.compare(READ, [run_id])
    totals = result["totals"][run_id]
    assert totals["steps"] == 3
    assert totals["wasted_rollouts"] == sum(s["wasted_rollouts"] for s in answer["steps"])
    valid = [s["n_valid"] for s in answer["steps"]]  # each step's effective ACR, by its groups
    pooled = sum(z / 16 * v for z, v in zip((4, 8, 0), valid, strict=True)) / sum(valid)
    assert totals["acr_effective_pooled"] == pytest.approx(pooled)
