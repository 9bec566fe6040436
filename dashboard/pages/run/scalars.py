"""How the run page's scalars chart is viewed: which logged scalars it charts, their smoothing,
a log scale, and steps or wall time on x; and the live appends that keep a view as it is. No I/O.

A view is a plain dict (it lives in the page's state): ``names`` (the chosen scalars, or None
for the default: the first MAX_SCALAR_CHARTS of `series.scalar_names`), ``smoothing`` (0 to
SMOOTH_MAX), ``log`` and ``x`` (``"step"`` or ``"time"``). With smoothing, each scalar has two
traces, its raw values (faint) then their smoothed line; without, one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from vantage.dashboard.figures import Point

from .series import MAX_SCALAR_CHARTS, Series, scalar_names, scalar_series

MAX_PICKED = 8  # scalars one view charts: 4 rows of 2
SMOOTH_MAX = 0.99
X_MODES = ("step", "time")
DEFAULT_VIEW: dict[str, Any] = {"names": None, "smoothing": 0.0, "log": False, "x": "step"}
ROW_HEIGHT = 200  # px a row of charts past the second


def normal_view(names: Any = None, smoothing: Any = 0.0, log: Any = False, x: Any = "step") -> dict:
    """A view from the controls' values as a browser sent them (anything: a hand-built request
    gets the default for what it garbled): at most MAX_PICKED names (none chosen is the
    default), smoothing clamped to [0, SMOOTH_MAX], log a bool, x one of X_MODES."""
    picked = [n for n in names if isinstance(n, str)] if isinstance(names, list) else []
    number = isinstance(smoothing, int | float) and not isinstance(smoothing, bool)
    weight = smoothing if number else 0.0
    weight = min(SMOOTH_MAX, max(0.0, float(weight))) if math.isfinite(weight) else 0.0
    on = log is True or (isinstance(log, list) and "log" in log)  # a checklist's value
    return {
        "names": list(dict.fromkeys(picked))[:MAX_PICKED] or None,
        "smoothing": weight,
        "log": on,
        "x": x if x in X_MODES else "step",
    }


def charted(points: Sequence[Point], view: dict | None) -> list[str]:
    """The names a view charts: its own, else the first MAX_SCALAR_CHARTS logged."""
    names = (view or {}).get("names")
    return list(names) if names else scalar_names(points)[:MAX_SCALAR_CHARTS]


def charted_series(names: Sequence[str]) -> tuple[Series, ...]:
    """The series of ``names``, each of them (a view's own may be more than the default's)."""
    return scalar_series(names, limit=len(names))


def traces_per_scalar(view: dict | None) -> int:
    """2 with smoothing (raw, smoothed), else 1."""
    return 2 if (view or {}).get("smoothing") else 1


def smooth(values: Sequence[Any], weight: float, last: float | None = None) -> tuple[list, Any]:
    """An exponential moving average as TensorBoard's smoothing slider draws it:
    ``s_t = weight·s_(t−1) + (1 − weight)·v_t``, starting at the first value (or continuing from
    ``last``, the average so far). A gap (None) stays a gap and leaves the average as it is.
    Returns (the smoothed values, the average after them)."""
    out = []
    for v in values:
        if v is None:
            out.append(None)
            continue
        last = v if last is None else weight * last + (1 - weight) * v
        out.append(last)
    return out, last


def x_values(points: Sequence[Point], mode: str) -> list:
    """Each point's step, or for ``time`` its wall time (UTC, ISO 8601, as Plotly's date axis
    reads it; None for a step sent without a time)."""
    if mode != "time":
        return [p["step"] for p in points]
    return [
        None if p.get("time") is None else datetime.fromtimestamp(p["time"], UTC).isoformat()
        for p in points
    ]


def ema_state(points: Sequence[Point], names: Sequence[str], view: dict | None) -> dict:
    """Per charted name, its smoothed average after ``points`` (None without smoothing), so
    that live appends continue the line."""
    weight = (view or {}).get("smoothing") or 0.0
    if not weight:
        return {}
    series = charted_series(names)
    return {s.key: smooth([s.value(p) for p in points], weight)[1] for s in series}


def extend(patch: Any, points: Sequence[Point], names: Sequence[str], view: dict | None,
           ema: dict) -> dict:  # fmt: skip
    """Append ``points`` to the traces of ``names`` in a ``dash.Patch``, smoothed lines
    continuing from ``ema``; returns the averages after them."""
    view = view or DEFAULT_VIEW
    per, weight = traces_per_scalar(view), view.get("smoothing") or 0.0
    xs = x_values(points, view.get("x", "step"))
    ema = dict(ema)
    for i, s in enumerate(charted_series(names)):
        ys = [s.value(p) for p in points]
        patch["data"][per * i]["x"].extend(xs)
        patch["data"][per * i]["y"].extend(ys)
        if per == 2:
            smoothed, ema[s.key] = smooth(ys, weight, ema.get(s.key))
            patch["data"][per * i + 1]["x"].extend(xs)
            patch["data"][per * i + 1]["y"].extend(smoothed)
    return ema


def append_late(patch: Any, point: Point, late: set[str], names: Sequence[str],
                view: dict | None, ema: dict) -> dict:  # fmt: skip
    """Append the ``late`` scalars of ``point`` (a step drawn before they arrived) to their
    traces in ``patch``; returns the averages after them."""
    view = view or DEFAULT_VIEW
    per, weight = traces_per_scalar(view), view.get("smoothing") or 0.0
    (x,) = x_values([point], view.get("x", "step"))
    ema = dict(ema)
    for i, s in enumerate(charted_series(names)):
        if s.key not in late:
            continue
        y = s.value(point)
        patch["data"][per * i]["x"].append(x)
        patch["data"][per * i]["y"].append(y)
        if per == 2:
            (smoothed,), ema[s.key] = smooth([y], weight, ema.get(s.key))
            patch["data"][per * i + 1]["x"].append(x)
            patch["data"][per * i + 1]["y"].append(smoothed)
    return ema


def grid(n: int) -> tuple[int, int]:
    """(rows, columns) of ``n`` small charts: one row up to 2, then 2 a row."""
    return (1, max(1, n)) if n <= 2 else (math.ceil(n / 2), 2)


def height(n: int, base: int) -> int:
    """The chart's height (px) for ``n`` scalars: ``base`` up to two rows, ROW_HEIGHT a row
    beyond."""
    rows = grid(n)[0]
    return base if rows <= 2 else base + ROW_HEIGHT * (rows - 2)


def view_note(view: dict | None) -> str | None:
    """What the title says of a view that is not the plain one ("smoothed 0.6 · log scale")."""
    view = view or DEFAULT_VIEW
    notes = []
    if view.get("smoothing"):
        notes.append(f"smoothed {view['smoothing']:g} (faint: raw)")
    if view.get("log"):
        notes.append("log scale (values ≤ 0 not drawn)")
    if view.get("x") == "time":
        notes.append("wall time (UTC)")
    return " · ".join(notes) or None
