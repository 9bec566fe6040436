"""Figure builders: plain data (the query functions' dicts) in, a Plotly figure out. No I/O.

Builders return the figure as its JSON dict (what ``go.Figure(...).to_plotly_json()`` gives), not
as a ``go.Figure``: validating and serialising a ``go.Figure`` of 8 series × 5,000 steps costs
~90 ms, the dict ~4 ms, and the run page has a 500 ms budget at 100,000 steps. ``go.Figure(d)``
validates one (the tests do).

Each live chart has a fixed list of series (``*_SERIES``): trace ``i`` of the figure is series
``i`` whatever the data, so a live update can append new steps to trace ``i`` with a ``Patch``
(:func:`extend_patch`) instead of rebuilding the figure.
"""

from __future__ import annotations

import html
import json
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from plotly.subplots import make_subplots

from . import explain

Point = dict[str, Any]
Figure = dict[str, Any]

# The all-pass/all-fail split and the runs of a comparison use Okabe and Ito's colour-blind safe
# palette (https://jfly.uni-koeln.de/color/): red against green could not be told apart with
# red-green colour blindness, the commonest kind.
COLORS = {
    "acr": "#1f2937",
    "acr_eps": "#6b7280",
    "acr_effective": "#cc79a7",
    "expected_acr": "#009e73",
    "all_fail": "rgba(213, 94, 0, 0.30)",
    "all_pass": "rgba(86, 180, 233, 0.40)",
    "constant": "rgba(107, 114, 128, 0.35)",
    "reward": "#7c3aed",
    "band": "rgba(124, 58, 237, 0.15)",
    "alert": "#dc2626",
}
RUN_COLORS = ["#0072b2", "#d55e00", "#009e73", "#e69f00", "#cc79a7", "#56b4e9", "#000000"]
RUN_DASHES = ["solid", "longdash", "dashdot"]  # "dot" is each run's effective ACR
LEGEND_CHARS = 40  # a 200-character run name's legend entry took the chart's whole width
# AAPO's band was the orange of the all-fail share beside it in the legend (a trial): yellow
# Okabe-Ito bluish green and yellow: AVSPO's blue tint vanished over the light-blue all-pass
# area (a trial); each band also starts with a line of its colour (`mitigation_shapes`).
_MITIGATION_RGBA = {"avspo": (0, 158, 115, 0.12), "aapo": (240, 228, 66, 0.25)}
MITIGATION_COLORS = {m: f"rgba({r}, {g}, {b}, {a})" for m, (r, g, b, a) in _MITIGATION_RGBA.items()}
# a band's start line: its fill colour, opaque
_BAND_EDGES = {
    MITIGATION_COLORS[m]: f"rgb({r}, {g}, {b})" for m, (r, g, b, _a) in _MITIGATION_RGBA.items()
}


def _field(name: str) -> Callable[[Point], Any]:
    return lambda p: p.get(name)


def _share(name: str) -> Callable[[Point], Any]:
    """A share of groups, to 4 decimals (1 group in 10,000): halves the figure's bytes."""

    def value(p: Point) -> Any:
        v = p.get(name)
        return None if v is None else round(v, 4)

    return value


def _scalar(name: str) -> Callable[[Point], Any]:
    """A trainer scalar; a non-finite one (stored as "NaN", "Infinity" or "-Infinity") is a gap
    in its line, and `non_finite_scalar` names it in the chart's title."""

    def value(p: Point) -> Any:
        v = (p.get("scalars") or {}).get(name)
        return None if isinstance(v, str) else v

    return value


_reward_std = _scalar("reward_std")


Bounds = tuple[float | None, float | None]
"""A run's (reward_min, reward_max): no reward lies outside them (None: unbounded)."""


def _reward_edge(sign: int, bounds: Bounds = (None, None)) -> Callable[[Point], Any]:
    """The band's lower (``sign`` −1) or upper (+1) edge, mean ∓ std, kept within the run's
    reward ``bounds``: a 0/1 reward at mean 0.9 drew its band up to 1.2, a reward no
    completion can get (a trial)."""
    low, high = bounds

    def edge(p: Point) -> Any:
        mean, std = p.get("reward_mean"), _reward_std(p)
        if mean is None or std is None:  # no band here: it narrows to the mean (a null in one
            return mean  # edge only, filled to the other edge, drew a triangle: a trial)
        value = mean + sign * std
        if low is not None and value < low:
            return low
        return high if high is not None and value > high else value

    return edge


@dataclass(frozen=True)
class Series:
    """One trace of a live chart: its label, how to read a point, how to draw it."""

    key: str
    label: str
    value: Callable[[Point], Any]
    hover: str
    style: dict = field(default_factory=dict)


def _hover(label: str, hint: str, digits: str = ".2f") -> str:
    return f"step %{{x}}<br>{label}: %{{y:{digits}}}<br><i>{hint}</i><extra></extra>"


ACR_SERIES: tuple[Series, ...] = (
    Series(
        "acr_all_fail",
        "all-fail share",
        _share("acr_all_fail"),
        _hover("all-fail share", "every completion wrong: prompts too hard"),
        {
            "stackgroup": "sides",
            "stackgaps": "interpolate",
            "line": {"width": 0},
            "fillcolor": COLORS["all_fail"],
        },
    ),
    Series(
        "acr_all_pass",
        "all-pass share",
        _share("acr_all_pass"),
        _hover("all-pass share", "every completion right: prompts too easy"),
        {
            "stackgroup": "sides",
            "stackgaps": "interpolate",
            "line": {"width": 0},
            "fillcolor": COLORS["all_pass"],
        },
    ),
    Series(
        "acr_constant",
        "constant-reward share",
        _share("acr_constant"),
        _hover("constant share", "same non-pass/fail reward: check the reward function"),
        {
            "stackgroup": "sides",
            "stackgaps": "interpolate",
            "line": {"width": 0},
            "fillcolor": COLORS["constant"],
        },
    ),
    Series(
        "expected_acr",
        "expected ACR (lower bound)",
        _share("expected_acr"),
        _hover("expected ACR", "what chance alone gives at this pass rate"),
        {"line": {"color": COLORS["expected_acr"], "dash": "dot", "width": 1.5}},
    ),
    Series(
        "acr_eps",
        "ACR incl. near-collapsed",
        _share("acr_eps"),
        _hover("ACR (eps)", "also counts groups whose rewards barely differ"),
        {"line": {"color": COLORS["acr_eps"], "dash": "dash", "width": 1.2}},
    ),
    Series(
        "acr_effective",
        "effective ACR (after mitigation)",
        _share("acr_effective"),
        _hover("effective ACR", "zero-advantage groups left after AVSPO/AAPO"),
        {"line": {"color": COLORS["acr_effective"], "width": 2.5}},
    ),
    Series(
        "acr",
        "ACR",
        _share("acr"),
        _hover("ACR", "share of groups with no gradient; > 0.35 for long = stalled"),
        {"line": {"color": COLORS["acr"], "width": 2}},
    ),
)


def reward_series(bounds: Bounds = (None, None)) -> tuple[Series, ...]:
    """The reward chart's series (band's lower edge, upper edge, mean), the band kept within
    a run's reward ``bounds`` (`run_bounds`)."""
    return (
        Series(
            "reward_low",
            "mean − std",
            _reward_edge(-1, bounds),
            _hover("mean − std", "spread of rewards"),
            {"line": {"width": 0}, "showlegend": False, "connectgaps": True},
        ),
        Series(
            "reward_high",
            "reward ± std",
            _reward_edge(+1, bounds),
            _hover("mean + std", "spread of rewards"),
            {
                "line": {"width": 0},
                "fill": "tonexty",
                "fillcolor": COLORS["band"],
                "connectgaps": True,
            },
        ),
        Series(
            "reward_mean",
            "reward mean",
            _field("reward_mean"),
            _hover("reward mean", "a sudden drop is a failure: check KL and the latest checkpoint"),
            {"line": {"color": COLORS["reward"], "width": 2}},
        ),
    )


def run_bounds(run: dict | None) -> Bounds:
    """A run's reward bounds as the API gives them (``reward_min``, ``reward_max``)."""
    run = run or {}
    return run.get("reward_min"), run.get("reward_max")


REWARD_SERIES = reward_series()


SCALAR_SERIES: tuple[Series, ...] = (
    Series(
        "eval_accuracy",
        "eval accuracy",
        _scalar("eval_accuracy"),
        _hover("eval accuracy", "held-out accuracy: whether the policy still learns", ".3g"),
    ),
    Series("loss", "loss", _scalar("loss"), _hover("loss", "policy loss", ".4g")),
    Series("kl", "KL", _scalar("kl"), _hover("KL", "distance from the reference model", ".4g")),
    Series(
        "entropy",
        "entropy",
        _scalar("entropy"),
        _hover("entropy", "falling towards 0: samples lose diversity, collapse follows", ".4g"),
    ),
    Series(
        "temperature",
        "temperature",
        _scalar("temperature"),
        _hover("temperature", "sampling temperature", ".3g"),
    ),
)


def series_xy(points: Iterable[Point], series: Sequence[Series]) -> list[tuple[list, list]]:
    """Per series, the steps and values of ``points`` (None where a value is missing). A
    stacked area leaves out the points it has no value at: Plotly draws a stack's leading
    gap at its first value, and step 0 (the baseline accuracy, no groups) was shaded as
    step 1's shares (a trial)."""
    points = points if isinstance(points, list) else list(points)
    steps = [p["step"] for p in points]
    out = []
    for s in series:
        values = [s.value(p) for p in points]
        if "stackgroup" in s.style:
            kept = [i for i, v in enumerate(values) if v is not None]
            out.append(([steps[i] for i in kept], [values[i] for i in kept]))
        else:
            out.append((steps, values))
    return out


# Chart heights (px), which the run page also sets on each graph's element: a graph sized by
# its own content could be resized by Plotly to a thin strip when its container's height was
# read mid-render (the ACR chart then lay under the charts below it: trials).
ACR_HEIGHT, REWARD_HEIGHT, SCALARS_HEIGHT, EVAL_HEIGHT = 420, 320, 420, 320


def _base_layout(title: str, height: int = 380) -> dict:
    return {
        "title": {"text": title, "x": 0.01, "font": {"size": 15}},
        "height": height,
        "margin": {"l": 55, "r": 20, "t": 60, "b": 50},
        "hovermode": "x unified",
        "legend": {"orientation": "h", "y": -0.22, "yanchor": "top"},
        "template": "plotly_white",
        "uirevision": "keep",  # zoom and legend choices survive live updates
        "xaxis": {"title": {"text": "step"}},
    }


def mitigation_changes(timeline: Iterable[dict]) -> list[tuple[int, str, dict]]:
    """(step, mode, command) of each ``set_mitigation`` the trainer applied, by step: where a
    run's mitigation changed. The step is the first the new mode trained: a command acked at
    step s (the trainer applies it at the boundary after s) changes step s + 1, a change the
    trainer reported changes the step that first reported it (the band of a command acked at
    step 4 began at step 4, where the summary said "in effect from step 5": a trial)."""
    changes = []
    for item in timeline:
        if item.get("type") != "set_mitigation" or item.get("status") in ("rejected", "expired"):
            continue
        step = item.get("step")
        if step is None:
            continue
        first = step if _reported(item) else step + 1
        changes.append((first, (item.get("params") or {}).get("mode", "none"), item))
    changes.sort(key=lambda c: c[0])
    # a mode set again (a second Enable AVSPO) changes nothing: the band and the legend date
    # from the first (they took the second's step: a trial)
    return [c for i, c in enumerate(changes) if i == 0 or c[1] != changes[i - 1][1]]


def mitigation_bands(timeline: Iterable[dict], last_step: int | None) -> list[dict]:
    """Shaded x-ranges where a mitigation was on, each named after the command that began it.

    A band starts at the first step a ``set_mitigation`` changed (`mitigation_changes`) and ends
    where the next change starts, or at the last step.
    """
    changes = mitigation_changes(timeline)
    on = [i for i, (_, mode, _) in enumerate(changes) if mode != "none"]
    span = max(last_step or 0, changes[-1][0] if changes else 0, 1)
    bands = []
    for i in on:
        start, mode, item = changes[i]
        end = changes[i + 1][0] if i + 1 < len(changes) else last_step
        if end is None or end < start:
            end = start
        bands.append(
            {
                "type": "rect",
                "xref": "x",
                "yref": "paper",
                "x0": start,
                "x1": end,
                "y0": 0,
                "y1": 1,
                "fillcolor": MITIGATION_COLORS.get(mode, "rgba(100,100,100,0.1)"),
                "line": {"width": 0},
                "layer": "below",
                "label": {
                    "text": _band_label(mode, item, (end - start) / span, i == on[-1], len(on)),
                    # a band in the right half is labelled from its right edge leftwards (a
                    # label running right from it was cut at the chart's edge: a trial)
                    "textposition": "top left" if start < span / 2 else "top right",
                    "font": {"size": 10, "color": "#374151"},
                },
            }
        )
    return bands


def _command_label(item: dict) -> str:
    """A marked command's label: "temperature 1.3", "checkpoint", "stop"."""
    if item.get("type") == "set_sampling":
        params = item.get("params") or {}
        return " ".join(f"{_text(str(k))} {v:g}" if isinstance(v, int | float) else _text(str(k))
                        for k, v in params.items()) or "sampling"  # fmt: skip
    return _text(str(item.get("type")))


def command_marks(timeline: Iterable[dict], last_step: int | None = None) -> list[dict]:
    """A dotted grey line, labelled at its foot, at the step where each temperature change
    (``set_sampling``), checkpoint and stop of ``timeline`` was applied (shapes named
    "command"): the chart showed mitigations only, and where the others took effect could not
    be seen (a trial). Pending, rejected and expired commands get none, nor one acked at a step
    past ``last_step``, the chart's last (an ack at step 1,000,000 stretched the axis of an
    11-step run until its steps could not be seen: a trial); a live update draws it once the
    run's steps reach it."""
    return [
        {
            "type": "line",
            "name": "command",
            "xref": "x",
            "yref": "paper",
            "x0": item["step"],
            "x1": item["step"],
            "y0": 0,
            "y1": 1,
            "line": {"color": "#6b7280", "width": 1, "dash": "dot"},
            # at the foot: at the top it ran under the chart's title and the band labels
            "label": {
                "text": _command_label(item),
                "textposition": "start",
                "font": {"size": 10, "color": "#4b5563"},
            },
        }
        for item in timeline
        if item.get("type") in ("set_sampling", "checkpoint", "stop")
        and item.get("status") == "applied"
        and item.get("step") is not None
        and (last_step is None or item["step"] <= last_step)
    ]


def mitigation_shapes(timeline: Iterable[dict], last_step: int | None) -> list[dict]:
    """`mitigation_bands`, each with a solid vertical line of its mode's colour where it
    starts (a band alone hid where a mitigation began behind the stacked areas: a trial), and
    the `command_marks` of the other commands."""
    timeline = list(timeline)
    bands = mitigation_bands(timeline, last_step)
    edges = [
        {
            "type": "line",
            "xref": "x",
            "yref": "paper",
            "x0": band["x0"],
            "x1": band["x0"],
            "y0": 0,
            "y1": 1,
            "line": {"color": _BAND_EDGES.get(band["fillcolor"], "#6b7280"), "width": 2},
        }
        for band in bands
    ]
    return bands + edges + command_marks(timeline, last_step)


def _reported(item: dict) -> bool:
    """Whether a timeline entry is a change the trainer reported that no command made (a
    mitigation its config started, say)."""
    return item.get("issued_by") == "trainer" and not item.get("command_id")


def _band_label(mode: str, item: dict, width: float, last: bool, n_bands: int) -> str:
    """A mitigation band's label, as long as its ``width`` (a share of the run's steps) has room
    for: the command in full, the mode alone, or nothing (a run that switched often had its
    labels piled on one another); the latest band names at least its mode. The command log
    has every command in full."""
    if width >= 0.2 or n_bands == 1:
        if _reported(item):  # a mode the trainer reports may be any name: text
            return f"{_text(mode.upper())} · reported by the trainer"
        who = _text(item.get("issued_by") or "?")  # "alert:<rule name>": a name is text
        cid = str(item["command_id"])[:8]
        return f"{_text(mode.upper())} · {item.get('status', '')} · cmd {cid} by {who}"
    return _text(mode.upper()) if width >= 0.05 or last else ""


def attempt_starts(points: Sequence[Point]) -> list[tuple[int, int]]:
    """(step, attempt) where the points' attempt changes: where a resumed run's newer attempt
    took over (the first point's attempt is not a change)."""
    starts, previous = [], None
    for p in points:
        attempt = p.get("attempt")
        if previous is not None and attempt != previous:
            starts.append((p["step"], attempt))
        previous = attempt
    return starts


def attempt_lines(starts: Iterable[tuple[int, int]]) -> list[dict]:
    """A dashed vertical line a resume, labelled with its attempt (a resumed run's page said
    "attempt 2" in its header only: a trial)."""
    return [
        {
            "type": "line",
            "xref": "x",
            "yref": "paper",
            "x0": step,
            "x1": step,
            "y0": 0,
            "y1": 1,
            "line": {"color": "#6b7280", "width": 1, "dash": "dash"},
            "label": {
                "text": f"attempt {attempt}",
                "textposition": "start",
                "font": {"size": 10, "color": "#374151"},
            },
        }
        for step, attempt in starts
    ]


def threshold_line(value: float = explain.STALL_THRESHOLD) -> dict:
    return {
        "type": "line",
        "xref": "paper",
        "x0": 0,
        "x1": 1,
        "yref": "y",
        "y0": value,
        "y1": value,
        "line": {"color": COLORS["alert"], "width": 1, "dash": "dot"},
        "label": {
            "text": f"stall threshold {value:g}",
            "textposition": "end",
            "font": {"size": 10, "color": COLORS["alert"]},
        },
    }


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
        rule, severity = _text(str(a.get("rule", "?"))), _text(str(a.get("severity", "warning")))
        texts.append(  # the rule's name and severity are text (a name was HTML in the hover)
            f"<b>alert {rule}</b> ({severity}, {a.get('state')})"
            f"<br>value {explain.fmt(value)} at step {step}"
            + _resolved(a)
            # at y = 1 it read as an ACR of 1 on a run whose every group was invalid (a trial)
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
    10 steps no line at all, trials)."""
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


@lru_cache(maxsize=8)
def _grid_layout(rows: int, cols: int, titles: tuple[str, ...], shared_x: bool) -> str:
    """The axes and titles of a subplot grid, as JSON (built once; copied per figure)."""
    fig = make_subplots(
        rows=rows,
        cols=cols,
        subplot_titles=list(titles),
        shared_xaxes=shared_x,
        vertical_spacing=0.18 if rows > 1 and not shared_x else 0.1,
    )
    return json.dumps(fig.layout.to_plotly_json())


def _axis_ref(index: int) -> tuple[str, str]:
    return ("x", "y") if index == 0 else (f"x{index + 1}", f"y{index + 1}")


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
    layout = _base_layout(title, height=ACR_HEIGHT)
    # from just below 0: a share of 0 (the effective ACR once AVSPO works) was drawn half
    # under the x axis and could not be seen (a trial)
    layout["yaxis"] = {"title": {"text": "share of groups"}, "range": [-0.03, 1.02]}
    starts = attempt_starts(points)
    mitigations = mitigation_shapes(timeline, last)
    layout["shapes"] = [threshold_line(), *attempt_lines(starts), *mitigations]
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
    layout = _base_layout(title + (" (downsampled)" if downsampled else ""), REWARD_HEIGHT)
    layout["yaxis"] = {"title": {"text": "reward"}}
    series = reward_series(bounds)
    data = _traces(series_xy(points, series), series)
    data[REWARD_BAND]["showlegend"] = banded
    if not points:
        layout["annotations"] = [dict(NO_STEPS_NOTE)]
    return {"data": data, "layout": layout}


REWARD_BAND = 1  # the trace of REWARD_SERIES that names the ± std band in the legend


def has_reward_std(points: Iterable[Point]) -> bool:
    """Whether any point carries the trainer's ``reward_std`` (the reward band's width)."""
    return any(_reward_std(p) is not None for p in points)


def non_finite_scalar(points: Iterable[Point]) -> str | None:
    """The non-finite trainer scalars of the first step that has any, as "loss NaN at step
    812" or "loss NaN, kl Infinity and 2 more at step 812"; None if there is none. A loss gone
    NaN is the usual sign of a diverged run."""
    for p in points:
        scalars = (p.get("scalars") or {}).items()
        bad = [f"{_text(name)} {v}" for name, v in scalars if isinstance(v, str)]
        if bad:
            more = f" and {len(bad) - 2} more" if len(bad) > 2 else ""
            return f"{', '.join(bad[:2])}{more} at step {p['step']}"
    return None


SCALARS_TITLE = "Trainer scalars (as the trainer logged them)"


def scalars_shown(points: Sequence[Point]) -> str | None:
    """How many of the logged scalars are charted, when not all are: "4 of 9 shown (...)"."""
    names = scalar_names(points)
    if len(names) <= MAX_SCALAR_CHARTS:
        return None
    return f"{MAX_SCALAR_CHARTS} of {len(names)} shown (all in the CSV export)"


def scalars_title(non_finite: str | None, shown: str | None = None) -> str:
    """The scalars chart's title; below it, in smaller type, the first non-finite scalars and
    how many of the scalars are charted (``shown``): on one line they ran past the half-width
    chart and were cut off."""
    notes = [f"non-finite: {non_finite}" if non_finite else None, shown]
    below = " · ".join(n for n in notes if n)
    return f"{SCALARS_TITLE}<br><sup>{below}</sup>" if below else SCALARS_TITLE


# The scalars chart's note while no scalar has been logged (a live update reloads the chart
# when the first arrive).
NO_SCALARS_NOTE = {
    # two short lines: one long line was cut at both ends in a half-width chart (a trial)
    "text": "No trainer scalars logged yet<br>(Monitor.log_scalars sends loss, KL, ...)",
    "xref": "paper",
    "yref": "paper",
    "x": 0.5,
    "y": 0.5,
    "showarrow": False,
}
# An empty chart said nothing of why (a run registered, its first step not yet sent).
NO_STEPS_NOTE = {
    **NO_SCALARS_NOTE,
    "text": "No steps yet:<br>they appear here as the trainer sends them",
}
MAX_SCALAR_CHARTS = 4
NOT_CHARTED = frozenset({"reward_std"})  # drawn as the reward chart's band


def scalar_names(points: Iterable[Point]) -> list[str]:
    """Every scalar logged in ``points`` that the chart may draw: the well-known ones first
    (held-out accuracy, loss, KL, entropy, temperature), then the others by name."""
    seen = {name for p in points for name in (p.get("scalars") or {})} - NOT_CHARTED
    known = [s.key for s in SCALAR_SERIES if s.key in seen]
    return known + sorted(seen - set(known))


def scalar_series(names: Sequence[str]) -> tuple[Series, ...]:
    """The series of the first MAX_SCALAR_CHARTS of ``names`` (`scalar_names`)."""
    known = {s.key: s for s in SCALAR_SERIES}
    return tuple(
        known.get(n)
        or Series(n, _text(n), _scalar(n), _hover(_text(n), "as the trainer logged it", ".4g"))
        for n in names[:MAX_SCALAR_CHARTS]
    )


def _text(name: str) -> str:
    """A logged name as Plotly shows text: its HTML escaped (a scalar named `<a href=…>` was a
    link in the chart: a trial), `%` kept from starting a hover template's `%{...}`, and its
    bidirectional controls shown, not obeyed (`explain.visible`)."""
    return explain.visible(html.escape(name, quote=False).replace("%", "&#37;"))


def scalars_figure(points: Sequence[Point]) -> Figure:
    """The run's logged scalars, one small chart each: up to MAX_SCALAR_CHARTS of them, the
    well-known ones first (the title says how many more there are); a note instead of empty
    charts while none was logged."""
    names = scalar_names(points)
    series = scalar_series(names)
    title = scalars_title(non_finite_scalar(points), scalars_shown(points))
    base = _base_layout(title, SCALARS_HEIGHT)
    base["margin"] = {**base["margin"], "t": 75}  # room for the title's second line
    if not series:
        base.pop("xaxis")
        base.update(xaxis={"visible": False}, yaxis={"visible": False})
        return {"data": [], "layout": {**base, "annotations": [dict(NO_SCALARS_NOTE)]}}
    rows, cols = (1, len(series)) if len(series) <= 2 else (2, 2)
    data = _traces(series_xy(points, series), series)
    for i, trace in enumerate(data):
        trace["xaxis"], trace["yaxis"] = _axis_ref(i)
    layout = json.loads(_grid_layout(rows, cols, tuple(s.label for s in series), False))
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
        trace["xaxis"], trace["yaxis"] = _axis_ref(0 if i < len(EVAL_ACR) else 1)
    titles = ("ACR", "reward mean")
    layout = json.loads(_grid_layout(1, 2, titles, False))
    base = _base_layout(f"Evaluation (split {_text(split)})", EVAL_HEIGHT)
    base.pop("xaxis")
    layout.update(base, hovermode="closest")
    layout["yaxis"].update(range=[0, 1.02])
    return {"data": data, "layout": layout}


def extend_patch(patch: Any, points: Sequence[Point], series: Sequence[Series]) -> int:
    """Append ``points`` to the traces of ``series`` in a ``dash.Patch``; returns how many."""
    if not points:
        return 0
    for i, (xs, ys) in enumerate(series_xy(points, series)):
        patch["data"][i]["x"].extend(xs)
        patch["data"][i]["y"].extend(ys)
    return len(points)


def mitigation_modes(run: dict) -> tuple[str | None, str | None]:
    """The mode of a run's applied and of its newest requested `set_mitigation` (None: none)."""
    applied = run.get("mitigation_applied") or {}
    requested = run.get("mitigation_requested") or {}
    return (
        applied.get("mode") if isinstance(applied, dict) else applied,
        requested.get("mode") if isinstance(requested, dict) else requested,
    )


def current_mitigation(run: dict) -> str:
    """The mitigation mode the run's trainer runs: the one it last reported with its steps
    (the truth), else the last one it acked, else "none"."""
    reported = (run.get("mitigation_reported") or {}).get("mode")
    return reported or mitigation_modes(run)[0] or "none"


def _legend_mitigation(run: dict, changes: Sequence[tuple[int, str, dict]] = ()) -> str | None:
    """What the legend says of a run's mitigation: the mode in effect (what the trainer last
    reported, else the applied command's) and the first step it trained, when the run changed
    to it (a plain GRPO run that got AVSPO at step 108 read "avspo" for its whole curve: a
    trial); a requested one that differs after an arrow (not applied yet, or applied in an
    attempt that a resume without it replaced)."""
    applied, requested = mitigation_modes(run)
    reported = (run.get("mitigation_reported") or {}).get("mode")
    current = reported or applied
    if requested and requested != current:
        return f"{current or 'none'} → {requested}"
    if not current or current == "none":
        return None
    started = len(changes) == 1 and _reported(changes[0][2])  # by its config, say
    if changes and changes[-1][1] == current and not started:
        return f"{current} from step {changes[-1][0]}"
    return current


COMPARE_TITLES = (
    "ACR, lower is better (dotted: effective ACR, after AVSPO/AAPO; ◆: a mitigation applied)",
    "Reward mean (higher is better)",
)


def no_runs_figure() -> Figure:
    """The compare page's chart before any run is chosen: a note, no axes (empty axes with a
    stray line and a reward title above nothing: a trial)."""
    hidden = {"visible": False}
    note = {**NO_SCALARS_NOTE, "text": "Choose runs above to compare them", "font": {"size": 14}}
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
        # Plotly reads trace names as HTML: a run's name is text (a trial's "<b>x</b>" showed
        # bold in the legend, plain in the table)
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
    layout = json.loads(_grid_layout(2, 1, COMPARE_TITLES, True))
    base = _base_layout("Runs compared by step", 620)
    base.pop("xaxis")
    layout.update(base, hovermode="x")
    # from just below 0, as the run page: an effective ACR of 0 lay on the axis line
    layout["yaxis"].update(range=[-0.03, 1.02], title={"text": "ACR"})
    layout["yaxis2"].update(title={"text": "reward"})
    layout["xaxis2"].update(title={"text": "step"})
    return {"data": data + extra, "layout": layout}


def _short(name: str) -> str:
    """A run's name for a legend: at most LEGEND_CHARS characters, cut in the middle, so that
    names told apart by their ends (``…-seed1``, ``…-seed2``) stay apart (a trial)."""
    if len(name) <= LEGEND_CHARS:
        return name
    tail = LEGEND_CHARS // 3
    return name[: LEGEND_CHARS - tail - 1] + "…" + name[-tail:]


def _compare_trace(
    run: dict, row: int, steps: list, values: list, color: str, name: str, legend: bool = True
) -> dict:
    xref, yref = _axis_ref(row)
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


def sparkline_svg(
    values: Sequence[float | None], width: int = 120, height: int = 28, latest: float | None = None
) -> str:
    """A tiny inline SVG line of ACR values in [0, 1] (gaps skipped), with the 0.35 threshold.

    Drawn as an <img> data URI so a runs table with hundreds of rows stays light.
    """
    pts = [(i, v) for i, v in enumerate(values) if v is not None]
    n = max(len(values) - 1, 1)

    def y(v: float) -> float:
        return round(height - 2 - (height - 4) * min(max(v, 0.0), 1.0), 1)

    poly = " ".join(f"{round(i * (width - 2) / n + 1, 1)},{y(v)}" for i, v in pts)
    t = y(explain.STALL_THRESHOLD)
    last = latest if latest is not None else (pts[-1][1] if pts else None)
    color = COLORS["alert"] if last is not None and last > explain.STALL_THRESHOLD else "#1f2937"
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">'
        f'<line x1="0" y1="{t}" x2="{width}" y2="{t}" stroke="#fca5a5" stroke-dasharray="2,2"/>'
        f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{poly}"/></svg>'
    )
