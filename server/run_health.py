"""The database side of the health verdict (`vantage.server.health` holds the rules): the
inputs of a page of runs in a few queries, and the verdict as a SQL expression so that the runs
list is ordered and filtered by it in the database."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import and_, case, func, literal, not_, or_, select
from sqlalchemy.orm import Session, aliased

from .alerts.models import AlertEpisode, AlertRule
from .health import COLLAPSE_THRESHOLD, STALL_RULE, WORST_FIRST, HealthInputs, verdict
from .models import Run, Step


def effective_at_latest(session: Session, runs: list[dict[str, Any]]) -> dict[str, float | None]:
    """Per run (dicts with ``run_id`` and ``latest_acr_step``): the effective ACR of the
    training step its ``latest_acr`` is from (None when the trainer sent none for that step).
    One query of index lookups by (run, split, step): a join on the runs table let PostgreSQL
    scan every step of the run (0.2-0.6 s at 100,000 steps, on every live update)."""
    wanted = [
        and_(Step.run_id == r["run_id"], Step.step == r["latest_acr_step"])
        for r in runs
        if r.get("latest_acr_step") is not None
    ]
    if not wanted:
        return {}
    rows = session.execute(
        select(Step.run_id, Step.acr_effective).where(Step.split == "train", or_(*wanted))
    ).all()
    return dict(rows)


def firing_rules(session: Session, run_ids: list[str]) -> dict[str, list[tuple[str, str]]]:
    """Per run: (rule name, severity) of each firing alert. One query for all ``run_ids``."""
    out: dict[str, list[tuple[str, str]]] = {rid: [] for rid in run_ids}
    if not run_ids:
        return out
    rows = session.execute(
        select(AlertEpisode.run_id, AlertRule.name, AlertEpisode.severity)
        .join(AlertRule, AlertRule.id == AlertEpisode.rule_id)
        .where(AlertEpisode.run_id.in_(run_ids), AlertEpisode.state == "firing")
    ).all()
    for run_id, rule, severity in rows:
        out[run_id].append((rule, severity))
    return out


def attach_health(session: Session, runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Add ``health``, ``health_reason``, ``latest_effective`` and ``alerts_firing`` (how many
    alerts fire) to each run dict (as `queries.run_dict` makes them), in two queries however
    many runs; returns ``runs``."""
    ids = [r["run_id"] for r in runs]
    effective = effective_at_latest(session, runs)
    firing = firing_rules(session, ids)
    for r in runs:
        eff = effective.get(r["run_id"])
        inputs = HealthInputs(r["status"], r.get("latest_acr"), eff, firing[r["run_id"]])
        found = verdict(inputs)
        r["latest_effective"] = eff
        r["alerts_firing"] = len(firing[r["run_id"]])
        r["health"], r["health_reason"] = found["health"], found["reason"]
    return runs


def stale_condition(session: Session, now: datetime | None = None) -> Any:
    """SQL: the run is running but nothing arrived for 3 × its ``heartbeat_s`` (as
    `queries.run_status` decides it)."""
    now = (now or datetime.now(UTC)).astimezone(UTC)
    if session.get_bind().dialect.name == "postgresql":
        quiet = Run.last_seen_at < literal(now) - func.make_interval(
            0, 0, 0, 0, 0, 0, 3 * Run.heartbeat_s
        )
    else:  # SQLite keeps the UTC time as text without its zone
        text_now = now.replace(tzinfo=None).isoformat(sep=" ")
        quiet = func.julianday(Run.last_seen_at) < func.julianday(text_now) - (
            3 * Run.heartbeat_s / 86400.0
        )
    return and_(Run.status == "running", quiet)


@dataclass(frozen=True)
class HealthSQL:
    """The verdict in SQL over `runs` joined (`join`) to two small relations: the firing
    alerts per run and the step of its ``latest_acr``. Joins, not a correlated subquery per
    condition: ordering 10,000 runs by health read each run's alerts three times."""

    firing: Any  # per run: critical, stall, other (0/1) and count, over its firing alerts
    effective: Any  # the step row of the run's latest_acr

    def join(self, query: Any) -> Any:
        """``query`` (selecting from `runs`) with both relations outer-joined."""
        eff = self.effective
        # a running run's step row only where the verdict reads it (a lookup for each of 100,000
        # runs, most of them ended, made ordering by health slow)
        on_step = and_(
            Run.status == "running",
            Run.latest_acr > COLLAPSE_THRESHOLD,
            eff.run_id == Run.id,
            eff.split == "train",
            eff.step == Run.latest_acr_step,
        )
        return query.outerjoin(self.firing, self.firing.c.run_id == Run.id).outerjoin(eff, on_step)

    def firing_count(self) -> Any:
        """SQL: how many alerts of the run fire."""
        return func.coalesce(self.firing.c.count, 0)

    def rank(self, session: Session, now: datetime | None = None) -> Any:
        """SQL: the run's verdict as its position in `health.WORST_FIRST` (0 needs a person
        first). The rules of `health.verdict`, in the same order; `tests/test_run_listing.py`
        checks that both agree."""
        effective = self.effective.acr_effective
        offset = and_(effective.is_not(None), effective <= COLLAPSE_THRESHOLD)
        high = Run.latest_acr > COLLAPSE_THRESHOLD
        f = self.firing.c
        rank = WORST_FIRST.index
        return case(
            (Run.status == "failed", rank("failed")),
            (Run.status == "finished", rank("finished")),
            (f.critical == 1, rank("critical")),
            (stale_condition(session, now), rank("stale")),
            (
                and_(f.stall == 1, or_(effective.is_(None), effective > COLLAPSE_THRESHOLD)),
                rank("stalled"),
            ),
            (and_(high, offset), rank("mitigated")),
            (high, rank("collapsing")),
            (f.other == 1, rank("warning")),
            (Run.latest_acr.is_(None), rank("starting")),
            else_=rank("healthy"),
        )


def health_sql() -> HealthSQL:
    """The relations `HealthSQL` joins: firing alerts grouped per run, and a steps alias."""

    def flag(condition: Any) -> Any:
        return func.max(case((condition, 1), else_=0))

    critical = AlertEpisode.severity == "critical"
    firing = (
        select(
            AlertEpisode.run_id.label("run_id"),
            flag(critical).label("critical"),
            flag(and_(AlertRule.name == STALL_RULE, not_(critical))).label("stall"),
            flag(not_(critical)).label("other"),
            func.count(AlertEpisode.id).label("count"),
        )
        .join(AlertRule, AlertRule.id == AlertEpisode.rule_id)
        .where(AlertEpisode.state == "firing")
        .group_by(AlertEpisode.run_id)
        .subquery("firing")
    )
    return HealthSQL(firing, aliased(Step, name="latest_step"))
