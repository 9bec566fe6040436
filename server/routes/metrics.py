"""Read routes of one run: metrics, summary, prompts, CSV export."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import PlainTextResponse, StreamingResponse
from vantage.client.schema import MAX_SPLIT_CHARS, MAX_STEP, SPLIT_PATTERN

from ..deps import ReadKey, SessionDep, load_run
from ..queries import (
    DEFAULT_MAX_POINTS,
    PROMPT_COLUMNS,
    export_csv_on_own_session,
    run_metrics_json,
    run_prompts,
    run_summary,
    to_csv,
)

router = APIRouter(prefix="/api/v1/runs", tags=["metrics"])
# The same rule as a record's split (docs/design.md §3), so no query reaches the database with
# a value it would refuse.
Split = Annotated[str, Query(min_length=1, max_length=MAX_SPLIT_CHARS, pattern=SPLIT_PATTERN)]
StepBound = Annotated[int | None, Query(ge=-MAX_STEP, le=MAX_STEP)]
PromptSide = Literal["all_pass", "all_fail", "constant"]


@router.get("/{run_id}/metrics")
def metrics(
    run_id: str,
    key: ReadKey,
    session: SessionDep,
    split: Split = "train",
    from_step: StepBound = None,
    to_step: StepBound = None,
    max_points: int = DEFAULT_MAX_POINTS,
) -> Response:
    """Per-step metrics ordered by step; downsampling keeps each bucket's extremes of acr."""
    load_run(session, run_id, key)
    answer = run_metrics_json(session, run_id, split, from_step, to_step, max(1, max_points))
    return Response(answer, media_type="application/json")


@router.get("/{run_id}/summary")
def summary(run_id: str, key: ReadKey, session: SessionDep) -> dict:
    load_run(session, run_id, key)
    return run_summary(session, run_id) or {}


@router.get("/{run_id}/prompts", response_model=None)
def prompts(
    run_id: str,
    key: ReadKey,
    session: SessionDep,
    side: PromptSide | None = None,
    min_steps: Annotated[int, Query(ge=1)] = 1,
    format: Literal["json", "csv"] = "json",  # noqa: A002
    split: Split | None = None,
) -> dict | PlainTextResponse:
    """Prompts by how often their groups collapsed (needs prompt_ids from the client), in one
    ``split`` or, without it, in all."""
    load_run(session, run_id, key)
    rows = run_prompts(session, run_id, side, min_steps, split)
    if format == "csv":
        return PlainTextResponse(to_csv(rows, PROMPT_COLUMNS), media_type="text/csv")
    return {"run_id": run_id, "prompts": rows}


@router.get("/{run_id}/export.csv", response_class=StreamingResponse)
def export(
    run_id: str, key: ReadKey, session: SessionDep, request: Request, split: Split | None = None
) -> StreamingResponse:
    """The run's step metrics and scalars as CSV, streamed (`iter_export_csv`): every split
    (the `split` column says which) unless `split` names one."""
    load_run(session, run_id, key)
    return StreamingResponse(
        export_csv_on_own_session(request.app.state.session_factory, run_id, split),
        media_type="text/csv",
        headers={"Content-Disposition": f'attachment; filename="{run_id}.csv"'},
    )
