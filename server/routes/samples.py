"""/api/v1/runs/{run_id}/samples: completion samples, sent (ingest) and read (read)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from vantage.client.samples import SamplesBatch
from vantage.client.schema import MAX_ID_CHARS, MAX_SPLIT_CHARS, MAX_STEP, SPLIT_PATTERN

from ..deps import IngestKey, ReadKey, SessionDep, load_run
from ..keys import KeyInfo
from ..samples import DEFAULT_LIMIT, MAX_LIMIT, UnknownAttempt, list_samples, store_samples
from . import parse_body, raw_body_openapi, read_body

router = APIRouter(prefix="/api/v1/runs", tags=["samples"])


@router.post("/{run_id}/samples", openapi_extra=raw_body_openapi(SamplesBatch))
async def post_samples(run_id: str, request: Request, key: IngestKey) -> dict:
    """Store completion samples (`Monitor.log_samples`): at most 256 a request; one sent
    again under its key (step, split, rank, attempt, seq) is a duplicate. Answers
    ``{stored, duplicates}``."""
    batch = parse_body(SamplesBatch, await read_body(request))
    return await run_in_threadpool(_store, request, run_id, batch, key)


def _store(request: Request, run_id: str, batch: SamplesBatch, key: KeyInfo) -> dict:
    with request.app.state.session_factory() as session:
        run = load_run(session, run_id, key)
        try:
            answer = store_samples(session, run, batch)
        except UnknownAttempt as exc:
            raise HTTPException(409, str(exc)) from exc
        session.commit()
    return answer


@router.get("/{run_id}/samples")
def get_samples(
    run_id: str,
    key: ReadKey,
    session: SessionDep,
    prompt_id: Annotated[str | None, Query(max_length=MAX_ID_CHARS)] = None,
    step: Annotated[int | None, Query(ge=0, le=MAX_STEP)] = None,
    split: Annotated[
        str | None, Query(min_length=1, max_length=MAX_SPLIT_CHARS, pattern=SPLIT_PATTERN)
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = DEFAULT_LIMIT,
) -> dict:
    """The run's completion samples, newest step first: of one prompt, step and split when
    given, at most ``limit``."""
    load_run(session, run_id, key)
    return {
        "run_id": run_id,
        "samples": list_samples(session, run_id, prompt_id, step, split, limit),
    }
