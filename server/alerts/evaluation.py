"""Alert evaluation of a run's steps (docs/design.md §6), in ingest's transaction or in the
periodic pass: which steps the rules take, in what order, with what window values, and the hook
ingest calls (`Evaluator.after_ingest`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, NamedTuple

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ..commands import ENDED_STATES
from ..locks import RunState, run_lock, save_run_state
from ..models import Step, utcnow
from ..settings import Settings
from .detectors import (
    BASELINES,
    baseline_key,
    components,
    detect,
    rule_value,
    uses_detector,
)
from .episodes import advance, notify_transition
from .metrics import SERIES_METRICS, Window, series_values, stale_value
from .models import AlertEpisode, AlertRule
from .periodic import runs_to_evaluate
from .states import Context, RuleRow, RuleState, remember_config, write_states
from .steps import (
    evaluable_steps,
    evaluated_frontier,
    mark_evaluated,
    unevaluated_steps,
)

log = logging.getLogger("vantage.alerts")


class EvaluationFailed(RuntimeError):
    """Alert evaluation raised; the ingest transaction must be redone without it."""


class Outcome(NamedTuple):
    """What an evaluation did that its caller acts on after the commit."""

    notified: bool = False  # a webhook message was queued: wake the outbox sender
    issued: bool = False  # a command was issued: the answer to rank 0 must carry it


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

    def committed(self, session: Session) -> None:
        """After the commit of an ingest transaction that evaluated: keep the rules and states
        it left for the run's next batch (`remember_config`)."""
        remember_config(session)

    def notified(self) -> None:
        """Wake this process's outbox sender (after the transaction that queued a message)."""
        if self.on_notify is not None:
            self.on_notify()

    def periodic_pass(self, session_factory: Callable[[], Session]) -> None:
        """Evaluate the runs `runs_to_evaluate` finds: steps left incomplete past
        `step_complete_after_s`, `stale` rules, and firing alerts no silence mutes any more."""
        with session_factory() as session:
            run_ids = runs_to_evaluate(session, utcnow(), self.settings.step_complete_after_s)
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
    the run's state, in one statement: `vantage.server.ingest.steps.save_steps_and_run`)."""
    now = utcnow()
    with session.no_autoflush:  # the evaluated flags go out with ingest's own writes
        rows = evaluable_steps(session, run, candidates, now, settings.step_complete_after_s)
        mark_evaluated(rows)
        progress = dict(run.eval_progress or {})
        baselines = progress.pop(BASELINES, None) or {}
        rows, replays = _in_order(progress, rows)
    before_reads = before_reads or _nothing
    if not rows and not stale and not _open_stale_episode(session, run.id):
        return Outcome()  # e.g. one rank of several: nothing to evaluate yet
    ctx = Context(session, run, settings, now)
    for rule in ctx.rules:  # before the steps, which may resolve it (then told too)
        _tell_unmuted(ctx, rule)
    # An ended run's late steps (a rank's, a `vantage sync`) are stored but fire nothing: the
    # finish resolved its alerts, and nothing would resolve one fired after it.
    ended = run.status in ENDED_STATES
    step_rules = [] if ended else [r for r in ctx.rules if r.metric != "stale"]
    series = {}
    for split in sorted({r.split for r in rows}):
        needs = {r.metric for r in step_rules if r.split == split}
        split_rows = [r for r in rows if r.split == split]
        last = progress.get(split)
        series[split], progress[split] = _walk(session, run, split_rows, needs, last, before_reads)
    if replays:
        before_reads()
    walked = dict(baselines)
    with session.no_autoflush:  # one flush at commit, not one per query
        rewinds = {i: _steps_between(session, run.id, rows[i], s) for i, s in replays.items()}
        for i, row in enumerate(rows):
            for rule in step_rules:
                if rule.split == row.split:
                    value = rule_value(row, rule.metric, series[row.split])
                    if uses_detector(rule):
                        key = baseline_key(rule)
                        parts = components(row, rule.metric, value)
                        value, walked[key] = detect(walked.get(key), rule, row.step, parts)
                    _evaluate_step(ctx, rule, row, value, rewinds.get(i, 0))
    if rows:
        kept = {baseline_key(r) for r in step_rules if uses_detector(r)}
        walked = {k: v for k, v in walked.items() if k in kept}  # rules gone or changed
        run.eval_progress = {**progress, BASELINES: walked} if walked else progress
    for rule in ctx.rules:
        if rule.metric == "stale":
            st = ctx.states.get(rule.id)
            if stale or (st is not None and st.episode_id is not None):
                _evaluate_stale(ctx, rule)
    write_states(session, run.id, ctx.states)
    return Outcome(ctx.queued, ctx.issued)


def _tell_unmuted(ctx: Context, rule: RuleRow) -> None:
    """Tell a firing episode of ``rule`` that was not told when it fired (a silence muted it,
    or the rule had no URL then) once nothing mutes it: a silence that ended while the alert
    fired left chat unaware of a live incident. A replay of a firing already told (a
    resumed run) stays untold, as `_fire` leaves it."""
    st = ctx.states.get(rule.id)
    ep = ctx.episodes.get(st.episode_id) if st is not None and st.episode_id else None
    if ep is None or ep.state != "firing" or ep.notified or not rule.notify:
        return
    step, told_through = ep.fired_step, st.notified_through
    if rule.metric != "stale" and None not in (step, told_through) and step <= told_through:
        return
    if notify_transition(ctx, rule, ep, "firing", step, ep.value):
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
    ctx: Context, rule: RuleRow, row: Step, value: float | None, rewind: int = 0
) -> None:
    """One step's value for one rule; ``rewind``: how many steps the rule already counted
    that this step and the ones after it replace (a resumed run's newer attempt)."""
    if rewind:
        _rewind(ctx, ctx.state(rule), row.step, rewind)
    if value is None or row.n_valid < rule.min_valid_groups:
        return  # neither advances nor resets for_steps
    advance(ctx, rule, ctx.state(rule), row.step, value)


def _rewind(ctx: Context, st: RuleState, step: int, replaced: int) -> None:
    """A newer attempt replays steps from ``step`` on that the rule already took: its streaks
    drop the ``replaced`` steps, so that a replayed step counts once toward ``for_steps`` (it
    counted twice, and a resumed run's alert fired early). A pending episode whose
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


def _evaluate_stale(ctx: Context, rule: RuleRow) -> None:
    st = ctx.state(rule)
    step = ctx.run.last_step
    advance(ctx, rule, st, step, stale_value(ctx.run, ctx.now), for_steps=1)
