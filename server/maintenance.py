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
    old = select(Run.key).where(Run.last_seen_at < cutoff)
    result = session.execute(delete(Group).where(Group.run_key.in_(old)))
    return result.rowcount or 0


def delete_run_data(session: Session, run: Run) -> None:
    """Delete a run with everything it owns. Groups carry no foreign key (it slowed ingest), so
    they go explicitly; the other tables cascade from the run row."""
    session.execute(delete(Group).where(Group.run_key == run.key))
    session.delete(run)
