"""/api/v1/runs/{run_id}/commands: issue, list (the command log), ack."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException
from vantage.client.schema import CommandAck, CommandCreate

from ..commands import (
    AckConflict,
    RunEnded,
    ack_command,
    check_run_listens,
    issue_once,
    list_commands,
)
from ..deps import CommandReaderKey, ControlKey, IngestKey, SessionDep, SettingsDep, load_run

router = APIRouter(prefix="/api/v1/runs", tags=["commands"])


@router.post("/{run_id}/commands", status_code=201)
def issue(
    run_id: str, body: CommandCreate, key: ControlKey, session: SessionDep, settings: SettingsDep
) -> dict:
    """Queue a command for the run's trainer. The same command (type and params) sent again
    by the same key within TWIN_WINDOW_S, while no trainer has acked the first, answers the
    first: a retried or doubled request applied twice (two stops would save two
    checkpoints)."""
    run = load_run(session, run_id, key)
    try:
        check_run_listens(run_id, run.status)
    except RunEnded as exc:
        raise HTTPException(409, str(exc)) from exc
    cmd = issue_once(
        session,
        run_id,
        body.type,
        body.params,
        body.reason,
        issued_by=f"key:{key.name}",
        ttl_s=settings.command_ttl_s,
    )
    session.commit()
    return cmd


@router.get("/{run_id}/commands")
def log(run_id: str, key: CommandReaderKey, session: SessionDep) -> dict:
    load_run(session, run_id, key)
    commands = list_commands(session, run_id)
    session.commit()
    return {"commands": commands}


@router.post("/{run_id}/commands/{command_id}/ack")
def ack(
    run_id: str, command_id: str, body: CommandAck, key: IngestKey, session: SessionDep
) -> dict:
    load_run(session, run_id, key)
    try:
        cmd = ack_command(session, run_id, command_id, body.status, body.step, body.detail)
    except LookupError as exc:
        raise HTTPException(404, str(exc)) from exc
    except AckConflict as exc:
        raise HTTPException(409, str(exc)) from exc
    session.commit()
    return cmd
