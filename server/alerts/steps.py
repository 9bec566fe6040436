"""Which steps alert evaluation may look at now (docs/design.md §6): a step is evaluated once, in
step order, on the newest-attempt view, when it is complete across ranks, when a later step made
waiting pointless, or when it has waited `step_complete_after_s`."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import false, select, true
from sqlalchemy.orm import Session

from ..locks import RunState
from ..models import Step, as_utc


def mark_evaluated(rows: list[Step]) -> None:
    """Flag rows as evaluated; the flag is written with the row (the ORM's next flush, or ingest's
    `write_step_rows`), together with any change ingest made to it. (The run's lock keeps other
    writers away, and a newer attempt that takes a step over later resets the flag.)"""
    for row in rows:
        row.evaluated = True


def unevaluated_steps(session: Session, run: RunState, splits: set[str] | None) -> list[Step]:
    """The run's steps not yet evaluated (a partial index keeps this small)."""
    q = select(Step).where(Step.run_id == run.id, Step.evaluated == false())
    if splits is not None:
        q = q.where(Step.split.in_(sorted(splits)))
    return list(session.scalars(q))


def evaluable_steps(
    session: Session,
    run: RunState,
    candidates: list[Step],
    now: datetime,
    complete_after_s: float,
) -> list[Step]:
    """Unevaluated steps that may be evaluated now, in step order, stopping at the first that
    may not. A step may be evaluated when every rank of its world_size reported it; when a later
    step of its attempt arrived and every rank known to the attempt reported it or a later step
    (ranks send in step order, and an integration that gathers groups to rank 0 has one known
    rank); when its first record is older than ``complete_after_s``; or when a later step was
    already evaluated (it arrived late). ``candidates``: the run's unevaluated steps (those of
    some splits suffice), as in the session now."""
    rows = sorted((r for r in candidates if not r.evaluated), key=lambda r: (r.split, r.step))
    cutoff = now - timedelta(seconds=complete_after_s)
    out: list[Step] = []
    by_split: dict[str, list[Step]] = {}
    for row in rows:
        by_split.setdefault(row.split, []).append(row)
    for split, split_rows in by_split.items():
        # Ranks that reported a later step of the same attempt, walking from the newest step.
        later: list[set[int] | None] = [None] * len(split_rows)
        seen: dict[int, set[int]] = {}
        for i in range(len(split_rows) - 1, -1, -1):
            row = split_rows[i]
            if row.attempt in seen:
                later[i] = set(seen[row.attempt])
            seen.setdefault(row.attempt, set()).update(_ranks(row))
        known: dict[int, set[int]] = {}
        for i, row in enumerate(split_rows):
            own = _ranks(row)
            if set(range(row.world_size or 1)) <= own or as_utc(row.first_seen_at) < cutoff:
                out.append(row)
                continue
            if later[i] is not None:
                if row.attempt not in known:
                    known[row.attempt] = seen[row.attempt] | _evaluated_ranks(
                        session, run.id, split, row.attempt
                    )
                if known[row.attempt] <= own | later[i]:
                    out.append(row)
                    continue
            if _passed(session, row):
                out.append(row)
                continue
            break  # step order: nothing after a step that waits is evaluated before it
    return sorted(out, key=lambda r: (r.step, r.split))


def _ranks(row: Step) -> set[int]:
    return {int(r) for r in row.ranks or []}


def _evaluated_ranks(session: Session, run_id: str, split: str, attempt: int) -> set[int]:
    """The ranks of the attempt's newest evaluated step (ranks known to the attempt)."""
    ranks = session.scalar(
        select(Step.ranks)
        .where(
            Step.run_id == run_id,
            Step.split == split,
            Step.attempt == attempt,
            Step.evaluated == true(),
        )
        .order_by(Step.step.desc())
        .limit(1)
    )
    return {int(r) for r in ranks or []}


def _passed(session: Session, row: Step) -> bool:
    """A later step of the same attempt was already evaluated (this one arrived late)."""
    later = session.scalar(
        select(Step.step)
        .where(
            Step.run_id == row.run_id,
            Step.split == row.split,
            Step.attempt == row.attempt,
            Step.evaluated == true(),
            Step.step > row.step,
        )
        .limit(1)
    )
    return later is not None


def evaluated_frontier(session: Session, run_id: str, split: str) -> int:
    """The highest evaluated step of a run's split (-1 when none), as in the session now."""
    # The newest step by the (run_id, split, step) index, not max(): without table statistics
    # PostgreSQL may plan max() as an aggregate over every step of the run.
    q = (
        select(Step.step)
        .where(Step.run_id == run_id, Step.split == split, Step.evaluated == true())
        .order_by(Step.step.desc())
        .limit(1)
    )
    frontier = session.scalar(q)
    return -1 if frontier is None else frontier
