"""Retention: drop per-group data of old runs while keeping their per-step metrics."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from .alerts.models import AlertEpisode, WebhookMessage
from .models import GroupBlock, Run, utcnow


def prune_groups(session: Session, older_than_days: float) -> int:
    """Delete the stored groups of runs that received nothing for ``older_than_days``; returns
    how many groups went. Steps, runs and commands stay, so charts and exports are unchanged.
    A span reaching back before year 1 (or infinite) prunes nothing."""
    try:
        cutoff = utcnow() - timedelta(days=older_than_days)
    except OverflowError:
        return 0
    old = GroupBlock.run_key.in_(select(Run.key).where(Run.last_seen_at < cutoff))
    groups = session.scalar(select(func.coalesce(func.sum(GroupBlock.n_groups), 0)).where(old))
    session.execute(delete(GroupBlock).where(old))
    return int(groups)


def delete_run_data(session: Session, run: Run) -> None:
    """What deleting a run must delete beside the run row, which the caller deletes (the other
    tables cascade from it), once `alerts.end_run_episodes` queued its alerts' resolutions.
    Group blocks carry no foreign key (it slowed ingest), so they go explicitly, as do its
    alerts' unsent messages to targets that already failed them (a failing target was retried
    for a day about a run that no longer exists). Messages not tried yet stay: a run
    deleted just after its alert fired lost both the firing and its resolution."""
    session.execute(delete(GroupBlock).where(GroupBlock.run_key == run.key))
    episodes = select(AlertEpisode.id).where(AlertEpisode.run_id == run.id)
    unsent = (WebhookMessage.status == "pending", WebhookMessage.episode_id.in_(episodes))
    failing = select(WebhookMessage.url).where(*unsent, WebhookMessage.attempts > 0)
    session.execute(delete(WebhookMessage).where(*unsent, WebhookMessage.url.in_(failing)))
