"""SQLAlchemy 2 models. Append-only facts (``group_blocks``) are separate from the per-step rows
that ingest maintains (``steps``) and the small latest-state row per run (``runs``), so that
queries and the dashboard never scan groups. Alembic (``vantage.migrations``) owns the schema."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    text,
    true,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

BigId = BigInteger().with_variant(Integer, "sqlite")


def utcnow() -> datetime:
    return datetime.now(UTC)


def as_utc(dt: datetime) -> datetime:
    """``dt`` as an aware datetime in UTC: a naive one (SQLite hands back what was stored as
    UTC without its zone) is taken as UTC, an aware one converted (SQLite would otherwise store
    06:31-05:00 as 06:31)."""
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)


def iso(dt: datetime | None) -> str | None:
    """ISO 8601 in UTC, or None."""
    return None if dt is None else as_utc(dt).isoformat()


# Run creation is rare; a concurrent duplicate fails the unique index and the route retries.
NEXT_RUN_KEY = text('(SELECT coalesce(max("key"), 0) + 1 FROM runs)')


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON, datetime: DateTime(timezone=True)}


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    scopes: Mapped[str] = mapped_column(String(100))
    project: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None]


def run_not_found(run_id: str) -> str:
    """The message for a run that does not exist (or the key may not see): its id, cut to 80
    characters, as a path or body may carry any text and the answer need not repeat it."""
    shown = run_id if len(run_id) <= 80 else run_id[:80] + "…"
    return f"run {shown} not found"


class Run(Base):
    __tablename__ = "runs"
    __table_args__ = (
        Index("ix_runs_key", "key", unique=True),
        Index("ix_runs_created", "created_at", "id"),  # the runs list's newest-first pages
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    # A small integer that names the run in `groups`, the largest table: its key and every index
    # entry carry 4 bytes instead of a 36-character id (assigned at creation, never changed).
    key: Mapped[int] = mapped_column(Integer, default=NEXT_RUN_KEY)
    name: Mapped[str] = mapped_column(String(200))
    project: Mapped[str | None] = mapped_column(String(200), index=True)
    config: Mapped[dict[str, Any] | None]
    tags: Mapped[list[Any]] = mapped_column(default=list)
    notes: Mapped[str | None] = mapped_column(Text)
    reward_min: Mapped[float] = mapped_column(Float, default=0.0)
    reward_max: Mapped[float] = mapped_column(Float, default=1.0)
    group_size: Mapped[int | None]
    trainer_eps: Mapped[float] = mapped_column(Float, default=1e-4)
    world_size: Mapped[int] = mapped_column(default=1)
    heartbeat_s: Mapped[float] = mapped_column(Float, default=10.0)
    mitigation_mode: Mapped[str] = mapped_column(String(16), default="auto")
    status: Mapped[str] = mapped_column(String(16), default="running")
    attempt: Mapped[int] = mapped_column(default=1)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_seen_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None]
    last_step: Mapped[int | None] = mapped_column(BigInteger)
    latest_acr: Mapped[float | None] = mapped_column(Float)
    # The training step latest_acr is from: the newest step that has an ACR.
    latest_acr_step: Mapped[int | None] = mapped_column(BigInteger)
    # Client health, per rank: {"0": {"spooled_groups": .., "dropped_groups": .., ...}}
    client_health: Mapped[dict[str, Any]] = mapped_column(default=dict)
    # The mitigation the trainer reported in its latest record (`mitigation` field).
    mitigation_reported: Mapped[dict[str, Any] | None]
    # Per split, [step, attempt] of the step alert rules last took (server/alerts.py): a step
    # at or before it from the same or an older attempt is a straggler.
    eval_progress: Mapped[dict[str, Any] | None]
    # What ingest knows of the run's step rows, so that a batch of steps the run has no row for
    # skips reading them (`vantage.server.ingest.steps.store_batch`): per split, the highest
    # step that has a row (None: not known, so every batch reads, as for a run made without
    # `create_or_resume_run`); and whether any step row may be unevaluated.
    newest_steps: Mapped[dict[str, Any] | None]
    has_unevaluated: Mapped[bool] = mapped_column(default=True, server_default=true())
    # Moved on by triggers (migration 0013) whenever a rule that may apply to the run changes,
    # or one of the run's alert states: evaluation keeps a run's rules and states in the process
    # while its epoch stays (`vantage.server.alerts.states.ALERT_CONFIG`).
    alert_epoch: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")


class Launch(Base):
    """One launch (all ranks of one training job) = one attempt of a run."""

    __tablename__ = "launches"
    __table_args__ = (
        UniqueConstraint("run_id", "attempt"),
        UniqueConstraint("run_id", "launch_id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    attempt: Mapped[int]
    launch_id: Mapped[str | None] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[float | None]  # unix s by the client's clock, when it said (RunCreate)


class GroupBlock(Base):
    """The groups one record stored for a (step, split, rank), packed into one row
    (`vantage.server.group_blocks` says how and why); append-only. A group's key
    ``(run, attempt, step, split, rank, group_id)`` is immutable within an attempt: ingest
    reads the ids and hashes of a key's earlier blocks before it adds one (under the run's
    lock; on PostgreSQL, before the lock, a key's first block is inserted unless the key has
    one, and earlier blocks are read only for a key that has them), and ``block`` numbers the
    blocks of a key from 0, the primary key arbitrating between concurrent writers of a key.

    The run is named by `runs.key`, with no foreign key; deleting or pruning a run deletes its
    blocks."""

    __tablename__ = "group_blocks"

    run_key: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    attempt: Mapped[int] = mapped_column(primary_key=True)
    step: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    split: Mapped[str] = mapped_column(String(64), primary_key=True)
    rank: Mapped[int] = mapped_column(primary_key=True)
    block: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    n_groups: Mapped[int]
    group_ids: Mapped[str] = mapped_column(Text)
    prompt_ids: Mapped[str | None] = mapped_column(Text)
    hashes: Mapped[bytes] = mapped_column(LargeBinary)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class StepSeries(Base):
    """A split's (step, acr) series packed for downsampling reads, 64 steps a row (PostgreSQL
    only; on SQLite the table stays empty and reads scan `steps`).

    Row ``chunk`` holds steps ``64·chunk`` to ``64·chunk + 63``; ``acrs`` is 64 big-endian
    float8 slots, slot ``step & 63``: the step's acr, `ACR_NULL` for a null acr, `ACR_ABSENT`
    where the split has no such step. A trigger on `steps` (migration 0012) writes the slot of
    every step row inserted, or updated with another acr, in the same transaction: no code
    path can write a step without its slot. Step rows are deleted only with their run, and
    its series rows with them (the foreign key). Scanning 20,000 step rows for their acr took
    10-16 ms of PostgreSQL's time (per-row costs, with or without the heap: measured), and
    313 of these rows 0.6 ms."""

    __tablename__ = "step_series"

    run_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True
    )
    split: Mapped[str] = mapped_column(String(64), primary_key=True)
    chunk: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    acrs: Mapped[bytes] = mapped_column(LargeBinary)


SERIES_SLOTS = 64  # steps a row of `step_series`
ACR_NULL = bytes.fromhex("7ff8000000000000")  # a null acr (acr itself is never NaN)
ACR_ABSENT = bytes.fromhex("7ff0000000000001")  # no step: a NaN of another payload
# (1 − α)^1100 = 2^−55 for the EMA's α: steps older than this no longer move a float64 EMA, so a
# long run's window metrics (queries and alert rules alike) read a bounded tail, not every step.
EMA_TAIL = 1100


class Step(Base):
    """The per-(run, split, step) row ingest maintains for the attempt that owns the step: the
    mergeable counts of `vantage.client.acr.StepAccumulator` and the metrics derived from them."""

    __tablename__ = "steps"
    __table_args__ = (
        UniqueConstraint("run_id", "split", "step"),
        # covers the (step, acr) scans of downsampling and window metrics
        Index("ix_steps_run_split_step_acr", "run_id", "split", "step", "acr"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    split: Mapped[str] = mapped_column(String(64))
    step: Mapped[int] = mapped_column(BigInteger)
    attempt: Mapped[int]
    time: Mapped[float | None] = mapped_column(Float)
    first_seen_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    world_size: Mapped[int] = mapped_column(default=1)
    ranks: Mapped[list[Any]] = mapped_column(default=list)
    # StepAccumulator counts (vantage.client.acr)
    acc: Mapped[dict[str, Any]] = mapped_column(default=dict)
    effective_by_rank: Mapped[dict[str, Any]] = mapped_column(default=dict)
    scalars: Mapped[dict[str, Any]] = mapped_column(default=dict)
    mitigation: Mapped[dict[str, Any] | None]
    # Derived metrics (docs/design.md §3 field names), for fast reads.
    n_groups: Mapped[int] = mapped_column(default=0)
    n_valid: Mapped[int] = mapped_column(default=0)
    n_collapsed: Mapped[int] = mapped_column(default=0)
    n_near_collapsed: Mapped[int] = mapped_column(default=0)
    n_invalid: Mapped[int] = mapped_column(default=0)
    n_degenerate: Mapped[int] = mapped_column(default=0)
    acr: Mapped[float | None] = mapped_column(Float)
    acr_eps: Mapped[float | None] = mapped_column(Float)
    acr_all_pass: Mapped[float | None] = mapped_column(Float)
    acr_all_fail: Mapped[float | None] = mapped_column(Float)
    acr_constant: Mapped[float | None] = mapped_column(Float)
    acr_effective: Mapped[float | None] = mapped_column(Float)
    wasted_rollouts: Mapped[int] = mapped_column(default=0)
    pass_rate: Mapped[float | None] = mapped_column(Float)
    expected_acr: Mapped[float | None] = mapped_column(Float)
    excess_acr: Mapped[float | None] = mapped_column(Float)
    reward_mean: Mapped[float | None] = mapped_column(Float)
    # Migration 0014: rewards outside [reward_min, reward_max], and the rewards' spread and shape.
    n_out_of_range: Mapped[int] = mapped_column(default=0, server_default="0")
    reward_std: Mapped[float | None] = mapped_column(Float)
    reward_bimodality: Mapped[float | None] = mapped_column(Float)
    evaluated: Mapped[bool] = mapped_column(default=False)
    # The step's point of `GET /metrics` as JSON, written with the row (`queries.point_json`);
    # None for rows written before migration 0004 (readers build it from the columns).
    point: Mapped[str | None] = mapped_column(Text)


# The states of a command that the trainer has yet to act on.
OPEN_STATES = ("pending", "delivered")


class Command(Base):
    """A command to the trainer: pending → delivered → applied | rejected | expired."""

    __tablename__ = "commands"
    __table_args__ = (Index("ix_commands_run_status", "run_id", "status"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    type: Mapped[str] = mapped_column(String(32))
    params: Mapped[dict[str, Any]] = mapped_column(default=dict)
    reason: Mapped[str | None] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), default="pending")
    # "key:", "alert:" or "dashboard:" and a name of up to 200 characters
    issued_by: Mapped[str] = mapped_column(String(256))
    alert_id: Mapped[int | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime]
    delivered_at: Mapped[datetime | None]
    acked_at: Mapped[datetime | None]
    acked_step: Mapped[int | None] = mapped_column(BigInteger)
    detail: Mapped[str | None] = mapped_column(Text)


class Sample(Base):
    """Completions of one prompt at one step, as a trainer chose to keep them
    (`Monitor.log_samples`, opt-in): what the model answered. Kept for the server's
    `samples_keep_days` and `samples_keep_steps` (`vantage.server.samples.prune_samples`).
    ``rewards`` hold numbers, null, or "NaN"/"Infinity"/"-Infinity" as text (never a NaN)."""

    __tablename__ = "samples"
    __table_args__ = (
        # a sample sent again under its number is stored once; leads with (run, step) for the
        # step filter and the retention by steps
        UniqueConstraint("run_id", "step", "split", "rank", "attempt", "seq"),
        Index("ix_samples_run_prompt_step", "run_id", "prompt_id", "step"),
        Index("ix_samples_created_at", "created_at"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(BigInteger)
    split: Mapped[str] = mapped_column(String(64))
    rank: Mapped[int]
    attempt: Mapped[int]
    seq: Mapped[int]
    prompt_id: Mapped[str | None] = mapped_column(String(128))
    prompt: Mapped[str] = mapped_column(Text)
    completions: Mapped[list[Any]]
    rewards: Mapped[list[Any]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
