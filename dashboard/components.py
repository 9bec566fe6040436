"""Small Dash components shared by the pages: badges, KPI cards, the runs table."""

from __future__ import annotations

import base64
from collections import Counter
from typing import Any

from dash import dcc, html

from . import explain, figures

URL_BASE = "/dashboard/"


def plain(value: Any) -> Any:
    """Components as their wire dicts, recursively.

    Dash serialises a callback's answer with orjson only when every part is plain JSON; one
    component object sends the whole answer, 5,000-point figures included, through plotly's slow
    recursive cleaner (~70 ms instead of ~4 ms on the run page's first load)."""
    if hasattr(value, "to_plotly_json"):
        wire = value.to_plotly_json()
        return {**wire, "props": {k: plain(v) for k, v in wire["props"].items()}}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def shown_id(run_id: str, limit: int = 40) -> str:
    """A run id from an address as a page shows it: whole, or its first ``limit`` characters
    and an ellipsis (a link can carry any text), with characters that are not printable
    (bidirectional controls, line breaks) as escapes: "\u202e…" showed its text reversed, so a
    crafted link could put words on the page (a trial)."""
    shown = run_id if len(run_id) <= limit else run_id[:limit] + "…"
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in shown)


# the dashboard shows a run id's first 8 characters: a prefix this long names a run in a link
SHORT_ID = 8


def resolve_run_ids(asked: list[str], visible: list[str]) -> tuple[list[str], list[str], list[str]]:
    """The runs a link names, as (chosen run ids in the link's order, each once; what names no
    visible run; what is the start of several). A name is a visible run's id, or the start of
    exactly one (at least SHORT_ID characters: the short id the pages show was refused in a
    compare link, a trial); a start that several share is ambiguous, not "not found"."""
    known, chosen, missing, ambiguous = set(visible), [], [], []
    for name in asked:
        found = [name] if name in known else []
        if not found and len(name) >= SHORT_ID:
            found = [r for r in visible if r.startswith(name)]
        if len(found) == 1:
            chosen.append(found[0])
        else:
            (ambiguous if found else missing).append(name)
    return list(dict.fromkeys(chosen)), missing, ambiguous


def run_href(run_id: str) -> str:
    return f"{URL_BASE}runs/{run_id}"


def acr_class(acr: float | None) -> str:
    if acr is None:
        return ""
    if acr > explain.STALL_THRESHOLD:
        return "acr-bad"
    return "acr-warn" if acr > 0.3 else "acr-ok"


def status_badge(status: str | None) -> html.Span:
    status = status or "unknown"
    return html.Span(
        status,
        className=f"badge status-{status}",
        title=explain.STATUS_HELP.get(status, ""),
    )


def mitigation_text(run: dict) -> tuple[str, str]:
    """Short text and hover for a run's mitigation: its mode with the settings the trainer
    reports for it, what was requested and applied."""
    mode = run.get("mitigation_mode") or "?"
    requested = run.get("mitigation_requested") or {}
    app, req = figures.mitigation_modes(run)
    said = run.get("mitigation_reported") or {}
    reported = said.get("mode")
    current = current_mitigation(run)
    settings = ", ".join(explain.settings_text(said, skip=("mode",)))
    state = f"{current} ({settings})" if reported and settings else current
    if req and req != current:
        state = f"{state} → {req} ({requested.get('status', 'pending')})"
    help_text = (
        f"Automatic mitigation mode: {mode} (auto: alerts issue their mitigation; suggest: they "
        f"appear on the run page for one click; off: nothing). In effect, as the trainer last "
        f"reported: {reported or 'not reported'}; last acked: {app or 'none'}; last requested: "
        f"{req or 'none'}."
    )
    # "· auto" read as nothing to a CTO (a trial): what the alerts do in this mode; the modes
    # are the trainer's own names, which may hold bidi controls (shown, not obeyed)
    return explain.visible(f"{state} · {ALERTS_DO.get(mode, mode)}"), explain.visible(help_text)


current_mitigation = figures.current_mitigation


ALERTS_DO = {"auto": "alerts act", "suggest": "alerts suggest", "off": "alerts notify only"}


def run_ended(run: dict) -> bool:
    """Whether the run has finished or failed (no trainer reads its commands, no step comes)."""
    return run.get("status") in ("finished", "failed")


def alert_chips(alerts: list[dict], ended: bool = False) -> list:
    """A chip per firing alert; grey, and said so, when the run has ended (no later step can
    resolve it: it was firing when the run ended). Rules of one name (a project's own
    `acr_stall` beside the global one) are told apart by their scope (a trial saw "acr_stall
    acr_stall")."""
    when = "firing when the run ended; " if ended else ""
    names = Counter(a.get("rule") for a in alerts)
    return [
        html.Span(
            _chip_label(a) if names[a.get("rule")] > 1 else a.get("rule", "alert"),
            className="alert-chip alert-chip-ended" if ended else "alert-chip",
            title=f"{when}{a.get('severity', 'warning')}: value {explain.fmt(a.get('value'))} "
            f"since step {a.get('fired_step')}; the rule of {_scope(a)}",
        )
        for a in alerts
    ]


def _scope(alert: dict) -> str:
    if alert.get("rule_run_id"):
        return "this run"
    if alert.get("rule_project"):
        return f"project {alert['rule_project']}"
    return "every run"


def _chip_label(alert: dict) -> str:
    return f"{alert.get('rule', 'alert')} ({_scope(alert)})"


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
    svg = figures.sparkline_svg(values, latest=latest)
    src = "data:image/svg+xml;base64," + base64.b64encode(svg.encode()).decode()
    return html.Img(src=src, alt="ACR sparkline", title="ACR over the latest steps (dotted: 0.35)")


RUNS_COLUMNS = [
    ("Run", "Name and id; click for details."),
    ("Status", "running, stale (no data lately), finished or failed."),
    ("Project / tags", "Where the run belongs."),
    ("Last step", "Newest training step received."),
    ("Latest ACR", explain.ACR),
    ("ACR trend", "ACR over the latest steps; the dotted line is the 0.35 stall threshold."),
    (
        "Mitigation",
        "Applied mitigation (→ requested) · what alerts do: act (issue their "
        "mitigation), suggest it, or notify only.",
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
                    html.Td(status_badge(r.get("status"))),
                    html.Td(
                        [r.get("project") or "—", html.Div(tags, className="muted")],
                        className="wrap",
                    ),
                    html.Td(explain.fmt(r.get("last_step"))),
                    latest_acr_cell(r),
                    html.Td(sparkline(r.get("spark") or [], r.get("latest_acr"))),
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
    """A run's latest ACR; with a mitigation on, the same step's effective ACR below it in its
    own colour (a run AVSPO brought to an effective 0 showed only a red ACR, the reddest on the
    list: a trial)."""
    acr = run.get("latest_acr")
    effective = run.get("latest_effective") if current_mitigation(run) != "none" else None
    if effective is None:
        return html.Td(explain.fmt(acr), className=acr_class(acr), title=explain.ACR)
    return html.Td(
        [
            html.Span(explain.fmt(acr), className=acr_class(acr)),
            html.Div(f"effective {explain.fmt(effective)}", className=acr_class(effective)),
        ],
        title=f"{explain.ACR} Below it, the effective ACR: after the mitigation.",
    )


def kpi_cards(cards: list[dict]) -> list[html.Div]:
    return [
        html.Div(
            [
                html.Div(c["title"], className="kpi-title"),
                html.Div(c["value"], className="kpi-value", id=f"kpi-{c['id']}-value"),
                html.Div(c["sub"], className="kpi-sub"),
            ],
            className=f"kpi kpi-{c['level']}",
            title=c["help"],
            id=f"kpi-{c['id']}",
        )
        for c in cards
    ]


def primer(open_: bool = False) -> html.Details:
    """A short, plain-language explanation of the page for someone new to ACR."""
    items = []
    for question, answer in explain.PRIMER:
        items += [html.B(question), html.P(answer)]
    return html.Details(
        [html.Summary("New here? What these charts mean and what to do"), *items],
        open=open_,
        className="card primer",
        id="primer",
    )
