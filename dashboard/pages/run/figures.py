"""The run page's figures: ACR, reward, trainer scalars and the evaluation split, from the
query functions' dicts. No I/O."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from vantage.dashboard import explain
from vantage.dashboard.figures import (
    COLORS,
    NOTE,
    Figure,
    Point,
    axis_ref,
    base_layout,
    grid_layout,
    plotly_text,
    step_dtick,
)

from . import scalars
from .series import (
    ACR_SERIES,
    MAX_SCALAR_CHARTS,
    REWARD_SERIES,
    Bounds,
    Series,
    has_reward_std,
    reward_series,
    scalar_names,
    series_xy,
)
from .shapes import attempt_lines, attempt_starts, mitigation_shapes, threshold_line

# Chart heights (px), which the run page also sets on each graph's element: a graph sized by
# its own content could be resized by Plotly to a thin strip when its container's height was
# read mid-render (the ACR chart then lay under the charts below it).
ACR_HEIGHT, REWARD_HEIGHT, SCALARS_HEIGHT, EVAL_HEIGHT = 420, 320, 420, 320


def fired(alerts: Iterable[dict]) -> list[dict]:
    """The alerts that fired (firing or resolved since): a pending one has not, and the chart
    says its triangles mark where alerts fired."""
    return [a for a in alerts if a.get("fired_step") is not None]


def alert_markers(alerts: Iterable[dict], points: Sequence[Point]) -> tuple[list, list, list]:
    """x, y and hover text of alert markers, placed on the ACR line at the step they fired
    (pending alerts get none)."""
    acr_at = {p["step"]: p.get("acr") for p in points}
    xs, ys, texts = [], [], []
    for a in fired(alerts):
        step = a["fired_step"]
        value = a.get("value")
        acr = acr_at.get(step)
        xs.append(step)
        ys.append(1.0 if acr is None else acr)  # at the top: its step has no ACR to sit on
        rule = plotly_text(str(a.get("rule", "?")))
        severity = plotly_text(str(a.get("severity", "warning")))
        texts.append(  # the rule's name and severity are text (a name was HTML in the hover)
            f"<b>alert {rule}</b> ({severity}, {a.get('state')})"
            f"<br>value {explain.fmt(value)} at step {step}"
            + _resolved(a)
            # at y = 1 it read as an ACR of 1 on a run whose every group was invalid
            + ("<br>(no ACR at this step: drawn at the top)" if acr is None else "")
        )
    return xs, ys, texts


def _resolved(alert: dict) -> str:
    """Where a resolved alert's hover says it ended: at a step (step 0 included), or, with no
    step, when its rule stopped watching it (disabled, deleted or re-scoped)."""
    if alert.get("state") != "resolved":
        return ""
    step = alert.get("resolved_step")
    return f", resolved at {step}" if step is not None else ", resolved when its rule changed"


def _isolated(ys: Sequence[Any]) -> bool:
    """Whether a value of ``ys`` has no value beside it, which a line alone does not draw."""
    return any(
        y is not None and (i == 0 or ys[i - 1] is None) and (i == len(ys) - 1 or ys[i + 1] is None)
        for i, y in enumerate(ys)
    )


def _traces(xy, series: Sequence[Series], **extra) -> list[dict]:
    """One line a series; a series with a value between gaps also gets markers (a line of one
    point draws nothing: a loss logged once showed an empty chart, and an accuracy logged every
    10 steps no line at all)."""
    return [
        {
            "type": "scatter",
            "x": xs,
            "y": ys,
            "name": s.label,
            "mode": "lines+markers" if _isolated(ys) else "lines",
            "hovertemplate": s.hover,
            **s.style,
            **extra,
        }
        for (xs, ys), s in zip(xy, series, strict=True)
    ]


def _dtick(points: Sequence[Point]) -> int | None:
    """`step_dtick` of the points' steps (a tick per step on a short run)."""
    return step_dtick(points[0]["step"], points[-1]["step"]) if points else None


def acr_figure(
    points: Sequence[Point],
    timeline: Iterable[dict] = (),
    alerts: Iterable[dict] = (),
    downsampled: bool = False,
) -> Figure:
    """The ACR chart: raw, near-collapse, effective and expected ACR over a stacked area of
    all-pass / all-fail / constant shares, mitigation bands and alert markers."""
    data = _traces(series_xy(points, ACR_SERIES), ACR_SERIES)
    ax, ay, at = alert_markers(alerts, points)
    data.append(
        {
            "type": "scatter",
            "x": ax,
            "y": ay,
            "text": at,
            "name": "alerts",
            "mode": "markers",
            "marker": {"symbol": "triangle-down", "size": 12, "color": COLORS["alert"]},
            "hovertemplate": "%{text}<extra></extra>",
        }
    )
    last = points[-1]["step"] if points else None
    title = "Advantage collapse rate: share of prompt groups that taught nothing"
    if downsampled:
        title += " (downsampled, extremes kept)"
    layout = base_layout(title, height=ACR_HEIGHT)
    # from just below 0: a share of 0 (the effective ACR once AVSPO works) was drawn half
    # under the x axis and could not be seen
    layout["yaxis"] = {"title": {"text": "share of groups"}, "range": [-0.03, 1.02]}
    starts = attempt_starts(points)
    mitigations = mitigation_shapes(timeline, last)
    layout["shapes"] = [threshold_line(), *attempt_lines(starts), *mitigations]
    layout["xaxis"]["dtick"] = _dtick(points)
    if not points:
        layout["annotations"] = [dict(NO_STEPS_NOTE)]
    return {"data": data, "layout": layout}


def reward_figure(
    points: Sequence[Point], downsampled: bool = False, bounds: Bounds = (None, None)
) -> Figure:
    """Reward mean with a ± std band (the std is the trainer's ``reward_std`` scalar; without
    it the band has no legend entry, as it has nothing to show), within the run's reward
    ``bounds``."""
    banded = has_reward_std(points)
    title = f"Reward mean{' ± std' if banded else ''}: watch for drops"
    layout = base_layout(title + (" (downsampled)" if downsampled else ""), REWARD_HEIGHT)
    layout["yaxis"] = {"title": {"text": "reward"}}
    layout["xaxis"]["dtick"] = _dtick(points)
    series = reward_series(bounds)
    data = _traces(series_xy(points, series), series)
    data[REWARD_BAND]["showlegend"] = banded
    if not points:
        layout["annotations"] = [dict(NO_STEPS_NOTE)]
    return {"data": data, "layout": layout}


REWARD_BAND = 1  # the trace of REWARD_SERIES that names the ± std band in the legend


def non_finite_scalar(points: Iterable[Point], most: int = 3) -> str | None:
    """Each trainer scalar with non-finite values, by first such step: its first value, step
    and how many steps had one, as "loss NaN at step 0 (3 steps), kl Infinity at step 2"
    (up to ``most`` scalars, then "and 2 more"); None if there is none. Naming only the first
    step's hid a KL gone Infinity later. A loss gone NaN is the usual sign of a diverged run."""
    first: dict[str, tuple[int, str]] = {}
    count: dict[str, int] = {}
    for p in points:
        for name, v in (p.get("scalars") or {}).items():
            if isinstance(v, str):
                first.setdefault(name, (p["step"], v))
                count[name] = count.get(name, 0) + 1
    if not first:
        return None
    said = [
        f"{plotly_text(name)} {v} at step {step}"
        + (f" ({count[name]} steps)" if count[name] > 1 else "")
        for name, (step, v) in sorted(first.items(), key=lambda kv: kv[1][0])
    ]
    more = f" and {len(said) - most} more" if len(said) > most else ""
    return ", ".join(said[:most]) + more


SCALARS_TITLE = "Trainer scalars (as the trainer logged them)"


def scalars_shown(
    points: Sequence[Point], shown: int = MAX_SCALAR_CHARTS, names: list[str] | None = None
) -> str | None:
    """How many of the logged scalars (``names``, else `scalar_names` of ``points``) are
    charted, when not all are: "4 of 9 shown (...)"."""
    names = scalar_names(points) if names is None else names
    if len(names) <= shown:
        return None
    return f"{shown} of {len(names)} shown: pick others above (all in the CSV export)"


def scalars_title(
    non_finite: str | None, shown: str | None = None, view_note: str | None = None
) -> str:
    """The scalars chart's title; below it, in smaller type, the first non-finite scalars, how
    many of the scalars are charted (``shown``) and how they are drawn (``view_note``,
    `scalars.view_note`): on one line they ran past the half-width chart and were cut off."""
    notes = [f"non-finite: {non_finite}" if non_finite else None, shown, view_note]
    below = " · ".join(n for n in notes if n)
    return f"{SCALARS_TITLE}<br><sup>{below}</sup>" if below else SCALARS_TITLE


# The scalars chart's note while no scalar has been logged (a live update reloads the chart
# when the first arrive).
NO_SCALARS_NOTE = {
    **NOTE,
    # two short lines: one long line was cut at both ends in a half-width chart
    "text": "No trainer scalars logged yet<br>(Monitor.log_scalars sends loss, KL, ...)",
}
# An empty chart said nothing of why (a run registered, its first step not yet sent).
NO_STEPS_NOTE = {
    **NOTE,
    "text": "No steps yet:<br>they appear here as the trainer sends them",
}


def scalars_figure(points: Sequence[Point], view: dict | None = None) -> Figure:
    """The run's logged scalars, one small chart each: those ``view`` picks (`scalars.charted`;
    by default up to MAX_SCALAR_CHARTS, the well-known ones first, and the title says how many
    more there are), smoothed, on a log scale, by step or wall time as ``view`` says
    (`scalars.normal_view`); a note instead of empty charts while none was logged."""
    view = view or scalars.DEFAULT_VIEW
    series = scalars.charted_series(scalars.charted(points, view))
    shown = scalars_shown(points, len(series) if view.get("names") else MAX_SCALAR_CHARTS)
    title = scalars_title(non_finite_scalar(points), shown, scalars.view_note(view))
    base = base_layout(title, scalars.height(len(series), SCALARS_HEIGHT))
    base["margin"] = {**base["margin"], "t": 75}  # room for the title's second line
    if not series:
        base.pop("xaxis")
        base.update(xaxis={"visible": False}, yaxis={"visible": False})
        return {"data": [], "layout": {**base, "annotations": [dict(NO_SCALARS_NOTE)]}}
    rows, cols = scalars.grid(len(series))
    by_time, weight = view.get("x") == "time", view.get("smoothing") or 0.0
    xs = scalars.x_values(points, "time") if by_time else None
    data = []
    for i, trace in enumerate(_traces(series_xy(points, series), series)):
        trace["xaxis"], trace["yaxis"] = axis_ref(i)
        if by_time:  # the hover's "step %{x}" would name a time a step
            trace["x"] = xs
            trace["hovertemplate"] = trace["hovertemplate"].replace("step %{x}", "%{x}", 1)
        data.append(trace)
        if weight:
            smoothed = {**trace, "y": scalars.smooth(trace["y"], weight)[0], "mode": "lines"}
            smoothed["name"] = f"{trace['name']}, smoothed"
            trace.update(opacity=0.3, hoverinfo="skip")
            trace.pop("hovertemplate", None)
            data.append(smoothed)
    layout = json.loads(grid_layout(rows, cols, tuple(s.label for s in series), False))
    for k in range(1, len(series) + 1):
        suffix = "" if k == 1 else str(k)
        if by_time:
            layout[f"xaxis{suffix}"]["type"] = "date"
        if view.get("log"):
            layout[f"yaxis{suffix}"]["type"] = "log"
    base.pop("xaxis")
    layout.update(base, showlegend=False, hovermode="closest")
    return {"data": data, "layout": layout}


# The evaluation chart: the eval split's ACR by side (left) and its reward mean (right).
EVAL_ACR = tuple(s for s in ACR_SERIES if s.key in ("acr_all_fail", "acr_all_pass", "acr"))
EVAL_SERIES = (*EVAL_ACR, REWARD_SERIES[-1])


def eval_figure(points: Sequence[Point], split: str = "eval") -> Figure:
    """The ACR (with its all-fail / all-pass shares) and reward mean of the evaluation split
    ``split`` by step, side by side: an eval set the model has outgrown is all-pass there
    first. ``points`` as `GET /metrics?split=` gives them."""
    data = _traces(series_xy(points, EVAL_SERIES), EVAL_SERIES)
    for i, trace in enumerate(data):
        trace["xaxis"], trace["yaxis"] = axis_ref(0 if i < len(EVAL_ACR) else 1)
    titles = ("ACR", "reward mean")
    layout = json.loads(grid_layout(1, 2, titles, False))
    base = base_layout(f"Evaluation (split {plotly_text(split)})", EVAL_HEIGHT)
    base.pop("xaxis")
    layout.update(base, hovermode="closest")
    layout["yaxis"].update(range=[0, 1.02])
    return {"data": data, "layout": layout}
