"""Alert episodes: the pending -> firing -> resolved state machine of one rule on one run
(docs/design.md §6), the notifications of its transitions, and the closing of episodes whose rule
or run goes away."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..locks import run_lock
from ..models import Run, utcnow
from ..settings import Settings
from .messages import webhook_body
from .mitigation import mitigate
from .models import AlertEpisode, AlertRule, AlertState, WebhookMessage
from .outbox import enqueue
from .states import Context, RuleRow, RuleState

OPS: dict[str, Callable[[float, float], bool]] = {
    ">": lambda v, t: v > t,
    ">=": lambda v, t: v >= t,
    "<": lambda v, t: v < t,
    "<=": lambda v, t: v <= t,
}


def past_clear(rule: AlertRule | RuleRow, value: float) -> bool:
    """Strictly past the clear threshold, on the side away from the condition. Without one, the
    threshold: the condition fails (so `n_invalid > 0` clears at 0)."""
    if rule.clear_threshold is None:
        return not OPS[rule.op](value, rule.threshold)
    clear = rule.clear_threshold
    return value < clear if rule.op in (">", ">=") else value > clear


def advance(
    ctx: Context,
    rule: RuleRow,
    st: RuleState,
    step: int | None,
    value: float,
    for_steps: int | None = None,
) -> None:
    """One evaluated value: the pending → firing → resolved state machine of §6."""
    session = ctx.session
    needed = max(1, for_steps or rule.for_steps or 1)
    cond = OPS[rule.op](value, rule.threshold)
    ep = None
    if st.episode_id is not None:
        ep = ctx.episodes.get(st.episode_id) or session.get(AlertEpisode, st.episode_id)
    if ep is None:
        st.episode_id, st.streak, st.clear_streak = None, 0, 0
        if not cond or _cooling_down(rule, st, step):
            return
        ep = AlertEpisode(
            rule_id=rule.id,
            run_id=ctx.run.id,
            state="pending",
            severity=rule.severity,
            value=value,
            pending_step=step,
            created_at=ctx.now,
            updated_at=ctx.now,
        )
        session.add(ep)
        session.flush()
        ctx.episodes[ep.id] = ep
        st.episode_id, st.streak = ep.id, 1
        if st.streak >= needed:
            _fire(ctx, rule, st, ep, step, value)
        return
    if ep.state == "pending":
        if not cond:  # discarded, never listed
            session.delete(ep)
            st.episode_id, st.streak = None, 0
            return
        st.streak += 1
        ep.value, ep.updated_at = value, ctx.now
        if st.streak >= needed:
            _fire(ctx, rule, st, ep, step, value)
        return
    ep.value, ep.updated_at = value, ctx.now  # firing
    last = st.last_mitigation_step
    if cond and (last is None or last < (ep.fired_step or 0)):  # not issued in this episode yet
        mitigate(ctx, rule, st, ep, step, f"alert {rule.name} firing since step {ep.fired_step}")
    if not past_clear(rule, value):
        st.clear_streak = 0
        return
    st.clear_streak += 1
    if st.clear_streak >= max(1, rule.clear_steps or 1):
        ep.state, ep.resolved_step, ep.resolved_at = "resolved", step, ctx.now
        st.episode_id, st.streak, st.clear_streak = None, 0, 0
        if ep.notified:
            notify_transition(ctx, rule, ep, "resolved", step, value)


def _cooling_down(rule: RuleRow, st: RuleState, step: int | None) -> bool:
    """Within `alert_cooldown_steps` of the step the rule's last episode on the run fired: no
    new episode opens (a detector that resolves and fires again every few steps would page
    each time)."""
    cooldown = getattr(rule, "alert_cooldown_steps", 0) or 0
    last = st.last_fired_step
    return bool(cooldown) and None not in (last, step) and last <= step < last + cooldown


def _fire(
    ctx: Context, rule: RuleRow, st: RuleState, ep: AlertEpisode, step: int | None, value: float
) -> None:
    ep.state, ep.fired_step, ep.fired_at = "firing", step, ctx.now
    st.clear_streak = 0
    if step is not None:
        st.last_fired_step = step
    # A resumed run replaying steps up to an episode that already notified does not notify
    # again. (`stale` is not step-based: its step is just where the run stood.)
    replay = (
        rule.metric != "stale"
        and st.notified_through is not None
        and step is not None
        and step <= st.notified_through
    )
    if not replay:
        ep.notified = notify_transition(ctx, rule, ep, "firing", step, value)
        if ep.notified and step is not None:
            st.notified_through = step
    mitigate(ctx, rule, st, ep, step, f"alert {rule.name} fired at step {step}")


def notify_transition(
    ctx: Context, rule: RuleRow, ep: AlertEpisode, state: str, step: int | None, value: float
) -> bool:
    """Queue the webhook messages of a transition; False when there is nobody to tell. A
    resolution whose firing was told is told too, even if a silence began in between (chat
    showed the alert firing for ever); a silence mutes the episodes it finds firing
    from then on."""
    urls = list(rule.notify or []) if state == "firing" else told(ctx.session, ep.id)
    if not urls or (state == "firing" and ctx.silenced(rule)):
        return False
    body = webhook_body(ctx.settings, ctx.run, rule, ep.id, state, step, value)
    enqueue(ctx.session, urls, body, ep.id)
    ctx.queued = True
    return True


def told(session: Session, episode_id: int) -> list[str]:
    """The URLs an episode's firing was queued for (its outbox messages), in order: where its
    resolution goes, whatever its rule's `notify` is now (a rule re-pointed while its alert
    fired sent "firing" to one URL and "resolved" to the other)."""
    rows = session.execute(
        select(WebhookMessage.url)
        .where(WebhookMessage.episode_id == episode_id)
        .order_by(WebhookMessage.id)
    ).scalars()
    # Evaluation does not flush: a firing queued earlier in this transaction (an alert that
    # fired and resolved within one batch) is not in the database yet, and its resolution
    # would be lost.
    queued = [
        m.url for m in session.new if isinstance(m, WebhookMessage) and m.episode_id == episode_id
    ]
    return list(dict.fromkeys([*rows, *queued]))


def end_rule_episodes(
    session: Session,
    rule: Any,
    settings: Settings,
    why: str,
    keep: Callable[[Run], bool] = lambda run: False,
) -> int:
    """Close the open episodes of a rule that stops watching their runs (it was disabled,
    deleted, or its metric, split or scope changed; docs/design.md §6 is silent), except on the runs
    ``keep`` keeps: a pending one is dropped, a firing one resolves now, at no step, and when
    its firing was told, a resolved message saying ``why`` goes where it went (``rule``: the
    rule as it was, its `notify` included). Without this, a disabled rule's alert stayed firing
    for ever. Each run's lock is held, as evaluation holds it; the caller took those
    of the runs it foresaw (`rules.change_lock`) and commits. A run it did not foresee (an
    episode opened since) is locked without waiting, as this transaction has written: a lock
    held elsewhere raises for the caller to redo it all (`db.redo_on_lock_conflict`), never an
    ingest's deadlock. Returns how many episodes resolved."""
    now, resolved = utcnow(), 0
    run_ids = session.scalars(
        select(AlertState.run_id)
        .where(AlertState.rule_id == rule.id, AlertState.episode_id.is_not(None))
        .order_by(AlertState.run_id)  # one order of locks for every caller
    ).all()
    for run_id in run_ids:
        with run_lock(session, run_id, nowait=True):
            run = session.get(Run, run_id)
            st = session.get(AlertState, (rule.id, run_id))
            if run is None or st is None or st.episode_id is None or keep(run):
                continue
            resolved += _close_episode(session, st, rule, run, settings, why, now)
    session.flush()
    return resolved


def end_run_episodes(session: Session, run: Run, settings: Settings, why: str) -> int:
    """Close the open episodes of a run that ended (finished or failed) or is being deleted, as
    `end_rule_episodes` closes a rule's: a pending one is dropped, a firing one resolves at no
    step, and a resolved message saying ``why`` goes where its firing was told. Without this an
    ended run's alerts stayed firing for ever, and a deleted run's vanished untold: an on-call
    incident stayed open. The caller holds the run's lock and commits. Returns how
    many episodes resolved."""
    now, resolved = utcnow(), 0
    states = session.scalars(
        select(AlertState).where(AlertState.run_id == run.id, AlertState.episode_id.is_not(None))
    ).all()
    for st in states:
        rule = session.get(AlertRule, st.rule_id)
        if rule is not None:
            resolved += _close_episode(session, st, rule, run, settings, why, now)
    session.flush()
    return resolved


def _close_episode(
    session: Session,
    st: AlertState,
    rule: Any,
    run: Run,
    settings: Settings,
    why: str,
    now: datetime,
) -> bool:
    """End the open episode of ``st`` (its rule and run) with no step: a pending one is
    deleted, a firing one resolved and, when its firing was told, told where it went (`told`)
    with ``why``. True when an episode resolved."""
    ep = session.get(AlertEpisode, st.episode_id)
    st.episode_id, st.streak, st.clear_streak = None, 0, 0
    if ep is None:
        return False
    if ep.state == "pending":
        session.delete(ep)
        return False
    ep.state, ep.resolved_at, ep.updated_at = "resolved", now, now
    if ep.notified and (urls := told(session, ep.id)):
        body = webhook_body(settings, run, rule, ep.id, "resolved", None, ep.value, why)
        enqueue(session, urls, body, ep.id)
    return True
