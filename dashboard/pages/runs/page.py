"""Runs page (/dashboard/): every run, newest first, with its collapse and health at a glance."""

from __future__ import annotations

from typing import Any, NamedTuple

import dash
from dash import Input, Output, callback, dcc, html
from vantage.dashboard import components, context, data, url_state
from vantage.dashboard.components import cost_text
from vantage.dashboard.html_text import to_html
from vantage.dashboard.pages.runs.table import runs_table

dash.register_page(__name__, path="/", name="Runs", title="Vantage · runs", order=0)

RUNS_REFRESH_MS = 5000
RUNS_SHOWN = 50  # runs listed at first; "Show more" adds as many (each refresh reads theirs)
_ADDRESS = {
    "project": "runs-project",
    "tag": "runs-tag",
    "status": "runs-status",
    "order": "runs-order",
}


def layout(
    project: str | None = None,
    tag: str | None = None,
    status: str | None = None,
    order: str | None = None,
    **_query,
) -> html.Div:
    """The runs page, filtered by ``?project=``, ``?tag=`` and ``?status=`` when they name one
    the key sees, in ``?order=`` (a `data.RUN_ORDERS` key). A filter the page cannot apply is
    said, not dropped silently; a repeated one counts once (`url_state.one`)."""
    project, tag, status, order = map(url_state.one, (project, tag, status, order))
    info = context.current_key()
    projects, tags = data.filter_options(info)
    if (project and project not in projects) or (tag and tag not in tags):
        projects, tags = data.filter_options(info, fresh=True)  # a run newer than the cache's
    unknown = [
        f"{what} {asked!r}"
        for what, asked, known in (
            ("project", project, projects),
            ("tag", tag, tags),
            ("status", status, data.RUN_STATUSES),
        )
        if asked and asked not in known
    ]
    return html.Div(
        [
            html.H2("Runs"),
            # a bookmarked filter that names nothing visible was dropped without a word; the
            # others still apply ("showing all" read as if none did)
            html.P(
                f"No run visible to this key has the {' or the '.join(unknown)}: "
                f"{'that filter is' if len(unknown) == 1 else 'those filters are'} left out.",
                id="runs-unknown-filter",
                className="result-error",
            )
            if unknown
            else None,
            html.P(
                f"No order {order!r}: showing {data.RUN_ORDERS['newest'].lower()} (the orders: "
                f"{', '.join(data.RUN_ORDERS)}).",
                id="runs-unknown-order",
                className="result-error",
            )
            if order and order not in data.RUN_ORDERS
            else None,
            html.P(
                "Each GRPO run with its health in one word and its advantage collapse rate (ACR): "
                "the share of prompt groups whose completions all got the same reward and so "
                "taught the model nothing. Red means above 0.35, where runs tend to stall. Hover "
                "over any column title or verdict.",
                className="muted",
            ),
            components.primer(),
            html.Div(
                [
                    _filter("runs-project", projects, project, "all projects"),
                    _filter("runs-tag", tags, tag, "all tags"),
                    _filter("runs-status", list(data.RUN_STATUSES), status, "any status"),
                    dcc.Dropdown(  # unset: newest first, and no ?order= in the address
                        id="runs-order",
                        options=[{"label": v, "value": k} for k, v in data.RUN_ORDERS.items()],
                        value=order if order in data.RUN_ORDERS else None,
                        placeholder=data.RUN_ORDERS["newest"],
                    ),
                ],
                className="filters card",
            ),
            _ADDRESS_STORE,
            html.Div(id="runs-costs", className="project-costs"),
            html.Div(
                [
                    html.Div(id="runs-body"),
                    html.Div(
                        [
                            html.Span(id="runs-count", className="muted"),
                            html.Button(
                                f"Show {RUNS_SHOWN} more",
                                id="runs-more",
                                n_clicks=0,
                                style={"display": "none"},
                            ),
                        ],
                        className="runs-more",
                    ),
                ],
                className="card",
            ),
            dcc.Interval(id="runs-interval", interval=RUNS_REFRESH_MS),
        ]
    )


_ADDRESS_STORE = url_state.keep_in_address("runs-address", _ADDRESS)


def _filter(component_id: str, options: list[str], asked: str | None, everything: str):
    """A filter's dropdown, set to ``asked`` (from the address) when it is one of ``options``."""
    value = asked if asked in options else None
    return dcc.Dropdown(
        id=component_id, options=options, value=value, placeholder=everything, clearable=True
    )


class RunsOutputs(NamedTuple):
    """The outputs of `refresh_runs`, in the order of its ``Output``s."""

    body: Any
    project_options: list[str]
    tag_options: list[str]
    count: str
    more_style: dict


@callback(
    Output("runs-body", "children"),
    Output("runs-project", "options"),
    Output("runs-tag", "options"),
    Output("runs-count", "children"),
    Output("runs-more", "style"),
    Input("runs-interval", "n_intervals"),
    Input("runs-project", "value"),
    Input("runs-tag", "value"),
    Input("runs-status", "value"),
    Input("runs-order", "value"),
    Input("runs-more", "n_clicks"),
)
@context.in_thread
def refresh_runs(_n, project, tag, status, order, more) -> RunsOutputs:
    info = context.current_key()
    project, tag, status, order = map(url_state.sent_text, (project, tag, status, order))
    limit = RUNS_SHOWN * (1 + url_state.sent_count(more))
    runs, total = data.runs_overview(info, project, tag, status, order or "newest", limit)
    projects, tags = data.filter_options(info)
    if (project and project not in projects) or (tag and tag not in tags):
        # a run newer than the cached lists: without its project among the options, the
        # dropdown would drop the value it shows
        projects, tags = data.filter_options(info, fresh=True)
    if not runs and (project or tag or status):  # "No runs yet" read as an empty server
        table = html.P("No run matches these filters.", className="muted", id="runs-empty")
    else:
        table = runs_table(runs)
    # one component: as ~1,200 Dash components, 50 rows took seconds to appear (`html_text`)
    body = dcc.Markdown(to_html(table), dangerously_allow_html=True, className="runs-html")
    count = f"{len(runs):,} of {total:,} runs" if total > len(runs) else ""
    more_style = {} if total > len(runs) else {"display": "none"}
    return RunsOutputs(body, projects, tags, count, more_style)


@callback(
    Output("runs-costs", "children"),
    Input("runs-interval", "n_intervals"),
    Input("runs-project", "value"),
)
@context.in_thread
def refresh_costs(_n, project) -> Any:
    """The cost of collapse summed per project (`data.project_costs`, cached for a minute)."""
    costs = data.project_costs(context.current_key(), url_state.sent_text(project))
    if not costs:
        return None
    items: list[Any] = [html.B("Wasted rollouts (raw) by project: ")]
    for name, cost in sorted(costs.items(), key=lambda kv: -kv[1]["wasted_rollouts"]):
        text, help_text = cost_text(cost)
        runs = f"{cost['runs']:,} run{'s' if cost['runs'] != 1 else ''}"
        items.append(
            html.Span(
                [html.Span(name or "(no project)", className="muted"), f" {text} ({runs}) "],
                title=help_text
                + f" GPU-hours count the {cost['runs_with_gpus']:,} of {runs} that report them.",
                className="project-cost",
                **{"data-project": name or ""},
            )
        )
    return components.plain(items)
