"""Runs page (/dashboard/): every run, newest first, with its collapse and health at a glance."""

from __future__ import annotations

import dash
from dash import Input, Output, callback, dcc, html
from vantage.dashboard import components, context, data, url_state

dash.register_page(__name__, path="/", name="Runs", title="Vantage · runs", order=0)

RUNS_REFRESH_MS = 5000
_ADDRESS = {"project": "runs-project", "tag": "runs-tag"}


def layout(project: str | None = None, tag: str | None = None, **_query) -> html.Div:
    """The runs page, filtered by ``?project=`` and ``?tag=`` when they name one the key sees."""
    projects, tags = data.filter_options(context.current_key())
    unknown = [
        f"{what} {asked!r}"
        for what, asked, known in (("project", project, projects), ("tag", tag, tags))
        if asked and asked not in known
    ]
    return html.Div(
        [
            html.H2("Runs"),
            # a bookmarked filter that names nothing visible was dropped without a word
            html.P(
                f"No run visible to this key has the {' or the '.join(unknown)}: showing all.",
                id="runs-unknown-filter",
                className="result-error",
            )
            if unknown
            else None,
            html.P(
                "Each GRPO run with its advantage collapse rate (ACR): the share of prompt groups "
                "whose completions all got the same reward and so taught the model nothing. Red "
                "means above 0.35, where runs tend to stall. Hover over any column title.",
                className="muted",
            ),
            components.primer(),
            html.Div(
                [
                    _filter("runs-project", projects, project, "all projects"),
                    _filter("runs-tag", tags, tag, "all tags"),
                ],
                className="filters card",
            ),
            _ADDRESS_STORE,
            html.Div(html.Div(id="runs-body"), className="card"),
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


@callback(
    Output("runs-body", "children"),
    Output("runs-project", "options"),
    Output("runs-tag", "options"),
    Input("runs-interval", "n_intervals"),
    Input("runs-project", "value"),
    Input("runs-tag", "value"),
)
@context.in_thread
def refresh_runs(_n, project, tag):
    info = context.current_key()
    runs = data.runs_overview(info, project, tag)
    projects, tags = data.filter_options(info)
    return components.runs_table(runs), projects, tags
