"""Commands to the trainer and their log: pending → delivered → applied | rejected | expired.

Delivery is at-least-once: every answer to rank 0 lists the run's pending and delivered-but-not-
acked commands until the trainer acks them or their TTL passes (docs/design.md §4 'Commands')."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session
from vantage.client.schema import CommandCreate

from .alerts.models import AlertEpisode
from .locks import run_lock
from .models import OPEN_STATES, Command, Run, as_utc, iso, run_not_found, utcnow

DEFAULT_TTL_S = 3600.0


def command_dict(c: Command) -> dict[str, Any]:
    return {
        "command_id": c.id,
        "type": c.type,
        "params": c.params,
        "status": c.status,
        "issued_by": c.issued_by,
        "alert_id": c.alert_id,
        "reason": c.reason,
        "created_at": iso(c.created_at),
        "expires_at": iso(c.expires_at),
        "acked_step": c.acked_step,
        "detail": c.detail,
    }


ENDED_STATES = ("finished", "failed")


class RunEnded(ValueError):
    """A command for a finished or failed run: no trainer reads it (a 409)."""


def check_run_listens(run_id: str, status: str) -> None:
    """Refuse a user's command for a run whose trainer has finished or failed: it would wait
    until its TTL and expire. Relaunching the run (a new attempt) makes it `running` again.
    Raises RunEnded naming the status."""
    if status in ENDED_STATES:
        raise RunEnded(
            f"run {run_id} has {status}, so no trainer reads its commands; relaunch it (a new "
            f"attempt) to send it commands again"
        )


def create_command(
    session: Session,
    run_id: str,
    type: str,  # noqa: A002 - the wire field's name
    params: dict[str, Any] | None = None,
    reason: str | None = None,
    issued_by: str = "api",
    alert_id: int | None = None,
    ttl_s: float = DEFAULT_TTL_S,
) -> dict[str, Any]:
    """Queue a command for a run (the caller commits), linked to ``alert_id`` when an alert
    issued or suggested it. Raises LookupError for an unknown run, ValueError on bad params or
    an alert that is not the run's (the dashboard's Send takes the id from the browser, and a
    crafted one linked a command to another project's alert)."""
    if session.get(Run, run_id) is None:
        raise LookupError(run_not_found(run_id))
    if alert_id is not None:
        episode = session.get(AlertEpisode, alert_id)
        if episode is None or episode.run_id != run_id:
            raise ValueError(f"alert {alert_id} is not an alert of this run; choose it again")
    body = CommandCreate(type=type, params=params or {}, reason=reason)  # validates params
    now = utcnow()
    cmd = Command(
        id=str(uuid.uuid4()),
        run_id=run_id,
        type=body.type,
        params=body.params,
        reason=body.reason,
        status="pending",
        issued_by=issued_by,
        alert_id=alert_id,
        created_at=now,
        expires_at=now + timedelta(seconds=ttl_s),
    )
    session.add(cmd)
    session.flush()
    return command_dict(cmd)


def expire_commands(session: Session, run_id: str | None = None) -> None:
    """Mark open commands past their TTL as expired."""
    stmt = (
        update(Command)
        .where(Command.status.in_(OPEN_STATES), Command.expires_at < utcnow())
        .values(status="expired")
    )
    if run_id is not None:
        stmt = stmt.where(Command.run_id == run_id)
    session.execute(stmt)


def end_commands(session: Session, run_id: str, status: str) -> None:
    """The run has finished or failed (``status``): its open commands expire now, as no trainer
    will read them (a relaunch gets only the commands issued after it). A late ack is still
    recorded (`ack_command`)."""
    session.execute(
        update(Command)
        .where(Command.run_id == run_id, Command.status.in_(OPEN_STATES))
        .values(status="expired", detail=f"the run {status} before the trainer applied it")
    )


def deliver_commands(session: Session, run_id: str) -> list[dict[str, Any]]:
    """The run's open commands, oldest first; pending ones become delivered (caller commits).

    One indexed read on the hot path; writes happen only when a command changes state."""
    rows = session.scalars(
        select(Command)
        .where(Command.run_id == run_id, Command.status.in_(OPEN_STATES))
        .order_by(Command.created_at, Command.id)
    ).all()
    now = utcnow()
    live = []
    for c in rows:
        expires = as_utc(c.expires_at)
        if expires < now:
            c.status = "expired"
            continue
        if c.status == "pending":
            c.status = "delivered"
            c.delivered_at = now
        live.append(c)
    return [
        {"command_id": c.id, "type": c.type, "params": c.params, "reason": c.reason} for c in live
    ]


class AckConflict(ValueError):
    """An ack whose status differs from the command's earlier ack."""


def ack_command(
    session: Session,
    run_id: str,
    command_id: str,
    status: str,
    step: int | None,
    detail: str | None,
) -> dict[str, Any]:
    """Record the trainer's ack. An ack is final: the same ack again (a retry: same status and
    step) answers the command as it is; another status or step raises AckConflict (409).
    Raises LookupError if the command is unknown."""
    c = session.get(Command, command_id)
    if c is None or c.run_id != run_id:
        raise LookupError(f"command {command_id} not found for run {run_id}")
    if c.status in ("applied", "rejected") and (c.status, c.acked_step) != (status, step):
        raise AckConflict(
            f"command {command_id} was already acked '{c.status}' (step {c.acked_step}); "
            "an ack is final"
        )
    if c.status in OPEN_STATES or c.status == "expired":
        c.status = status
        c.acked_step = step
        c.detail = detail
        c.acked_at = utcnow()
    return command_dict(c)


# A command sent again by the same issuer within this many seconds, before a trainer acked the
# first, is the first (a double click on Send, a retried POST).
TWIN_WINDOW_S = 5.0


def open_twin(
    session: Session, run_id: str, type_: str, params: dict, issued_by: str, within_s: float
) -> dict[str, Any] | None:
    """The command that ``issued_by`` issued for the run within the last ``within_s`` seconds
    with the same type and these ``params``, while no trainer has acked it yet; else None. A
    second click on Send is such a twin (it applied the temperature twice)."""
    since = utcnow() - timedelta(seconds=within_s)
    rows = session.scalars(
        select(Command)
        .where(
            Command.run_id == run_id,
            Command.type == type_,
            Command.issued_by == issued_by,
            Command.status.in_(OPEN_STATES),
            Command.created_at >= since,
        )
        .order_by(Command.created_at.desc())
    ).all()
    for c in rows:
        if all((c.params or {}).get(k) == v for k, v in params.items()):
            return command_dict(c)
    return None


def issue_once(
    session: Session,
    run_id: str,
    type: str,  # noqa: A002 - the wire field's name
    params: dict[str, Any],
    reason: str | None,
    issued_by: str,
    ttl_s: float = DEFAULT_TTL_S,
    alert_id: int | None = None,
) -> dict[str, Any]:
    """`create_command`, unless ``issued_by`` sent the same command within TWIN_WINDOW_S and no
    trainer has acked it (`open_twin`): then that one. The check and the insert hold the run's
    lock until the caller commits, so two requests at once make one command (two stops sent
    back to back saved two checkpoints). Raises as `create_command` does."""
    with run_lock(session, run_id):
        twin = open_twin(session, run_id, type, params, issued_by, TWIN_WINDOW_S)
        if twin is not None:
            return twin
        return create_command(
            session, run_id, type, params, reason, issued_by, alert_id=alert_id, ttl_s=ttl_s
        )


def list_commands(session: Session, run_id: str) -> list[dict[str, Any]]:
    """The command log, newest first."""
    expire_commands(session, run_id)
    rows = session.scalars(
        select(Command).where(Command.run_id == run_id).order_by(Command.created_at.desc())
    ).all()
    return [command_dict(c) for c in rows]


def mitigation_state(session: Session, run_ids: list[str]) -> dict[str, dict[str, Any]]:
    """Per run: the newest requested set_mitigation (not rejected/expired), the newest applied."""
    out: dict[str, dict[str, Any]] = {rid: {"requested": None, "applied": None} for rid in run_ids}
    if not run_ids:
        return out
    rows = session.scalars(
        select(Command)
        .where(Command.run_id.in_(run_ids), Command.type == "set_mitigation")
        .order_by(Command.created_at)
    ).all()
    for c in rows:
        state = out[c.run_id]
        if c.status not in ("rejected", "expired"):
            state["requested"] = {**c.params, "command_id": c.id, "status": c.status}
        if c.status == "applied":
            state["applied"] = {**c.params, "command_id": c.id, "step": c.acked_step}
    return out
