"""The alerts page's table: a row per alert episode (firing first), with its rule, run, value,
steps, recommended action, and a silence button."""

from __future__ import annotations

from html import escape
from typing import Any, NamedTuple

from dash import dcc, html
from vantage.dashboard import alert_data, context, explain
from vantage.dashboard.components import plain, run_href, shown_id

READ_ONLY = "Needs an API key with the control scope."

ALERT_COLUMNS = [
    ("State", "pending: the condition holds but not yet for the rule's steps; firing; resolved."),
    ("Severity", "The rule's label, sent with its notifications."),
    ("Rule", "The rule and the metric it watches; rules are on the Rules page."),
    ("Run", "The run, linked at the alert's step."),
    ("Value", "The metric at the latest step evaluated (stale: seconds since the last step)."),
    ("Steps", "The step it began pending at, fired at and resolved at."),
    ("Fired", "When it fired (UTC)."),
    ("What to do", "The rule's recommended action, when it has one."),
    ("Notifications", "Muted until a silence ends, or a button that mutes them."),
]


def alert_step(alert: dict) -> int | None:
    """The step a link to the alert's run points at: where it fired, else where it began."""
    for key in ("fired_step", "pending_step", "resolved_step"):
        if alert.get(key) is not None:
            return alert[key]
    return None


def _text(value: Any) -> str:
    """Text as HTML: escaped (run names and rules stay text), on one line (a blank line would
    end the HTML block that `dcc.Markdown` passes through as it is)."""
    return escape(str(value), quote=True).replace("\n", "&#10;").replace("\r", "&#13;")


def _tag(name: str, content: str = "", attrs: dict[str, Any] | None = None) -> str:
    """``<name attrs>content</name>``: ``content`` is HTML already (`_text` for text); an
    attribute whose value is None is left out."""
    shown = "".join(f' {k}="{_text(v)}"' for k, v in (attrs or {}).items() if v is not None)
    return f"<{name}{shown}>{content}</{name}>"


def run_link(alert: dict, run: dict | None) -> str:
    """A link to the alert's run at its step (`?step=`, which the run page's ACR chart shows)."""
    step = alert_step(alert)
    href = run_href(alert["run_id"]) + (f"?step={step}" if step is not None else "")
    name = (run or {}).get("name") or shown_id(alert["run_id"])
    title = f"run {alert['run_id']}, at step {step}"
    return _tag("a", _text(name), {"href": href, "title": title})


# each step named ("0 → 0" read as a range for an alert pending and fired at step 0)
_STEP_NAMES = (("pending_step", "pending"), ("fired_step", "fired"), ("resolved_step", "resolved"))
# metrics whose value is not a bare ratio or count: their unit beside the value
_UNITS = {"stale": "s"}


def _steps(alert: dict) -> str:
    """As "pending 3, fired 5, resolved 9": the steps the alert has reached; "—" for none."""
    shown = [
        f"{said} {explain.fmt(alert[k])}" for k, said in _STEP_NAMES if alert.get(k) is not None
    ]
    return ", ".join(shown) or "—"


def _value(alert: dict) -> str:
    """The alert's value with its metric's unit (a `stale` alert's 312 is seconds)."""
    unit = _UNITS.get(alert.get("metric") or "")
    if not unit or not isinstance(alert.get("value"), int | float):
        return explain.fmt(alert.get("value"))
    return f"{explain.fmt(alert['value'], 0)} {unit}"


def _silence_cell(alert: dict, muted: str | None, can_control: bool) -> str:
    """Muted until when, else a Silence button, which `assets/alerts.js` turns into a click on
    the page's `alerts-silence-click` store."""
    if muted:
        until = f"muted until {muted[:16].replace('T', ' ')}"
        return _tag("span", _text(until), {"class": "muted-until"})
    if alert.get("state") == "resolved":
        return "—"
    if not can_control:
        return _tag("span", "—", {"title": READ_ONLY})
    attrs = {
        "class": "action alert-silence",
        "title": "Mute this rule's notifications on this run for the chosen time.",
        "data-alert-id": alert["alert_id"],
    }
    return _tag("button", "Silence", attrs)


def _row(a: dict, run: dict | None, muted: str | None, can_control: bool) -> str:
    project = _tag("div", _text((run or {}).get("project") or ""), {"class": "muted"})
    metric = _tag("div", _text(a.get("metric")), {"class": "muted"})
    cells = [
        (_tag("span", _text(a["state"]), {"class": f"badge alert-{a['state']}"}), None),
        (_text(a.get("severity") or "—"), None),
        (_text(a.get("rule") or "?") + metric, None),
        (run_link(a, run) + project, "wrap"),
        (_text(_value(a)), None),
        (_text(_steps(a)), None),
        (_text((a.get("fired_at") or "")[:16].replace("T", " ") or "—"), None),
        (_text(a.get("recommended_action") or "—"), "wrap"),
        (_silence_cell(a, muted, can_control), None),
    ]
    tds = "".join(_tag("td", content, {"class": cls}) for content, cls in cells)
    attrs = {"class": "alert-row", "data-alert-id": a["alert_id"], "data-state": a["state"]}
    return _tag("tr", tds, attrs)


def alerts_table(
    alerts: list[dict], runs: dict[str, dict], muted: dict[int, str | None], can_control: bool
) -> str:
    """The table as one HTML text (for one `dcc.Markdown`: as ~750 Dash components, 50 rows
    took 1.5 s more to appear in Chromium, and 20 ms to build on the server); ``muted``: each
    alert's silence end (or None)."""
    header = "".join(_tag("th", _text(name), {"title": tip}) for name, tip in ALERT_COLUMNS)
    rows = "".join(
        _row(a, runs.get(a["run_id"]), muted.get(a["alert_id"]), can_control) for a in alerts
    )
    table = _tag(
        "table",
        _tag("thead", _tag("tr", header)) + _tag("tbody", rows),
        {"class": "runs", "id": "alerts-table"},
    )
    return _tag("div", table, {"class": "table-scroll"})


class AlertsOutputs(NamedTuple):
    """What the alerts page's refresh callback answers, in the order of its ``Output``s."""

    body: Any
    count: str
    more_style: dict
    shown: dict


def alerts_outputs(info: Any, filters: dict[str, str | None], limit: int) -> AlertsOutputs:
    """The alerts page's table for the key ``info``: the first ``limit`` alerts with
    ``filters`` (state, severity, rule, project; None: any), firing first; the count line, the
    "Show more" button's style, and the shown alerts' rule and run (for the silence buttons)."""
    view = alert_data.alerts_view(info, limit=limit, **filters)
    if not view.alerts:
        said = "No alert matches these filters." if any(filters.values()) else "No alerts yet."
        body: Any = html.P(said, className="muted", id="alerts-empty")
    else:
        muted = {
            a["alert_id"]: alert_data.muted_until(a, view.runs.get(a["run_id"]), view.silences)
            for a in view.alerts
        }
        table = alerts_table(view.alerts, view.runs, muted, context.can(info, "control"))
        body = dcc.Markdown(table, dangerously_allow_html=True, className="alerts-html")
    count = f"Showing the first {len(view.alerts):,} alerts." if view.more else ""
    shown = {str(a["alert_id"]): {k: a[k] for k in ("rule", "run_id")} for a in view.alerts}
    # as wire dicts: Dash then serialises the answer with orjson (`plain`)
    return AlertsOutputs(plain(body), count, {} if view.more else {"display": "none"}, shown)
