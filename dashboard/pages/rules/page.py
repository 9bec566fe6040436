"""Rules page (/dashboard/rules): every alert rule the key sees; with the control scope, create,
edit, enable or disable and delete rules (notify targets and the mitigation command included),
and send a test message to each target. Changes go through the API as the caller
(`alert_data.call_api`), so they are checked as API calls are."""

from __future__ import annotations

from typing import Any

import dash
from dash import ALL, Input, Output, State, callback, ctx, html, no_update
from dash.exceptions import PreventUpdate
from vantage.dashboard import alert_data, context, url_state
from vantage.dashboard.pages.rules import form
from vantage.dashboard.pages.rules.table import rules_table

dash.register_page(__name__, path="/rules", name="Rules", title="Vantage · rules", order=4)

READ_ONLY = "Needs an API key with the control scope."
FIELD = {"type": "rule-field", "field": ALL}
RULES_API = "/api/v1/alert-rules"


def layout(**_query: Any) -> html.Div:
    can_control = context.can(context.current_key(), "control")
    fields = form.shown_fields()
    editor = html.Div(
        [
            html.Div(
                [
                    html.H3("New rule", id="rules-form-title"),
                    html.Button("New rule", id="rules-new", className="secondary", n_clicks=0),
                ],
                className="form-head",
            ),
            html.Div(form.inputs(fields, form.form_values(fields, None)), className="rule-form"),
            html.Button("Save rule", id="rules-save", className="action", n_clicks=0),
            # the save's answer beside the button (at the page's top it went unseen)
            html.Div(id="rules-form-result"),
        ],
        className="card",
        id="rules-editor",
        # there, hidden, for a read-only key: its callbacks' inputs must exist on the page
        hidden=not can_control,
    )
    readonly = html.P(
        "Read-only: your key has no control scope, so rules cannot be changed here.",
        className="result-error",
        id="rules-readonly",
    )
    return html.Div(
        [
            html.H2("Alert rules"),
            html.P(
                "A rule watches a metric of every run (or a project's, or one run's) at each "
                "step, fires an alert when its condition holds long enough, tells its targets, "
                "and may issue a command. Built-in rules can be edited or disabled.",
                className="muted",
            ),
            readonly if not can_control else None,
            html.Div(id="rules-result"),
            html.Div(html.Div(id="rules-body"), className="card"),
            editor,
            dash.dcc.Store(id="rules-editing"),  # the rule being edited (None: a new one)
        ]
    )


@callback(
    Output("rules-body", "children"),
    Input("rules-result", "children"),
    Input("rules-form-result", "children"),
)
@context.in_thread
def refresh_rules(_result, _saved) -> Any:
    info = context.current_key()
    why_not = None if context.can(info, "control") else READ_ONLY
    return rules_table(alert_data.rules(info), why_not)


def _clicked() -> bool:
    """Whether the callback runs for a click (not for buttons drawn again)."""
    return bool(ctx.triggered) and url_state.sent_count(ctx.triggered[0].get("value")) > 0


@callback(
    Output(FIELD, "value"),
    Output("rules-form-title", "children"),
    Output("rules-editing", "data"),
    Input({"type": "rule-edit", "rule": ALL}, "n_clicks"),
    Input("rules-new", "n_clicks"),
    prevent_initial_call=True,
)
@context.in_thread
def fill_form(_edits, _new) -> Any:
    """The form filled with the clicked rule (as the API shows it to the caller), or emptied
    for a new rule."""
    if not _clicked():
        raise PreventUpdate  # (`no_update` for the ALL output was a 500)
    trigger = ctx.triggered_id
    rule = None
    if isinstance(trigger, dict):
        answer = alert_data.call_api("GET", f"{RULES_API}/{trigger.get('rule')}")
        rule = answer.body if answer.ok else None
    values = form.form_values(form.shown_fields(), rule)
    filled = [values.get(o["id"]["field"]) for o in ctx.outputs_list[0]]
    title = f"Edit rule {rule['id']}: {rule['name']}" if rule else "New rule"
    return filled, title, rule


@callback(
    Output("rules-result", "children"),
    Output("rules-form-result", "children"),
    Input("rules-save", "n_clicks"),
    Input({"type": "rule-toggle", "rule": ALL}, "n_clicks"),
    Input({"type": "rule-delete", "rule": ALL}, "n_clicks"),
    Input({"type": "rule-delete-confirm", "rule": ALL}, "n_clicks"),
    Input({"type": "rule-test", "rule": ALL, "target": ALL}, "n_clicks"),
    State(FIELD, "value"),
    State("rules-editing", "data"),
    prevent_initial_call=True,
)
@context.in_thread
def act(_save, _toggle, _delete, _confirm, _test, values, editing) -> Any:
    """Save the form (its answer beside the form), enable or disable, delete (after a
    confirmation) or test a rule (their answers above the table)."""
    if not _clicked():
        return no_update, no_update
    if not context.can(context.current_key(), "control"):
        return _said(READ_ONLY), no_update
    trigger = ctx.triggered_id
    if trigger == "rules-save":
        ids = [s["id"]["field"] for s in ctx.states_list[0]]
        return no_update, _save_rule(dict(zip(ids, values or [], strict=False)), editing)
    return _acted(trigger), no_update


def _acted(trigger: dict) -> Any:
    """Enable or disable, delete (after a confirmation) or test the rule of ``trigger``."""
    kind, rule_id = trigger.get("type"), trigger.get("rule")
    if kind == "rule-delete":
        return html.Div(
            [
                html.Span(f"Delete rule {rule_id} and its alerts? ", className="result-error"),
                html.Button(
                    "Yes, delete it",
                    id={"type": "rule-delete-confirm", "rule": rule_id},
                    className="action danger",
                ),
            ],
            id="rules-confirm",
        )
    if kind == "rule-delete-confirm":
        answer = alert_data.call_api("DELETE", f"{RULES_API}/{rule_id}")
        return _said(f"Deleted rule {rule_id}.", answer)
    got = alert_data.call_api("GET", f"{RULES_API}/{rule_id}")
    if not got.ok:
        return _said("", got)
    rule = got.body
    if kind == "rule-toggle":
        turned = not rule["enabled"]
        answer = alert_data.call_api("PUT", f"{RULES_API}/{rule_id}", {"enabled": turned})
        return _said(f"{'Enabled' if turned else 'Disabled'} rule {rule['name']}.", answer)
    targets, index = rule.get("notify") or [], trigger.get("target")
    if not isinstance(index, int) or not 0 <= index < len(targets):
        return _said("that target is no longer the rule's; reload the page")
    target = targets[index]
    answer = alert_data.call_api("POST", f"{RULES_API}/{rule_id}/test-message", {"target": target})
    if answer.ok and not answer.body["sent"]:
        return _said(f"The test message to {answer.body['target']} failed: {answer.body['error']}")
    return _said(f"Sent a test message to {target}.", answer, "rules-test-sent")


def _save_rule(values: dict[str, Any], editing: dict | None) -> html.Div | html.P:
    try:
        body = form.rule_body(form.shown_fields(), values, editing)
    except ValueError as exc:
        return _refused(str(exc).splitlines())
    if editing is None:
        answer = alert_data.call_api("POST", RULES_API, body)
        done = f"Created rule {answer.body.get('name')} ({answer.body.get('id')})."
    elif not body:
        return html.P("Nothing changed.", className="muted", id="rules-saved")
    else:
        answer = alert_data.call_api("PUT", f"{RULES_API}/{editing['id']}", body)
        done = f"Saved rule {editing['name']}."
    if not answer.ok:
        detail = answer.body.get("detail") if isinstance(answer.body, dict) else None
        return _refused(form.api_errors(form.shown_fields(), detail) or [answer.said()])
    if answer.body.get("warning"):
        done += f" Note: {answer.body['warning']}"
    return _said(done, answer, "rules-saved")


def _refused(errors: list[str]) -> html.Div:
    """Every error of a save, one a line, each field by the form's label."""
    return html.Div(
        [html.P("Not saved:", className="result-error"),
         html.Ul([html.Li(e) for e in errors], className="result-error")],
        id="rules-form-error",
    )  # fmt: skip


def _said(done: str, answer: alert_data.ApiAnswer | None = None, id_: str = "") -> html.P:
    """``done`` when ``answer`` is a success, else the API's error (or ``done`` as an error
    without an answer)."""
    if answer is not None and answer.ok:
        return html.P(done, className="result-ok", id=id_ or "rules-done")
    said = answer.said() if answer is not None else done
    return html.P(f"Not done: {said}", className="result-error", id="rules-error")
