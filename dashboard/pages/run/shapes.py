"""The shapes over the ACR chart: the stall threshold, where each attempt took over, the bands
of each mitigation and the marks of the other commands."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from vantage.dashboard import explain
from vantage.dashboard.figures import (
    COLORS,
    Point,
    mitigation_changes,
    plotly_text,
    reported_change,
)

# AAPO's band was the orange of the all-fail share beside it in the legend: yellow
# Okabe-Ito bluish green and yellow: AVSPO's blue tint vanished over the light-blue all-pass
# area; each band also starts with a line of its colour (`mitigation_shapes`).
_MITIGATION_RGBA = {
    "avspo": (0, 158, 115, 0.12),
    "aapo": (240, 228, 66, 0.25),
    "dapo": (204, 121, 167, 0.15),  # Okabe-Ito reddish purple
}
MITIGATION_COLORS = {m: f"rgba({r}, {g}, {b}, {a})" for m, (r, g, b, a) in _MITIGATION_RGBA.items()}
# a band's start line: its fill colour, opaque
_BAND_EDGES = {
    MITIGATION_COLORS[m]: f"rgb({r}, {g}, {b})" for m, (r, g, b, _a) in _MITIGATION_RGBA.items()
}


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
                    # label running right from it was cut at the chart's edge)
                    "textposition": "top left" if start < span / 2 else "top right",
                    # above the plotting area: inside it, the label lay over the band's start
                    # line and over the alert triangles on a high raw ACR (issue 42)
                    "yanchor": "bottom",
                    "padding": 4,
                    "font": {"size": 10, "color": "#374151"},
                },
            }
        )
    return bands


def _command_label(item: dict) -> str:
    """A marked command's label: "temperature 1.3", "checkpoint", "stop"."""
    if item.get("type") == "set_sampling":
        params = item.get("params") or {}
        said = [
            f"{plotly_text(str(k))} {v:g}" if isinstance(v, int | float) else plotly_text(str(k))
            for k, v in params.items()
        ]
        return " ".join(said) or "sampling"
    return plotly_text(str(item.get("type")))


def command_marks(timeline: Iterable[dict], last_step: int | None = None) -> list[dict]:
    """A dotted grey line, labelled at its foot, at the step where each temperature change
    (``set_sampling``), checkpoint and stop of ``timeline`` was applied (shapes named
    "command"): the chart showed mitigations only, and where the others took effect could not
    be seen. Pending, rejected and expired commands get none, nor one acked at a step
    past ``last_step``, the chart's last (an ack at step 1,000,000 stretched the axis of an
    11-step run until its steps could not be seen); a live update draws it once the
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
    starts (a band alone hid where a mitigation began behind the stacked areas), and
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


def _band_label(mode: str, item: dict, width: float, last: bool, n_bands: int) -> str:
    """A mitigation band's label, as long as its ``width`` (a share of the run's steps) has room
    for: the command in full, the mode alone, or nothing (a run that switched often had its
    labels piled on one another); the latest band names at least its mode. The command log
    has every command in full."""
    if width >= 0.2 or n_bands == 1:
        if reported_change(item):  # a mode the trainer reports may be any name: text
            return f"{plotly_text(mode.upper())} · reported by the trainer"
        who = plotly_text(item.get("issued_by") or "?")  # "alert:<rule name>": a name is text
        cid = str(item["command_id"])[:8]
        return f"{plotly_text(mode.upper())} · {item.get('status', '')} · cmd {cid} by {who}"
    return plotly_text(mode.upper()) if width >= 0.05 or last else ""


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
    "attempt 2" in its header only)."""
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
