"""POST /api/v1/acr: classify groups and compute step metrics; stores nothing."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request, Response
from vantage.client.acr import ACRSettings, InconsistentStatsError, StepAccumulator
from vantage.client.schema import MAX_GROUPS_PER_REQUEST, MAX_REQUEST_BYTES, ACRRequest

from ..deps import ReadKey
from ..ingest import summarize_group
from . import json_response, parse_body, raw_body_openapi, read_limited_body

router = APIRouter(prefix="/api/v1", tags=["acr"])
SCHEMA = raw_body_openapi(ACRRequest)


@router.post("/acr", openapi_extra=SCHEMA)
async def acr(request: Request, key: ReadKey) -> Response:
    raw = await read_limited_body(request, MAX_REQUEST_BYTES)
    body = parse_body(ACRRequest, raw)
    if body.group_count() > MAX_GROUPS_PER_REQUEST:
        raise HTTPException(413, f"more than {MAX_GROUPS_PER_REQUEST} groups in one request")
    settings = ACRSettings(body.reward_min, body.reward_max, body.trainer_eps, body.tol)
    acc = StepAccumulator()
    groups = []
    for index, g in enumerate(body.normal_groups()):
        try:
            summary = summarize_group(g, settings)
        except InconsistentStatsError as exc:
            raise HTTPException(422, f"group {index} ('{g.group_id}'): {exc}") from exc
        acc.add(summary)
        groups.append(
            {
                "index": index,
                "group_id": g.group_id,
                "class": summary.cls.value,
                "side": summary.side,
            }
        )
    return json_response({"step": acc.metrics(), "groups": groups})
