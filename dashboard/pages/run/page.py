"""Run page (/dashboard/runs/<run_id>): KPIs, the ACR chart, reward and trainer scalars, live;
commands with confirmation; prompts that keep collapsing; the run's config."""

from __future__ import annotations

from typing import Any, NamedTuple
from urllib.parse import unquote

import dash
from dash import ALL, Input, Output, State, callback, ctx, dcc, html, no_update
from vantage.dashboard import components, context, data, explain, step_focus, url_state
from vantage.dashboard.pages.run import (
    command_log,
    command_panel,
    figures,
    prompts,
    scalar_controls,
    view,
)
from vantage.dashboard.pages.run import scalars as scalar_views

dash.register_page(
    __name__, path_template="/runs/<run_id>", name="Run", title="Vantage · run", order=1
)

GRAPH_CONFIG = {"displaylogo": False, "responsive": True}
# `?step=N` (the alerts page links to a run at its alert's step): the ACR chart shows that step
_STEP_FOCUS = step_focus.keep_step_in_view("run-acr-graph", "run-step-focus")


def _graph(id_: str, help_text: str, height: int) -> html.Div:
    """A chart in a card; its element has the figure's ``height`` (px), so that Plotly's resizes
    never take a height from a container read mid-render (`figures.ACR_HEIGHT`)."""
    return html.Div(
        dcc.Graph(
            id=id_,
            config=GRAPH_CONFIG,
            figure={"data": [], "layout": {"height": height}},
            style={"height": f"{height}px"},
        ),
        className="card",
        title=help_text,
    )


def layout(run_id: str | None = None, **_query) -> html.Div:
    info = context.current_key()
    run, ambiguous = _named(info, run_id) if run_id else (None, False)
    if run is None:
        return html.Div(
            [
                _missing(run_id or "", ambiguous),
                # asks until the run is visible, then loads its page
                dcc.Store(id="run-wait-id", data=run_id or ""),
                dcc.Interval(id="run-wait", interval=context.refresh_ms()),
                dcc.Location(id="run-wait-reload", refresh=True),
            ]
        )
    run_id = run["run_id"]  # the whole id, when the address gave its start
    can_control = context.can(info, "control")
    ended = run["status"] if components.run_ended(run) else None
    settings = command_panel.current_settings(
        run, data.commands(info, run_id) or [], data.latest_point(run)
    )
    return html.Div(
        [
            dcc.Store(id="run-id", data=run_id),
            _STEP_FOCUS,
            dcc.Store(id="run-name", data=run.get("name") or run_id),
            dcc.Store(id="run-state"),
            dcc.Store(id="run-pending-command"),
            dcc.Store(id="run-command-sent"),
            dcc.Store(id="run-ended-at-load", data=ended),
            dcc.Interval(id="run-interval", interval=context.refresh_ms(), disabled=True),
            command_panel.confirm_box(),
            html.Div(id="run-header"),
            html.Div(id="run-banner"),
            html.Div(id="run-kpis", className="kpis"),
            components.primer(),
            _graph("run-acr-graph", explain.ACR, figures.ACR_HEIGHT),
            html.Div(
                [
                    html.Div(
                        _graph("run-reward-graph", explain.REWARD_MEAN, figures.REWARD_HEIGHT),
                        style={"flex": 1},
                    ),
                    html.Div(scalar_controls.card(GRAPH_CONFIG), style={"flex": 1}),
                ],
                style={"display": "flex", "gap": "1rem"},
            ),
            html.Div(id="run-eval"),  # the evaluation chart, once the run has evaluation steps
            dcc.Store(id="run-eval-last"),
            dcc.Tabs(
                id="run-tabs",
                value="commands",
                children=[
                    dcc.Tab(
                        label="Commands",
                        value="commands",
                        children=html.Div(
                            [
                                html.Div(
                                    command_panel.panel(can_control, ended, settings),
                                    id="cmd-panel",
                                ),
                                html.H4("Command log"),
                                html.Div(id="cmd-log"),
                            ],
                            className="card",
                        ),
                    ),
                    dcc.Tab(label="Prompts", value="prompts", children=prompts.tab(run_id)),
                    dcc.Tab(
                        label="Config",
                        value="config",
                        children=html.Div(id="run-config", className="card"),
                    ),
                ],
            ),
        ],
        id="run-page",
    )


@callback(
    Output("run-wait-reload", "href"),
    Input("run-wait", "n_intervals"),
    State("run-wait-id", "data"),
    prevent_initial_call=True,
)
@context.in_thread
def reload_when_visible(_n, run_id):
    """The page of a run that was not there yet (the demo prints its link before the run
    registers): loaded once the run is visible to the key."""
    if run_id and data.visible_run(context.current_key(), run_id) is not None:
        return components.run_href(run_id)
    return no_update


def _named(info, run_id: str) -> tuple[dict | None, bool]:
    """The visible run an address names, by its id or the start of exactly one visible run's
    id (the short id the pages show: it was "not found"), and whether the address is
    the start of several runs' ids (then None)."""
    run = data.visible_run(info, run_id)
    if run is not None or len(run_id) < components.SHORT_ID:
        return run, False
    ids = [r["run_id"] for r in data.visible_runs(info)]
    chosen, _, ambiguous = components.resolve_run_ids([run_id], ids)
    return (data.visible_run(info, chosen[0]) if chosen else None), bool(ambiguous)


def _missing(run_id: str, ambiguous: bool = False) -> html.Div:
    """The page of a run that does not exist or that the key may not see (no controls), or
    whose short id several runs' ids start with."""
    shown = components.shown_id(unquote(run_id))
    said = (
        f"{shown} is the start of several runs' ids: give more of the id, or pick the run "
        "from all runs."
        if ambiguous
        else f"No run {shown} is visible to this key: it was deleted, belongs to a project "
        "this key cannot see, or has not registered yet. This page shows it as soon as it "
        "appears (the demo's run registers after its warm start)."
    )
    return html.Div(
        [
            html.H2("Several runs match" if ambiguous else "Run not found"),
            html.P(said),
            dcc.Link("All runs", href=components.URL_BASE),
        ],
        id="run-missing",
    )


@callback(
    Output("run-header", "children"),
    Output("run-banner", "children"),
    Output("run-kpis", "children"),
    Output("run-state", "data"),
    Output("run-acr-graph", "figure"),
    Output("run-reward-graph", "figure"),
    Output("run-scalars-graph", "figure"),
    Output("run-config", "children"),
    Output("run-interval", "disabled"),
    Output("run-scalars-pick", "options"),
    Output("run-scalars-graph", "style"),
    Input("run-id", "data"),
    Input("run-interval", "n_intervals"),
    *(Input(control, "value") for control in scalar_controls.CONTROLS),
    State("run-state", "data"),
)
@context.in_thread
def update_run(run_id, _n, picked, smoothing, log, x, state) -> view.RunOutputs:
    info = context.current_key()
    scalar_view = scalar_views.normal_view(picked, smoothing, log, x)
    # by the view itself, not by which input fired: a tick that fired with a control (one
    # request for both) would otherwise append to the old view and drop the new one
    if state and scalar_view != state.get("scalar_view"):
        out = view.scalars_reload(info, run_id, state, scalar_view)
    elif ctx.triggered_id == "run-interval" and state:
        out = view.live_update(info, run_id, state)
    else:
        out = view.first_load(info, run_id, context.can(info, "control"), scalar_view)
    if out is None:  # deleted, or moved to a project the key may not see, since the page loaded
        blank = {"data": [], "layout": {"height": 360}}
        # nothing stale left; the page keeps asking, so a run that registers later appears
        return view.RunOutputs(
            header=_missing(run_id),
            banner=[],
            kpis=[],
            state=None,
            acr_figure=blank,
            reward_figure=blank,
            scalars_figure=blank,
            config=[],
            interval_disabled=False,
        )
    return out


@callback(
    Output("run-eval", "children"),
    Output("run-eval-last", "data"),
    Input("run-id", "data"),
    Input("run-interval", "n_intervals"),
    State("run-eval-last", "data"),
)
@context.in_thread
def update_eval(run_id, _n, last):
    """The evaluation chart (split ``eval``, as the TRL integration sends it): hidden while the
    run has no evaluation step, redrawn when a new one arrives (eval groups were stored and
    never shown)."""
    info, tick = context.current_key(), ctx.triggered_id == "run-interval"
    if tick and not data.split_points(info, run_id, EVAL_SPLIT, after_step=last):
        return no_update, no_update  # no new evaluation step
    points = data.split_points(info, run_id, EVAL_SPLIT)
    if not points:
        return [], None
    # drawn anew in a visible box (a figure drawn into a hidden one stayed zero-sized)
    graph = dcc.Graph(
        id="run-eval-graph",
        config=GRAPH_CONFIG,
        figure=figures.eval_figure(points, EVAL_SPLIT),
        style={"height": f"{figures.EVAL_HEIGHT}px"},
    )
    return html.Div(graph, className="card", title=explain.EVAL), points[-1]["step"]


EVAL_SPLIT = "eval"


@callback(
    Output("cmd-panel", "children"),
    Input("run-interval", "disabled"),
    State("run-ended-at-load", "data"),
    State("run-id", "data"),
    prevent_initial_call=True,
)
@context.in_thread
def disable_commands_when_the_run_ends(stopped, ended_at_load, run_id):
    """The actions of a run that ended while its page was open: disabled, and said why (they
    stayed enabled, and a click was refused with an error, until a reload)."""
    if not stopped or ended_at_load:
        return no_update
    info = context.current_key()
    run = data.visible_run(info, run_id)
    if run is None or not components.run_ended(run):
        return no_update
    settings = command_panel.current_settings(
        run, data.commands(info, run_id) or [], data.latest_point(run)
    )
    return command_panel.panel(context.can(info, "control"), run["status"], settings)


class ConfirmOutputs(NamedTuple):
    """The outputs of `ask_confirmation`, in the order of its ``Output``s."""

    hidden: Any = no_update
    message: Any = no_update
    pending: Any = no_update
    input_error: Any = no_update


class SendOutputs(NamedTuple):
    """The outputs of `send_command`, in the order of its ``Output``s; the confirmation closes
    whatever happened."""

    result: Any = no_update
    sent: Any = no_update
    reason: Any = no_update
    confirm_hidden: bool = True
    pending: Any = no_update


@callback(
    Output("cmd-confirm", "hidden"),
    Output("cmd-confirm-message", "children"),
    Output("run-pending-command", "data"),
    Output("cmd-input-error", "children"),
    Input({"type": "cmd", "action": ALL}, "n_clicks"),
    Input({"type": "suggest", "command": ALL}, "n_clicks"),
    Input("cmd-confirm-cancel", "n_clicks"),
    State("avspo-threshold", "value"),
    State("avspo-alpha", "value"),
    State("aapo-delta-low", "value"),
    State("aapo-delta-high", "value"),
    State("dapo-max-gen-batches", "value"),
    State("temperature-value", "value"),
    State("run-name", "data"),
    prevent_initial_call=True,
)
def ask_confirmation(
    _cmd, _suggest, _cancel, threshold, alpha, d_low, d_high, batches, temp, name
) -> ConfirmOutputs:
    trigger = ctx.triggered_id
    if trigger == "cmd-confirm-cancel":
        return ConfirmOutputs(hidden=True, pending=None, input_error="")
    if not trigger or not ctx.triggered or not ctx.triggered[0].get("value"):
        return ConfirmOutputs()
    values = {
        "avspo_threshold": threshold,
        "avspo_alpha": alpha,
        "aapo_delta_low": d_low,
        "aapo_delta_high": d_high,
        "dapo_max_gen_batches": batches,
        "temperature": temp,
    }
    try:
        kind, params, alert_id = command_panel.asked_command(trigger, values)
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        error = html.Span(str(exc), className="result-error")
        return ConfirmOutputs(hidden=True, pending=None, input_error=error)
    return ConfirmOutputs(
        hidden=False,
        message=command_panel.describe(kind, params, str(name or "")),
        pending={"type": kind, "params": params, "alert_id": alert_id},
        input_error="",
    )


@callback(
    Output("cmd-result", "children"),
    Output("run-command-sent", "data"),
    Output("cmd-reason", "value"),
    Output("cmd-confirm", "hidden", allow_duplicate=True),
    Output("run-pending-command", "data", allow_duplicate=True),
    Input("cmd-confirm-send", "n_clicks"),
    State("run-pending-command", "data"),
    State("run-id", "data"),
    State("cmd-reason", "value"),
    prevent_initial_call=True,
)
@context.in_thread
def send_command(_submit, pending, run_id, reason) -> SendOutputs:
    if not pending:  # sent already (a second click on Send), or cancelled
        return SendOutputs()
    info = context.current_key()
    try:
        kind, params, alert_id = command_panel.pending_command(pending, run_id, reason)
        cmd = data.issue_command(
            info, run_id, kind, params, reason or "from the dashboard", alert_id=alert_id
        )
    except (PermissionError, ValueError, LookupError) as exc:
        said = command_panel.one_line(exc)
        error = html.Span(f"Not sent: {said}", className="result-error", id="cmd-error")
        return SendOutputs(result=error, sent=None, pending=None)  # the reason stays for a retry
    # the command log below follows its status; a status here stayed "pending" for good
    text = (
        f"Sent {cmd['type']} (command {cmd['command_id'][:8]}); the command log below shows "
        "when the trainer applies it."
    )
    # the reason went with this command; the next one gets its own
    sent = html.Span(text, className="result-ok", id="cmd-sent")
    return SendOutputs(result=sent, sent=cmd["command_id"], reason="", pending=None)


@callback(
    Output("cmd-log", "children"),
    Input("run-id", "data"),
    Input("run-interval", "n_intervals"),
    Input("run-command-sent", "data"),
)
@context.in_thread
def refresh_command_log(run_id, _n, _sent):
    commands = data.commands(context.current_key(), run_id)
    return command_log.log_table(commands or [])


@callback(
    Output("prompts-body", "children"),
    Output("prompts-csv", "href"),
    Input("run-tabs", "value"),
    Input("prompts-side", "value"),
    Input("prompts-split", "value"),
    State("run-id", "data"),
)
@context.in_thread
def show_prompts(tab, side, split, run_id):
    # a hand-built request's list or number for a dropdown counts as nothing chosen
    side, split = url_state.sent_text(side), url_state.sent_text(split)
    href = prompts.csv_href(run_id, side, split)
    if tab != "prompts":
        return no_update, href
    rows = data.prompts(context.current_key(), run_id, side or None, split=split or None) or []
    return prompts.table(rows), href


@callback(
    Output("prompt-samples", "children"),
    Input("prompts-table", "active_cell"),
    State("run-id", "data"),
    prevent_initial_call=True,
)
@context.in_thread
def show_samples(cell, run_id):
    """A clicked prompt's latest completions and rewards ("what did the model answer?")."""
    prompt_id = cell.get("row_id") if isinstance(cell, dict) else None
    if not isinstance(prompt_id, str):
        return prompts.samples_hint()
    found = data.samples(context.current_key(), run_id, prompt_id, prompts.SAMPLES_SHOWN)
    return prompts.samples_view(prompt_id, found or [])
