"""One batch of step records into the database (docs/design.md §3, §6): the transaction that
stores a batch's groups, adds them to their steps, evaluates alerts and lists the commands for
rank 0, redone when a concurrent batch or a failing alert evaluation got in its way."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy.orm import Session
from vantage.client.schema import StepsBatch

from ..alerts import EvaluationFailed, Evaluator, Outcome
from ..commands import deliver_commands
from ..keys import KeyInfo
from ..locks import run_lock, wait_until_durable
from ..models import run_not_found
from ..telemetry import count_ingest
from .groups import (
    GroupsExist,
    IngestResult,
    RunInfo,
    classify_batch,
    forget_run,
    run_info,
    store_groups,
)
from .steps import (
    StepWrites,
    note_unevaluated,
    save_steps_and_run,
    store_batch,
)

MAX_COLLISIONS = 8


class RunNotFound(LookupError):
    """The run does not exist, or the key may not see it (a 404)."""


class IngestBusy(RuntimeError):
    """The batch collided with others more times than it is redone (a 503: send it again)."""


def ingest_batch(
    session_factory: Callable[[], Session],
    evaluator: Evaluator,
    run_id: str,
    batch: StepsBatch,
    key: KeyInfo,
) -> dict[str, Any]:
    """Store a batch of step records of a run in one transaction and answer what ingest
    answers: counters, step metrics, commands for rank 0 and the newest attempt. The
    transaction is redone when it did not go through: another batch stored groups of the same
    (step, split, rank) meanwhile (read them again); alert evaluation failed (store the batch
    alone); the run's cached fields are stale (read them again). Raises RunNotFound,
    IngestError, UnknownAttemptError, and IngestBusy after too many collisions."""
    evaluate = True
    # Each collision means another batch of the key committed; a rank sends its batches one
    # after another, so more than a few in a row means many concurrent senders of one key.
    for _ in range(MAX_COLLISIONS + 3):
        try:
            return _ingest_once(session_factory, evaluator, run_id, batch, key, evaluate)
        except GroupsExist:
            pass
        except EvaluationFailed:
            evaluate = False
        except StaleRunInfo:
            forget_run(run_id)
    raise IngestBusy(
        f"run {run_id}, or other batches of the same steps and ranks, changed while this batch "
        "was stored; send it again"
    )


class StaleRunInfo(RuntimeError):
    """The run's cached fields differ from its row (deleted and created again)."""


def _ingest_once(
    session_factory: Callable[[], Session],
    evaluator: Evaluator,
    run_id: str,
    batch: StepsBatch,
    key: KeyInfo,
    evaluate: bool,
) -> dict[str, Any]:
    """One transaction: classify the groups and, on PostgreSQL, store them (the primary key
    arbitrates, `store_groups`); then, under the run's lock, (on SQLite store them and) add
    them to their step rows, evaluate alerts (docs/design.md §6) and list the commands for rank 0;
    commit. Work done before the lock lets one run's concurrent batches (ranks) overlap there:
    the lock is held to the commit. On PostgreSQL groups are never inserted under the lock, so
    that a transaction holding the lock never waits for one that waits for the lock.

    On PostgreSQL the commit does not wait for the disk (``commit_async``): the run's lock,
    which ends with the commit, was held through the WAL's flush, and two senders of one run
    waited for each other's disk writes. The answer waits instead: `wait_until_durable` flushes
    the WAL past this commit, and a failure there raises (503, the client sends the batch again,
    and what was committed counts as duplicates)."""
    with session_factory() as session:
        info = run_info(session, run_id)
        if info is None or not key.allows_project(info.project):
            raise RunNotFound(run_not_found(run_id))
        result = IngestResult()
        classified = classify_batch(info, batch, result)
        early = session.get_bind().dialect.name == "postgresql"
        if early:
            store_groups(session, info.key, batch.attempt, classified, result)
        with run_lock(session, run_id, commit_async=True) as locked:
            if locked.run is None:
                forget_run(run_id)  # deleted since this process cached it
            run = locked.run
            if run is None or not key.allows_project(run.project):
                raise RunNotFound(run_not_found(run_id))
            if RunInfo.of(run) != info:
                raise StaleRunInfo(run_id)
            store_batch(session, run, batch, classified, result, groups_stored=early)
            writes = StepWrites(session, result)
            outcome = Outcome()
            if evaluate:
                outcome = evaluator.after_ingest(session, run, result, writes.flush)
            commands = []
            newest = run.attempt
            # a superseded launch still sending (a zombie) must not take the commands meant
            # for the relaunch: it would act on them and ack them in its place
            newest_sends = batch.attempt == newest
            if newest_sends and result.has_rank0 and (locked.has_open_commands or outcome.issued):
                commands = deliver_commands(session, run_id)
            note_unevaluated(run, result)
            save_steps_and_run(session, run, writes)
            session.commit()
            evaluator.committed(session)
        wait_until_durable(session)
    if outcome.notified:
        evaluator.notified()
    count_ingest(result.accepted, result.duplicates, result.conflicts)
    return {
        "accepted": result.accepted,
        "duplicates": result.duplicates,
        "conflicts": result.conflicts,
        "invalid_groups": result.invalid_groups,
        "steps": result.steps,
        "commands": commands,
        "newest_attempt": newest,
    }
