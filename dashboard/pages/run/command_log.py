"""The run page's command log: each command, who issued it and why, and the status its trainer
moved it to."""

from __future__ import annotations

from typing import Any

from dash import html
from vantage.dashboard import explain

STATUS_HELP = {
    "pending": "Waiting for the trainer to pick it up (with its next batch or heartbeat).",
    "delivered": "The trainer received it and applies it at the next step boundary.",
    "applied": "The trainer applied it at the step shown.",
    "rejected": "The trainer refused it; see the detail.",
    "expired": "The trainer did not acknowledge it within the TTL (is it running?).",
}


def log_table(commands: list[dict]) -> Any:
    if not commands:
        return html.P("No commands yet.", className="muted", id="cmd-log-empty")
    head = ["status", "command", "parameters", "issued by", "reason", "created (UTC)", "step",
            "trainer's detail"]  # fmt: skip
    rows = []
    for c in commands:
        params = ", ".join(explain.settings_text(c.get("params") or {}))
        rows.append(
            html.Tr(
                [
                    html.Td(
                        c.get("status"),
                        className=f"cmd-status cmd-status-{c.get('status')}",
                        title=STATUS_HELP.get(c.get("status"), ""),
                    ),
                    html.Td(c.get("type")),
                    html.Td(params),
                    html.Td(c.get("issued_by")),
                    html.Td(c.get("reason") or ""),
                    html.Td((c.get("created_at") or "")[:19].replace("T", " ")),
                    html.Td(explain.fmt(c.get("acked_step"))),
                    html.Td(c.get("detail") or ""),
                ],
                **{"data-command-id": c.get("command_id")},
            )
        )
    return html.Table(
        [html.Thead(html.Tr([html.Th(h) for h in head])), html.Tbody(rows)],
        className="runs",
        id="cmd-log-table",
    )
