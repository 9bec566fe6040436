"""Alert evaluation (DESIGN.md §6): rules over evaluated steps, episodes, notifications and
automatic mitigation.

Ingest stores a batch, then calls `Evaluator.after_ingest` in the same transaction, before the
commit (if evaluation raises, ingest redoes the transaction without it: the batch is stored and
the periodic pass evaluates later). It evaluates — in step order, on the newest-attempt view —
the steps of that run that became evaluable: every rank of its `world_size` reported it or a
later step (ranks send in step order, so a rank that moved on will not send it), or its first
record is older than `step_complete_after_s` (the periodic pass). Each step is evaluated once
(`steps.evaluated`; a newer attempt taking a step over resets it).

Replicas: every writer of a run's steps and alert state holds the run's lock
(`vantage.server.locks.run_lock`) for its whole transaction, so two processes ingesting one run
never both see a step unevaluated, and the per-(rule, run) `alert_states` row holds the one open
episode. Transitions, their outbox messages and their commands commit with the batch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any, NamedTuple

from sqlalchemy import and_, bindparam, false, func, insert, or_, select, update
from sqlalchemy.orm import Session

from .alert_metrics import SERIES_METRICS, Window, series_values, stale_value, step_value
from .alert_models import AlertEpisode, AlertRule, AlertState, Silence, WebhookMessage
from .alert_steps import evaluable_steps, evaluated_frontier, mark_evaluated, unevaluated_steps
from .commands import ENDED_STATES, create_command, mitigation_state
from .locks import RunState, run_lock, save_run_state
from .models import Command, Run, Step, as_utc, iso, utcnow
from .notify import enqueue
from .settings import Settings

log = logging.getLogger("vantage.alerts")


class EvaluationFailed(RuntimeError):
    """Alert evaluation raised; the ingest transaction must be redone without it."""


class Outcome(NamedTuple):
    """What an evaluation did that its caller acts on after the commit."""

    notified: bool = False  # a webhook message was queued: wake the outbox sender
    issued: bool = False  # a command was issued: the answer to rank 0 must carry it


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


RULES, STATES = AlertRule.__table__, AlertState.__table__
RuleRow = SimpleNamespace
"""A rule as evaluation reads it (`rules_and_states`): its columns as attributes."""
STATE_FIELDS = ("episode_id", "streak", "clear_streak", "last_mitigation_step", "notified_through")
# The enabled rules that apply to a run (its own, its project's, global ones) with the run's
# state of each, read with Core and built once (ingest runs it for every evaluated step).
_RULES_AND_STATES = (
    select(RULES, *(STATES.c[f].label(f"state_{f}") for f in STATE_FIELDS))
    .add_columns(STATES.c.rule_id.label("state_rule_id"))
    .outerjoin(STATES, and_(STATES.c.rule_id == RULES.c.id, STATES.c.run_id == bindparam("run_id")))
    .where(
        RULES.c.enabled.is_(True),
        or_(
            RULES.c.run_id == bindparam("run_id"),
            and_(
                RULES.c.run_id.is_(None),
                or_(RULES.c.project.is_(None), RULES.c.project == bindparam("project")),
            ),
        ),
    )
    .order_by(RULES.c.id)
)
_INSERT_STATE = insert(STATES)
_UPDATE_STATE = (
    update(STATES)
    .where(STATES.c.rule_id == bindparam("key_rule_id"), STATES.c.run_id == bindparam("key_run_id"))
    .values({f: bindparam(f) for f in STATE_FIELDS})
)


@dataclass(slots=True)
class RuleState:
    """Where evaluation of one rule on one run stands (a row of `alert_states`); `stored` is
    what the row held when read (None: no row yet), so only changed states are written."""

    rule_id: int
    episode_id: int | None = None
    streak: int = 0
    clear_streak: int = 0
    last_mitigation_step: int | None = None
    notified_through: int | None = None
    stored: tuple | None = None

    def values(self) -> tuple:
        return tuple(getattr(self, f) for f in STATE_FIELDS)


@dataclass(frozen=True, slots=True)
class _KeptConfig:
    """A run's rules and states as they were at its `alert_epoch` (`ALERT_CONFIG`)."""

    key: int  # the run's key: a run deleted and made again under its id starts a new epoch
    project: str | None
    epoch: int
    rules: tuple[RuleRow, ...]  # shared by evaluations: never changed
    states: tuple[RuleState, ...]  # copied for each evaluation


ALERT_CONFIG: dict[str, _KeptConfig] = {}
"""Per run id, its rules and states as an evaluation in this process left them committed. A
trigger on `alert_rules` and one on `alert_states` (migration 0013) move a run's `alert_epoch`
on with every change of a rule that may apply to it or of one of its states, whatever code or
process makes it; `run_lock` reads the epoch with the run, current under the lock. While it is
the kept one, evaluation takes the kept rules and states instead of reading them (a query each
batch of ingest, about a tenth of its CPU)."""
_ALERT_CONFIG_MAX = 10_000


def rules_and_states(session: Session, run: RunState) -> tuple[list[RuleRow], dict[int, RuleState]]:
    """The rules that apply to a run (plain objects with the rule's columns as attributes)
    and the run's states of them: those kept in `ALERT_CONFIG` when the run's epoch is theirs,
    else read in one query. The caller holds the run's lock; `remember_config` keeps what it
    commits."""
    kept = ALERT_CONFIG.get(run.id)
    if kept is not None and (kept.key, kept.project, kept.epoch) == (
        run.key,
        run.project,
        run.alert_epoch,
    ):
        rules, states = list(kept.rules), {st.rule_id: replace(st) for st in kept.states}
    else:
        rules, states = _read_rules_and_states(session, run)
    session.info["alert_config"] = (run, rules, states)
    return rules, states


def remember_config(session: Session) -> None:
    """After a commit: keep the rules and states the committed transaction's evaluation left
    (`rules_and_states`), under the run's epoch as `save_run_state` read it back after the
    states were written. A state written after that (none is, in ingest or `evaluate_run`)
    would move the epoch past it, and the kept copy would only be read again."""
    config = session.info.pop("alert_config", None)
    if config is None:
        return
    run, rules, states = config
    if len(ALERT_CONFIG) >= _ALERT_CONFIG_MAX:
        ALERT_CONFIG.clear()
    kept = tuple(replace(st) for st in states.values())
    ALERT_CONFIG[run.id] = _KeptConfig(run.key, run.project, run.alert_epoch, tuple(rules), kept)


def _read_rules_and_states(
    session: Session, run: RunState
) -> tuple[list[RuleRow], dict[int, RuleState]]:
    rules, states = [], {}
    params = {"run_id": run.id, "project": run.project}
    for row in session.connection().execute(_RULES_AND_STATES, params).mappings():
        fields = dict(row)
        state = {f: fields.pop(f"state_{f}") for f in STATE_FIELDS}
        has_state = fields.pop("state_rule_id") is not None
        rule = SimpleNamespace(**fields)
        rules.append(rule)
        if has_state:
            st = states[rule.id] = RuleState(rule.id, **state)
            st.stored = st.values()
    return rules, states


def write_states(session: Session, run_id: str, states: dict[int, RuleState]) -> None:
    """Insert new states and update changed ones (the caller holds the run's lock)."""
    new, changed = [], []
    for st in states.values():
        values = dict(zip(STATE_FIELDS, st.values(), strict=True))
        if st.stored is None:
            new.append({"rule_id": st.rule_id, "run_id": run_id, **values})
        elif st.values() != st.stored:
            changed.append({"key_rule_id": st.rule_id, "key_run_id": run_id, **values})
        st.stored = st.values()
    conn = session.connection()
    if new:
        conn.execute(_INSERT_STATE, new)
    if changed:
        conn.execute(_UPDATE_STATE, changed)


class _Context:
    """What one evaluation of one run shares: the run, its rules, states, silences, time."""

    def __init__(self, session: Session, run: RunState, settings: Settings, now: datetime) -> None:
        self.session, self.run, self.settings, self.now = session, run, settings, now
        self.rules, self.states = rules_and_states(session, run)
        self.episodes: dict[int, AlertEpisode] = {}  # the open ones
        open_ids = [s.episode_id for s in self.states.values() if s.episode_id is not None]
        if open_ids:
            q = select(AlertEpisode).where(AlertEpisode.id.in_(open_ids))
            self.episodes = {e.id: e for e in session.scalars(q)}
        self._silences: list[Silence] | None = None
        self.queued = False  # a webhook message was queued
        self.issued = False  # a command was issued

    def state(self, rule: RuleRow) -> RuleState:
        st = self.states.get(rule.id)
        if st is None:
            st = self.states[rule.id] = RuleState(rule.id)
        return st

    def silenced(self, rule: RuleRow) -> bool:
        if self._silences is None:
            self._silences = active_silences(self.session, self.now)
        return any(_mutes(s, rule.name, self.run.id, self.run.project) for s in self._silences)


def active_silences(session: Session, now: datetime) -> list[Silence]:
    """The silences in force at ``now`` (their `until` later)."""
    return list(session.scalars(select(Silence).where(Silence.until > now)))


def _mutes(silence: Silence, rule: str, run_id: str, project: str | None) -> bool:
    """Whether ``silence`` mutes the alerts of the rule named ``rule`` on a run."""
    m = silence.matchers or {}
    return (
        m.get("rule") in (None, rule)
        and m.get("run_id") in (None, run_id)
        and m.get("project") in (None, project)
    )


class Evaluator:
    """Alert evaluation bound to the server's settings; `after_ingest` is ingest's hook."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.on_notify: Callable[[], None] | None = None  # wakes this process's outbox sender
        self._failing: dict[str, str] = {}  # run id -> the error its evaluation last raised

    def _failed(self, run_id: str, exc: Exception, where: str) -> None:
        """Log a failed evaluation: with its traceback when the run's error is new, in one
        line while it fails alike (the periodic pass retries every few seconds)."""
        error = f"{type(exc).__name__}: {exc}"
        if self._failing.get(run_id) == error:
            log.warning("%s failed again for run %s: %s", where, run_id, error)
        else:
            self._failing[run_id] = error
            log.error("%s failed for run %s", where, run_id, exc_info=exc)

    def after_ingest(
        self, session: Session, run: RunState, result: Any, write: Callable[[], None]
    ) -> Outcome:
        """Evaluate the steps of ``run`` that the batch made evaluable, inside the ingest
        transaction (the caller holds the run's lock and commits). ``write`` stores ingest's
        step rows; it is called, once their evaluated flags are set, before evaluation reads
        steps, if it does (else the caller writes them after). Raises EvaluationFailed when
        evaluation fails: the caller then stores the batch alone (it is never lost to an
        alert error) and the periodic pass evaluates later."""
        if not result.touched:
            return Outcome()
        try:
            outcome = evaluate_locked(
                session, run, self.settings, candidates=result.candidates, before_reads=write
            )
        except Exception as exc:
            self._failed(run.id, exc, "alert evaluation")
            raise EvaluationFailed(str(exc)) from exc
        self._failing.pop(run.id, None)
        return outcome

    def notified(self) -> None:
        """Wake this process's outbox sender (after the transaction that queued a message)."""
        if self.on_notify is not None:
            self.on_notify()

    def periodic_pass(self, session_factory: Callable[[], Session]) -> None:
        """Steps left incomplete past `step_complete_after_s`, and `stale` rules."""
        now = utcnow()
        cutoff = now - timedelta(seconds=self.settings.step_complete_after_s)
        with session_factory() as session:
            run_ids = set(
                session.scalars(
                    select(Step.run_id)
                    .where(Step.evaluated == false(), Step.first_seen_at < cutoff)
                    .distinct()
                )
            )
            run_ids |= _stale_candidates(session, now)
            run_ids |= _unmuted_candidates(session, now)
        for run_id in sorted(run_ids):
            with session_factory() as session:
                try:
                    notified = evaluate_run(session, run_id, self.settings, stale=True)
                except Exception as exc:  # noqa: BLE001
                    session.rollback()
                    self._failed(run_id, exc, "periodic alert pass")
                    continue
                self._failing.pop(run_id, None)
                if notified:
                    self.notified()


def _unmuted_candidates(session: Session, now: datetime) -> set[str]:
    """Runs with a firing alert that was never told (a silence muted its firing) whose rule
    has URLs and that no silence mutes any more: the silence expired or was deleted while the
    alert fired, and chat never heard of it (a trial). Evaluation tells it (`_tell_unmuted`)."""
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
        if notify and not any(_mutes(s, rule, run_id, project) for s in silences)
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


def evaluate_run(
    session: Session,
    run_id: str,
    settings: Settings,
    splits: set[str] | None = None,
    stale: bool = False,
) -> bool:
    """Take the run's lock, evaluate (`evaluate_locked`) and commit. Returns whether a webhook
    message was queued."""
    with run_lock(session, run_id) as locked:
        if locked.run is None:
            session.rollback()
            return False
        candidates = unevaluated_steps(session, locked.run, splits)
        outcome = evaluate_locked(session, locked.run, settings, candidates, stale)
        save_run_state(session, locked.run)
        session.commit()
        remember_config(session)
        return outcome.notified


def evaluate_locked(
    session: Session,
    run: RunState,
    settings: Settings,
    candidates: list[Any],
    stale: bool = False,
    before_reads: Callable[[], None] | None = None,
) -> Outcome:
    """Evaluate, in step order, every evaluable step among ``candidates`` (the run's unevaluated
    steps, of some splits at least: ORM rows, or ingest's plain rows), and the run's `stale`
    rules (all of them when ``stale``, else only open episodes, which fresh data resolves). The
    caller holds the run's lock and commits. ``before_reads`` writes ingest's rows, whose
    evaluated flags are set by then: it is called before evaluation reads any step from the
    database, if it does (in the steady state it reads none, and ingest writes the rows with
    the run's state, in one statement: `vantage.server.ingest.save_steps_and_run`)."""
    now = utcnow()
    with session.no_autoflush:  # the evaluated flags go out with ingest's own writes
        rows = evaluable_steps(session, run, candidates, now, settings.step_complete_after_s)
        mark_evaluated(rows)
        progress = dict(run.eval_progress or {})
        rows, replays = _in_order(progress, rows)
    before_reads = before_reads or _nothing
    if not rows and not stale and not _open_stale_episode(session, run.id):
        return Outcome()  # e.g. one rank of several: nothing to evaluate yet
    ctx = _Context(session, run, settings, now)
    for rule in ctx.rules:  # before the steps, which may resolve it (then told too)
        _tell_unmuted(ctx, rule)
    # An ended run's late steps (a rank's, a `vantage sync`) are stored but fire nothing: the
    # finish resolved its alerts, and nothing would resolve one fired after it (a trial).
    ended = run.status in ENDED_STATES
    step_rules = [] if ended else [r for r in ctx.rules if r.metric != "stale"]
    series = {}
    for split in sorted({r.split for r in rows}):
        needs = {r.metric for r in step_rules if r.split == split}
        split_rows = [r for r in rows if r.split == split]
        last = progress.get(split)
        series[split], progress[split] = _walk(session, run, split_rows, needs, last, before_reads)
    if rows:
        run.eval_progress = progress
    if replays:
        before_reads()
    with session.no_autoflush:  # one flush at commit, not one per query
        rewinds = {i: _steps_between(session, run.id, rows[i], s) for i, s in replays.items()}
        for i, row in enumerate(rows):
            for rule in step_rules:
                if rule.split == row.split:
                    value = step_value(row, rule.metric, series[row.split])
                    _evaluate_step(ctx, rule, row, value, rewinds.get(i, 0))
    for rule in ctx.rules:
        if rule.metric == "stale":
            st = ctx.states.get(rule.id)
            if stale or (st is not None and st.episode_id is not None):
                _evaluate_stale(ctx, rule)
    write_states(session, run.id, ctx.states)
    return Outcome(ctx.queued, ctx.issued)


def _tell_unmuted(ctx: _Context, rule: RuleRow) -> None:
    """Tell a firing episode of ``rule`` that was not told when it fired (a silence muted it,
    or the rule had no URL then) once nothing mutes it: a silence that ended while the alert
    fired left chat unaware of a live incident (a trial). A replay of a firing already told (a
    resumed run) stays untold, as `_fire` leaves it."""
    st = ctx.states.get(rule.id)
    ep = ctx.episodes.get(st.episode_id) if st is not None and st.episode_id else None
    if ep is None or ep.state != "firing" or ep.notified or not rule.notify:
        return
    step, told_through = ep.fired_step, st.notified_through
    if rule.metric != "stale" and None not in (step, told_through) and step <= told_through:
        return
    if _notify(ctx, rule, ep, "firing", step, ep.value):
        ep.notified = True
        if step is not None:
            st.notified_through = max(step, told_through or step)


def _open_stale_episode(session: Session, run_id: str) -> bool:
    """Whether fresh data may resolve a `stale` episode of the run."""
    q = (
        select(AlertEpisode.id)
        .join(AlertRule, AlertRule.id == AlertEpisode.rule_id)
        .where(
            AlertEpisode.run_id == run_id,
            AlertEpisode.state.in_(("pending", "firing")),
            AlertRule.metric == "stale",
        )
        .limit(1)
    )
    return session.scalar(q) is not None


def _evaluate_step(
    ctx: _Context, rule: RuleRow, row: Step, value: float | None, rewind: int = 0
) -> None:
    """One step's value for one rule; ``rewind``: how many steps the rule already counted
    that this step and the ones after it replace (a resumed run's newer attempt)."""
    if rewind:
        _rewind(ctx, ctx.state(rule), row.step, rewind)
    if value is None or row.n_valid < rule.min_valid_groups:
        return  # neither advances nor resets for_steps
    _advance(ctx, rule, ctx.state(rule), row.step, value)


def _rewind(ctx: _Context, st: RuleState, step: int, replaced: int) -> None:
    """A newer attempt replays steps from ``step`` on that the rule already took: its streaks
    drop the ``replaced`` steps, so that a replayed step counts once toward ``for_steps`` (it
    counted twice, and a resumed run's alert fired early: a trial). A pending episode whose
    streak is gone starts again at ``step`` if the condition holds there."""
    st.streak = max(0, st.streak - replaced)
    st.clear_streak = max(0, st.clear_streak - replaced)
    if st.episode_id is None or st.streak:
        return
    ep = ctx.episodes.get(st.episode_id) or ctx.session.get(AlertEpisode, st.episode_id)
    if ep is not None and ep.state == "pending":
        ep.pending_step = step


def _in_order(progress: dict[str, Any], rows: list[Step]) -> tuple[list[Step], dict[int, int]]:
    """The rows the rules take, in step order, and the replays among them: index → the step
    the rules had taken last, for a row at or before it. ``progress`` (`runs.eval_progress`)
    holds per split the step the rules last took and its attempt (see `_walk`): a straggler —
    at or before it, from the same or an older attempt — is flagged evaluated but changes no
    rule; a resumed run's newer attempt replays its steps, and is taken."""
    last = {split: entry[:2] for split, entry in progress.items()}
    out, replays = [], {}
    for row in rows:
        seen = last.get(row.split)
        if seen is not None and row.step <= seen[0]:
            if row.attempt <= seen[1]:
                continue
            replays[len(out)] = seen[0]
        last[row.split] = [row.step, row.attempt]
        out.append(row)
    return out, replays


def _steps_between(session: Session, run_id: str, row: Step, last: int) -> int:
    """How many of the run's steps of ``row``'s split lie from ``row.step`` to ``last``: the
    steps a replay from ``row`` goes back over (at most those a rule counted)."""
    q = select(func.count()).where(
        Step.run_id == run_id, Step.split == row.split, Step.step.between(row.step, last)
    )
    return int(session.scalar(q) or 0)


def _nothing() -> None:
    pass


def _walk(
    session: Session,
    run: RunState,
    rows: list[Step],
    needs: set[str],
    last: list[Any] | None,
    before_reads: Callable[[], None],
) -> tuple[dict[int, dict[str, float | None]], list[Any]]:
    """Window values at a split's taken ``rows`` (in step order), and the split's new progress
    entry ``[step, attempt, frontier, window]``: the step the rules took last and its attempt,
    the highest step evaluated so far, and the window as of that step.

    The kept window is walked on when nothing was evaluated after its step (its step is the
    frontier: a resumed run replaying earlier steps moves the step back, leaving the old
    attempt's later rows in the view) and the rows follow it; every step row between them is
    then among ``rows``, as steps are evaluated in step order. Otherwise the window is read
    again from the database, if a rule needs it (after ``before_reads``)."""
    start = None
    if last is not None and len(last) > 3 and last[0] == last[2] and rows[0].step > last[0]:
        start = Window.load(last[3])
    step, attempt = rows[-1].step, rows[-1].attempt
    if start is not None:
        values = start.walk(rows, needs & SERIES_METRICS, (run.reward_min, run.reward_max))
        return values, [step, attempt, step, start.dump()]
    before_reads()
    frontier = max(step, evaluated_frontier(session, run.id, rows[0].split))
    if not needs & SERIES_METRICS:
        return {}, [step, attempt, frontier]
    values, window = series_values(session, run, rows[0].split, [r.step for r in rows], needs)
    return values, [step, attempt, frontier, window.dump()]


def _evaluate_stale(ctx: _Context, rule: RuleRow) -> None:
    st = ctx.state(rule)
    step = ctx.run.last_step
    _advance(ctx, rule, st, step, stale_value(ctx.run, ctx.now), for_steps=1)


def _advance(
    ctx: _Context,
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
        if not cond:
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
        _mitigate(ctx, rule, st, ep, step, f"alert {rule.name} firing since step {ep.fired_step}")
    if not past_clear(rule, value):
        st.clear_streak = 0
        return
    st.clear_streak += 1
    if st.clear_streak >= max(1, rule.clear_steps or 1):
        ep.state, ep.resolved_step, ep.resolved_at = "resolved", step, ctx.now
        st.episode_id, st.streak, st.clear_streak = None, 0, 0
        if ep.notified:
            _notify(ctx, rule, ep, "resolved", step, value)


def _fire(
    ctx: _Context, rule: RuleRow, st: RuleState, ep: AlertEpisode, step: int | None, value: float
) -> None:
    ep.state, ep.fired_step, ep.fired_at = "firing", step, ctx.now
    st.clear_streak = 0
    # A resumed run replaying steps up to an episode that already notified does not notify
    # again. (`stale` is not step-based: its step is just where the run stood.)
    replay = (
        rule.metric != "stale"
        and st.notified_through is not None
        and step is not None
        and step <= st.notified_through
    )
    if not replay:
        ep.notified = _notify(ctx, rule, ep, "firing", step, value)
        if ep.notified and step is not None:
            st.notified_through = step
    _mitigate(ctx, rule, st, ep, step, f"alert {rule.name} fired at step {step}")


def _mitigate(
    ctx: _Context, rule: RuleRow, st: RuleState, ep: AlertEpisode, step: int | None, why: str
) -> None:
    """Issue the rule's mitigation for a firing episode (DESIGN.md §6): when the run's mode is
    auto, at most once per cooldown_steps (counted from the step it was issued or found
    already asked for), and not while the run already asks for it (`_in_effect`). Called when
    the alert fires and, until the episode has done so, at each later step whose value meets
    the condition: an alert that fired in `suggest` mode, or within a cooldown, acts once the
    run is switched to `auto` or the cooldown ends (found by a fresh-user trial). Nothing is
    issued for a run that has finished or failed (`evaluate_locked` gives an ended run's steps
    to no rule; this guards the rest): no trainer reads its commands, and one left `pending`
    would reach a relaunch as if new (a fresh-user trial)."""
    if not rule.mitigation or ctx.run.mitigation_mode != "auto" or step is None:
        return
    if ctx.run.status in ENDED_STATES:
        return
    last, cooldown = st.last_mitigation_step, rule.cooldown_steps or 0
    mit = rule.mitigation
    if not (last is None or cooldown == 0 or abs(step - last) >= cooldown):
        return
    # Already asked for: this episode's mitigation is done, so a user who then turns it off by
    # hand is not overruled while the alert keeps firing (the next episode issues it again).
    st.last_mitigation_step = step
    if not _in_effect(ctx.session, ctx.run.id, mit):
        create_command(
            ctx.session,
            ctx.run.id,
            mit["type"],
            mit.get("params") or {},
            reason=f"{why}: {rule.metric} = {ep.value:.4g} ({rule.op} {rule.threshold:g})",
            issued_by=f"alert:{rule.name}",
            alert_id=ep.id,
            ttl_s=ctx.settings.command_ttl_s,
        )
        ctx.issued = True


# Command types a rule never repeats while the run's newest one of the type, in these states,
# asks for the same thing (a checkpoint may be wanted at every episode).
_UNREPEATED = {
    "set_mitigation": ("pending", "delivered", "applied"),
    "set_sampling": ("pending", "delivered", "applied"),
    "stop": ("pending", "delivered"),  # an applied stop: the run was relaunched since
}


def _in_effect(session: Session, run_id: str, mitigation: dict[str, Any]) -> bool:
    """Whether the run's newest command of the rule's type that is pending, delivered or
    (for settings) applied already asks for ``mitigation`` (every parameter the rule gives):
    issuing it again would only repeat it, each time the alert fires anew."""
    kind, wanted = mitigation.get("type"), mitigation.get("params") or {}
    if kind == "set_mitigation":
        requested = mitigation_state(session, [run_id])[run_id]["requested"]
        return requested is not None and all(requested.get(k) == v for k, v in wanted.items())
    if kind not in _UNREPEATED:
        return False
    newest = session.scalars(
        select(Command.params)
        .where(
            Command.run_id == run_id,
            Command.type == kind,
            Command.status.in_(_UNREPEATED[kind]),
        )
        .order_by(Command.created_at.desc())
        .limit(1)
    ).first()
    return newest is not None and all(newest.get(k) == v for k, v in wanted.items())


def _notify(
    ctx: _Context, rule: RuleRow, ep: AlertEpisode, state: str, step: int | None, value: float
) -> bool:
    """Queue the webhook messages of a transition; False when there is nobody to tell. A
    resolution whose firing was told is told too, even if a silence began in between (chat
    showed the alert firing for ever: a trial); a silence mutes the episodes it finds firing
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
    fired sent "firing" to one URL and "resolved" to the other: a trial)."""
    rows = session.execute(
        select(WebhookMessage.url)
        .where(WebhookMessage.episode_id == episode_id)
        .order_by(WebhookMessage.id)
    ).scalars()
    # Evaluation does not flush: a firing queued earlier in this transaction (an alert that
    # fired and resolved within one batch) is not in the database yet (a trial lost its
    # resolution).
    queued = [
        m.url for m in session.new if isinstance(m, WebhookMessage) and m.episode_id == episode_id
    ]
    return list(dict.fromkeys([*rows, *queued]))


def dashboard_url(settings: Settings, run_id: str) -> str | None:
    if not settings.public_url:
        return None
    return f"{settings.public_url.rstrip('/')}/dashboard/runs/{run_id}"


def webhook_body(
    settings: Settings,
    run: Any,
    rule: Any,
    alert_id: int,
    state: str,
    step: int | None,
    value: float | None,
    why: str | None = None,
) -> dict[str, Any]:
    """The §6 body, plus `alert_id` (the episode: a receiver that retries may de-duplicate on
    it and `state`) and the rule's id and scope (`rule_id`, `rule_project`, `rule_run_id`);
    `text` is a Slack-compatible line that names only the new state, and ``why`` instead of
    the value when no step resolved the alert (its rule was disabled, changed or deleted).
    ``run`` and ``rule``: anything with a run's `id` and `name` and a rule's columns as
    attributes."""
    url = dashboard_url(settings, run.id)
    at = f" at step {step}" if step is not None else ""
    icon = ":rotating_light:" if state == "firing" else ":white_check_mark:"
    verb = "FIRING" if state == "firing" else "RESOLVED"
    shown = _slack(why) if why else f"{_slack(rule.metric)} = {value:.4g}"
    cond = f" ({_slack(rule.op)} {rule.threshold:g})" if state == "firing" else ""
    link = f" <{url}|dashboard>" if url else ""
    return {
        "text": f"{icon} [{_slack(rule.severity)}] {_slack(rule.name)} {verb} on run "
        f"'{_slack(run.name)}'{at}: {shown}{cond}{link}",
        "state": state,
        "rule": rule.name,
        "run_id": run.id,
        "run_name": run.name,
        "value": value,
        "step": step,
        "severity": rule.severity,
        "dashboard_url": url,
        "alert_id": alert_id,
        # which rule: rules of one name in several scopes sent look-alike messages (a trial)
        "rule_id": rule.id,
        "rule_project": rule.project,
        "rule_run_id": rule.run_id,
    }


def end_rule_episodes(
    session: Session,
    rule: Any,
    settings: Settings,
    why: str,
    keep: Callable[[Run], bool] = lambda run: False,
) -> int:
    """Close the open episodes of a rule that stops watching their runs (it was disabled,
    deleted, or its metric, split or scope changed; DESIGN.md §6 is silent), except on the runs
    ``keep`` keeps: a pending one is dropped, a firing one resolves now, at no step, and when
    its firing was told, a resolved message saying ``why`` goes where it went (``rule``: the
    rule as it was, its `notify` included). Without this, a disabled rule's alert stayed firing
    for ever (a trial). Each run's lock is held, as evaluation holds it; the caller took those
    of the runs it foresaw (`alert_rules.change_lock`) and commits. A run it did not foresee (an
    episode opened since) is locked without waiting, as this transaction has written: a lock
    held elsewhere raises for the caller to redo it all (`db.redo_on_lock_conflict`), never an
    ingest's deadlock (a trial's ingests got 500s). Returns how many episodes resolved."""
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
    incident stayed open (a trial). The caller holds the run's lock and commits. Returns how
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


def _slack(text: str) -> str:
    """``text`` as plain text in a Slack message: ``&``, ``<`` and ``>`` escaped, as Slack's
    message formatting asks, so that a run named ``<!channel>`` pings no one and
    ``<http://x|y>`` is no disguised link (the other fields carry the names as they are); line
    breaks and other control characters become spaces, so the summary stays one line."""
    one_line = "".join(c if c.isprintable() else " " for c in text)
    return one_line.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def alert_dict(
    ep: AlertEpisode, rule: AlertRule, mode: str | None, session: Session
) -> dict[str, Any]:
    """An episode as `GET /alerts` lists it. ``mitigation``: the rule's command, offered for one
    click while the episode fires on a run in 'suggest' mode, unless the run already asks for
    it (`_in_effect`, the test a rule in 'auto' mode applies)."""
    offer = rule.mitigation if mode == "suggest" and ep.state == "firing" else None
    if offer and _in_effect(session, ep.run_id, offer):
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
