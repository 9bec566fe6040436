"""The run page's scalars card: which logged scalars to chart, smoothing, log scale, step or
wall time on x, above the chart (`scalars.normal_view` reads the controls' values)."""

from __future__ import annotations

from dash import dcc, html

from . import figures, series
from . import scalars as scalar_views

CONTROLS = ("run-scalars-pick", "run-scalars-smooth", "run-scalars-log", "run-scalars-x")


def card(graph_config: dict) -> html.Div:
    """The trainer's scalars: which to chart (any logged), smoothing, log scale, step or wall
    time on x, above the chart (`scalars.normal_view` reads the controls)."""
    controls = html.Div(
        [
            dcc.Dropdown(
                id="run-scalars-pick",
                options=[],
                multi=True,
                placeholder=f"the first {series.MAX_SCALAR_CHARTS} scalars: pick any "
                f"(up to {scalar_views.MAX_PICKED})",
                style={"minWidth": "16rem", "flex": 2},
            ),
            html.Div(
                [
                    html.Span("smoothing", className="muted"),
                    dcc.Slider(
                        id="run-scalars-smooth",
                        min=0,
                        max=scalar_views.SMOOTH_MAX,
                        step=0.01,
                        value=0,
                        marks={0: "0", 0.5: "0.5", 0.9: "0.9"},
                        tooltip={"placement": "bottom"},
                    ),
                ],
                title="An exponential moving average, as TensorBoard's slider: 0 draws the "
                "values as logged; with smoothing the raw values stay, faint, behind the line.",
                style={"minWidth": "10rem", "flex": 1},
            ),
            dcc.Checklist(
                id="run-scalars-log",
                options=[{"label": " log scale", "value": "log"}],
                value=[],
            ),
            dcc.RadioItems(
                id="run-scalars-x",
                options=[
                    {"label": " step", "value": "step"},
                    {"label": " wall time", "value": "time"},
                ],
                value="step",
                inline=True,
            ),
        ],
        className="filters",
    )
    graph = dcc.Graph(
        id="run-scalars-graph",
        config=graph_config,
        figure={"data": [], "layout": {"height": figures.SCALARS_HEIGHT}},
        style={"height": f"{figures.SCALARS_HEIGHT}px"},
    )
    help_text = "The trainer's own logged scalars; pick any of them above."
    return html.Div([controls, graph], className="card", title=help_text)
