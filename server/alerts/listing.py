"""Alert episodes as `GET /alerts` and the dashboard list them."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..models import Run, iso
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
    }


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
    q = q.order_by(AlertEpisode.created_at.desc(), AlertEpisode.id.desc()).limit(limit)
    return [alert_dict(ep, r, mode, session) for ep, r, mode in session.execute(q).all()]
