"""Alert tables (docs/design.md §6): rules, per-(rule, run) evaluation state, episodes, silences and
the webhook outbox. They share `vantage.server.models.Base`'s
metadata; Alembic's environment imports this module."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    false,
)
from sqlalchemy.orm import Mapped, mapped_column

from ..models import Base, BigId, Step, utcnow

# Ingest leaves new and re-owned steps with evaluated = false; evaluation looks only at those.
Index(
    "ix_steps_unevaluated",
    Step.run_id,
    Step.split,
    Step.step,
    postgresql_where=Step.evaluated == false(),
    sqlite_where=Step.evaluated == false(),
)


class AlertRule(Base):
    """A rule: `metric op threshold` for `for_steps` evaluated steps (docs/design.md §6)."""

    __tablename__ = "alert_rules"
    __table_args__ = {"sqlite_autoincrement": True}  # ids are never reused (migration 0007)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), index=True)
    run_id: Mapped[str | None] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    project: Mapped[str | None] = mapped_column(String(200))
    metric: Mapped[str] = mapped_column(String(200))
    op: Mapped[str] = mapped_column(String(2))
    threshold: Mapped[float] = mapped_column(Float)
    for_steps: Mapped[int] = mapped_column(default=1)
    # None: the threshold. A firing alert resolves at the first step strictly past it.
    clear_threshold: Mapped[float | None] = mapped_column(Float)
    # Consecutive steps past clear_threshold needed to resolve (non_finite_rewards uses 10).
    clear_steps: Mapped[int] = mapped_column(default=1)
    min_valid_groups: Mapped[int] = mapped_column(default=1)
    severity: Mapped[str] = mapped_column(String(32), default="warning")
    notify: Mapped[list[Any]] = mapped_column(default=list)
    mitigation: Mapped[dict[str, Any] | None]
    cooldown_steps: Mapped[int] = mapped_column(default=0)
    split: Mapped[str] = mapped_column(String(64), default="train")
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    builtin: Mapped[bool] = mapped_column(Boolean, default=False)
    description: Mapped[str | None] = mapped_column(Text)
    # Detector fields (migration 0014, docs/detectors.md); their defaults leave a rule as it was.
    # How the value is compared: "absolute" (the metric itself), "zscore" (standard deviations
    # above the rule's rolling baseline) or "relative" (the metric over its early-run level).
    comparison: Mapped[str] = mapped_column(
        String(16), default="absolute", server_default="absolute"
    )
    # zscore: the latest values before the step; relative: the run's first values.
    baseline_steps: Mapped[int] = mapped_column(default=20, server_default="20")
    # The run's first steps (from the first with a value) that feed the baseline, never fire.
    warmup_steps: Mapped[int] = mapped_column(default=0, server_default="0")
    # After an episode fired at step s, no new episode fires before s + alert_cooldown_steps.
    alert_cooldown_steps: Mapped[int] = mapped_column(default=0, server_default="0")
    # One line carried in every notification and alert; `{reward_min}`/`{reward_max}` filled in.
    recommended_action: Mapped[str | None] = mapped_column(Text)
    # A command offered with the alert, never issued by it ({type, params}; `mitigation` issues).
    suggested_command: Mapped[dict[str, Any] | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class AlertState(Base):
    """Where evaluation of one rule on one run stands. Its primary key makes 'one episode per
    (rule, run) at a time' a row that a replica locks while it evaluates."""

    __tablename__ = "alert_states"

    rule_id: Mapped[int] = mapped_column(
        ForeignKey("alert_rules.id", ondelete="CASCADE"), primary_key=True
    )
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    episode_id: Mapped[int | None] = mapped_column(BigInteger)  # the open episode, if any
    streak: Mapped[int] = mapped_column(default=0)  # consecutive steps meeting the condition
    clear_streak: Mapped[int] = mapped_column(default=0)  # consecutive steps past clear_threshold
    last_mitigation_step: Mapped[int | None] = mapped_column(BigInteger)
    # Highest fired_step that was notified: replayed steps of a resumed run never notify again.
    notified_through: Mapped[int | None] = mapped_column(BigInteger)
    # Step of the episode that fired last (`alert_cooldown_steps`).
    last_fired_step: Mapped[int | None] = mapped_column(BigInteger)


class AlertEpisode(Base):
    """One episode: pending → firing → resolved (a pending one that fails is deleted)."""

    __tablename__ = "alert_episodes"
    __table_args__ = (
        Index("ix_alert_episodes_run_state", "run_id", "state"),
        # the alerts listing's pages, newest first: firing ones, then the others (0016)
        Index("ix_alert_episodes_state_created", "state", "created_at", "id"),
        Index("ix_alert_episodes_created", "created_at", "id"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    rule_id: Mapped[int] = mapped_column(ForeignKey("alert_rules.id", ondelete="CASCADE"))
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    state: Mapped[str] = mapped_column(String(16))
    severity: Mapped[str] = mapped_column(String(32))
    value: Mapped[float | None] = mapped_column(Float)
    pending_step: Mapped[int | None] = mapped_column(BigInteger)
    fired_step: Mapped[int | None] = mapped_column(BigInteger)
    resolved_step: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    fired_at: Mapped[datetime | None]
    resolved_at: Mapped[datetime | None]
    notified: Mapped[bool] = mapped_column(Boolean, default=False)


class Silence(Base):
    """Mutes notifications (not evaluation) of matching alerts until `until`."""

    __tablename__ = "silences"
    __table_args__ = {"sqlite_autoincrement": True}

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    matchers: Mapped[dict[str, Any]] = mapped_column(default=dict)
    until: Mapped[datetime]
    reason: Mapped[str | None] = mapped_column(Text)
    created_by: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class WebhookMessage(Base):
    """The outbox: one row per (transition, URL), sent by whichever replica claims it first."""

    __tablename__ = "webhook_outbox"
    __table_args__ = (Index("ix_webhook_outbox_status_url", "status", "url"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    url: Mapped[str] = mapped_column(String(2000))
    payload: Mapped[dict[str, Any]] = mapped_column(default=dict)
    episode_id: Mapped[int | None] = mapped_column(BigInteger)
    status: Mapped[str] = mapped_column(String(16), default="pending")  # pending, sent, failed
    attempts: Mapped[int] = mapped_column(default=0)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    next_attempt_at: Mapped[datetime] = mapped_column(default=utcnow)
    sent_at: Mapped[datetime | None]
    last_error: Mapped[str | None] = mapped_column(Text)


class WebhookTarget(Base):
    """Per-URL send slot: at most one message per second per URL, across replicas."""

    __tablename__ = "webhook_targets"

    url: Mapped[str] = mapped_column(String(2000), primary_key=True)
    next_send_at: Mapped[datetime] = mapped_column(default=utcnow)
