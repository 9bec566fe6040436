"""Which runs the periodic alert pass evaluates: steps left incomplete past
`step_complete_after_s`, `stale` rules that would change state, and firing alerts that a silence
kept untold and nothing mutes any more."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import false, select
from sqlalchemy.orm import Session

from ..models import Run, Step, as_utc
from .episodes import OPS, past_clear
from .models import AlertEpisode, AlertRule
from .states import active_silences, mutes


def runs_to_evaluate(session: Session, now: datetime, step_complete_after_s: float) -> set[str]:
    """The ids of the runs the periodic pass evaluates at ``now``."""
    cutoff = now - timedelta(seconds=step_complete_after_s)
    run_ids = set(
        session.scalars(
            select(Step.run_id)
            .where(Step.evaluated == false(), Step.first_seen_at < cutoff)
            .distinct()
        )
    )
    return run_ids | _stale_candidates(session, now) | _unmuted_candidates(session, now)


def _unmuted_candidates(session: Session, now: datetime) -> set[str]:
    """Runs with a firing alert that was never told (a silence muted its firing) whose rule
    has URLs and that no silence mutes any more: the silence expired or was deleted while the
    alert fired, and chat never heard of it. Evaluation tells it (`_tell_unmuted`)."""
    rows = session.execute(
        select(AlertEpisode.run_id, AlertRule.name, AlertRule.notify, Run.project)
        .join(AlertRule, AlertRule.id == AlertEpisode.rule_id)
        .join(Run, Run.id == AlertEpisode.run_id)
        .where(AlertEpisode.state == "firing", AlertEpisode.notified.is_(False))
    ).all()
    if not rows:
        return set()
    silences = active_silences(session, now)
    return {
        run_id
        for run_id, rule, notify, project in rows
        if notify and not any(mutes(s, rule, run_id, project) for s in silences)
    }


def _stale_candidates(session: Session, now: datetime) -> set[str]:
    """Runs where a `stale` rule would change state: silent running runs without an open stale
    episode, and open stale episodes whose run spoke again or finished. A run that stays silent
    costs nothing per pass."""
    rules = list(
        session.scalars(
            select(AlertRule).where(AlertRule.metric == "stale", AlertRule.enabled.is_(True))
        )
    )
    if not rules:
        return set()
    open_pairs = {
        (rule_id, run_id)
        for rule_id, run_id in session.execute(
            select(AlertEpisode.rule_id, AlertEpisode.run_id).where(
                AlertEpisode.rule_id.in_([r.id for r in rules]),
                AlertEpisode.state.in_(("pending", "firing")),
            )
        )
    }
    out: set[str] = set()
    q = select(Run.id, Run.project, Run.status, Run.last_seen_at, Run.heartbeat_s)
    running = {rid for rid, *_ in session.execute(q.where(Run.status == "running"))}
    out |= {run_id for _, run_id in open_pairs if run_id not in running}
    for run_id, project, _status, seen, heartbeat in session.execute(
        q.where(Run.status == "running")
    ):
        period = heartbeat if heartbeat and heartbeat > 0 else 10.0
        value = max(0.0, (now - as_utc(seen)).total_seconds() / period)
        for rule in rules:
            if rule.run_id not in (None, run_id) or rule.project not in (None, project):
                continue
            is_open = (rule.id, run_id) in open_pairs
            if (not is_open and OPS[rule.op](value, rule.threshold)) or (
                is_open and past_clear(rule, value)
            ):
                out.add(run_id)
                break
    return out
