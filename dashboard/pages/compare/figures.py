"""The compare page's figure: the chosen runs' ACR and reward by step, overlaid. No I/O."""

from __future__ import annotations

import html
import json
from bisect import bisect_left
from collections.abc import Callable, Sequence

from vantage.dashboard.components import mitigation_modes
from vantage.dashboard.figures import (
    NOTE,
    Figure,
    Point,
    axis_ref,
    base_layout,
    grid_layout,
    mitigation_changes,
    reported_change,
)

RUN_COLORS = ["#0072b2", "#d55e00", "#009e73", "#e69f00", "#cc79a7", "#56b4e9", "#000000"]
RUN_DASHES = ["solid", "longdash", "dashdot"]  # "dot" is each run's effective ACR
LEGEND_CHARS = 40  # a 200-character run name's legend entry took the chart's whole width


def _legend_mitigation(run: dict, changes: Sequence[tuple[int, str, dict]] = ()) -> str | None:
    """What the legend says of a run's mitigation: the mode in effect (what the trainer last
    reported, else the applied command's) and the first step it trained, when the run changed
    to it (so that a run switched mid-way does not read as mitigated for its whole curve); a
    requested one that differs after an arrow (not applied yet, or applied in an
    attempt that a resume without it replaced)."""
    applied, requested = mitigation_modes(run)
    reported = (run.get("mitigation_reported") or {}).get("mode")
    current = reported or applied
    if requested and requested != current:
        return f"{current or 'none'} → {requested}"
    if not current or current == "none":
        return None
    started = len(changes) == 1 and reported_change(changes[0][2])  # by its config, say
    if changes and changes[-1][1] == current and not started:
        return f"{current} from step {changes[-1][0]}"
    return current


COMPARE_TITLES = (
    "ACR, lower is better (dotted: effective ACR, after AVSPO/AAPO; ◆: a mitigation applied)",
    "Reward mean (higher is better)",
)


def no_runs_figure() -> Figure:
    """The compare page's chart before any run is chosen: a note, no axes (empty axes with a
    stray line and a reward title above nothing)."""
    hidden = {"visible": False}
    note = {**NOTE, "text": "Choose runs above to compare them", "font": {"size": 14}}
    layout = {"height": 160, "xaxis": hidden, "yaxis": hidden, "annotations": [note]}
    return {"data": [], "layout": {**layout, "margin": {"l": 20, "r": 20, "t": 20, "b": 20}}}


def compare_figure(
    runs: Sequence[dict],
    metrics: dict[str, Sequence[Point]],
    timelines: dict[str, Sequence[dict]] | None = None,
) -> Figure:
    """ACR (top) and reward mean (bottom) of several runs, overlaid by step: two traces a run
    first, in the runs' order; then each run's effective ACR (dotted, where the trainer sent
    it: AVSPO and AAPO leave the raw ACR as it is, so raw ACR alone never showed them
    working) and a marker where each mitigation was applied (``timelines``: run id → its
    summary's ``mitigation_timeline``)."""
    data, extra = [], []
    for i, run in enumerate(runs):
        color = RUN_COLORS[i % len(RUN_COLORS)]
        pts = metrics.get(run["run_id"], [])
        steps = [p["step"] for p in pts]
        changes = mitigation_changes((timelines or {}).get(run["run_id"], []))
        # Plotly reads trace names as HTML: a run's name is text
        label = html.escape(_short(run.get("name") or run["run_id"][:8]), quote=False)
        mode = _legend_mitigation(run, changes)  # a reported mode is any name: text
        mode = mode and html.escape(mode, quote=False)
        name = f"{label} ({mode})" if mode else label
        for row, (key, what, digits) in enumerate(
            (("acr", "ACR", ".2f"), ("reward_mean", "reward", ".3f"))
        ):
            data.append(_compare_trace(run, row, steps, [p.get(key) for p in pts], color, name))
            # past the palette's 7 colours, runs that share one differ by their line's dashes
            data[-1]["line"]["dash"] = RUN_DASHES[i // len(RUN_COLORS) % len(RUN_DASHES)]
            # the name by reference: a name holding "%{" stays text
            data[-1]["hovertemplate"] = (
                f"%{{fullData.name}}<br>step %{{x}}<br>{what} %{{y:{digits}}}<extra></extra>"
            )
        extra.extend(_effective_and_changes(run, pts, changes, color, name))
    layout = json.loads(grid_layout(2, 1, COMPARE_TITLES, True))
    base = base_layout("Runs compared by step", 620)
    base.pop("xaxis")
    layout.update(base, hovermode="x")
    # from just below 0, as the run page: an effective ACR of 0 lay on the axis line
    layout["yaxis"].update(range=[-0.03, 1.02], title={"text": "ACR"})
    layout["yaxis2"].update(title={"text": "reward"})
    layout["xaxis2"].update(title={"text": "step"})
    return {"data": data + extra, "layout": layout}


def _short(name: str) -> str:
    """A run's name for a legend: at most LEGEND_CHARS characters, cut in the middle, so that
    names told apart by their ends (``…-seed1``, ``…-seed2``) stay apart."""
    if len(name) <= LEGEND_CHARS:
        return name
    tail = LEGEND_CHARS // 3
    return name[: LEGEND_CHARS - tail - 1] + "…" + name[-tail:]


def _compare_trace(
    run: dict, row: int, steps: list, values: list, color: str, name: str, legend: bool = True
) -> dict:
    xref, yref = axis_ref(row)
    return {
        "type": "scatter",
        "mode": "lines" if len(steps) > 1 else "markers",  # one step: a dot
        "x": steps,
        "y": values,
        "name": name,
        "legendgroup": run["run_id"],
        "showlegend": legend and row == 0,
        "line": {"color": color},
        "marker": {"color": color},
        "xaxis": xref,
        "yaxis": yref,
    }


def _effective_and_changes(
    run: dict, pts: Sequence[Point], changes: Sequence[tuple], color: str, name: str
) -> list[dict]:
    """A run's effective ACR (dotted) and its mitigation changes (diamonds on its ACR)."""
    out = []
    effective = [(p["step"], p.get("acr_effective")) for p in pts]
    if any(v is not None for _, v in effective):
        steps, values = [s for s, _ in effective], [v for _, v in effective]
        trace = _compare_trace(run, 0, steps, values, color, name, legend=False)
        trace["line"] = {"color": color, "dash": "dot"}
        trace["hovertemplate"] = (
            "%{fullData.name}<br>step %{x}<br>effective ACR %{y:.2f}<extra></extra>"
        )
        out.append(trace)
    if changes and pts:
        acr_at = _acr_at(pts)
        marks = [(step, acr_at(step), mode) for step, mode, _ in changes]
        trace = _compare_trace(run, 0, [m[0] for m in marks], [m[1] for m in marks], color, name,
                               legend=False)  # fmt: skip
        trace.update(
            mode="markers",
            marker={"color": color, "symbol": "diamond", "size": 10, "line": {"width": 1}},
            text=[f"{mode} in effect from step {step}" for step, _, mode in marks],
            hovertemplate="%{fullData.name}<br>%{text}<extra></extra>",
        )
        out.append(trace)
    return out


def _acr_at(pts: Sequence[Point]) -> Callable[[int], float | None]:
    """The ACR of the first point at or after a step (the last point's past the end)."""
    steps = [p["step"] for p in pts]

    def at(step: int) -> float | None:
        i = min(bisect_left(steps, step), len(pts) - 1)
        return pts[i].get("acr")

    return at
