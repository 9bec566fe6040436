"""POST /api/v1/runs/{run_id}/steps: the hot path. Reads the raw body and validates it with
``model_validate_json`` (about 2.5× faster than FastAPI's parse-then-validate), or
faster still with orjson first (`parse_steps`)."""

from __future__ import annotations

import orjson
from fastapi import APIRouter, HTTPException, Request, Response
from fastapi.concurrency import run_in_threadpool
from vantage.client.schema import (
    MAX_GROUPS_PER_REQUEST,
    MAX_RECORDS_PER_REQUEST,
    StepsBatch,
)

from ..deps import IngestKey
from ..ingest import IngestBusy, IngestError, RunNotFound, UnknownAttemptError, ingest_batch
from ..keys import KeyInfo
from . import json_response, parse_body, raw_body_openapi, read_body

router = APIRouter(prefix="/api/v1/runs", tags=["ingest"])

STEPS_SCHEMA = raw_body_openapi(StepsBatch)


@router.post("/{run_id}/steps", openapi_extra=STEPS_SCHEMA)
async def post_steps(run_id: str, request: Request, key: IngestKey) -> Response:
    """Store a batch of step records atomically; answers counters, step metrics and commands."""
    raw = await read_body(request)
    batch = parse_steps(raw)
    n_groups = batch.group_count()
    if n_groups > MAX_GROUPS_PER_REQUEST:
        raise HTTPException(
            413, f"{n_groups} groups in one request; the limit is {MAX_GROUPS_PER_REQUEST}"
        )
    if len(batch.records) > MAX_RECORDS_PER_REQUEST:
        raise HTTPException(
            413,
            f"{len(batch.records)} records in one request; the limit is {MAX_RECORDS_PER_REQUEST}",
        )
    answer = await run_in_threadpool(_ingest, request, run_id, batch, key)
    return json_response(answer)


def parse_steps(raw: bytes) -> StepsBatch:
    """`parse_body` of a step batch, about twice as fast for the common body: orjson's parse,
    then validation of the Python objects, took 240 µs for 500 groups of 8 rewards where
    ``model_validate_json`` took 460 (pydantic's JSON mode parses numbers more slowly, and a
    list of floats validates fastest as Python floats). Only a batch that this path gives as
    ``model_validate_json`` would is taken from it; `parse_body` decides the rest, and names
    every error:
    - orjson refuses the NaN and Infinity tokens, numbers past float64, lone surrogates;
    - orjson reads an integer literal beyond 64 bits as a float: strict integer fields refuse
      it, and a mitigation that holds a number that large is parsed again, since as an integer
      its check refuses it.
    tests/test_parse_steps.py checks that the two paths agree."""
    try:
        batch = StepsBatch.model_validate(orjson.loads(raw))
    except Exception:  # noqa: BLE001 - parse_body decides, and names the errors
        return parse_body(StepsBatch, raw)
    if any(r.mitigation is not None and _has_huge_number(r.mitigation) for r in batch.records):
        return parse_body(StepsBatch, raw)
    return batch


def _has_huge_number(value: object) -> bool:
    """Whether a JSON value holds a float of magnitude 2^63 or more (what orjson makes of an
    integer literal beyond 64 bits)."""
    if isinstance(value, float):
        return abs(value) >= 2.0**63
    if isinstance(value, dict):
        return any(_has_huge_number(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_huge_number(v) for v in value)
    return False


def _ingest(request: Request, run_id: str, batch: StepsBatch, key: KeyInfo) -> dict:
    """`ingest_batch`, its refusals as HTTP errors."""
    state = request.app.state
    try:
        return ingest_batch(state.session_factory, state.evaluator, run_id, batch, key)
    except RunNotFound as exc:
        raise HTTPException(404, str(exc)) from exc
    except IngestError as exc:
        raise HTTPException(422, exc.detail) from exc
    except UnknownAttemptError as exc:
        raise HTTPException(409, str(exc)) from exc
    except IngestBusy as exc:
        # the client's sender waits as long as Retry-After says, not its back-off
        raise HTTPException(503, str(exc), headers={"Retry-After": "1"}) from exc
