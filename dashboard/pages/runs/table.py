"""The runs page's table: a row per run with its status, latest ACR and trend, mitigation,
alerts and the delivery health of its client."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

from dash import dcc, html
from vantage.dashboard import explain
from vantage.dashboard.components import (
    acr_class,
    alert_chips,
    cost_text,
    current_mitigation,
    health_badge,
    mitigation_text,
    run_ended,
    run_href,
    status_badge,
)
from vantage.dashboard.figures import COLORS


def health_cell(client: dict | None) -> Any:
    client = client or {}
    spooled = int(client.get("spooled_groups") or 0)
    dropped = int(client.get("dropped_groups") or 0)
    dead = int(client.get("dead_letter_batches") or 0)
    if not (spooled or dropped or dead):
        return html.Span("ok", title="The client delivers everything it logs.")
    return html.Span(
        f"{spooled} spooled · {dropped} dropped · {dead} refused",
        className="health-warn",
        title=(
            "Spooled: groups waiting on the trainer's disk for the server (sent when it is "
            "reachable). Dropped: groups the client could not send: rewards it could not read "
            "(its log names them), or a full spool or queue. Refused: batches the "
            "server rejected (see the client's dead-letter table). Dropped or refused data means "
            "the charts miss steps."
        ),
    )


def sparkline(values: list, latest: float | None = None) -> html.Img:
    svg = sparkline_svg(values, latest=latest)
    src = "data:image/svg+xml;base64," + base64.b64encode(svg.encode()).decode()
    return html.Img(src=src, alt="ACR sparkline", title="ACR over the latest steps (dotted: 0.35)")


RUNS_COLUMNS = [
    ("Run", "Name and id; click for details."),
    (
        "Health",
        "One word for the run, from documented rules (docs/design.md §9): critical (a critical "
        "alert fires), stalled, collapsing (ACR above 0.35), stale, failed, warning (another "
        "alert fires), mitigated (raw ACR high, effective ACR at or below 0.35), starting, "
        "healthy, finished. Hover over a verdict for its numbers.",
    ),
    ("Status", "running, stale (no data lately), finished or failed."),
    ("Project / tags", "Where the run belongs."),
    ("Last step", "Newest training step received."),
    ("Latest ACR", explain.ACR),
    ("ACR trend", "ACR over the latest steps; the dotted line is the 0.35 stall threshold."),
    (
        "Wasted",
        "Cost of collapse over the whole run (raw): the share of completions in groups that "
        "all got one reward, those completions, and GPU-hours (the run config's gpus × each "
        "step's step_s × its wasted share) when the trainer reports both. Under AVSPO these "
        "groups still get a gradient: the figure is what plain GRPO would have wasted.",
    ),
    (
        "Mitigation",
        "Applied mitigation (→ requested) · what alerts do in the run's mode: apply their fix "
        "(auto: a firing rule with a mitigation command sends it), suggest it for one click, or "
        "notify only.",
    ),
    ("Alerts", "Alerts firing now (grey: firing when the run ended); hover for the value."),
    ("Client", "Delivery health of the trainer's client: spooled, dropped or refused data."),
    ("Started", "When the run was created (UTC)."),
]


def runs_table(runs: list[dict]) -> html.Div | html.P:
    if not runs:
        return html.P(
            "No runs yet. Start one with `vantage demo`, or add the Monitor hook to a trainer.",
            className="muted",
            id="runs-empty",
        )
    header = html.Tr([html.Th(name, title=help_text) for name, help_text in RUNS_COLUMNS])
    rows = []
    for r in runs:
        mit, mit_help = mitigation_text(r)
        cost = cost_text(r.get("cost"))
        tags = ", ".join(r.get("tags") or [])
        rows.append(
            html.Tr(
                [
                    html.Td(
                        [
                            dcc.Link(r.get("name") or r["run_id"], href=run_href(r["run_id"])),
                            html.Div(r["run_id"][:8], className="muted"),
                        ],
                        className="wrap",
                    ),
                    html.Td(health_badge(r)),
                    html.Td(status_badge(r.get("status"))),
                    html.Td(
                        [r.get("project") or "—", html.Div(tags, className="muted")],
                        className="wrap",
                    ),
                    html.Td(explain.fmt(r.get("last_step"))),
                    latest_acr_cell(r),
                    html.Td(sparkline(r.get("spark") or [], r.get("latest_acr"))),
                    html.Td(cost[0], className="cost"),  # the column's title says what
                    html.Td(mit, title=mit_help),
                    html.Td(alert_chips(r.get("alerts") or [], run_ended(r)) or "—"),
                    html.Td(health_cell(r.get("client"))),
                    html.Td((r.get("created_at") or "")[:16].replace("T", " ")),
                ],
                className="run-row",
                **{"data-run-id": r["run_id"]},
            )
        )
    # on a narrow window the table scrolls in its card, not the whole page
    table = html.Table([html.Thead(header), html.Tbody(rows)], className="runs", id="runs-table")
    return html.Div(table, className="table-scroll")


def latest_acr_cell(run: dict) -> html.Td:
    """A run's latest raw ACR; when its trainer sent the same step's effective ACR (after a
    mitigation) and it differs, that below it, labelled and in its own colour (a run AVSPO
    brought to an effective 0 showed only a red ACR, the reddest on the list)."""
    acr = run.get("latest_acr")
    effective = run.get("latest_effective")
    if effective is None or (current_mitigation(run) == "none" and effective == acr):
        # the column's title explains the ACR (repeated in each of 50 rows, it doubled the table)
        return html.Td(explain.fmt(acr), className=acr_class(acr))
    return html.Td(
        [
            html.Span(f"raw {explain.fmt(acr)}", className=acr_class(acr)),
            html.Div(f"effective {explain.fmt(effective)}", className=acr_class(effective)),
        ],
        title="Raw: every collapsed group. Effective: the groups that still had no gradient "
        "after the mitigation.",
    )


def sparkline_svg(
    values: Sequence[float | None], width: int = 120, height: int = 28, latest: float | None = None
) -> str:
    """A tiny inline SVG line of ACR values in [0, 1] (gaps skipped), with the 0.35 threshold.

    Drawn as an <img> data URI so a runs table with hundreds of rows stays light.
    """
    pts = [(i, v) for i, v in enumerate(values) if v is not None]
    n = max(len(values) - 1, 1)

    def y(v: float) -> float:
        return round(height - 2 - (height - 4) * min(max(v, 0.0), 1.0), 1)

    poly = " ".join(f"{round(i * (width - 2) / n + 1, 1)},{y(v)}" for i, v in pts)
    t = y(explain.STALL_THRESHOLD)
    last = latest if latest is not None else (pts[-1][1] if pts else None)
    color = COLORS["alert"] if last is not None and last > explain.STALL_THRESHOLD else "#1f2937"
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">'
        f'<line x1="0" y1="{t}" x2="{width}" y2="{t}" stroke="#fca5a5" stroke-dasharray="2,2"/>'
        f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{poly}"/></svg>'
    )
