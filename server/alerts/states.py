"""What alert evaluation knows of a run's rules: the rules that apply to it and its state of
each (`alert_states`), kept per process between batches while the run's `alert_epoch` stays; the
silences in force; and the context one evaluation of one run shares."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from types import SimpleNamespace

from sqlalchemy import and_, bindparam, insert, or_, select, update
from sqlalchemy.orm import Session

from ..locks import RunState
from ..settings import Settings
from .models import AlertEpisode, AlertRule, AlertState, Silence

RULES, STATES = AlertRule.__table__, AlertState.__table__
RuleRow = SimpleNamespace
"""A rule as evaluation reads it (`rules_and_states`): its columns as attributes."""
STATE_FIELDS = (
    "episode_id",
    "streak",
    "clear_streak",
    "last_mitigation_step",
    "notified_through",
    "last_fired_step",
)
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
    last_fired_step: int | None = None
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


class Context:
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
        return any(mutes(s, rule.name, self.run.id, self.run.project) for s in self._silences)


def active_silences(session: Session, now: datetime) -> list[Silence]:
    """The silences in force at ``now`` (their `until` later)."""
    return list(session.scalars(select(Silence).where(Silence.until > now)))


def mutes(silence: Silence, rule: str, run_id: str, project: str | None) -> bool:
    """Whether ``silence`` mutes the alerts of the rule named ``rule`` on a run."""
    m = silence.matchers or {}
    return (
        m.get("rule") in (None, rule)
        and m.get("run_id") in (None, run_id)
        and m.get("project") in (None, project)
    )
