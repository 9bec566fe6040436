"""Completion samples (docs/design.md §4 'Samples'): store a batch, read a run's samples, and
drop old ones (the retention the periodic pass enforces).

A sample is one prompt's completions and rewards at one step; its key ``(run, step, split, rank,
attempt, seq)`` makes a re-sent sample a duplicate. Rewards are stored as numbers, null, or the
strings "NaN", "Infinity", "-Infinity" (never a NaN in the database).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session, aliased
from vantage.client.samples import SamplesBatch
from vantage.client.schema import storable_scalar

from .models import Run, Sample, iso, utcnow

DEFAULT_LIMIT = 20
MAX_LIMIT = 200


class UnknownAttempt(ValueError):
    """The batch names an attempt the run has not registered (a 409)."""


def store_samples(session: Session, run: Run, batch: SamplesBatch) -> dict[str, int]:
    """Insert ``batch``'s samples for ``run``; a sample whose key is stored already is a
    duplicate. Returns ``{stored, duplicates}``; the caller commits. Raises UnknownAttempt
    for an attempt above the run's newest."""
    if batch.attempt > run.attempt:
        raise UnknownAttempt(
            f"attempt {batch.attempt} is unknown for run {run.id} (latest is {run.attempt}); "
            "POST /api/v1/runs first to register the launch"
        )
    if not batch.samples:
        return {"stored": 0, "duplicates": 0}
    now = utcnow()
    rows = {}
    for s in batch.samples:  # the same key twice in one batch: the first counts
        key = (s.step, s.split, s.rank, s.seq)
        rows.setdefault(
            key,
            {
                "run_id": run.id,
                "step": s.step,
                "split": s.split,
                "rank": s.rank,
                "attempt": batch.attempt,
                "seq": s.seq,
                "prompt_id": s.prompt_id,
                "prompt": s.prompt,
                "completions": s.completions,
                "rewards": [storable_scalar(r) for r in s.rewards],
                "created_at": now,
            },
        )
    insert = pg_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert
    statement = insert(Sample).on_conflict_do_nothing().returning(Sample.id)
    stored = len(session.execute(statement, list(rows.values())).all())
    return {"stored": stored, "duplicates": len(batch.samples) - stored}


def sample_dict(row: Sample) -> dict[str, Any]:
    """A stored sample as `GET .../samples` answers it."""
    return {
        "step": row.step,
        "split": row.split,
        "rank": row.rank,
        "attempt": row.attempt,
        "prompt_id": row.prompt_id,
        "prompt": row.prompt,
        "completions": row.completions,
        "rewards": row.rewards,
        "created_at": iso(row.created_at),
    }


def list_samples(
    session: Session,
    run_id: str,
    prompt_id: str | None = None,
    step: int | None = None,
    split: str | None = None,
    limit: int = DEFAULT_LIMIT,
) -> list[dict[str, Any]]:
    """The run's samples, newest step first (newest attempt first within a step), of one
    ``prompt_id``, ``step`` and ``split`` when given; at most ``limit`` (1 to MAX_LIMIT)."""
    q = select(Sample).where(Sample.run_id == run_id)
    if prompt_id is not None:
        q = q.where(Sample.prompt_id == prompt_id)
    if step is not None:
        q = q.where(Sample.step == step)
    if split is not None:
        q = q.where(Sample.split == split)
    limit = max(1, min(MAX_LIMIT, limit))
    q = q.order_by(Sample.step.desc(), Sample.attempt.desc(), Sample.rank, Sample.seq)
    return [sample_dict(r) for r in session.scalars(q.limit(limit))]


def prune_samples(
    session: Session, keep_days: float | None = None, keep_steps: int | None = None
) -> int:
    """Delete samples older than ``keep_days`` (by when the server stored them), and those of
    each run more than ``keep_steps`` steps behind the run's newest sample (None: no such
    limit). Returns how many went; the caller commits."""
    deleted = 0
    if keep_days is not None:
        try:
            cutoff = utcnow() - timedelta(days=keep_days)
        except OverflowError:  # a span reaching back before year 1 prunes nothing
            cutoff = None
        if cutoff is not None:
            deleted += session.execute(delete(Sample).where(Sample.created_at < cutoff)).rowcount
    if keep_steps is not None:
        newest = aliased(Sample)
        top = select(func.max(newest.step)).where(newest.run_id == Sample.run_id).scalar_subquery()
        old = delete(Sample).where(Sample.step <= top - keep_steps)
        deleted += session.execute(old.execution_options(synchronize_session=False)).rowcount
    return int(deleted)
