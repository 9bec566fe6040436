"""Reads and writes of the alerts and rules pages.

Reads call the server's functions directly, filtered in the database by what the caller's key
may see (the alerts page reads one page of alerts, not every alert). Writes (silences, rules,
test messages) go through the API's own routes, in process, with the caller's key as its Bearer
key: a dashboard change is checked exactly as an API change is (scopes, a project key's limits,
the rule's validation, the SSRF refusals, locks), and answers with the API's status and error.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

import httpx

from . import context

ALERT_STATES = ("firing", "pending", "resolved")
SILENCE_HOURS = {"1": "1 hour", "4": "4 hours", "24": "1 day", "168": "7 days"}


class AlertsView(NamedTuple):
    """What the alerts page shows: a page of alerts (firing first), whether there are more,
    the shown runs' names and projects by id, and the silences in force that the key sees."""

    alerts: list[dict]
    more: bool
    runs: dict[str, dict]
    silences: list[dict]


def alerts_view(
    info: Any,
    state: str | None = None,
    severity: str | None = None,
    rule: str | None = None,
    project: str | None = None,
    limit: int = 50,
) -> AlertsView:
    """The first ``limit`` alerts the key sees with the given filters (None: any), firing
    first, then newest first (`alert_page`)."""
    from sqlalchemy import select
    from vantage.server.alerts.listing import alert_page
    from vantage.server.alerts.silences import list_silences
    from vantage.server.models import Run

    own = getattr(info, "project", None)
    if not context.can(info, "read") or (own is not None and project not in (None, own)):
        return AlertsView([], False, {}, [])
    with context.session() as s:
        page = alert_page(
            s,
            rule=rule,
            state=state,
            severity=severity,
            project=own or project,
            order="firing_first",
            limit=max(1, limit),
        )
        ids = {a["run_id"] for a in page.alerts}
        rows = s.execute(select(Run.id, Run.name, Run.project).where(Run.id.in_(ids))).all()
        silences = [x for x in list_silences(s, active_only=True) if _sees(s, x, info)]
    runs = {r.id: {"name": r.name, "project": r.project} for r in rows}
    return AlertsView(page.alerts, page.next_cursor is not None, runs, silences)


def _sees(session, silence: dict, info: Any) -> bool:
    from vantage.server.alerts.silences import silence_visible

    return silence_visible(session, silence["matchers"] or {}, info)


def muted_until(alert: dict, run: dict | None, silences: list[dict]) -> str | None:
    """The latest end of the silences in force that mute ``alert`` (its rule, run and the
    run's project match every matcher a silence has), or None."""
    facts = {"rule": alert.get("rule"), "run_id": alert.get("run_id")}
    facts["project"] = (run or {}).get("project")
    ends = [
        x["until"]
        for x in silences
        if all(facts.get(k) == v for k, v in (x.get("matchers") or {}).items())
    ]
    return max(ends) if ends else None


def filter_options(info: Any) -> dict[str, list[str]]:
    """The values the alerts page's filters offer: the rules' names and severities the key
    sees, and the projects of its runs (distinct values, read in the database)."""
    from sqlalchemy import select
    from vantage.server.alerts.models import AlertRule
    from vantage.server.alerts.rules import visible_to
    from vantage.server.models import Run

    own = getattr(info, "project", None)
    with context.session() as s:
        seen = select(AlertRule.name, AlertRule.severity).where(visible_to(own)).distinct()
        rules = s.execute(seen).all()
        if own is None:
            projects = s.scalars(select(Run.project).where(Run.project.is_not(None)).distinct())
            projects = sorted(projects)
        else:
            projects = [own]
    return {
        "rule": sorted({r.name for r in rules}),
        "severity": sorted({r.severity for r in rules}),
        "project": projects,
    }


def rules(info: Any) -> list[dict]:
    """The rules the key sees, by id, as `GET /alert-rules` shows them to it (targets in full
    only to a key that may change the rule)."""
    from vantage.server.alerts.rules import list_rules, rule_as_seen

    if not context.can(info, "read"):
        return []
    with context.session() as s:
        return [rule_as_seen(s, r, info) for r in list_rules(s, getattr(info, "project", None))]


class ApiAnswer(NamedTuple):
    """An in-process API call's status and JSON answer (None when it had no body)."""

    status: int
    body: Any

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def said(self) -> str:
        """The answer's error in one line: each of a 422's errors as "field: message"."""
        detail = self.body.get("detail") if isinstance(self.body, dict) else self.body
        if isinstance(detail, list):
            return "; ".join(_one_error(e) for e in detail)
        return str(detail)


def _one_error(error: Any) -> str:
    if not isinstance(error, dict):
        return str(error)
    where = [str(p) for p in error.get("loc") or [] if p not in ("body", "query")]
    return f"{'.'.join(where)}: {error.get('msg')}" if where else str(error.get("msg"))


def call_api(method: str, path: str, body: Any = None) -> ApiAnswer:
    """``method path`` on this server's API, in process, as the caller of the running callback
    (its login cookie's key as the Bearer key). Run in a callback's worker thread."""
    from dash import callback_context

    app = context.request_app() or context.state().app
    try:
        key = (callback_context.cookies or {}).get(context.COOKIE_NAME)
    except Exception:  # outside a request: tests calling directly, with auth off
        key = None
    headers = {"authorization": f"Bearer {key}"} if key else {}

    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://dashboard") as client:
            return await client.request(method, path, json=body, headers=headers)

    response = asyncio.run(call())
    try:
        answer = response.json() if response.content else None
    except ValueError:
        answer = response.text
    return ApiAnswer(response.status_code, answer)


def silence_alert(alert: dict, hours: float, who: str) -> ApiAnswer:
    """Mute the notifications of ``alert``'s rule on its run for ``hours`` (`POST /silences`)."""
    until = datetime.now(UTC) + timedelta(hours=hours)
    body = {
        "matchers": {"rule": alert["rule"], "run_id": alert["run_id"]},
        "until": until.isoformat(timespec="seconds"),
        "reason": f"silenced from the alerts page by {who}",
    }
    return call_api("POST", "/api/v1/silences", body)
