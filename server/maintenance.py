"""Retention: drop per-group rows of old runs while keeping their per-step metrics."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from .models import Group, Run, utcnow


def prune_groups(session: Session, older_than_days: float) -> int:
    """Delete the group rows of runs that received nothing for ``older_than_days``; returns how
    many rows went. Steps, runs and commands stay, so charts and exports are unchanged."""
    cutoff = utcnow() - timedelta(days=older_than_days)
    old = select(Run.id).where(Run.last_seen_at < cutoff)
    result = session.execute(delete(Group).where(Group.run_id.in_(old)))
    return result.rowcount or 0
