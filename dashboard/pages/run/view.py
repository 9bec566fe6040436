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
from vantage.dashboard.figures import step_dtick

from . import figures, kpis, series, shapes
from . import scalars as scalar_views
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
    scalar_options: Any = no_update
    scalars_style: Any = no_update


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


def first_load(
    info, run_id: str, can_control: bool = False, scalar_view: dict | None = None
) -> RunOutputs | None:
    """Every output of the data callback for a fresh page, the scalars chart as ``scalar_view``
    says (`scalars.normal_view`; None: the default); None if the run is not visible."""
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
    state["first_step"] = points[0]["step"] if points else None  # for the ticks (`step_dtick`)
    state["can_control"] = can_control
    state["timeline"] = summary.get("mitigation_timeline") or []
    state["reported"] = snap["reported"]  # the live updates add the new steps' changes
    state["attempt_starts"] = shapes.attempt_starts(points)  # a new attempt reloads the page
    state["non_finite"] = figures.non_finite_scalar(points)
    state.update(_scalar_state(points, scalar_view))
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
        scalars_figure=figures.scalars_figure(points, state["scalar_view"]),
        config=components.plain(config_view(run)),
        interval_disabled=components.run_ended(run),
        scalar_options=_options(state["scalar_options"]),
        scalars_style=_scalars_style(state),
    )


def _scalar_state(points: list[dict], scalar_view: dict | None) -> dict:
    """The state of the scalars chart drawn from ``points`` as ``scalar_view`` says: the view,
    the names charted, the smoothed averages the live appends continue, every logged name
    (the picker's options), and the scalars of the last step drawn. One pass over the points
    for the names (each pass is ~2 ms at 5,000 points)."""
    view = scalar_view or scalar_views.DEFAULT_VIEW
    logged = {n for p in points for n in (p.get("scalars") or {})}
    names = series.ordered_names(logged)
    charted = list(view["names"]) if view.get("names") else names[: series.MAX_SCALAR_CHARTS]
    shown = len(charted) if view.get("names") else series.MAX_SCALAR_CHARTS
    return {
        "scalar_view": view,
        "scalars": charted,
        "scalar_ema": scalar_views.ema_state(points, charted, view),
        "scalar_options": names + sorted(logged - set(names)),  # the band's reward_std too
        "shown": figures.scalars_shown(points, shown, names),
        "last_scalars": _scalars_at(points[-1] if points else None),
    }


def _logged(points: list[dict]) -> list[str]:
    """Every scalar name of ``points``, the charted ones' order first (the band's too)."""
    logged = {n for p in points for n in (p.get("scalars") or {})}
    names = series.ordered_names(logged)
    return names + sorted(logged - set(names))


def _options(names: list[str]) -> list[dict]:
    return [{"label": n, "value": n} for n in names]


def _scalars_style(state: dict) -> dict:
    """The scalars graph's element height (px), the figure's (`figures.SCALARS_HEIGHT`)."""
    n = len(state.get("scalars") or [])
    return {"height": f"{scalar_views.height(n, figures.SCALARS_HEIGHT)}px"}


def scalars_reload(info, run_id: str, state: dict, scalar_view: dict) -> RunOutputs | None:
    """The scalars chart drawn again as ``scalar_view`` says (the picker, smoothing, log scale
    or x axis changed), from the steps already drawn (a live update appends the rest); None
    if the run is not visible."""
    points = data.split_points(info, run_id, "train", max_points=5000)
    if points is None:
        return None
    last = state.get("last_step")
    points = [p for p in points if last is not None and p["step"] <= last]
    new_state = {**state, **_scalar_state(points, scalar_view)}
    new_state["last_scalars"] = state.get("last_scalars") or []  # late ones still come
    if points and points[-1]["step"] == last:
        new_state["last_scalars"] = _scalars_at(points[-1])
    return RunOutputs(
        state=new_state,
        scalars_figure=figures.scalars_figure(points, new_state["scalar_view"]),
        scalar_options=_options(new_state["scalar_options"]),
        scalars_style=_scalars_style(new_state),
    )


def _new_scalar_chart(state: dict, points: list[dict]) -> bool:
    """Whether ``points`` bring a scalar that gets a chart of its own (the first scalars of a
    run, say): the scalars figure is then drawn again."""
    charted = state.get("scalars") or []
    if (state.get("scalar_view") or {}).get("names") or len(charted) >= series.MAX_SCALAR_CHARTS:
        return False  # a chosen set, or a full default one, stays as it is
    return bool(set(series.scalar_names(points)) - set(charted))


def _scalars_at(point: dict | None) -> list[str]:
    """The names of the scalars ``point`` has a value for."""
    return sorted(n for n, v in ((point or {}).get("scalars") or {}).items() if v is not None)


def _late_scalars(state: dict, again: dict | None) -> set[str]:
    """The scalars of the last drawn step (``again``, read again) that came after it was drawn:
    the bundled trainer logs the held-out accuracy after the step's groups, and the eval chart
    showed no point for it until a reload."""
    return set(_scalars_at(again)) - set(state.get("last_scalars") or []) if again else set()


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
        ema = scalar_views.append_late(
            scalars, again, late, state.get("scalars") or [], state.get("scalar_view"),
            state.get("scalar_ema") or {},
        )  # fmt: skip
        state = {**state, "last_scalars": _scalars_at(again), "scalar_ema": ema}
    new_attempt = run.get("attempt") != state.get("attempt") and state.get("attempt") is not None
    # A page left open for days would grow its figures without bound: past APPEND_LIMIT appended
    # steps, reload them downsampled.
    too_long = state.get("appended", 0) + len(points) > APPEND_LIMIT
    first_steps = bool(points) and state.get("last_step") is None  # the "no steps" note goes
    new_chart = _new_scalar_chart(state, [again, *points] if late else points)
    if new_attempt or too_long or first_steps or new_chart:
        return first_load(info, run_id, state.get("can_control", False), state.get("scalar_view"))
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
    # a tick per step while the run is short, Plotly's once it is not
    dtick = step_dtick(state.get("first_step"), new_state["last_step"])
    acr["layout"]["xaxis"]["dtick"] = reward["layout"]["xaxis"]["dtick"] = dtick
    new_state["scalar_ema"] = scalar_views.extend(
        scalars, points, state.get("scalars") or [], state.get("scalar_view"),
        state.get("scalar_ema") or {},
    )  # fmt: skip
    options = _logged([{"scalars": dict.fromkeys(state.get("scalar_options") or [])}, *points])
    new_state["scalar_options"] = options
    if not state.get("reward_std") and series.has_reward_std(points):  # the band shows now
        reward["data"][figures.REWARD_BAND]["showlegend"] = True
        new_state["reward_std"] = True
    if not state.get("non_finite") and (
        note := figures.non_finite_scalar([again, *points] if late else points)
    ):
        note_view = scalar_views.view_note(state.get("scalar_view"))
        scalars["layout"]["title"]["text"] = figures.scalars_title(
            note, state.get("shown"), note_view
        )
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
        scalar_options=_options(options) if options != state.get("scalar_options") else no_update,
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
