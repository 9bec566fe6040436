"""/api/v1/runs: create or resume, list, read, settings, delete, heartbeat, finish."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Query, Response
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.exc import IntegrityError
from vantage.client.schema import Finish, Heartbeat, RunCreate, RunPatch

from ..alerts.episodes import end_run_episodes
from ..commands import ENDED_STATES, deliver_commands, end_commands
from ..deps import AdminKey, ControlKey, IngestKey, ReadKey, SessionDep, SettingsDep, load_run
from ..errors import field_error
from ..health import PRECEDENCE as HEALTH_VERDICTS
from ..ingest import forget_run
from ..locks import run_lock
from ..maintenance import delete_run_data
from ..models import utcnow
from ..queries import get_run, run_dict
from ..run_listing import DEFAULT_LIMIT, MAX_LIMIT, BadCursor, runs_page
from ..runs import (
    LaunchOlderThanAttempt,
    RunNameRequired,
    RunSettingsConflict,
    create_or_resume_run,
)

router = APIRouter(prefix="/api/v1/runs", tags=["runs"])


@router.post("", status_code=201)
def create_run(
    body: RunCreate, key: IngestKey, session: SessionDep, settings: SettingsDep, response: Response
) -> dict:
    """Create a run (201, attempt 1) or register a launch of a known run (200)."""
    project = body.project
    if key.project is not None:
        if project not in (None, key.project):
            raise HTTPException(403, f"this key is limited to project '{key.project}'")
        project = key.project
    for attempt_no in range(2):
        try:
            # The run's lock makes concurrent registrations of one run take turns (on SQLite,
            # which has no row locks, they would otherwise pick the same attempt number).
            with run_lock(session, body.run_id or ""):
                run, attempt, created = create_or_resume_run(
                    session, body, project, settings.default_mitigation_mode
                )
                if not key.allows_project(run.project):  # a create answered 404
                    raise HTTPException(
                        409,
                        f"run id {run.id} is taken by a run of another project; choose "
                        "another run_id, or leave it out for a new one",
                    )
                session.commit()
            break
        except (RunSettingsConflict, LaunchOlderThanAttempt) as exc:
            raise HTTPException(409, str(exc)) from exc
        except RunNameRequired as exc:
            missing = field_error(f"Field required: {exc}", ["body", "name"], "missing")
            raise HTTPException(422, [missing]) from exc
        except IntegrityError:  # a concurrent rank registered the same run or launch first
            session.rollback()
            if attempt_no:
                raise
    if not created:
        response.status_code = 200
    return {**run_dict(run), "attempt": attempt}


class RunFilters(BaseModel):
    """`GET /runs`'s query: an unknown parameter is a 422, not a filter silently dropped
    (`?projct=vision` listed every run)."""

    model_config = ConfigDict(extra="forbid")
    # an empty value is refused, not a filter that matches nothing (`?project=` listed no run)
    project: Annotated[str, Field(min_length=1)] | None = None
    tag: Annotated[str, Field(min_length=1)] | None = None
    status: Literal["running", "stale", "finished", "failed"] | None = None
    health: Literal[HEALTH_VERDICTS] | None = None  # type: ignore[valid-type]
    order: Literal["newest", "health", "acr", "alerts"] = "newest"
    limit: Annotated[int, Field(ge=1, le=MAX_LIMIT)] = DEFAULT_LIMIT
    cursor: Annotated[str, Field(min_length=1, max_length=2000)] | None = None
    # the cost of collapse of each run listed (docs/design.md §9): a scan of its steps
    cost: bool = False


@router.get("")
def runs_index(key: ReadKey, session: SessionDep, query: Annotated[RunFilters, Query()]) -> dict:
    """A page of runs (newest first unless ``order`` says otherwise), each with its ``health``
    verdict (with ``?cost=true`` also its ``cost`` of collapse), and ``next_cursor``: pass it
    as ``cursor`` for the next page (null after the last)."""
    project = query.project
    if key.project is not None and project not in (None, key.project):
        # it listed the key's own project's runs as if they were the other's
        raise HTTPException(403, f"this key is limited to project '{key.project}'")
    filters = query.model_dump(exclude={"project", "cost"})
    scope = key.project or project
    try:
        runs, next_cursor = runs_page(session, project=scope, with_cost=query.cost, **filters)
    except BadCursor as exc:
        raise HTTPException(422, [field_error(str(exc), ["query", "cursor"])]) from exc
    return {"runs": runs, "next_cursor": next_cursor}


@router.get("/{run_id}")
def run_detail(run_id: str, key: ReadKey, session: SessionDep) -> dict:
    load_run(session, run_id, key)
    return get_run(session, run_id) or {}


@router.patch("/{run_id}")
def patch_run(run_id: str, body: RunPatch, key: ControlKey, session: SessionDep) -> dict:
    run = load_run(session, run_id, key)
    for name in ("name", "tags", "notes", "mitigation_mode"):
        value = getattr(body, name)
        if value is not None:
            setattr(run, name, value)
    session.commit()
    return get_run(session, run_id) or {}


@router.delete("/{run_id}", status_code=204)
def delete_run(run_id: str, key: AdminKey, session: SessionDep, settings: SettingsDep) -> Response:
    """Delete the run and all it owns; its firing alerts that were told are told resolved."""
    run = load_run(session, run_id, key)
    with run_lock(session, run_id):
        # resolutions first: they go where the firing went, which its unsent messages tell
        end_run_episodes(session, run, settings, "its run was deleted")
        delete_run_data(session, run)
        session.delete(run)
        session.commit()
    forget_run(run_id)
    return Response(status_code=204)


@router.post("/{run_id}/heartbeat")
def heartbeat(run_id: str, body: Heartbeat, key: IngestKey, session: SessionDep) -> dict:
    """Liveness and client health of one rank; rank 0 of the newest attempt gets the open
    commands back. The answer's ``newest_attempt`` tells a superseded launch that it is one.
    Under the run's lock, taken before the run is read: the per-rank health is read, changed
    and written back whole, and two ranks' concurrent heartbeats lost one rank's counts."""
    with run_lock(session, run_id):
        run = load_run(session, run_id, key)
        if body.attempt > run.attempt:
            raise HTTPException(409, f"attempt {body.attempt} is unknown for run {run_id}")
        run.last_seen_at = utcnow()
        health = dict(run.client_health or {})
        counters = body.model_dump(
            include={"spooled_groups", "dropped_groups", "dead_letter_batches"}, exclude_none=True
        )
        health[str(body.rank)] = {**health.get(str(body.rank), {}), **counters}
        run.client_health = health
        # only the newest launch's rank 0 takes commands (a superseded one would act in its
        # place)
        newest_sends = body.rank == 0 and body.attempt == run.attempt
        commands = deliver_commands(session, run_id) if newest_sends else []
        session.commit()
    return {"commands": commands, "newest_attempt": run.attempt}


@router.post("/{run_id}/finish")
def finish(
    run_id: str, body: Finish, key: IngestKey, session: SessionDep, settings: SettingsDep
) -> dict:
    """Mark the run finished or failed; its open commands expire and its alerts resolve (told
    where their firing went). The same status again answers the run as it is (a retry); the
    other status is a 409, as a run ends once (a relaunch makes it running again)."""
    run = load_run(session, run_id, key)
    if body.attempt is not None and body.attempt > run.attempt:  # as steps and heartbeat say
        raise HTTPException(409, f"attempt {body.attempt} is unknown for run {run_id}")
    if body.attempt is not None and body.attempt < run.attempt:
        raise HTTPException(
            409,
            f"attempt {body.attempt} of run {run_id} was superseded by attempt {run.attempt}, "
            "which owns the run now; only it ends the run",
        )
    if run.status in ENDED_STATES:
        if run.status != body.status:
            raise HTTPException(
                409, f"run {run_id} has already {run.status}; a run ends once (relaunch it)"
            )
        return get_run(session, run_id) or {}
    with run_lock(session, run_id):  # as an evaluation of its alerts holds it
        run.status = body.status
        run.finished_at = utcnow()
        end_commands(session, run_id, body.status)
        end_run_episodes(session, run, settings, f"its run {body.status}")
        session.commit()
    return get_run(session, run_id) or {}
