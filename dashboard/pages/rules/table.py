"""The rules page's table: a row per rule with its scope, condition, targets (each with a
"Send test" button), command and state, and its Edit, Enable/Disable and Delete buttons."""

from __future__ import annotations

from typing import Any

from dash import html
from vantage.dashboard import explain

RULE_COLUMNS = [
    ("Rule", "Its name and description; built-in rules come with Vantage."),
    ("Applies to", "Every run, a project's runs, or one run."),
    ("Condition", "When it fires, and when a firing alert resolves."),
    ("Severity", "The label sent with its notifications."),
    ("Notify", "Targets told when it fires and resolves; Send test posts a test message now."),
    (
        "Command",
        "The command it issues when it fires (or offers: the run's mitigation mode "
        "decides), and the one it only suggests.",
    ),
    ("State", "A disabled rule is not evaluated."),
    ("", ""),
]


def scope(rule: dict) -> str:
    if rule.get("run_id"):
        return f"run {rule['run_id']}"
    return f"project {rule['project']}" if rule.get("project") else "every run"


def condition(rule: dict) -> str:
    """``acr > 0.35 for 51 steps; clears at or below 0.3``."""
    steps = rule.get("for_steps") or 1
    text = f"{rule.get('metric')} {rule.get('op')} {_number(rule.get('threshold'))}"
    if rule.get("comparison") not in (None, "absolute"):
        text += f" ({rule['comparison']})"
    text += f" for {steps} step{'s' if steps != 1 else ''}"
    if rule.get("clear_threshold") is not None:
        text += f"; clears past {_number(rule['clear_threshold'])}"
    return text


def _number(value: float | None) -> str:
    """A threshold as written (0.35, 1e-06), not to fixed digits (0.3500)."""
    return "—" if value is None else f"{value:g}"


def _targets(rule: dict, why_not: str | None) -> Any:
    targets = rule.get("notify") or []
    if not targets:
        return "—"
    return html.Ul(
        [
            html.Li(
                [
                    html.Span(t, className="target"),
                    " ",
                    html.Button(
                        "Send test",
                        id={"type": "rule-test", "rule": rule["id"], "target": i},
                        className="secondary small",
                        disabled=why_not is not None,
                        title=why_not or "Send a test message to this target now.",
                    ),
                ]
            )
            for i, t in enumerate(targets)
        ],
        className="targets",
    )


def _command(rule: dict) -> str:
    """The command the rule issues (`mitigation`) and the one it only suggests, if any."""
    said = []
    for key, how in (("mitigation", "issues"), ("suggested_command", "suggests")):
        m = rule.get(key)
        if m:
            params = ", ".join(explain.settings_text(m.get("params") or {}))
            said.append(f"{how} {m['type']}" + (f" ({params})" if params else ""))
    return "; ".join(said) or "—"


def _button(text: str, kind: str, rule_id: int, why_not: str | None, danger: bool = False):
    return html.Button(
        text,
        id={"type": kind, "rule": rule_id},
        className="action danger" if danger else "action",
        disabled=why_not is not None,
        title=why_not or "",
    )


def rules_table(rules: list[dict], why_not: str | None) -> html.Div | html.P:
    """The table; ``why_not``: why the buttons are disabled (None: enabled)."""
    if not rules:
        return html.P("No rules: create one below.", className="muted", id="rules-empty")
    header = html.Tr([html.Th(name, title=help_text) for name, help_text in RULE_COLUMNS])
    rows = []
    for r in rules:
        enabled = bool(r.get("enabled"))
        about = r.get("recommended_action") or r.get("description")
        rows.append(
            html.Tr(
                [
                    html.Td(
                        [
                            html.B(r["name"]),
                            " (built-in)" if r.get("builtin") else "",
                            html.Div(about or "", className="muted"),
                        ],
                        className="wrap",
                    ),
                    html.Td(scope(r), className="wrap"),
                    html.Td(condition(r), className="wrap"),
                    html.Td(r.get("severity")),
                    html.Td(_targets(r, why_not), className="wrap"),
                    html.Td(_command(r), className="wrap"),
                    html.Td("enabled" if enabled else "disabled"),
                    html.Td(
                        className="rule-actions",
                        children=[
                            _button("Edit", "rule-edit", r["id"], why_not),
                            _button(
                                "Disable" if enabled else "Enable", "rule-toggle", r["id"], why_not
                            ),
                            _button("Delete", "rule-delete", r["id"], why_not, danger=True),
                        ],
                    ),
                ],
                className="rule-row",
                **{"data-rule": r["name"], "data-rule-id": str(r["id"])},
            )
        )
    table = html.Table([html.Thead(header), html.Tbody(rows)], className="runs", id="rules-table")
    return html.Div(table, className="table-scroll")
