"""Alert episodes as `GET /alerts` and the dashboard list them: `list_alerts` (newest first,
at most ``limit``) and `alert_page` (one page of a keyset-paginated listing)."""

from __future__ import annotations

import base64
import json
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import Select, and_, or_, select, true
from sqlalchemy.orm import Session

from ..models import Run, as_utc, iso
from .messages import recommended_action
from .mitigation import in_effect
from .models import AlertEpisode, AlertRule


def alert_dict(
    ep: AlertEpisode, rule: AlertRule, mode: str | None, session: Session
) -> dict[str, Any]:
    """An episode as `GET /alerts` lists it. ``mitigation``: the rule's command, offered for one
    click while the episode fires on a run in 'suggest' mode, unless the run already asks for
    it (`in_effect`, the test a rule in 'auto' mode applies)."""
    offer = rule.mitigation if mode == "suggest" and ep.state == "firing" else None
    if offer and in_effect(session, ep.run_id, offer):
        offer = None
    return {
        "alert_id": ep.id,
        "rule_id": ep.rule_id,
        "rule": rule.name,
        # the rule's scope: a project may have its own rule of a global rule's name
        "rule_project": rule.project,
        "rule_run_id": rule.run_id,
        "metric": rule.metric,
        "run_id": ep.run_id,
        "state": ep.state,
        "severity": ep.severity,
        "value": ep.value,
        "pending_step": ep.pending_step,
        "fired_step": ep.fired_step,
        "resolved_step": ep.resolved_step,
        "fired_at": iso(ep.fired_at),
        "resolved_at": iso(ep.resolved_at),
        "mitigation": offer,
        # what to do (docs/detectors.md): the dashboard shows both; the command is only offered,
        # and stays in the alert once it resolved (what was suggested, for the record)
        "recommended_action": _action(rule, ep.run_id, session),
        "suggested_command": rule.suggested_command,
    }


def _action(rule: AlertRule, run_id: str, session: Session) -> str | None:
    """The rule's recommended action with the run's reward bounds filled in."""
    text = rule.recommended_action or rule.description
    run = session.get(Run, run_id) if text and "{reward_" in text else None
    return recommended_action(rule, run)


def _filtered(
    run_id: str | None,
    rule: str | None,
    state: str | None,
    project: str | None,
    since: datetime | None,
) -> Select:
    """Episodes with their rule and their run's mitigation mode, filtered (None: any)."""
    q = (
        select(AlertEpisode, AlertRule, Run.mitigation_mode)
        .join(AlertRule, AlertRule.id == AlertEpisode.rule_id)
        .join(Run, Run.id == AlertEpisode.run_id)
    )
    if run_id is not None:
        q = q.where(AlertEpisode.run_id == run_id)
    if project is not None:
        q = q.where(Run.project == project)
    if rule is not None:
        q = (
            q.where(AlertRule.id == int(rule))
            if rule.isdigit() and len(rule) <= 9
            else q.where(AlertRule.name == rule)
        )
    if state is not None:
        q = q.where(AlertEpisode.state == state)
    if since is not None:
        q = q.where(AlertEpisode.updated_at >= since)
    return q


def list_alerts(
    session: Session,
    run_id: str | None = None,
    rule: str | None = None,
    state: str | None = None,
    since: datetime | None = None,
    project: str | None = None,
    limit: int = 1000,
) -> list[dict[str, Any]]:
    """Episodes newest first (resolved ones too unless ``state`` filters them)."""
    q = _filtered(run_id, rule, state, project, since)
    q = q.order_by(AlertEpisode.created_at.desc(), AlertEpisode.id.desc()).limit(limit)
    return [alert_dict(ep, r, mode, session) for ep, r, mode in session.execute(q).all()]


ORDERS = ("newest", "firing_first")
DEFAULT_PAGE = 100
MAX_PAGE = 1000


class BadCursor(ValueError):
    """A `cursor` this listing did not hand out (or one of another `order`)."""


class AlertPage(NamedTuple):
    """One page of `alert_page`: the alerts, and the cursor of the next page (None: the last)."""

    alerts: list[dict[str, Any]]
    next_cursor: str | None


def _encode(order: str, rank: int, created_at: datetime, episode_id: int) -> str:
    key = [order, rank, iso(created_at), episode_id]
    return base64.urlsafe_b64encode(json.dumps(key).encode()).decode().rstrip("=")


def _decode(cursor: str, order: str) -> tuple[int, datetime, int]:
    """(rank, created_at, id) of the last alert of the page before, as `_encode` wrote it."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        kind, rank, created_at, episode_id = json.loads(raw)
        when = as_utc(datetime.fromisoformat(created_at))
        ok = kind in ORDERS and rank in (0, 1) and type(episode_id) is int
    except (ValueError, TypeError, UnicodeDecodeError):
        ok = False
    if not ok:
        raise BadCursor("cursor is not one this listing handed out: start again without it")
    if kind != order:
        raise BadCursor(f"cursor belongs to order={kind}, not order={order}")
    return rank, when, episode_id


def alert_page(
    session: Session,
    *,
    run_id: str | None = None,
    rule: str | None = None,
    state: str | None = None,
    severity: str | None = None,
    project: str | None = None,
    since: datetime | None = None,
    order: str = "newest",
    limit: int = DEFAULT_PAGE,
    cursor: str | None = None,
) -> AlertPage:
    """One page of alert episodes, filtered, ordered and cut in the database (keyset
    pagination: a page costs the same at any depth). ``order``: "newest" (created first, as
    `list_alerts`) or "firing_first" (firing episodes, then the others, each newest first).
    ``rule``: a rule's name or id; ``project``: the run's project. ``cursor``: the
    `next_cursor` of the page before, under the same filters and order; raises BadCursor
    for one it did not hand out."""
    q = _filtered(run_id, rule, state, project, since)
    if severity is not None:
        q = q.where(AlertEpisode.severity == severity)
    start_rank, after = 0, None
    if cursor is not None:
        start_rank, *after = _decode(cursor, order)
    # firing first is two reads, firing then the rest, each newest first: each walks an
    # index (`ix_alert_episodes_state_created`, `ix_alert_episodes_created`) and stops at the
    # page's end, where one ORDER BY over "is it firing" sorted every matching episode
    parts = [AlertEpisode.state == "firing", AlertEpisode.state != "firing"]
    rows: list[tuple[int, Any]] = []
    for rank, part in enumerate(parts if order == "firing_first" else [true()]):
        if rank < start_rank:
            continue
        page = q.where(part)
        if after and rank == start_rank:
            last_at, last_id = after
            page = page.where(
                or_(
                    AlertEpisode.created_at < last_at,
                    and_(AlertEpisode.created_at == last_at, AlertEpisode.id < last_id),
                )
            )
        page = page.order_by(AlertEpisode.created_at.desc(), AlertEpisode.id.desc())
        rows += [(rank, row) for row in session.execute(page.limit(limit + 1 - len(rows)))]
        if len(rows) > limit:
            break
    more = len(rows) > limit
    rows = rows[:limit]
    alerts = [alert_dict(ep, r, mode, session) for _, (ep, r, mode) in rows]
    next_cursor = None
    if more:
        last_rank, (ep, _, _) = rows[-1]
        next_cursor = _encode(order, last_rank, ep.created_at, ep.id)
    return AlertPage(alerts, next_cursor)
