"""Alerts page (/dashboard/alerts): every alert episode across the runs the key sees, firing
first; filters by state, severity, rule and project (kept in the address); a silence button
with a duration (control scope); links to each run at the alert's step."""

from __future__ import annotations

from typing import Any

import dash
from dash import Input, Output, State, callback, dcc, html, no_update
from vantage.dashboard import alert_data, context, url_state
from vantage.dashboard.pages.alerts import table
from vantage.dashboard.pages.alerts.table import AlertsOutputs, alerts_outputs

dash.register_page(__name__, path="/alerts", name="Alerts", title="Vantage · alerts", order=3)

ALERTS_REFRESH_MS = 5000
ALERTS_SHOWN = 50  # alerts listed at first; "Show more" adds as many
FILTERS = ("state", "severity", "rule", "project")  # query parameter → component alerts-<name>
_ADDRESS_STORE = url_state.keep_in_address("alerts-address", {f: f"alerts-{f}" for f in FILTERS})


def layout(**query: Any) -> html.Div:
    """The alerts page, filtered by ``?state=``, ``?severity=``, ``?rule=`` and ``?project=``."""
    info = context.current_key()
    asked = {f: url_state.one(query.get(f)) for f in FILTERS}
    options = {**alert_data.filter_options(info), "state": list(alert_data.ALERT_STATES)}
    can_control = context.can(info, "control")
    unknown = [f"{f} {asked[f]!r}" for f in FILTERS if asked[f] and asked[f] not in options[f]]
    return html.Div(
        [
            html.H2("Alerts"),
            # a bookmarked filter that names nothing this key sees is said, not dropped silently
            html.P(
                f"No {' and no '.join(unknown)} among what this key sees: left out.",
                id="alerts-unknown-filter",
                className="result-error",
            )
            if unknown
            else None,
            html.P(
                "Every alert of the runs your key sees, firing ones first. An alert is one "
                "episode of a rule on a run: pending while its condition holds for fewer "
                "steps than the rule asks, firing, then resolved. Silencing mutes its "
                "notifications, not its evaluation.",
                className="muted",
            ),
            None
            if can_control
            else html.P(
                "Read-only: your key has no control scope, so silencing is disabled.",
                className="result-error",
                id="alerts-readonly",
            ),
            html.Div(
                [
                    *(
                        dcc.Dropdown(
                            id=f"alerts-{f}",
                            options=options[f],
                            value=asked[f] if asked[f] in options[f] else None,
                            placeholder=f"any {f}",
                        )
                        for f in FILTERS
                    ),
                    html.Span(
                        [
                            html.Label("silence for ", htmlFor="alerts-silence-hours"),
                            dcc.Dropdown(
                                id="alerts-silence-hours",
                                options=[
                                    {"label": v, "value": k}
                                    for k, v in alert_data.SILENCE_HOURS.items()
                                ],
                                value="4",
                                clearable=False,
                                disabled=not can_control,
                            ),
                        ],
                        className="silence-for",
                        title="How long the Silence buttons mute an alert's notifications.",
                    ),
                ],
                className="filters card",
            ),
            _ADDRESS_STORE,
            html.Div(id="alerts-result"),
            html.Div(
                [
                    html.Div(id="alerts-body"),
                    html.Div(
                        [
                            html.Span(id="alerts-count", className="muted"),
                            html.Button(
                                f"Show {ALERTS_SHOWN} more",
                                id="alerts-more",
                                n_clicks=0,
                                style={"display": "none"},
                            ),
                        ],
                        className="runs-more",
                    ),
                ],
                className="card",
            ),
            dcc.Store(id="alerts-shown"),  # the shown alerts, for the silence buttons
            dcc.Store(id="alerts-silence-click"),  # {alert, at}: a click (`assets/alerts.js`)
            dcc.Interval(id="alerts-interval", interval=ALERTS_REFRESH_MS),
        ]
    )


@callback(
    Output("alerts-body", "children"),
    Output("alerts-count", "children"),
    Output("alerts-more", "style"),
    Output("alerts-shown", "data"),
    Input("alerts-interval", "n_intervals"),
    *(Input(f"alerts-{f}", "value") for f in FILTERS),
    Input("alerts-more", "n_clicks"),
    Input("alerts-result", "children"),  # a silence was made: show it at once
)
@context.in_thread
def refresh_alerts(_n, state, severity, rule, project, more, _result) -> AlertsOutputs:
    sent = map(url_state.sent_text, (state, severity, rule, project))
    filters = dict(zip(FILTERS, sent, strict=True))
    limit = ALERTS_SHOWN * (1 + url_state.sent_count(more))
    return alerts_outputs(context.current_key(), filters, limit)


@callback(
    Output("alerts-result", "children"),
    Input("alerts-silence-click", "data"),
    State("alerts-silence-hours", "value"),
    State("alerts-shown", "data"),
    prevent_initial_call=True,
)
@context.in_thread
def silence(click, hours, shown) -> Any:
    """Silence the clicked alert's rule on its run for the chosen time (`POST /silences`, as
    the caller). ``click``: ``{alert, at}``, which `assets/alerts.js` sets when a Silence
    button of the table (plain HTML, `table.alerts_outputs`) is clicked."""
    if not isinstance(click, dict):
        return no_update
    alert = (shown or {}).get(str(click.get("alert"))) if isinstance(shown, dict) else None
    if not isinstance(alert, dict) or hours not in alert_data.SILENCE_HOURS:
        return html.P("That alert is no longer shown; try again.", className="result-error")
    info = context.current_key()
    if not context.can(info, "control"):
        return html.P(table.READ_ONLY, className="result-error", id="alerts-silence-error")
    answer = alert_data.silence_alert(alert, float(hours), info.name)
    if not answer.ok:
        return html.P(f"Not silenced: {answer.said()}", className="result-error")
    until = answer.body["until"][:16].replace("T", " ")
    return html.P(
        f"Silenced {alert['rule']} on run {alert['run_id'][:8]} until {until} UTC "
        f"(silence {answer.body['id']}).",
        className="result-ok",
        id="alerts-silenced",
    )
