"""Small Dash components shared by the pages: badges, KPI cards, the runs table."""

from __future__ import annotations

from collections import Counter
from typing import Any

from dash import html

from . import explain

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
    crafted link could put words on the page."""
    shown = run_id if len(run_id) <= limit else run_id[:limit] + "…"
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in shown)


# the dashboard shows a run id's first 8 characters: a prefix this long names a run in a link
SHORT_ID = 8


def resolve_run_ids(asked: list[str], visible: list[str]) -> tuple[list[str], list[str], list[str]]:
    """The runs a link names, as (chosen run ids in the link's order, each once; what names no
    visible run; what is the start of several). A name is a visible run's id, or the start of
    exactly one (at least SHORT_ID characters: the short id the pages show was refused in a
    compare link); a start that several share is ambiguous, not "not found"."""
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
    app, req = mitigation_modes(run)
    said = run.get("mitigation_reported") or {}
    reported = said.get("mode")
    current = current_mitigation(run)
    settings = ", ".join(explain.settings_text(said, skip=("mode",)))
    state = f"{current} ({settings})" if reported and settings else current
    if req and req != current:
        state = f"{state} → {req} ({requested.get('status', 'pending')})"
    help_text = (
        f"Automatic mitigation mode: {mode} (auto: a firing alert whose rule carries a "
        f"mitigation command sends it to the trainer; suggest: the command appears on the run "
        f"page for one click; off: alerts only notify). In effect, as the trainer last "
        f"reported: {reported or 'not reported'}; last acked: {app or 'none'}; last requested: "
        f"{req or 'none'}."
    )
    # "· auto" read as nothing to a CTO: what the alerts do in this mode; the modes
    # are the trainer's own names, which may hold bidi controls (shown, not obeyed)
    return explain.visible(f"{state} · {ALERTS_DO.get(mode, mode)}"), explain.visible(help_text)


def mitigation_modes(run: dict) -> tuple[str | None, str | None]:
    """The mode of a run's applied and of its newest requested `set_mitigation` (None: none)."""
    applied = run.get("mitigation_applied") or {}
    requested = run.get("mitigation_requested") or {}
    return (
        applied.get("mode") if isinstance(applied, dict) else applied,
        requested.get("mode") if isinstance(requested, dict) else requested,
    )


def current_mitigation(run: dict) -> str:
    """The mitigation mode the run's trainer runs: the one it last reported with its steps
    (the truth), else the last one it acked, else "none"."""
    reported = (run.get("mitigation_reported") or {}).get("mode")
    return reported or mitigation_modes(run)[0] or "none"


# "alerts act" went unexplained: say what they do (the hover has the full sentence)
ALERTS_DO = {
    "auto": "alerts apply their fix",
    "suggest": "alerts suggest their fix",
    "off": "alerts notify only",
}


def health_badge(run: dict, component_id: str | None = None) -> html.Span:
    """The run's health verdict (`vantage.server.health`) as a coloured word; the hover says
    why and what the word means."""
    from vantage.server.health import LEVEL, MEANING

    health = run.get("health") or "unknown"
    extra = {"id": component_id} if component_id else {}
    return html.Span(
        health,
        className=f"health-badge health-level-{LEVEL.get(health, 'none')}",
        title=f"{run.get('health_reason') or ''} {MEANING.get(health, '')}".strip(),
        **{"data-health": health},
        **extra,
    )


def cost_text(cost: dict | None) -> tuple[str, str]:
    """A run's (or project's) cost of collapse (`vantage.server.cost`) in short, and in full
    for its hover: the share, the completions and, when known, the GPU-hours wasted."""
    cost = cost or {}
    share = cost.get("wasted_share")
    wasted = int(cost.get("wasted_rollouts") or 0)
    gpu_hours = cost.get("wasted_gpu_hours")
    parts = [
        "—" if share is None else f"{100 * share:.0f}%",
        f"{wasted:,} completions",
    ]
    if gpu_hours is not None:
        parts.append(f"{gpu_hours:,.2f} GPU-h")
    help_text = (
        "Cost of collapse (raw): completions in groups whose completions all got one reward, so "
        "plain GRPO learns nothing from them; as a share of all completions, as completions, "
        "and as GPU-hours (the run config's gpus × each step's step_s × its wasted share) when "
        "the trainer reports both. Under AVSPO these groups still get a gradient: the figure "
        "is what plain GRPO would have wasted."
    )
    if gpu_hours is None:
        help_text += " No GPU-hours: the run reports no gpus in its config or no step_s."
    return " · ".join(parts), help_text


def run_ended(run: dict) -> bool:
    """Whether the run has finished or failed (no trainer reads its commands, no step comes)."""
    return run.get("status") in ("finished", "failed")


def alert_chips(alerts: list[dict], ended: bool = False) -> list:
    """A chip per firing alert; grey, and said so, when the run has ended (no later step can
    resolve it: it was firing when the run ended). Rules of one name (a project's own
    `acr_stall` beside the global one) are told apart by their scope."""
    when = "firing when the run ended; " if ended else ""
    names = Counter(a.get("rule") for a in alerts)
    return [
        html.Span(
            _chip_label(a) if names[a.get("rule")] > 1 else a.get("rule", "alert"),
            className="alert-chip alert-chip-ended" if ended else "alert-chip",
            title=f"{when}{a.get('severity', 'warning')}: value {explain.fmt(a.get('value'))}"
            f"{' s' if a.get('metric') == 'stale' else ''} "
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
