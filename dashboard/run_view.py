"""What the run page's data callback returns, on first load and on each live update.

Kept out of the page module so that the benchmark and the tests call exactly what the callback
runs, without a browser: ``first_load`` builds every figure; ``live_update`` reads only the steps
after the last one shown and returns ``Patch`` objects that append them.
"""

from __future__ import annotations

import json
from typing import Any

from dash import Patch, html, no_update

from . import components, data, explain, figures, kpis

APPEND_LIMIT = 5000

# Output order of the run page's data callback (pages/run.py).
OUTPUTS = (
    "header",
    "banner",
    "kpis",
    "state",
    "acr_figure",
    "reward_figure",
    "scalars_figure",
    "config",
    "interval_disabled",
)


def header(run: dict) -> list:
    """The run's title, status, identity, mitigation and notes."""
    tags = ", ".join(run.get("tags") or [])
    bits = [
        f"project {run.get('project') or '—'}",
        f"attempt {run.get('attempt')}",
        f"id {run['run_id']}",
    ]
    if tags:
        bits.append(f"tags {tags}")
    mit, mit_help = components.mitigation_text(run)
    out = [
        html.H2([run.get("name") or run["run_id"], " ", components.status_badge(run["status"])]),
        html.Div(" · ".join(bits), className="muted"),
        html.Div(["Mitigation: ", html.Span(mit, title=mit_help, id="run-mitigation")]),
    ]
    if run.get("notes"):  # set with PATCH /api/v1/runs/{id}; shown as typed (text, not markup)
        out.append(html.Div(run["notes"], id="run-notes", className="run-notes"))
    return out


def suggestions(run: dict, alerts: list[dict], state: dict) -> list[dict]:
    """Mitigations to offer for one click: those the server offers with firing alerts (a rule's
    command on a run in 'suggest' mode that does not already ask for it), else AVSPO when the
    run looks stalled (ACR above 0.35 for more than 50 steps), runs and has requested no
    mitigation and its mode is not 'off'. None once the run has finished or failed."""
    if components.run_ended(run):  # no trainer reads commands any more
        return []
    requested = run.get("mitigation_requested") or {}
    requested_mode = requested.get("mode") if isinstance(requested, dict) else requested
    out = [
        {
            "type": mit["type"],
            "params": mit.get("params") or {},
            "alert_id": a.get("alert_id"),
            "why": f"alert {a.get('rule')} is firing (value {explain.fmt(a.get('value'))})",
        }
        for a in alerts
        if a.get("state") == "firing"
        and isinstance(mit := a.get("mitigation"), dict)
        and mit.get("type")
    ]
    avspo = {"mode": "avspo", "threshold": "fixed", "alpha": 0.5}
    # not while a mitigation runs: AVSPO leaves the raw ACR high, and a run started with it
    # from its config (reported, never requested) was offered AVSPO again
    idle = requested_mode in (None, "none") and components.current_mitigation(run) == "none"
    stalled = (state.get("streak") or 0) > 50 and idle
    if not out and stalled and run.get("mitigation_mode") != "off":
        out.append(
            {
                "type": "set_mitigation",
                "params": avspo,
                "alert_id": None,
                "why": f"ACR has been above 0.35 for {state['streak']} steps",
            }
        )
    return out


def banner_key(run: dict, alerts: list[dict], offers: list[dict]) -> str:
    """What the banner shows, in short: its firing alerts and its offers (`suggestions`)."""
    firing = sorted(str(a.get("alert_id")) for a in alerts if a.get("state") == "firing")
    said = [(s["type"], s["params"], s.get("alert_id")) for s in offers]
    return json.dumps([firing, said, components.run_ended(run)], default=str)


def _mitigated_note(run: dict) -> str:
    """For the alerts banner of a run with a mitigation on: the built-in rules read the raw ACR,
    which a mitigation leaves as it is (a stall alert on a run AVSPO brought to an effective 0
    read as the run failing: a trial)."""
    mode = components.current_mitigation(run)
    if mode == "none":
        return ""
    return (
        f" {mode.upper()} is on: it leaves the raw ACR that rules read as it is and gives "
        "collapsed groups a gradient, so judge it by the effective ACR line."
    )


def banner(
    run: dict, alerts: list[dict], state: dict, can_control: bool, offers: list[dict] | None = None
) -> list:
    """The run's banner: its firing alerts, then its offers (``offers``: `suggestions` of the
    run, computed here when not given)."""
    offers = suggestions(run, alerts, state) if offers is None else offers
    firing = [a for a in alerts if a.get("state") == "firing"]
    ended = components.run_ended(run)
    parts: list[Any] = []
    if firing:
        parts.append(
            html.Div(
                [
                    html.B(f"Alerts firing{' when the run ended' if ended else ''}: "),
                    *components.alert_chips(firing, ended),
                    html.Span(
                        " Red triangles on the ACR chart mark where alerts fired."
                        + _mitigated_note(run),
                        className="muted",
                    ),
                ],
                className="banner banner-info" if ended else "banner banner-alert",
                id="run-alerts",
            )
        )
    for s in offers:
        params = s["params"] or {}
        mode = params.get("mode", s["type"])
        # what it would do: the mode, or the command and its values (set_sampling temperature=1.3)
        what = mode.upper()
        if "mode" not in params:
            what = " ".join([s["type"], *explain.settings_text(params)])
        said = f"{s['type']} {what}" if "mode" in params else what
        extra = explain.settings_text(params, skip=("mode",))
        if "mode" in params and extra:  # the values the rule set (they were not said)
            said += f" ({', '.join(extra)})"
        parts.append(
            html.Div(
                [
                    html.B("Suggested: "),
                    f"{said} because {s['why']}. ",
                    explain.COMMAND_HELP.get(mode, ""),
                    html.Button(
                        f"Apply {what}",
                        # The command rides in the id, so the click callback needs no lookup.
                        id={
                            "type": "suggest",
                            "command": json.dumps(
                                {
                                    "type": s["type"],
                                    "params": s["params"],
                                    "alert_id": s["alert_id"],
                                }
                            ),
                        },
                        className="action",
                        disabled=not can_control,
                        title="" if can_control else "needs a key with the control scope",
                    ),
                ],
                className="banner banner-info",
            )
        )
    return parts


def config_view(run: dict) -> html.Pre:
    fields = (
        "reward_min",
        "reward_max",
        "group_size",
        "trainer_eps",
        "world_size",
        "heartbeat_s",
        "attempt",
        "created_at",
        "last_seen_at",
    )
    shown = {"run": {k: run.get(k) for k in fields}, "config": run.get("config") or {}}
    return html.Pre(json.dumps(shown, indent=2, default=str), className="config")


def first_load(info, run_id: str, can_control: bool = False) -> tuple | None:
    """Every output of the data callback for a fresh page; None if the run is not visible."""
    snap = data.run_snapshot(info, run_id)
    if snap is None:
        return None
    run, metrics, summary = snap["run"], snap["metrics"], snap["summary"]
    points, alerts = metrics["points"], snap["alerts"]
    downsampled = metrics["downsampled"]
    tail = snap["tail"]
    # `tail` is every step when not downsampled, else the newest ones (for the KPI state).
    state = kpis.initial_state(summary.get("window") or {}, tail, downsampled, run.get("attempt"))
    state["last_step"] = points[-1]["step"] if points else None
    state["can_control"] = can_control
    state["timeline"] = summary.get("mitigation_timeline") or []
    state["reported"] = snap["reported"]  # the live updates add the new steps' changes
    state["attempt_starts"] = figures.attempt_starts(points)  # a new attempt reloads the page
    state["non_finite"] = figures.non_finite_scalar(points)
    state["scalars"] = figures.scalar_names(points)[: figures.MAX_SCALAR_CHARTS]  # charted
    state["shown"] = figures.scalars_shown(points)
    state["last_scalars"] = _scalars_at(points[-1] if points else None)
    offers = suggestions(run, alerts, state)
    state["banner_key"] = banner_key(run, alerts, offers)
    state["reward_std"] = figures.has_reward_std(points)
    state["marked"] = [a.get("alert_id") for a in figures.fired(alerts)]
    return (
        components.plain(header(run)),
        components.plain(banner(run, alerts, state, can_control, offers)),
        components.plain(components.kpi_cards(kpis.cards(state, run))),
        state,
        figures.acr_figure(points, state["timeline"], alerts, downsampled),
        figures.reward_figure(points, downsampled, figures.run_bounds(run)),
        figures.scalars_figure(points),
        components.plain(config_view(run)),
        components.run_ended(run),
    )


def _new_scalar_chart(state: dict, points: list[dict]) -> bool:
    """Whether ``points`` bring a scalar that gets a chart of its own (the first scalars of a
    run, say): the scalars figure is then drawn again."""
    charted = state.get("scalars") or []
    if len(charted) >= figures.MAX_SCALAR_CHARTS:
        return False
    return bool(set(figures.scalar_names(points)) - set(charted))


def _scalars_at(point: dict | None) -> list[str]:
    """The names of the scalars ``point`` has a value for."""
    return sorted(n for n, v in ((point or {}).get("scalars") or {}).items() if v is not None)


def _late_scalars(state: dict, again: dict | None) -> set[str]:
    """The scalars of the last drawn step (``again``, read again) that came after it was drawn:
    the bundled trainer logs the held-out accuracy after the step's groups, and the eval chart
    showed no point for it until a reload (a trial)."""
    return set(_scalars_at(again)) - set(state.get("last_scalars") or []) if again else set()


def _append_late(patch: Patch, state: dict, again: dict, late: set[str]) -> None:
    """Append the ``late`` scalars of step ``again`` to their charts' traces in ``patch``."""
    for i, series in enumerate(figures.scalar_series(state.get("scalars") or [])):
        if series.key in late:
            patch["data"][i]["x"].append(again["step"])
            patch["data"][i]["y"].append(series.value(again))


def live_update(info, run_id: str, state: dict) -> tuple | None:
    """Outputs for one tick: Patches appending the new steps, or no_update where nothing
    changed; a full reload when a new attempt rewrote steps already shown."""
    update = data.run_since(info, run_id, state.get("last_step"), state.get("reported"))
    if update is None:
        return None
    run, points, again = update["run"], update["points"], update.get("again")
    late = _late_scalars(state, again)
    scalars = Patch()
    if late:
        _append_late(scalars, state, again, late)
        state = {**state, "last_scalars": _scalars_at(again)}
    new_attempt = run.get("attempt") != state.get("attempt") and state.get("attempt") is not None
    # A page left open for days would grow its figures without bound: past APPEND_LIMIT appended
    # steps, reload them downsampled.
    too_long = state.get("appended", 0) + len(points) > APPEND_LIMIT
    first_steps = bool(points) and state.get("last_step") is None  # the "no steps" note goes
    new_chart = _new_scalar_chart(state, [again, *points] if late else points)
    if new_attempt or too_long or first_steps or new_chart:
        return first_load(info, run_id, state.get("can_control", False))
    finished = components.run_ended(run)
    alerts = update["alerts"] or []
    if not points:
        # Nothing new: keep the figures, refresh the header (status may turn stale) and the
        # banner when its alerts or offers changed (an offer taken, an alert of the periodic
        # pass), not at every tick, which would replace a button under the user's click.
        offers = suggestions(run, alerts, state)
        key = banner_key(run, alerts, offers)
        late_figure = scalars if late else no_update
        if key == state.get("banner_key"):
            return (header(run), no_update, no_update, state if late else no_update, no_update,
                    no_update, late_figure, no_update, finished)  # fmt: skip
        can_control = state.get("can_control", False)
        return (header(run), banner(run, alerts, state, can_control, offers), no_update,
                {**state, "banner_key": key}, no_update, no_update, late_figure, no_update,
                finished)  # fmt: skip
    new_state = kpis.advance(state, points)
    new_state["appended"] = state.get("appended", 0) + len(points)
    new_state["last_scalars"] = _scalars_at(points[-1])
    acr, reward = Patch(), Patch()
    figures.extend_patch(acr, points, figures.ACR_SERIES)
    figures.extend_patch(reward, points, figures.reward_series(figures.run_bounds(run)))
    figures.extend_patch(scalars, points, figures.scalar_series(state.get("scalars") or []))
    if not state.get("reward_std") and figures.has_reward_std(points):  # the band shows now
        reward["data"][figures.REWARD_BAND]["showlegend"] = True
        new_state["reward_std"] = True
    if not state.get("non_finite") and (
        note := figures.non_finite_scalar([again, *points] if late else points)
    ):
        scalars["layout"]["title"]["text"] = figures.scalars_title(note, state.get("shown"))
        new_state["non_finite"] = note
    timeline = update["timeline"] or []
    # Markers for alerts that fired since the last tick (the trace after the series); a pending
    # alert gets its marker once it fires.
    marked = set(state.get("marked") or [])
    fresh = [a for a in figures.fired(alerts) if a.get("alert_id") not in marked]
    new_state["marked"] = [*marked, *(a.get("alert_id") for a in fresh)]
    ax, ay, at = figures.alert_markers(fresh, points)
    if ax:
        marker_trace = len(figures.ACR_SERIES)
        acr["data"][marker_trace]["x"].extend(ax)
        acr["data"][marker_trace]["y"].extend(ay)
        acr["data"][marker_trace]["text"].extend(at)
    # Mitigation bands are a handful of shapes: replace them (they stretch to the last step).
    acr["layout"]["shapes"] = [
        figures.threshold_line(),
        *figures.attempt_lines(state.get("attempt_starts") or []),
        *figures.mitigation_shapes(timeline, new_state["last_step"]),
    ]
    new_state["timeline"] = timeline
    new_state["reported"] = update["reported"]
    offers = suggestions(run, alerts, new_state)
    new_state["banner_key"] = banner_key(run, alerts, offers)
    return (
        header(run),
        banner(run, alerts, new_state, state.get("can_control", False), offers),
        components.kpi_cards(kpis.cards(new_state, run)),
        new_state,
        acr,
        reward,
        scalars,
        no_update,
        finished,
    )
