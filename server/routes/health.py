"""Liveness, readiness and the Prometheus exposition."""

from __future__ import annotations

import secrets

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import PlainTextResponse
from sqlalchemy import text

from ..db import UNAVAILABLE
from ..deps import SessionDep, SettingsDep
from ..queries import prometheus_text
from ..telemetry import counters_text

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> dict:
    return {"status": "ok"}


@router.get("/readyz")
def readyz(session: SessionDep) -> dict:
    try:
        session.execute(text("SELECT 1"))
    except Exception as exc:  # noqa: BLE001 - any database failure means not ready
        raise HTTPException(503, f"database not reachable: {type(exc).__name__}") from exc
    return {"status": "ready"}


@router.get("/metrics", response_class=PlainTextResponse)
def metrics(request: Request, session: SessionDep, settings: SettingsDep) -> PlainTextResponse:
    if settings.metrics_token:
        token = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        if not secrets.compare_digest(token, settings.metrics_token):
            raise HTTPException(401, "this /metrics needs 'Authorization: Bearer <metrics token>'")
    try:
        runs, up = prometheus_text(session), 1
    except UNAVAILABLE:  # the process's counters still tell what it did: a scrape is not lost
        runs, up = "", 0
    database = (
        "# HELP vantage_database_up Whether this scrape could read the database (1) or not (0).\n"
        f"# TYPE vantage_database_up gauge\nvantage_database_up {up}\n"
    )
    return PlainTextResponse(
        counters_text() + database + runs, media_type="text/plain; version=0.0.4"
    )
