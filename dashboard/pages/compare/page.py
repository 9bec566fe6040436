"""Compare page (/dashboard/compare?runs=a,b,c): ACR and reward of chosen runs by step, with
their window metrics side by side (e.g. GRPO vs AVSPO vs AAPO on the same task)."""

from __future__ import annotations

from typing import Any, NamedTuple

import dash
from dash import Input, Output, State, callback, ctx, dcc, html, no_update
from vantage.dashboard import components, context, data, url_state
from vantage.dashboard.pages.compare import side_by_side
from vantage.dashboard.pages.compare.figures import compare_figure, no_runs_figure
from vantage.dashboard.pages.compare.table import comparison_table

dash.register_page(__name__, path="/compare", name="Compare", title="Vantage · compare", order=2)


def layout(runs: str | None = None, **_query) -> html.Div:
    runs = url_state.joined(runs)
    asked = list(dict.fromkeys(r.strip() for r in (runs or "").split(",") if r.strip()))
    options = [
        {"label": f"{r.get('name') or r['run_id'][:8]} · {r['run_id'][:8]}", "value": r["run_id"]}
        for r in data.visible_runs(context.current_key())
    ]
    chosen, unknown, ambiguous = components.resolve_run_ids(asked, [o["value"] for o in options])
    missing = [components.shown_id(r) for r in unknown]
    shared = ", ".join(components.shown_id(r) for r in ambiguous[:10])
    return html.Div(
        [
            html.H2("Compare runs"),
            html.P(
                "Pick runs of the same task (for example plain GRPO, AVSPO and AAPO) to see "
                "whether a mitigation lowers collapse and what it does to reward. AVSPO and AAPO "
                "leave the raw ACR (solid) as it is and give the collapsed groups a gradient: "
                "their effect is the effective ACR (dotted): whether collapsed groups still "
                "teach, which a mitigation lowers by design. Which run learns better is the "
                "held-out accuracy and reward at the same step: the table gives both at the last "
                "step every chosen run reached (one run a setting is one seed: compare a few "
                "before trusting a small difference).",
                className="muted",
            ),
            html.P(
                f"Not found or not visible to this key: {', '.join(missing[:10])}"
                + (f" and {len(missing) - 10:,} more" if len(missing) > 10 else ""),
                id="compare-missing",
                className="muted",
            )
            if missing
            else None,
            html.P(
                f"The start of several runs' ids (give more of the id): {shared}",
                id="compare-ambiguous",
                className="muted",
            )
            if ambiguous
            else None,
            dcc.Dropdown(
                id="compare-runs",
                options=options,
                multi=True,
                value=chosen,
                placeholder="choose runs to compare",
            ),
            _ADDRESS_STORE,
            # live: redrawn when a compared run has new steps or another status
            dcc.Interval(id="compare-interval", interval=context.refresh_ms(times=2)),
            dcc.Store(id="compare-marks"),
            html.Div(
                dcc.Graph(id="compare-graph", config={"displaylogo": False}), className="card"
            ),
            html.Div(id="compare-table", className="card"),
            html.Div(id="compare-side-card", className="card"),
            html.Div(id="compare-config-card", className="card"),
        ]
    )


_ADDRESS_STORE = url_state.keep_in_address("compare-address", {"runs": "compare-runs"})


class ComparisonOutputs(NamedTuple):
    """The outputs of `show_comparison`, in the order of its ``Output``s."""

    figure: Any
    table: Any
    marks: Any
    side: Any = no_update
    config: Any = no_update


@callback(
    Output("compare-graph", "figure"),
    Output("compare-table", "children"),
    Output("compare-marks", "data"),
    Output("compare-side-card", "children"),
    Output("compare-config-card", "children"),
    Input("compare-runs", "value"),
    Input("compare-interval", "n_intervals"),
    State("compare-marks", "data"),
)
@context.in_thread
def show_comparison(run_ids, _n, marks) -> ComparisonOutputs:
    info, run_ids = context.current_key(), url_state.sent_texts(run_ids)
    now = data.run_marks(info, run_ids)
    if ctx.triggered_id == "compare-interval" and now == marks:
        return ComparisonOutputs(no_update, no_update, no_update)  # nothing new: keep the page
    result = data.compare(info, run_ids)
    if not result["runs"]:
        return ComparisonOutputs(
            no_runs_figure(), html.P("Choose runs above.", className="muted"), now, [], []
        )
    figure = compare_figure(result["runs"], result["metrics"], result.get("timelines"))
    side = [html.H4("Side by side"), side_by_side.metrics_table(result)]
    config = side_by_side.config_table(result["runs"])
    return ComparisonOutputs(figure, comparison_table(result), now, side, config)
