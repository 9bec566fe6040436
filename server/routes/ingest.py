"""POST /api/v1/runs/{run_id}/steps: the hot path. Reads the raw body and validates it with
``model_validate_json`` (about 2.5× faster than FastAPI's parse-then-validate, NOTES.md)."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request, Response
from fastapi.concurrency import run_in_threadpool
from vantage.client.schema import MAX_GROUPS_PER_REQUEST, MAX_REQUEST_BYTES, StepsBatch

from ..alerts import EvaluationFailed, Outcome
from ..commands import deliver_commands
from ..deps import IngestKey, authorized
from ..ingest import GroupsExist, IngestError, UnknownAttemptError, ingest_batch
from ..locks import run_lock
from . import json_response, parse_body, raw_body_openapi, read_limited_body

router = APIRouter(prefix="/api/v1/runs", tags=["ingest"])

STEPS_SCHEMA = raw_body_openapi(StepsBatch)


@router.post("/{run_id}/steps", openapi_extra=STEPS_SCHEMA)
async def post_steps(run_id: str, request: Request, key: IngestKey) -> Response:
    """Store a batch of step records atomically; answers counters, step metrics and commands."""
    raw = await read_limited_body(request, MAX_REQUEST_BYTES)
    batch = parse_body(StepsBatch, raw)
    n_groups = batch.group_count()
    if n_groups > MAX_GROUPS_PER_REQUEST:
        raise HTTPException(
            413, f"{n_groups} groups in one request; the limit is {MAX_GROUPS_PER_REQUEST}"
        )
    answer = await run_in_threadpool(_ingest, request, run_id, batch, key)
    return json_response(answer)


def _ingest(request: Request, run_id: str, batch: StepsBatch, key) -> dict:  # noqa: ANN001
    """Store the batch; redo the transaction when the fast path does not fit (some groups exist
    already: the duplicate-safe path; alert evaluation failed: the batch alone)."""
    dedup, evaluate = False, True
    while True:
        try:
            return _ingest_once(request.app.state, run_id, batch, key, dedup, evaluate)
        except GroupsExist:
            dedup = True
        except EvaluationFailed:
            evaluate = False


def _ingest_once(state, run_id, batch, key, dedup: bool, evaluate: bool) -> dict:  # noqa: ANN001
    """One transaction under the run's lock: store the batch, evaluate alerts (DESIGN.md §6),
    collect commands for rank 0, commit."""
    with state.session_factory() as session, run_lock(session, run_id) as locked:
        run = authorized(locked.run, run_id, key)
        try:
            result = ingest_batch(session, run, batch, dedup=dedup)
        except IngestError as exc:
            raise HTTPException(422, str(exc)) from exc
        except UnknownAttemptError as exc:
            raise HTTPException(409, str(exc)) from exc
        outcome = state.evaluator.after_ingest(session, run, result) if evaluate else Outcome()
        commands = []
        if result.has_rank0 and (locked.has_open_commands or outcome.issued):
            commands = deliver_commands(session, run_id)
        session.commit()
    if outcome.notified:
        state.evaluator.notified()
    counters = state.counters
    counters["ingested_groups_total"] += result.accepted
    counters["duplicate_groups_total"] += result.duplicates
    counters["conflict_groups_total"] += result.conflicts
    counters["ingest_requests_total"] += 1
    return {
        "accepted": result.accepted,
        "duplicates": result.duplicates,
        "conflicts": result.conflicts,
        "invalid_groups": result.invalid_groups,
        "steps": result.steps,
        "commands": commands,
    }
