"""What the run page's data callback returns, on first load and on each live update.

Kept out of the page module so that the benchmark and the tests call exactly what the callback
runs, without a browser: ``first_load`` builds every figure; ``live_update`` reads only the steps
after the last one shown and returns ``Patch`` objects that append them.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from dash import Patch, html, no_update
from vantage.dashboard import components, data

from . import figures, kpis, series, shapes
from .banner import banner, banner_key, header, suggestions

APPEND_LIMIT = 5000


class RunOutputs(NamedTuple):
    """The outputs of the run page's data callback, in the order of its ``Output``s: each a
    value, a ``Patch`` that appends to it, or (the default) ``no_update``."""

    header: Any = no_update
    banner: Any = no_update
    kpis: Any = no_update
    state: Any = no_update
    acr_figure: Any = no_update
    reward_figure: Any = no_update
    scalars_figure: Any = no_update
    config: Any = no_update
    interval_disabled: Any = no_update


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


def first_load(info, run_id: str, can_control: bool = False) -> RunOutputs | None:
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
    state["attempt_starts"] = shapes.attempt_starts(points)  # a new attempt reloads the page
    state["non_finite"] = figures.non_finite_scalar(points)
    state["scalars"] = series.scalar_names(points)[: series.MAX_SCALAR_CHARTS]  # charted
    state["shown"] = figures.scalars_shown(points)
    state["last_scalars"] = _scalars_at(points[-1] if points else None)
    offers = suggestions(run, alerts, state)
    state["banner_key"] = banner_key(run, alerts, offers)
    state["reward_std"] = series.has_reward_std(points)
    state["marked"] = [a.get("alert_id") for a in figures.fired(alerts)]
    return RunOutputs(
        header=components.plain(header(run)),
        banner=components.plain(banner(run, alerts, state, can_control, offers)),
        kpis=components.plain(kpis.kpi_cards(kpis.cards(state, run))),
        state=state,
        acr_figure=figures.acr_figure(points, state["timeline"], alerts, downsampled),
        reward_figure=figures.reward_figure(points, downsampled, series.run_bounds(run)),
        scalars_figure=figures.scalars_figure(points),
        config=components.plain(config_view(run)),
        interval_disabled=components.run_ended(run),
    )


def _new_scalar_chart(state: dict, points: list[dict]) -> bool:
    """Whether ``points`` bring a scalar that gets a chart of its own (the first scalars of a
    run, say): the scalars figure is then drawn again."""
    charted = state.get("scalars") or []
    if len(charted) >= series.MAX_SCALAR_CHARTS:
        return False
    return bool(set(series.scalar_names(points)) - set(charted))


def _scalars_at(point: dict | None) -> list[str]:
    """The names of the scalars ``point`` has a value for."""
    return sorted(n for n, v in ((point or {}).get("scalars") or {}).items() if v is not None)


def _late_scalars(state: dict, again: dict | None) -> set[str]:
    """The scalars of the last drawn step (``again``, read again) that came after it was drawn:
    the bundled trainer logs the held-out accuracy after the step's groups, and the eval chart
    showed no point for it until a reload."""
    return set(_scalars_at(again)) - set(state.get("last_scalars") or []) if again else set()


def _append_late(patch: Patch, state: dict, again: dict, late: set[str]) -> None:
    """Append the ``late`` scalars of step ``again`` to their charts' traces in ``patch``."""
    for i, scalar in enumerate(series.scalar_series(state.get("scalars") or [])):
        if scalar.key in late:
            patch["data"][i]["x"].append(again["step"])
            patch["data"][i]["y"].append(scalar.value(again))


def live_update(info, run_id: str, state: dict) -> RunOutputs | None:
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
        return _no_new_steps(run, alerts, state, scalars if late else None)
    new_state = kpis.advance(state, points)
    new_state["appended"] = state.get("appended", 0) + len(points)
    new_state["last_scalars"] = _scalars_at(points[-1])
    acr, reward = Patch(), Patch()
    series.extend_patch(acr, points, series.ACR_SERIES)
    series.extend_patch(reward, points, series.reward_series(series.run_bounds(run)))
    series.extend_patch(scalars, points, series.scalar_series(state.get("scalars") or []))
    if not state.get("reward_std") and series.has_reward_std(points):  # the band shows now
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
        marker_trace = len(series.ACR_SERIES)
        acr["data"][marker_trace]["x"].extend(ax)
        acr["data"][marker_trace]["y"].extend(ay)
        acr["data"][marker_trace]["text"].extend(at)
    # Mitigation bands are a handful of shapes: replace them (they stretch to the last step).
    acr["layout"]["shapes"] = [
        shapes.threshold_line(),
        *shapes.attempt_lines(state.get("attempt_starts") or []),
        *shapes.mitigation_shapes(timeline, new_state["last_step"]),
    ]
    new_state["timeline"] = timeline
    new_state["reported"] = update["reported"]
    offers = suggestions(run, alerts, new_state)
    new_state["banner_key"] = banner_key(run, alerts, offers)
    return RunOutputs(
        header=header(run),
        banner=banner(run, alerts, new_state, state.get("can_control", False), offers),
        kpis=kpis.kpi_cards(kpis.cards(new_state, run)),
        state=new_state,
        acr_figure=acr,
        reward_figure=reward,
        scalars_figure=scalars,
        interval_disabled=finished,
    )


def _no_new_steps(run: dict, alerts: list[dict], state: dict, late: Patch | None) -> RunOutputs:
    """A tick without new steps: the figures stay (but for ``late``, the scalars of the last
    step that came after it was drawn), the header is refreshed (the status may turn stale),
    and the banner only when its alerts or offers changed (an offer taken, an alert of the
    periodic pass): replaced at every tick, it would move a button under the user's click."""
    offers = suggestions(run, alerts, state)
    key = banner_key(run, alerts, offers)
    outputs = RunOutputs(
        header=header(run),
        state=state if late is not None else no_update,
        scalars_figure=late if late is not None else no_update,
        interval_disabled=components.run_ended(run),
    )
    if key == state.get("banner_key"):
        return outputs
    can_control = state.get("can_control", False)
    return outputs._replace(
        banner=banner(run, alerts, state, can_control, offers),
        state={**state, "banner_key": key},
    )
