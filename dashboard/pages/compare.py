"""Compare page (/dashboard/compare?runs=a,b,c): ACR and reward of chosen runs by step, with
their window metrics side by side (e.g. GRPO vs AVSPO vs AAPO on the same task)."""

from __future__ import annotations

import dash
from dash import Input, Output, State, callback, ctx, dcc, html, no_update
from vantage.dashboard import components, context, data, explain, figures, kpis, url_state

dash.register_page(__name__, path="/compare", name="Compare", title="Vantage · compare", order=2)

COMMON_COLUMNS = [
    ("acr", "ACR", explain.ACR),
    ("acr_effective", "effective ACR", explain.ACR_EFFECTIVE),
    ("reward_mean", "reward", "Mean reward of the step's completions."),
    ("eval_accuracy", "eval accuracy", "Held-out accuracy, as the trainer logs it (the "
     "`eval_accuracy` scalar), with the step it was measured at when that is an earlier "
     "one; — when it logs none."),
]  # fmt: skip
COMMON_STEP = (
    "Taken at the last step every chosen run reached (its newest point by then), so that the "
    "runs compare at the same step."
)
WINDOW_COLUMNS = [
    ("acr_pooled", "ACR pooled", "Collapsed groups / valid groups over the whole run."),
    ("acr_100", "ACR first 100", explain.ACR_100),
    ("acr_ema", "ACR EMA", explain.ACR_EMA),
    ("acr_volatility", "ACR volatility", "Std of the last 25 step ACRs: a jumpy run is unstable."),
    ("acr_streak", "current streak > 0.35", explain.ACR_STREAK),
]


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
        ]
    )


_ADDRESS_STORE = url_state.keep_in_address("compare-address", {"runs": "compare-runs"})


@callback(
    Output("compare-graph", "figure"),
    Output("compare-table", "children"),
    Output("compare-marks", "data"),
    Input("compare-runs", "value"),
    Input("compare-interval", "n_intervals"),
    State("compare-marks", "data"),
)
@context.in_thread
def show_comparison(run_ids, _n, marks):
    info, run_ids = context.current_key(), url_state.sent_texts(run_ids)
    now = data.run_marks(info, run_ids)
    if ctx.triggered_id == "compare-interval" and now == marks:
        return no_update, no_update, no_update  # nothing new: keep the page as it is
    result = data.compare(info, run_ids)
    return *_comparison(result), now


def _comparison(result: dict) -> tuple:
    """The figure and the table of ``data.compare``'s result."""
    if not result["runs"]:
        return figures.no_runs_figure(), html.P("Choose runs above.", className="muted")
    fig = figures.compare_figure(result["runs"], result["metrics"], result.get("timelines"))
    common, at = kpis.at_common_step(
        {r["run_id"]: result["metrics"].get(r["run_id"]) or [] for r in result["runs"]}
    )
    when = f"at step {common}" if common is not None else "at a common step"
    head = html.Tr(
        [html.Th("run"), html.Th("mitigation"), html.Th("last step")]
        + [html.Th(f"{label} {when}", title=f"{help_text} {COMMON_STEP}")
           for _k, label, help_text in COMMON_COLUMNS]
        + [html.Th(label, title=help_text) for _k, label, help_text in WINDOW_COLUMNS]
        + [html.Th("CSV")]
    )  # fmt: skip
    rows = []
    for run in result["runs"]:
        window = result["windows"].get(run["run_id"], {})
        values = at.get(run["run_id"], {})
        mit, mit_help = components.mitigation_text(run)
        rows.append(
            html.Tr(
                [
                    html.Td(
                        dcc.Link(
                            run.get("name") or run["run_id"][:8],
                            href=components.run_href(run["run_id"]),
                        ),
                        className="wrap",
                    ),
                    html.Td(mit, title=mit_help),
                    html.Td(explain.fmt(run.get("last_step"))),
                ]
                + [
                    html.Td(
                        kpis.common_cell(values, k, common),
                        className=components.acr_class(values.get(k))
                        if k.startswith("acr")
                        else "",
                    )
                    for k, _l, _h in COMMON_COLUMNS
                ]
                + [
                    html.Td(
                        explain.fmt(window.get(k))
                        if k != "acr_streak"
                        else explain.fmt(window.get(k), 0)
                    )
                    for k, _l, _h in WINDOW_COLUMNS
                ]
                + [
                    html.Td(
                        html.A(
                            "metrics",
                            href=f"/dashboard/export/{run['run_id']}/metrics.csv",
                            download="",
                        )
                    )
                ]
            )  # fmt: skip
        )
    table = html.Table([html.Thead(head), html.Tbody(rows)], className="runs", id="compare-tbl")
    return fig, table
