"""POST /api/v1/acr: classify groups and compute step metrics; stores nothing."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request, Response
from vantage.client.acr import ACRSettings, StepAccumulator
from vantage.client.schema import MAX_GROUPS_PER_REQUEST, ACRRequest

from ..classify import BadGroupStats, classify_groups
from ..deps import ReadKey
from ..reward_shape import add_reward_shape
from . import json_response, parse_body, raw_body_openapi, read_body

router = APIRouter(prefix="/api/v1", tags=["acr"])
SCHEMA = raw_body_openapi(ACRRequest)


@router.post("/acr", openapi_extra=SCHEMA)
async def acr(request: Request, key: ReadKey) -> Response:
    raw = await read_body(request)
    body = parse_body(ACRRequest, raw)
    if body.group_count() > MAX_GROUPS_PER_REQUEST:
        raise HTTPException(413, f"more than {MAX_GROUPS_PER_REQUEST} groups in one request")
    settings = ACRSettings(body.reward_min, body.reward_max, body.trainer_eps, body.tol)
    try:
        cols = classify_groups(body.normal_groups(), settings)
    except BadGroupStats as exc:
        raise HTTPException(422, exc.detail("body")) from exc
    acc = StepAccumulator()
    cols.add_to(acc)
    add_reward_shape(acc, body, cols, None, settings)
    classes = cols.classes()
    groups = [
        {"index": i, "group_id": cols.group_ids[i], "class": classes[i].value, "side": cols.side[i]}
        for i in range(len(classes))
    ]
    return json_response({"step": acc.metrics(), "groups": groups})
