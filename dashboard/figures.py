"""What every chart of the dashboard is built from: colours, layouts, subplot grids, the
mitigation changes of a run's timeline, text as Plotly shows it. No I/O.

Builders return the figure as its JSON dict (what ``go.Figure(...).to_plotly_json()`` gives), not
as a ``go.Figure``: validating and serialising a ``go.Figure`` of 8 series × 5,000 steps costs
~90 ms, the dict ~4 ms, and the run page has a 500 ms budget at 100,000 steps. ``go.Figure(d)``
validates one (the tests do). The pages' own figures live beside them
(``pages/run/figures.py``, ``pages/compare/figures.py``).
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable
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

# A note in the middle of a chart, in place of data it does not have yet.
NOTE = {"xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5, "showarrow": False}


# Below this many steps on the x axis, a tick at every step: Plotly's own ticks fell between
# steps (0.5, 1.5) on a short run, and a step is a whole number.
FEW_STEPS = 10


def step_dtick(first: int | None, last: int | None) -> int | None:
    """The x axis's ``dtick`` for steps ``first`` to ``last``: 1 while they span fewer than
    FEW_STEPS steps, else None (Plotly's ticks, whole numbers at that span)."""
    if first is None or last is None or last - first >= FEW_STEPS:
        return None
    return 1


def base_layout(title: str, height: int = 380) -> dict:
    """The layout every chart starts from: its title, height, legend below, steps on x."""
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
    step 4 began at step 4, where the summary said "in effect from step 5")."""
    changes = []
    for item in timeline:
        if item.get("type") != "set_mitigation" or item.get("status") in ("rejected", "expired"):
            continue
        step = item.get("step")
        if step is None:
            continue
        first = step if reported_change(item) else step + 1
        changes.append((first, (item.get("params") or {}).get("mode", "none"), item))
    changes.sort(key=lambda c: c[0])
    # a mode set again (a second Enable AVSPO) changes nothing: the band and the legend date
    # from the first (they took the second's step)
    return [c for i, c in enumerate(changes) if i == 0 or c[1] != changes[i - 1][1]]


def reported_change(item: dict) -> bool:
    """Whether a timeline entry is a change the trainer reported that no command made (a
    mitigation its config started, say)."""
    return item.get("issued_by") == "trainer" and not item.get("command_id")


@lru_cache(maxsize=8)
def grid_layout(rows: int, cols: int, titles: tuple[str, ...], shared_x: bool) -> str:
    """The axes and titles of a subplot grid, as JSON (built once; copied per figure)."""
    fig = make_subplots(
        rows=rows,
        cols=cols,
        subplot_titles=list(titles),
        shared_xaxes=shared_x,
        vertical_spacing=0.18 if rows > 1 and not shared_x else 0.1,
    )
    return json.dumps(fig.layout.to_plotly_json())


def axis_ref(index: int) -> tuple[str, str]:
    """The x and y axes of subplot ``index`` (0-based) of a grid, as traces name them."""
    return ("x", "y") if index == 0 else (f"x{index + 1}", f"y{index + 1}")


def plotly_text(name: str) -> str:
    """A logged name as Plotly shows text: its HTML escaped (a scalar named `<a href=…>` was a
    link in the chart), `%` kept from starting a hover template's `%{...}`, and its
    bidirectional controls shown, not obeyed (`explain.visible`)."""
    return explain.visible(html.escape(name, quote=False).replace("%", "&#37;"))
