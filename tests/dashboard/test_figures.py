"""Figure builders, KPI state and command forms: plain data in, plain data out (no browser)."""

from __future__ import annotations

import json
import random

import plotly.graph_objects as go
import pytest
from dash import Patch
from vantage.client.acr import window_metrics
from vantage.dashboard import components, explain, url_state
from vantage.dashboard import figures as dashboard_figures
from vantage.dashboard.pages.compare import figures as compare_figures
from vantage.dashboard.pages.compare import table as compare_table
from vantage.dashboard.pages.run import command_panel, figures, kpis
from vantage.dashboard.pages.run import series as run_series
from vantage.dashboard.pages.run import shapes as run_shapes
from vantage.dashboard.pages.runs.table import sparkline_svg


def point(step: int, acr: float | None = 0.5, **extra) -> dict:
    p = {
        "step": step,
        "time": 1000.0 + 2 * step,
        "n_valid": 16,
        "n_collapsed": None if acr is None else round(acr * 16),
        "acr": acr,
        "acr_eps": None if acr is None else acr + 0.05,
        "acr_all_pass": None if acr is None else acr * 0.75,
        "acr_all_fail": None if acr is None else acr * 0.25,
        "acr_constant": 0.0,
        "acr_effective": None,
        "expected_acr": 0.2,
        "wasted_rollouts": 0 if acr is None else round(acr * 16) * 8,
        "pass_rate": 0.6,
        "reward_mean": 0.6,
        "scalars": {"loss": 0.1, "kl": 0.01, "entropy": 1.2, "temperature": 1.0, "reward_std": 0.2},
    }
    p.update(extra)
    return p


def test_acr_figure_is_valid_and_keeps_its_series_order():
    pts = [point(s, 0.1 * (s % 10)) for s in range(50)]
    fig = figures.acr_figure(pts)
    go.Figure(fig)  # validates every property
    names = [t["name"] for t in fig["data"]]
    assert names[: len(run_series.ACR_SERIES)] == [s.label for s in run_series.ACR_SERIES]
    assert names[-1] == "alerts"
    acr = fig["data"][[s.key for s in run_series.ACR_SERIES].index("acr")]
    assert acr["x"] == list(range(50)) and acr["y"][3] == pytest.approx(0.3)
    # The three sides stack into one area, under the lines.
    assert {fig["data"][i]["stackgroup"] for i in range(3)} == {"sides"}
    # The stall threshold is drawn and named.
    assert fig["layout"]["shapes"][0]["y0"] == 0.35


def test_empty_and_missing_values_still_build():
    for fig in (
        figures.acr_figure([]),
        figures.reward_figure([]),
        figures.scalars_figure([]),
        figures.acr_figure([point(0, None), point(1, 0.5, scalars={})]),
        figures.reward_figure([point(0, None, reward_mean=None)]),
    ):
        go.Figure(fig)
    fig = figures.acr_figure([point(0, None), point(1, 0.5)])
    assert fig["data"][6]["y"] == [None, 0.5]  # a gap, never a silent 0


def test_a_point_without_groups_is_no_part_of_the_stacked_sides():
    """Step 0 holds the baseline accuracy only: the stacked sides were drawn from step 0 at
    step 1's shares (Plotly draws a stack's leading gap at its first value: a trial)."""
    shares = ("acr_all_fail", "acr_all_pass", "acr_constant")
    baseline = point(0, None, n_valid=0, acr_constant=None, expected_acr=None)
    fig = figures.acr_figure([baseline, point(1, 0.5), point(2, 0.25)])
    go.Figure(fig)
    stacked = [t for t in fig["data"] if t.get("stackgroup") == "sides"]
    assert [t["x"] for t in stacked] == [[1, 2]] * 3
    acr = fig["data"][[s.key for s in run_series.ACR_SERIES].index("acr")]
    assert acr["x"] == [0, 1, 2] and acr["y"][0] is None  # the line keeps its gap
    patch = Patch()
    run_series.extend_patch(patch, [point(3, 0.5), {**baseline, "step": 4}], run_series.ACR_SERIES)
    added = [op for op in patch.to_plotly_json()["operations"] if op["operation"] == "Extend"]
    xs = {tuple(op["location"]): op["params"]["value"] for op in added}
    for i, key in enumerate(s.key for s in run_series.ACR_SERIES):
        assert xs[("data", i, "x")] == ([3] if key in shares else [3, 4]), key


def test_reward_band_is_mean_plus_minus_std():
    fig = figures.reward_figure([point(0, reward_mean=0.5)])
    low, high, mean = (t["y"][0] for t in fig["data"])
    assert (low, mean, high) == pytest.approx((0.3, 0.5, 0.7))
    go.Figure(figures.scalars_figure([point(0)]))


def test_mitigation_bands_name_the_command_and_end_at_the_next_change():
    timeline = [
        {"type": "set_mitigation", "params": {"mode": "avspo"}, "step": 10, "status": "applied",
         "command_id": "c0ffee12-aaaa", "issued_by": "dashboard:lead"},
        {"type": "set_sampling", "params": {"temperature": 1.2}, "step": 15, "status": "applied"},
        {"type": "set_mitigation", "params": {"mode": "none"}, "step": 30, "status": "applied",
         "command_id": "x"},
        {"type": "set_mitigation", "params": {"mode": "aapo"}, "step": 40, "status": "applied",
         "command_id": "deadbeef", "issued_by": "alert"},
        {"type": "set_mitigation", "params": {"mode": "aapo"}, "step": None, "status": "pending"},
        {"type": "set_mitigation", "params": {"mode": "avspo"}, "step": 45, "status": "rejected"},
    ]  # fmt: skip
    bands = run_shapes.mitigation_bands(timeline, last_step=60)
    # a command acked at step s changes step s + 1 (the trainer applies it after step s)
    assert [(b["x0"], b["x1"]) for b in bands] == [(11, 31), (41, 60)]
    assert "AVSPO" in bands[0]["label"]["text"] and "c0ffee12" in bands[0]["label"]["text"]
    assert "dashboard:lead" in bands[0]["label"]["text"]
    assert "AAPO" in bands[1]["label"]["text"]
    # a band in the right half is labelled leftwards from its right edge (cut at the chart's
    # edge when it ran right: a trial)
    assert [b["label"]["textposition"] for b in bands] == ["top left", "top right"]
    fig = figures.acr_figure([point(s) for s in range(61)], timeline)
    go.Figure(fig)
    assert fig["layout"]["yaxis"]["range"][0] < 0  # a share of 0 is drawn whole


def test_alert_markers_sit_on_the_acr_line_with_a_tooltip():
    pts = [point(s, 0.4) for s in range(5)]
    alerts = [{"rule": "acr_stall", "fired_step": 3, "value": 0.41, "state": "firing",
               "severity": "warning"}, {"rule": "never_fired", "state": "pending"},
              {"rule": "pending", "state": "pending", "pending_step": 1, "fired_step": None},
              {"rule": "at_0", "state": "resolved", "pending_step": 0, "fired_step": 0,
               "resolved_step": 0},
              {"rule": "changed", "state": "resolved", "fired_step": 2, "resolved_step": None},
              ]  # fmt: skip
    xs, ys, texts = figures.alert_markers(alerts, pts)
    assert (xs, ys) == ([3, 0, 2], [0.4, 0.4, 0.4])
    assert "acr_stall" in texts[0] and "0.41" in texts[0] and "resolved" not in texts[0]
    assert texts[1].endswith("resolved at 0")  # step 0 was taken for no step
    assert texts[2].endswith("resolved when its rule changed")  # disabled, say
    fig = figures.acr_figure(pts, alerts=alerts)
    assert fig["data"][-1]["x"] == [3, 0, 2]


def test_extend_patch_appends_each_series_to_its_trace():
    patch = Patch()
    assert (
        run_series.extend_patch(patch, [point(7, 0.25), point(8, 0.5)], run_series.ACR_SERIES) == 2
    )
    ops = patch.to_plotly_json()["operations"]
    acr_index = [s.key for s in run_series.ACR_SERIES].index("acr")
    extend_y = [o for o in ops if o["location"] == ["data", acr_index, "y"]]
    assert extend_y[0]["operation"] == "Extend" and extend_y[0]["params"]["value"] == [0.25, 0.5]
    assert run_series.extend_patch(Patch(), [], run_series.ACR_SERIES) == 0


def test_compare_figure_overlays_acr_and_reward_per_run():
    runs = [
        {"run_id": "a" * 8, "name": "grpo"},
        {"run_id": "b" * 8, "name": "avspo", "mitigation_applied": {"mode": "avspo"}},
    ]
    fig = compare_figures.compare_figure(runs, {"a" * 8: [point(0)], "b" * 8: [point(0), point(1)]})
    go.Figure(fig)
    assert len(fig["data"]) == 4
    assert fig["data"][2]["name"] == "avspo (avspo)"
    # a requested mitigation the trainer has not applied yet is not shown as on
    pending = {**runs[0], "mitigation_requested": {"mode": "aapo", "status": "pending"}}
    assert compare_figures.compare_figure([pending], {})["data"][0]["name"] == "grpo (none → aapo)"
    switching = {**runs[1], "mitigation_requested": {"mode": "none", "status": "delivered"}}
    assert (
        compare_figures.compare_figure([switching], {})["data"][0]["name"] == "avspo (avspo → none)"
    )
    # a resumed attempt that runs without the applied mitigation says so (it showed "avspo")
    resumed = {
        **runs[1],
        "mitigation_requested": {"mode": "avspo", "status": "applied"},
        "mitigation_reported": {"mode": "none"},
    }
    assert (
        compare_figures.compare_figure([resumed], {})["data"][0]["name"] == "avspo (none → avspo)"
    )
    assert fig["data"][1]["yaxis"] == "y2"  # reward on the lower chart
    # a name is text, not Plotly's HTML, in the legend and the hover; a one-step run is a dot
    tagged = {"run_id": "c" * 8, "name": "<b>x</b> %{y}"}
    (acr, _) = compare_figures.compare_figure([tagged], {"c" * 8: [point(0)]})["data"]
    assert acr["name"] == "&lt;b&gt;x&lt;/b&gt; %{y}" and "<b>" not in acr["hovertemplate"]
    assert acr["mode"] == "markers" and fig["data"][0]["mode"] == "markers"
    assert fig["data"][2]["mode"] == "lines"
    # twenty runs: past the seven colours, dashes tell runs of one colour apart (a trial saw
    # two orange lines); a 200-character name is cut in the legend
    many = [{"run_id": f"r{i:07d}", "name": "n" * 200 if i == 0 else f"run {i}"} for i in range(20)]
    acrs = compare_figures.compare_figure(many, {})["data"][0:40:2]
    styles = {(t["line"]["color"], t["line"]["dash"]) for t in acrs}
    assert len(styles) == 20
    assert acrs[0]["name"] == "n" * 26 + "…" + "n" * 13
    seeds = [{"run_id": f"s{i}", "name": f"qwen2.5-7b-instruct-grpo-math500-lr1e-6-seed{i}"}
             for i in (1, 2)]  # fmt: skip
    names = [t["name"] for t in compare_figures.compare_figure(seeds, {})["data"][0:4:2]]
    assert names[0] != names[1] and names[1].endswith("lr1e-6-seed2"), names  # cut mid-name


def test_compare_says_when_a_mitigation_applied_and_draws_the_effective_acr():
    """A plain GRPO run that got AVSPO at step 108 read "avspo" for its whole curve, and only
    the raw ACR was drawn, which AVSPO leaves as it is (a trial): the legend says after which
    step, a diamond marks it, and the effective ACR is dotted."""
    run = {"run_id": "b" * 8, "name": "mine", "mitigation_applied": {"mode": "avspo"}}
    timeline = [
        {"type": "set_sampling", "status": "applied", "step": 0, "params": {"temperature": 1}},
        {"type": "set_mitigation", "status": "rejected", "step": 1, "params": {"mode": "aapo"}},
        {"type": "set_mitigation", "status": "applied", "step": 2, "params": {"mode": "avspo"}},
    ]
    pts = [point(s, 0.75, acr_effective=0.75 if s <= 2 else 0.0) for s in range(6)]
    fig = compare_figures.compare_figure([run], {run["run_id"]: pts}, {run["run_id"]: timeline})
    go.Figure(fig)
    acr, reward, effective, marks = fig["data"]
    # acked at step 2, so in effect from step 3 (the legend said "after step 2", the run
    # page's band began at 2: one run, two readings)
    assert acr["name"] == "mine (avspo from step 3)" == effective["name"] == marks["name"]
    assert effective["line"]["dash"] == "dot" and effective["y"] == [0.75] * 3 + [0.0] * 3
    assert not effective["showlegend"] and effective["yaxis"] == "y"
    assert marks["x"] == [3] and marks["y"] == [0.75] and marks["mode"] == "markers"
    assert marks["text"] == ["avspo in effect from step 3"]
    # without effective ACR from the trainer nor a change, nothing is added
    plain = compare_figures.compare_figure([run], {run["run_id"]: [point(0), point(1)]}, {})
    assert len(plain["data"]) == 2 and plain["data"][0]["name"] == "mine (avspo)"
    # a mitigation the config started is on from the first step: no "from step 0"
    by_config = [
        {"type": "set_mitigation", "status": "applied", "step": 0, "params": {"mode": "avspo"}}
    ]
    by_config[0].update(issued_by="trainer", command_id=None)
    fig = compare_figures.compare_figure([run], {run["run_id"]: pts}, {run["run_id"]: by_config})
    assert fig["data"][0]["name"] == "mine (avspo)"


def test_sparkline_is_an_svg_with_the_threshold():
    svg = sparkline_svg([0.1, None, 0.9])
    assert svg.startswith("<svg") and "polyline" in svg
    assert dashboard_figures.COLORS["alert"] in svg  # the latest value is above 0.35
    assert "polyline" in sparkline_svg([])


def test_kpi_state_advances_like_the_servers_window_metrics():
    rng = random.Random(3)
    acrs = [None if rng.random() < 0.05 else rng.random() for _ in range(180)]
    pts = [point(s, a) for s, a in enumerate(acrs)]
    start = 60
    window = window_metrics(pts[:start])
    state = kpis.initial_state(window, pts[:start], False, attempt=1)
    for i in range(start, len(pts), 7):  # live updates of 7 steps
        state = kpis.advance(state, pts[i : i + 7])
    want = window_metrics(pts)
    assert state["ema"] == pytest.approx(want["acr_ema"])
    assert state["streak"] == want["acr_streak"]
    assert state["acr_100"] == pytest.approx(want["acr_100"])
    assert state["last_step"] == 179
    # Volatility needs 25 consecutive acrs in the tail; without gaps it matches.
    clean = [point(s, rng.random()) for s in range(40)]
    st = kpis.advance(kpis.initial_state(window_metrics(clean[:10]), clean[:10], False, 1),
                      clean[10:])  # fmt: skip
    assert st["volatility"] == pytest.approx(window_metrics(clean)["acr_volatility"])


def test_kpi_cards_explain_each_number():
    state = kpis.initial_state({"acr_ema": 0.4, "acr_streak": 60}, [point(0, 0.5), point(1, 0.5)],
                               False, 1)  # fmt: skip
    cards = {c["id"]: c for c in kpis.cards(state, {"group_size": 8, "status": "running"})}
    assert cards["acr"]["value"] == "0.50" and cards["acr"]["level"] == "bad"
    assert cards["wasted"]["value"] == "50%"
    assert cards["steps_per_min"]["value"] == "30.0"  # 1 step per 2 s
    assert cards["acr_streak"]["level"] == "bad"
    assert all(len(c["help"]) > 40 for c in cards.values())
    # without a group size: completions wasted per step, not rounded down to a whole number
    tail = [point(s, 0.5, wasted_rollouts=w) for s, w in enumerate((17, 4, 2))]
    state = kpis.initial_state({}, tail, False, 1)
    cards = {c["id"]: c for c in kpis.cards(state, {"group_size": None, "status": "running"})}
    assert cards["wasted"]["value"] == "7.7/step"
    # groups larger than the declared size: per step too, never a share above 100%
    tail = [point(s, 1.0, wasted_rollouts=w, n_valid=1) for s, w in enumerate((8, 8, 2))]
    state = kpis.initial_state({}, tail, False, 1)
    cards = {c["id"]: c for c in kpis.cards(state, {"group_size": 2, "status": "running"})}
    assert cards["wasted"]["value"] == "6.0/step"
    cards = {c["id"]: c for c in kpis.cards(state, {"group_size": 8, "status": "running"})}
    assert cards["wasted"]["value"] == "75%"  # 18 of 3 × 8
    # points that carry their completions give the real share, whatever the declared size
    tail = [point(s, 0.2, wasted_rollouts=8, n_valid=5, n_completions=40) for s in range(3)]
    state = kpis.initial_state({}, tail, False, 1)
    for size in (2, 8, None):
        cards = {c["id"]: c for c in kpis.cards(state, {"group_size": size, "status": "running"})}
        assert cards["wasted"]["value"] == "20%"
    assert cards["wasted"]["sub"] == "last 3 steps"
    one = kpis.initial_state({}, tail[:1], False, 1)
    one_card = {c["id"]: c for c in kpis.cards(one, {"status": "running"})}
    assert one_card["wasted"]["sub"] == "last 1 step"  # not "last 1 steps"
    # counted before the trainer's mitigation, which the card says once there is one (a trial)
    tail[-1]["acr_effective"] = 0.0
    state = kpis.initial_state({}, tail, False, 1)
    avspo = {"group_size": 8, "status": "running", "mitigation_reported": {"mode": "avspo"}}
    cards = {c["id"]: c for c in kpis.cards(state, avspo)}
    assert cards["wasted"]["sub"] == "last 3 steps; AVSPO acts on it: effective 0.00"
    # a run whose mitigation brought the effective ACR to 0 looked failing on every ACR card
    # (a trial), then "Wasted rollouts 94%" was green (issue 42): the raw cards say "raw", turn
    # grey ("info": neither fine nor a worry) and say why; the effective ACR has its own card
    mitigated = [point(s, 0.9, acr_effective=0.0) for s in range(3)]
    state = kpis.initial_state({"acr_streak": 60}, mitigated, False, 1)
    cards = {c["id"]: c for c in kpis.cards(state, avspo)}
    assert cards["acr"]["value"] == "0.90" and cards["acr"]["level"] == "info"
    assert cards["acr"]["sub"] == "step 2 · AVSPO acts on it: effective 0.00"
    assert "raw" in cards["acr"]["title"] and "raw" in cards["wasted"]["title"]
    assert (cards["acr_effective"]["value"], cards["acr_effective"]["level"]) == ("0.00", "ok")
    assert cards["acr_effective"]["sub"] == "after AVSPO"
    # a run with no mitigation is judged by its ACR, even when its trainer sends an effective
    # one (it read "effective … after mitigation" beside "Mitigation: none": a trial)
    plain = {c["id"]: c for c in kpis.cards(state, {"group_size": 8, "status": "running"})}
    assert plain["acr"]["sub"] == "step 2" and plain["acr"]["level"] == "bad"
    assert "mitigation" not in plain["acr_streak"]["sub"] and plain["acr_streak"]["level"] == "bad"
    cards = {c["id"]: c for c in kpis.cards(state, avspo)}
    assert cards["acr_streak"]["sub"] == "AVSPO acts on it: effective 0.00"
    assert cards["acr_streak"]["level"] == "info"
    # so do the trend and wasted cards, which stayed red (raw values, still shown)
    mitigated = [
        point(s, 0.9, acr_effective=0.0, wasted_rollouts=30, n_completions=32) for s in range(3)
    ]
    state = kpis.initial_state({"acr_streak": 60, "acr_ema": 0.9}, mitigated, False, 1)
    cards = {c["id"]: c for c in kpis.cards(state, avspo)}
    assert cards["acr_ema"]["value"] == "0.90" and cards["acr_ema"]["level"] == "info"
    assert cards["acr_ema"]["sub"].endswith("; AVSPO acts on it: effective 0.00")
    assert cards["wasted"]["value"] == "94%" and cards["wasted"]["level"] == "info"
    still = [
        point(s, 0.9, acr_effective=0.8, wasted_rollouts=30, n_completions=32) for s in range(3)
    ]
    state = kpis.initial_state({"acr_ema": 0.9}, still, False, 1)
    cards = {c["id"]: c for c in kpis.cards(state, avspo)}
    assert cards["acr_ema"]["level"] == cards["wasted"]["level"] == "bad"


def test_texts_never_promise_an_accuracy_prediction():
    texts = [v for k, v in vars(explain).items() if isinstance(v, str) and k.isupper()]
    texts += list(explain.KPI_HELP.values()) + list(explain.COMMAND_HELP.values())
    texts += [answer for _question, answer in explain.PRIMER]
    for text in texts:
        assert "51.4" not in text and "29.6" not in text
        assert "will reach" not in text.lower() and "expected accuracy" not in text.lower()
    assert "not a forecast" in explain.ACR_100
    assert "nothing here predicts accuracy" in explain.PRIMER[-1][1]


def test_command_forms():
    values = {"avspo_threshold": "adaptive", "avspo_alpha": 0.7, "aapo_delta_low": -0.1,
              "aapo_delta_high": 0.3, "temperature": 1.3}  # fmt: skip
    assert command_panel.build_command("avspo", values) == (
        "set_mitigation", {"mode": "avspo", "threshold": "adaptive", "alpha": 0.7})  # fmt: skip
    assert command_panel.build_command("aapo", values) == (
        "set_mitigation", {"mode": "aapo", "delta_low": -0.1, "delta_high": 0.3})  # fmt: skip
    assert command_panel.build_command("none", values) == ("set_mitigation", {"mode": "none"})
    assert command_panel.build_command("temperature", values) == (
        "set_sampling", {"temperature": 1.3})  # fmt: skip
    assert command_panel.build_command("stop", values) == ("stop", {})
    with pytest.raises(ValueError, match="temperature"):
        command_panel.build_command("temperature", {})
    # refused before the confirmation, in words (a temperature of -1 was confirmed, then
    # answered with pydantic's dump; an empty box said nothing)
    for t in (-1, 0, 11, ""):
        with pytest.raises(ValueError, match="temperature"):
            command_panel.build_command("temperature", {"temperature": t})
    with pytest.raises(ValueError, match="alpha must be a number above 0 and at most 100"):
        command_panel.build_command("avspo", {**values, "avspo_alpha": 1000})
    assert "STOP" in command_panel.describe("stop", {})
    assert "to run 'qwen-7b'?" in command_panel.describe("stop", {}, "qwen-7b")  # which run


def test_the_dapo_form_sends_its_batch_budget():
    assert command_panel.build_command("dapo", {"dapo_max_gen_batches": 4.0}) == (
        "set_mitigation", {"mode": "dapo", "max_gen_batches": 4})  # fmt: skip
    assert command_panel.build_command("dapo", {}) == ("set_mitigation", {"mode": "dapo"})
    for bad in (0, 2.5, 101):
        with pytest.raises(ValueError, match="max_gen_batches"):
            command_panel.build_command("dapo", {"dapo_max_gen_batches": bad})
    # the box starts at the trainer config's max_gen_batches, then the newest applied command's
    applied = [{"type": "set_mitigation", "status": "applied",
                "params": {"mode": "dapo", "max_gen_batches": 6}}]  # fmt: skip
    run = {"config": {"max_gen_batches": 5}}
    assert command_panel.current_settings(run, [])["dapo_max_gen_batches"] == 5
    assert command_panel.current_settings(run, applied)["dapo_max_gen_batches"] == 6
    assert "DAPO" in explain.COMMAND_HELP["dapo"]


def test_the_temperature_box_starts_at_the_runs_temperature():
    sampling = {"type": "set_sampling", "params": {"temperature": 0.6}}
    run = {"config": {"temperature": 0.8}}
    newest_first = [{**sampling, "status": "pending", "params": {"temperature": 2.0}},
                    {**sampling, "status": "applied"},
                    {**sampling, "status": "applied", "params": {"temperature": 0.4}}]  # fmt: skip
    assert command_panel.current_temperature(run, newest_first) == 0.6  # newest applied
    assert command_panel.current_temperature(run, newest_first[:1]) == 0.8  # the config's
    assert command_panel.current_temperature({"config": {"temperature": "hot"}}, []) == 1.0
    assert command_panel.current_temperature({"config": None}, []) == 1.0
    # What the trainer reported at a step after the command wins: a relaunch with
    # temperature=0.9 after set_sampling 1.3 was applied at step 68 (the box kept 1.3: a trial)
    applied = [{**sampling, "status": "applied", "acked_step": 68, "params": {"temperature": 1.3}}]
    relaunched = {"step": 70, "scalars": {"temperature": 0.9, "loss": 0.1}}
    assert command_panel.current_temperature(run, applied, relaunched) == 0.9
    assert command_panel.current_temperature(run, applied, {**relaunched, "step": 68}) == 1.3
    assert command_panel.current_temperature(run, [], relaunched) == 0.9
    no_scalar = {"step": 70, "scalars": {"temperature": "NaN"}}
    assert command_panel.current_temperature(run, applied, no_scalar) == 1.3
    assert command_panel.current_settings(run, applied, relaunched)["temperature"] == 0.9


def test_the_command_forms_start_at_the_runs_settings():
    """Not the defaults, which a click would silently send back (found by a fresh-user trial:
    'Enable AAPO' reverted the run's deltas)."""
    run = {"config": {"aapo_delta_low": -0.1, "avspo_alpha": "x", "avspo_threshold": "adaptive"}}
    mit = {"type": "set_mitigation", "status": "applied"}
    newest_first = [
        {**mit, "status": "pending", "params": {"mode": "aapo", "delta_high": 0.9}},
        {**mit, "params": {"mode": "aapo", "delta_high": 0.4}},
        {**mit, "params": {"mode": "avspo", "alpha": 0.7, "delta_high": 0.35}},
    ]
    assert command_panel.current_settings(run, newest_first) == {
        "avspo_threshold": "adaptive",
        "avspo_alpha": 0.7,
        "aapo_delta_low": -0.1,
        "aapo_delta_high": 0.4,  # the newest applied; a pending one is not in effect yet
        "dapo_max_gen_batches": 3,
        "temperature": 1.0,
    }
    defaults = command_panel.current_settings({}, [])
    assert defaults["aapo_delta_low"] == -0.2 and defaults["avspo_threshold"] == "fixed"


def test_a_non_finite_scalar_is_a_gap_named_in_the_title():
    points = [point(0, scalars={"loss": 0.5, "reward_std": 0.1}),
              point(1, scalars={"loss": "NaN", "reward_std": "Infinity"}),
              point(2, scalars={"loss": "-Infinity"})]  # fmt: skip
    fig = figures.scalars_figure(points)
    go.Figure(fig)
    assert fig["data"][0]["y"] == [0.5, None, None]
    # every scalar with non-finite values is named, with its first step and how many steps
    # (only the first step's were: a KL gone Infinity later went unsaid, a trial)
    said = "<br><sup>non-finite: loss NaN at step 1 (2 steps), reward_std Infinity at step 1</sup>"
    assert fig["layout"]["title"]["text"].endswith(said)
    # a scalar's name is text in the title too (`<a href=…>` was a link there)
    evil = point(1, scalars={'<a href="https://evil.example/">l</a>': "NaN"})
    assert figures.non_finite_scalar([evil]).startswith('&lt;a href="https://evil.example/"&gt;')
    later = [point(0, scalars={"loss": "NaN", "kl": 0.1}), point(2, scalars={"kl": "Infinity"})]
    assert figures.non_finite_scalar(later) == "loss NaN at step 0, kl Infinity at step 2"
    many = point(1, scalars={"a": "NaN", "b": "NaN", "c": "Infinity", "e": "NaN", "d": 1.0})
    assert figures.non_finite_scalar([many]) == (
        "a NaN at step 1, b NaN at step 1, c Infinity at step 1 and 1 more"
    )
    go.Figure(figures.reward_figure(points, False))  # reward ± std skips the non-finite std
    assert "non-finite" not in figures.scalars_figure(points[:1])["layout"]["title"]["text"]


def test_the_mitigation_shown_is_what_the_trainer_reports_in_effect():
    from vantage.dashboard import components

    run = {"mitigation_mode": "auto", "mitigation_applied": {"mode": "aapo"}}
    assert (
        components.mitigation_text(run)[0] == "aapo · alerts apply their fix"
    )  # acked, nothing reported
    run["mitigation_reported"] = {"mode": "avspo", "alpha": 0.5}  # a resume went back to it
    text, help_text = components.mitigation_text(run)
    assert text == "avspo (alpha=0.5) · alerts apply their fix"  # with the settings it reports
    assert "last reported: avspo; last acked: aapo" in help_text
    run["mitigation_requested"] = {"mode": "none", "status": "pending"}
    assert (
        components.mitigation_text(run)[0]
        == "avspo (alpha=0.5) → none (pending) · alerts apply their fix"
    )
    # a setting of the trainer's own that is not a number or text reads as JSON, not Python
    reported = {"mode": "clip", "band": {"a": [1, None]}, "on": True}
    run = {"mitigation_mode": "off", "mitigation_reported": reported}
    text = components.mitigation_text(run)[0]
    assert text == 'clip (band={"a": [1, null]}, on=true) · alerts notify only', text
    # the trainer's own names are not checked for bidi controls: shown, not obeyed (a trial)
    run["mitigation_reported"] = {"mode": "a\u202eb", "ev\u202eil": "x\u202ey"}
    text, help_text = components.mitigation_text(run)
    assert text == "a<U+202E>b (ev<U+202E>il=x<U+202E>y) · alerts notify only", text
    assert "\u202e" not in help_text and "a<U+202E>b" in help_text
    fig = figures.scalars_figure([point(1, scalars={"lo\u202ess": 1.0})])
    assert "\u202e" not in json.dumps(fig, ensure_ascii=False)
    assert "lo<U+202E>ss" in fig["layout"]["annotations"][0]["text"]


def test_a_run_without_scalars_gets_a_note_not_four_empty_charts():
    empty = figures.scalars_figure([point(0, scalars={}), point(1, scalars={"reward_std": 1.0})])
    assert empty["data"] == [] and figures.NO_SCALARS_NOTE in empty["layout"]["annotations"]
    full = figures.scalars_figure([point(0, scalars={"loss": 0.3})])
    assert figures.NO_SCALARS_NOTE not in full["layout"].get("annotations", [])
    go.Figure(empty)
    go.Figure(full)


def test_the_scalars_charted_are_those_the_run_logged():
    """The chart had four fixed panels: entropy and temperature empty for a run that never
    logged them, and grad_norm, which it did log, nowhere (a trial)."""
    fig = figures.scalars_figure([point(0, scalars={"loss": 1.0, "kl": 0.1, "grad_norm": 2.0})])
    assert [t["name"] for t in fig["data"]] == ["loss", "KL", "grad_norm"]
    assert [a["text"] for a in fig["layout"]["annotations"]] == ["loss", "KL", "grad_norm"]
    many = {name: 1.0 for name in ("zeta", "loss", "alpha", "entropy", "beta", "reward_std")}
    fig = figures.scalars_figure([point(0, scalars=many)])
    assert [t["name"] for t in fig["data"]] == ["loss", "entropy", "alpha", "beta"]
    assert fig["layout"]["title"]["text"].endswith(
        "<sup>4 of 5 shown: pick others above (all in the CSV export)</sup>"
    )
    many["loss"] = "NaN"  # both notes, on the title's second line
    title = figures.scalars_figure([point(3, scalars=many)])["layout"]["title"]["text"]
    assert title.endswith(
        "<sup>non-finite: loss NaN at step 3 · 4 of 5 shown: pick others above "
        "(all in the CSV export)</sup>"
    )
    go.Figure(fig)
    plain = figures.reward_figure([point(0, scalars={"loss": 1.0})])
    band = plain["data"][figures.REWARD_BAND]
    assert band["name"] == "reward ± std" and band["showlegend"] is False
    # nor does the title promise a band it cannot draw (a trial)
    assert plain["layout"]["title"]["text"].startswith("Reward mean: watch")
    banded = figures.reward_figure([point(0, reward_mean=0.5, scalars={"reward_std": 0.1})])
    assert banded["layout"]["title"]["text"].startswith("Reward mean ± std: watch")


def test_the_reward_band_narrows_where_no_std_was_logged():
    """A step without reward_std was a null in both edges, filled to each other: a triangle
    across the chart (a trial). The band narrows to the mean there and keeps its shape."""
    points = [point(s, reward_mean=0.625, scalars={"reward_std": 0.1}) for s in range(6)]
    points[2]["scalars"] = {"loss": 1.0}
    low, high, mean = figures.reward_figure(points, False)["data"]
    assert low["y"] == pytest.approx([0.525, 0.525, 0.625, 0.525, 0.525, 0.525])
    assert high["y"] == pytest.approx([0.725, 0.725, 0.625, 0.725, 0.725, 0.725])
    assert low["connectgaps"] and high["connectgaps"]


def test_logged_names_are_text_in_charts():
    """A scalar named `<a href=…>` was a clickable link in the scalars chart, an alert rule's
    name HTML in the mitigation label (a trial)."""
    evil = '<a href="https://evil.example/">loss</a> %{y}'
    fig = figures.scalars_figure([point(0, scalars={evil: 1.0})])
    assert fig["data"][0]["name"] == '&lt;a href="https://evil.example/"&gt;loss&lt;/a&gt; &#37;{y}'
    assert "<a" not in json.dumps(fig)
    item = {"step": 1, "type": "set_mitigation", "params": {"mode": "avspo"}}
    timeline = [{**item, "status": "applied", "issued_by": "alert:<b>x</b>", "command_id": "c"}]
    (band,) = run_shapes.mitigation_bands(timeline, 5)
    assert "alert:&lt;b&gt;x&lt;/b&gt;" in band["label"]["text"]
    alert = {"alert_id": "a", "rule": '<a href="https://evil.example/">r</a>', "state": "firing",
             "severity": "<i>page</i>", "fired_step": 1, "value": 0.5}  # fmt: skip
    (text,) = figures.alert_markers([alert], [point(1)])[2]
    assert "<a" not in text and "<i>" not in text and "&lt;i&gt;page&lt;/i&gt;" in text


@pytest.mark.parametrize(
    ("value", "digits", "shown"),
    [(0.625, 2, "0.63"), (-0.625, 2, "-0.63"), (0.615, 2, "0.61"), (1.005, 2, "1.00"),
     (0.1234, 3, "0.123"), (None, 2, "—"), (12345, 2, "12,345"), (float("inf"), 2, "inf"),
     # steps a minute of steps that jumped to 2**62: 19 digits ran off the card (a trial)
     (3.873e18, 1, "3.87e+18"), (2221330.5, 1, "2.22e+06"), (999999.25, 1, "999999.3")],
)  # fmt: skip
def test_a_card_rounds_as_the_chart_hover_does(value, digits, shown):
    """ACR 0.625 was 0.62 on its card and 0.63 under the cursor: a card rounds a tie of the
    float's exact value up, as JavaScript's toFixed (d3-format) does."""
    assert explain.fmt(value, digits) == shown


def test_mitigation_labels_of_narrow_bands_do_not_pile_up():
    """A run that switched mitigation every few steps had its long labels drawn over each
    other: a narrow band names its mode or nothing, the latest at least its mode."""
    item = {"type": "set_mitigation", "status": "applied", "command_id": "c0ffee12"}
    modes = ["avspo", "none"] * 10 + ["aapo"]
    timeline = [{**item, "step": 2 * i, "params": {"mode": m}} for i, m in enumerate(modes)]
    timeline.append({**item, "step": 0, "params": {"mode": "avspo"}, "status": "rejected"})
    bands = run_shapes.mitigation_bands(timeline, last_step=100)
    labels = [b["label"]["text"] for b in bands]
    assert labels[:-1] == [""] * 10 and labels[-1] == "AAPO · applied · cmd c0ffee12 by ?"
    # acked at the last step: the latest band begins at the next one, and names its mode
    young = run_shapes.mitigation_bands(timeline, last_step=40)
    assert (young[-1]["x0"], young[-1]["x1"], young[-1]["label"]["text"]) == (41, 41, "AAPO")
    # a band of a twentieth of the run names its mode
    wide = run_shapes.mitigation_bands(timeline[:4], last_step=40)
    assert [(b["x0"], b["x1"], b["label"]["text"]) for b in wide] == [
        (1, 3, "AVSPO"),
        (5, 7, "AVSPO"),
    ]


def test_the_evaluation_figure_draws_acr_by_side_and_reward():
    points = [point(s, acr=0.5, acr_all_pass=0.3, acr_all_fail=0.2, reward_mean=0.4)
              for s in range(3)]  # fmt: skip
    fig = figures.eval_figure(points, "<b>eval</b>")
    go.Figure(fig)
    names = [t["name"] for t in fig["data"]]
    assert names == ["all-fail share", "all-pass share", "ACR", "reward mean"]
    assert [t["yaxis"] for t in fig["data"]] == ["y", "y", "y", "y2"]
    assert fig["data"][2]["y"] == [0.5, 0.5, 0.5] and "&lt;b&gt;" in fig["layout"]["title"]["text"]


def test_a_scalar_logged_once_is_drawn_as_a_dot():
    """A line of one point draws nothing: a loss logged at one step left its chart empty."""
    points = [point(1, scalars={"kl": 0.1}), point(2, scalars={"loss": 0.5, "kl": 0.2})]
    fig = figures.scalars_figure(points)
    modes = {t["name"]: t["mode"] for t in fig["data"]}
    assert modes["loss"] == "lines+markers" and modes["KL"] == "lines", modes


def test_held_out_accuracy_is_charted_first_and_its_sparse_points_drawn():
    """The trainer's `eval_accuracy` (every few steps) came fifth among a run's scalars, so it
    was never charted, and its points, each between steps without one, drew no line at all
    (a trial): it is charted first, and a series with isolated points gets markers."""
    points = [
        point(s, scalars={"loss": 0.5, "kl": 0.1, "entropy": 1.0, "temperature": 1.0,
                          **({"eval_accuracy": s / 40} if s % 10 == 0 else {})})
        for s in range(31)
    ]  # fmt: skip
    fig = figures.scalars_figure(points)
    names = [t["name"] for t in fig["data"]]
    assert names == ["eval accuracy", "loss", "KL", "entropy"], names
    accuracy = fig["data"][0]
    assert accuracy["mode"] == "lines+markers", accuracy["mode"]
    assert [y for y in accuracy["y"] if y is not None] == [0.0, 0.25, 0.5, 0.75]
    assert fig["data"][1]["mode"] == "lines"  # a dense series stays a plain line
    go.Figure(fig)


def test_alert_chips_of_rules_of_one_name_say_their_scope():
    """A project's own `acr_stall` firing beside the global one showed "acr_stall acr_stall"
    (a trial): chips of one name say whose rule they are; a lone chip stays short."""
    from vantage.dashboard import components

    alerts = [
        {"rule": "acr_stall", "rule_project": None, "rule_run_id": None, "value": 0.5},
        {"rule": "acr_stall", "rule_project": "projA", "rule_run_id": None, "value": 0.5},
        {"rule": "mine", "rule_project": None, "rule_run_id": "r1", "value": 0.5},
    ]
    chips = components.alert_chips(alerts)
    assert [c.children for c in chips] == [
        "acr_stall (every run)",
        "acr_stall (project projA)",
        "mine",
    ]
    assert chips[2].title.endswith("the rule of this run")


def test_bidirectional_controls_in_prompt_ids_are_shown_not_obeyed():
    """A prompt id holding U+202E (RIGHT-TO-LEFT OVERRIDE) was drawn backwards in the prompts
    table (a trial): the table shows the control as a code point instead."""
    assert explain.visible("🚀 \u202e rtl") == "🚀 <U+202E> rtl"
    assert explain.visible("plain-id") == "plain-id"


def test_the_acr_chart_marks_where_a_resumed_attempt_took_over():
    """A resumed run's page said "attempt 2" in its header only (a trial): a dashed line
    labelled with the attempt marks its first step; a run of one attempt has none."""
    pts = [point(s, attempt=1 if s < 3 else 2) for s in range(5)]
    shapes = figures.acr_figure(pts)["layout"]["shapes"]
    lines = [s for s in shapes if s.get("label", {}).get("text", "").startswith("attempt")]
    assert [(s["x0"], s["label"]["text"]) for s in lines] == [(3, "attempt 2")]
    one = figures.acr_figure([point(s, attempt=1) for s in range(5)])["layout"]["shapes"]
    assert not [s for s in one if "attempt" in s.get("label", {}).get("text", "")]
    go.Figure(figures.acr_figure(pts))


def test_the_primer_names_the_colours_the_charts_use():
    """The "New here?" primer named green, red and a blue expected ACR, and told to watch an
    orange effective ACR, while the charts drew light blue, orange, green and pink (a trial):
    the primer's colour names must be those of the palette."""
    from vantage.dashboard.explain import PRIMER

    text = " ".join(answer for _, answer in PRIMER)
    named = {  # palette entry -> the name the primer gives its colour
        "all_pass": ("rgba(86, 180, 233, 0.40)", "light blue groups were all right"),
        "all_fail": ("rgba(213, 94, 0, 0.30)", "orange all wrong"),
        "expected_acr": ("#009e73", "dotted green line"),
        "acr_effective": ("#cc79a7", "pink line is the effective ACR"),
    }
    for series, (colour, words) in named.items():
        assert dashboard_figures.COLORS[series] == colour, series
        assert words in text, words
    assert "effective ACR (pink) fall" in text


def test_a_reported_mode_is_shown_as_text():
    """A mode the trainer reports is any name (a mitigation of its own): the bands and the
    legend show it as text, not as Plotly's HTML."""
    item = {"type": "set_mitigation", "status": "applied", "issued_by": "trainer"}
    timeline = [{**item, "step": 5, "params": {"mode": "<b>x</b>"}}]
    [band] = run_shapes.mitigation_bands(timeline, last_step=10)
    assert band["label"]["text"] == "&lt;B&gt;X&lt;/B&gt; · reported by the trainer"
    run = {"run_id": "r", "name": "n", "mitigation_reported": {"mode": "<b>x</b>"}}
    fig = compare_figures.compare_figure([run], {"r": [point(0), point(1)]}, {"r": timeline})
    assert fig["data"][0]["name"] == "n (&lt;b&gt;x&lt;/b&gt;)"


def test_compared_runs_are_read_at_the_last_step_they_all_reached():
    """The compare table set latest values side by side from steps 80 and 193, and never showed
    the held-out accuracy the trainer logs (a trial)."""
    short = [point(s, 0.5, reward_mean=0.1 * s) for s in range(0, 81, 10)]
    short[-1]["scalars"] = {"eval_accuracy": 0.88}
    long = [point(s, 0.9, acr_effective=0.0, reward_mean=0.2) for s in range(0, 194, 7)]
    long[11]["scalars"] = {"eval_accuracy": 0.86}  # step 77
    long[12]["scalars"] = {"eval_accuracy": "NaN"}  # step 84: not a number, and past step 80
    common, at = compare_table.at_common_step({"short": short, "long": long})
    assert common == 80
    assert at["short"] == {"acr": 0.5, "acr_effective": None, "reward_mean": 8.0,
                           "eval_accuracy": 0.88, "eval_accuracy_step": 80}  # fmt: skip
    # step 77's point: the newest by step 80; the accuracy's own step is said in its cell
    # (the column said "at step 80" of an accuracy measured at 77, a trial)
    assert at["long"] == {"acr": 0.9, "acr_effective": 0.0, "reward_mean": 0.2,
                          "eval_accuracy": 0.86, "eval_accuracy_step": 77}  # fmt: skip
    assert compare_table.common_cell(at["long"], "eval_accuracy", common) == "0.86 (step 77)"
    assert compare_table.common_cell(at["short"], "eval_accuracy", common) == "0.88"
    assert compare_table.common_cell(at["long"], "acr", common) == "0.90"
    common, at = compare_table.at_common_step({"short": short, "empty": []})  # blanked every run
    assert common == 80 and at["short"]["eval_accuracy"] == 0.88
    assert set(at["empty"].values()) == {None}
    assert compare_table.at_common_step({"empty": []}) == (None, {})


def test_the_compare_chart_without_runs_is_a_note_not_empty_axes():
    fig = compare_figures.no_runs_figure()
    go.Figure(fig)  # valid for Plotly
    assert fig["data"] == [] and not fig["layout"]["xaxis"]["visible"]
    assert fig["layout"]["annotations"][0]["text"] == "Choose runs above to compare them"


def test_a_run_with_no_acr_at_all_gets_no_green_cards():
    """All-NaN rewards (every group invalid) showed "0 steps above 0.35" and "0 wasted" in
    green, as if the run were healthy (a trial)."""
    tail = [point(s, None, n_valid=0, wasted_rollouts=0) for s in range(3)]
    state = kpis.initial_state({}, tail, False, 1)
    cards = {c["id"]: c for c in kpis.cards(state, {"group_size": 8, "status": "running"})}
    assert {cards[k]["level"] for k in ("acr", "acr_ema", "acr_streak", "wasted")} == {"none"}
    # without a group size the card fell back to "0.0/step" wasted
    cards = {c["id"]: c for c in kpis.cards(state, {"status": "running"})}
    assert cards["wasted"]["value"] == "—"
    # an alert at a step with no ACR sits at the top, and its hover says why (it read as 1)
    alert = {"rule": "non_finite_rewards", "fired_step": 1, "state": "firing", "value": 8}
    _xs, ys, (text,) = figures.alert_markers([alert], tail)
    assert ys == [1.0] and text.endswith("(no ACR at this step: drawn at the top)")


def test_a_mode_set_again_is_no_change():
    """Enable AVSPO sent twice (acked at steps 22 and 24) drew the band and the legend from
    step 24 (a trial)."""
    item = {"type": "set_mitigation", "status": "applied", "params": {"mode": "avspo"}}
    timeline = [{**item, "step": 22, "command_id": "a"}, {**item, "step": 24, "command_id": "b"}]
    assert [
        (s, c["command_id"]) for s, _m, c in dashboard_figures.mitigation_changes(timeline)
    ] == [(23, "a")]
    [band] = run_shapes.mitigation_bands(timeline, last_step=40)
    assert band["x0"] == 23 and band["x1"] == 40


def test_a_compare_link_takes_the_short_id_the_pages_show():
    """The runs list and compare legend show a run id's first 8 characters; a link naming a run
    by them was refused as "not found"."""
    visible = ["3f2a9c1e-aaaa", "3f2a9c1e-bbbb", "7d41e0b2-cccc", "short"]
    chosen, missing, ambiguous = components.resolve_run_ids(
        ["7d41e0b2", "short", "7d41e0b2-cccc", "3f2a9c1e", "3f2a", "gone-run-id"], visible
    )
    assert chosen == ["7d41e0b2-cccc", "short"]  # each once, in the link's order
    # one shorter than the short id and an unknown id are not found; a prefix two runs share
    # is said to be ambiguous (it was "not found", a trial)
    assert missing == ["3f2a", "gone-run-id"]
    assert ambiguous == ["3f2a9c1e"]


def test_a_repeated_address_parameter_is_read_as_one():
    """`?order=a&order=b` reached the page as a list and answered 500 (a trial): a repeated
    filter counts once, its last value; a repeated `runs` list adds up."""
    assert url_state.one(["acr", "newest"]) == "newest" and url_state.one("acr") == "acr"
    assert url_state.one([]) is None and url_state.one(None) is None
    assert url_state.joined(["a,b", "c"]) == "a,b,c" and url_state.joined("a") == "a"
    assert url_state.joined(None) is None


def test_the_reward_band_stays_within_the_runs_reward_bounds():
    """A 0/1 reward at mean 0.9 ± 0.3 drew its band up to 1.2, a reward no completion can get
    (a trial): the band's edges stop at the run's reward_min and reward_max, the first draw
    and the live updates alike."""
    points = [point(0, reward_mean=0.9, scalars={"reward_std": 0.3}),
              point(1, reward_mean=0.1, scalars={"reward_std": 0.3})]  # fmt: skip
    run = {"reward_min": 0.0, "reward_max": 1.0}
    fig = figures.reward_figure(points, bounds=run_series.run_bounds(run))
    low, high, mean = (t["y"] for t in fig["data"])
    assert high == [1.0, 0.4] and low == [pytest.approx(0.6), 0.0] and mean == [0.9, 0.1]
    unbounded = figures.reward_figure(points)  # no bounds: mean ± std as it is
    assert unbounded["data"][1]["y"][0] == 1.2
    patch = Patch()
    run_series.extend_patch(patch, points[:1], run_series.reward_series(run_series.run_bounds(run)))
    assert "1.0" in json.dumps(patch.to_plotly_json()) and "1.2" not in json.dumps(
        patch.to_plotly_json()
    )


def test_steps_per_minute_needs_a_second_of_steps():
    """A loop that sent its steps in one batch, a few microseconds apart, showed 458,060 steps
    per minute (a trial): under a second of steps is too short to tell a speed."""
    assert kpis.steps_per_minute([[0, 100.0], [24, 100.0003]]) is None
    assert kpis.steps_per_minute([[0, 100.0], [24, 100.9]]) is None
    assert kpis.steps_per_minute([[0, 100.0], [24, 148.0]]) == 30.0
    assert kpis.steps_per_minute([[0, 100.0]]) is None


def test_an_id_from_the_address_is_shown_with_its_controls_escaped():
    """`/dashboard/runs/%E2%80%AEdetaerc-si-nur` showed "run-is-created" on the page: a link
    could put words there (a trial)."""
    assert components.shown_id("\u202edetaerc-si-nur") == "\\u202edetaerc-si-nur"
    assert components.shown_id("a\nb") == "a\\nb"
    assert components.shown_id("plain-id") == "plain-id"
    assert components.shown_id("x" * 50) == "x" * 40 + "…"


def test_a_command_acked_past_the_last_step_is_not_marked_yet():
    """An ack at step 1,000,000 of an 11-step run stretched the ACR chart's axis until the
    run's steps could not be seen (a trial): a mark waits until the steps reach it."""
    timeline = [
        {"type": "set_sampling", "status": "applied", "step": 1_000_000,
         "params": {"temperature": 3.0}},
        {"type": "checkpoint", "status": "applied", "step": 5, "params": {}},
    ]  # fmt: skip
    fig = figures.acr_figure([point(s) for s in range(12)], timeline)
    marks = [s for s in fig["layout"]["shapes"] if s.get("name") == "command"]
    assert [(m["x0"], m["label"]["text"]) for m in marks] == [(5, "checkpoint")]
    later = run_shapes.command_marks(timeline, last_step=1_000_000)
    assert [m["label"]["text"] for m in later] == ["temperature 3", "checkpoint"]


def test_the_latest_acr_card_keeps_the_acr_of_the_newest_step_that_has_one():
    """A step of scalars only (acr null) after step 10's 0.5: the card shows 0.50 at step 10,
    as the API's latest_acr and latest_acr_step do, on the first load and on a live update."""
    scalars_only = point(11, None, reward_mean=None)
    first = kpis.initial_state({}, [point(9, 0.25), point(10, 0.5), scalars_only], False, 1)
    card = {c["id"]: c for c in kpis.cards(first, {"group_size": 8})}["acr"]
    assert (card["value"], card["sub"]) == ("0.50", "step 10")
    live = kpis.advance(kpis.initial_state({}, [point(10, 0.5)], False, 1), [scalars_only])
    card = {c["id"]: c for c in kpis.cards(live, {"group_size": 8})}["acr"]
    assert (card["value"], card["sub"]) == ("0.50", "step 10")
    newer = kpis.advance(live, [point(12, 0.75), point(13, None)])
    card = {c["id"]: c for c in kpis.cards(newer, {"group_size": 8})}["acr"]
    assert (card["value"], card["sub"]) == ("0.75", "step 12")
    # no ACR at any step (every group invalid): the newest step, with no value
    none = kpis.initial_state({}, [point(1, None), point(2, None)], False, 1)
    card = {c["id"]: c for c in kpis.cards(none, {"group_size": 8})}["acr"]
    assert (card["value"], card["sub"]) == ("—", "step 2")


def test_short_runs_get_a_tick_per_step_and_band_labels_clear_the_plot():
    """A 3-step run's axis read 0, 0.5, 1, 1.5 (steps are whole numbers), and the AVSPO band's
    label lay over its start line and the alert triangles (issue 42)."""
    short = [point(s, 0.5) for s in range(3)]
    assert figures.acr_figure(short)["layout"]["xaxis"]["dtick"] == 1
    assert figures.reward_figure(short)["layout"]["xaxis"]["dtick"] == 1
    long = [point(s, 0.5) for s in range(40)]
    assert figures.acr_figure(long)["layout"]["xaxis"]["dtick"] is None
    timeline = [{"type": "set_mitigation", "params": {"mode": "avspo"}, "status": "applied",
                 "step": 5, "command_id": "c1", "issued_by": "alert:acr_stall"}]  # fmt: skip
    [band] = run_shapes.mitigation_bands(timeline, 40)
    assert band["label"]["yanchor"] == "bottom"  # above the plotting area


def test_the_runs_table_as_html_escapes_every_text():
    """The runs table goes to the browser as one HTML text (`html_text`): a run's name, tags and
    project stay text, and its sparkline is drawn inline (Markdown dropped a data: image, and
    the whole table with it)."""
    from vantage.dashboard.html_text import to_html
    from vantage.dashboard.pages.runs.table import runs_table

    run = {"run_id": 'r"1', "name": "<script>x</script>", "status": "running", "tags": ["a&b"],
           "health": "healthy", "health_reason": "fine", "spark": [0.1, 0.5]}  # fmt: skip
    text = to_html(runs_table([run]))
    assert "<script>" not in text and "&lt;script&gt;x&lt;/script&gt;" in text
    assert 'data-run-id="r&quot;1"' in text and "a&amp;b" in text and "\n" not in text
    assert "<svg" in text and "<img" not in text
