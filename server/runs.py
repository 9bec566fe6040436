"""Runs and their attempts (docs/design.md §3 'Identity, attempts, ranks')."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session
from vantage.client.schema import RunCreate

from .models import Launch, Run, as_utc, utcnow


def _new_attempt(session: Session, run: Run, body: RunCreate) -> int:
    latest = session.scalar(select(func.max(Launch.attempt)).where(Launch.run_id == run.id)) or 0
    attempt = latest + 1
    session.add(
        Launch(run_id=run.id, attempt=attempt, launch_id=body.launch_id, started_at=body.started_at)
    )
    run.attempt = attempt
    run.status = "running"
    run.finished_at = None
    run.last_seen_at = utcnow()
    return attempt


FIXED_FIELDS = ("reward_min", "reward_max", "trainer_eps")


class RunSettingsConflict(ValueError):
    """A known run registered again with different reward bounds, eps or project (answered
    409)."""


def _check_same_settings(run: Run, body: RunCreate) -> None:
    """A run's classification settings are fixed when it is created: a launch that explicitly
    sends other values would be scored against the old ones, so it is refused, not ignored."""
    for name in FIXED_FIELDS:
        if name in body.model_fields_set and getattr(body, name) != getattr(run, name):
            raise RunSettingsConflict(
                f"run {run.id} was created with {name} {getattr(run, name)!r}, not "
                f"{getattr(body, name)!r}; a run's reward bounds and eps cannot change (start a "
                "new run for new ones)"
            )
    if body.project is not None and body.project != run.project:
        # It was ignored: the launch reported to a run its key's project may not see.
        # The run's own project is not named: the key may belong to another project.
        raise RunSettingsConflict(
            f"run {run.id} was created in another project than {body.project!r} (or in none); "
            "a run's project cannot change (start a new run, or leave `project` out)"
        )


# How far apart two machines' clocks may be: a launch is refused as older than the newest
# attempt only when it began more than this before it.
LAUNCH_CLOCK_SKEW_S = 300.0


class LaunchOlderThanAttempt(ValueError):
    """A new launch of a known run that began before the run's newest attempt (answered 409)."""


def _check_not_older(session: Session, run: Run, body: RunCreate) -> None:
    """Refuse a new launch that began before the run's newest attempt: registered now, it would
    become the newest attempt and its old steps would replace the newer attempt's (`vantage sync`
    of a spool written while the server was down, after a relaunch had registered)."""
    if body.started_at is None:
        return
    newest = session.scalars(
        select(Launch).where(Launch.run_id == run.id).order_by(Launch.attempt.desc()).limit(1)
    ).first()
    if newest is None:
        return
    began = newest.started_at or as_utc(newest.created_at).timestamp()
    if body.started_at < began - LAUNCH_CLOCK_SKEW_S:
        when = datetime.fromtimestamp(body.started_at, UTC).isoformat(timespec="seconds")
        since = datetime.fromtimestamp(began, UTC).isoformat(timespec="seconds")
        raise LaunchOlderThanAttempt(
            f"launch {body.launch_id or '(unnamed)'} began at {when}, before attempt "
            f"{newest.attempt} of run {run.id} (began {since}): registered now it would be the "
            "newest attempt and its steps would replace the newer attempt's, so it is refused"
        )


class RunNameRequired(ValueError):
    """A new run registered without a name (docs/design.md §4 requires one; a known run keeps its
    own, so registering a launch of it may leave the name out)."""


def create_or_resume_run(
    session: Session, body: RunCreate, project: str | None, default_mode: str
) -> tuple[Run, int, bool]:
    """Create a run (attempt 1) or register a launch of a known one.

    Returns (run, attempt, created). A known launch_id returns its attempt (idempotent for every
    rank and retry); a new or absent launch_id on a known run is the next attempt. The caller
    holds the run's lock (`vantage.server.locks.run_lock`) and commits; two first registrations
    of a new run race on its primary key (IntegrityError), which the route retries once. Raises
    RunSettingsConflict when a known run is sent other reward bounds, eps or project, and
    RunNameRequired for a new run without a name.
    """
    run_id = body.run_id or str(uuid.uuid4())
    run = session.get(Run, run_id)  # read under the run's lock, which the caller holds
    if run is None:
        if body.name is None:
            raise RunNameRequired("a new run needs a name")
        run = Run(
            id=run_id,
            name=body.name,
            project=project,
            config=body.config,
            tags=body.tags,
            reward_min=body.reward_min,
            reward_max=body.reward_max,
            group_size=body.group_size,
            trainer_eps=body.trainer_eps,
            world_size=body.world_size,
            heartbeat_s=body.heartbeat_s,
            mitigation_mode=default_mode,
            attempt=1,
            newest_steps={},  # no step rows yet, and so none unevaluated
            has_unevaluated=False,
        )
        session.add(run)
        session.flush()  # the run row first: launches reference it
        session.add(
            Launch(run_id=run_id, attempt=1, launch_id=body.launch_id, started_at=body.started_at)
        )
        session.flush()
        return run, 1, True
    _check_same_settings(run, body)
    if body.launch_id is not None:
        known = session.scalar(
            select(Launch.attempt).where(
                Launch.run_id == run_id, Launch.launch_id == body.launch_id
            )
        )
        if known is not None:
            run.last_seen_at = utcnow()
            return run, known, False
    _check_not_older(session, run, body)
    attempt = _new_attempt(session, run, body)
    # a new attempt describes what runs now: its world size, group size and config (the page
    # showed the first launch's config and group size after a relaunch changed them)
    if body.world_size:
        run.world_size = body.world_size
    if body.group_size is not None:
        run.group_size = body.group_size
    if body.config is not None:
        run.config = body.config
    session.flush()
    return run, attempt, False
