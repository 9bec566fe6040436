"""Typed FastAPI dependencies: the session of a request and the key that guards a route."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Annotated, Any, TypeVar

from fastapi import Depends, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.orm import Session

from .keys import ALL_ACCESS, KeyInfo, authenticate
from .models import Run, run_not_found
from .settings import Settings


async def get_settings(request: Request) -> Settings:  # async: no trip to the thread pool
    return request.app.state.settings


def get_session(request: Request) -> Iterator[Session]:
    with request.app.state.session_factory() as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session)]
SettingsDep = Annotated[Settings, Depends(get_settings)]


def _bearer(request: Request) -> str | None:
    """The key of an ``Authorization: Bearer`` header. Never a cookie: a browser sends cookies
    with requests that other sites make, so a cookie key would let them write (CSRF); the
    dashboard's own cookie is checked by the dashboard's routes only."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return None


def check_key(request: Request, session: Session, scope: str, *others: str) -> KeyInfo:
    """The caller's key when it has ``scope`` (or one of ``others``). Raises HTTPException 401
    for a missing, unknown or revoked key and 403 for a missing scope (docs/design.md §4); without
    auth, every access."""
    if not request.app.state.settings.auth_enabled:
        return ALL_ACCESS
    token = _bearer(request)
    if token is None:
        raise HTTPException(
            401,
            "missing API key: send 'Authorization: Bearer vtg_...'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    key = authenticate(session, token)
    if key is None:
        raise HTTPException(
            401, "unknown or revoked API key", headers={"WWW-Authenticate": "Bearer"}
        )
    if scope not in key.scopes and not key.scopes.intersection(others):
        needed = " or ".join(f"'{s}'" for s in (scope, *others))
        raise HTTPException(403, f"this key lacks the {needed} scope")
    return key


def require(scope: str, *others: str) -> Callable[..., Awaitable[KeyInfo]]:
    """A dependency that checks the caller's key with `check_key`. It is async: without auth
    it answers at once, and with auth it looks the key up in one trip to the thread pool, on a
    session of its own (a sync dependency on the request's session took three trips, a
    measurable part of a small request)."""

    async def dependency(request: Request) -> KeyInfo:
        if not request.app.state.settings.auth_enabled:
            return ALL_ACCESS
        return await run_in_threadpool(_check_in_session, request, (scope, *others))

    return dependency


def _check_in_session(request: Request, scopes: tuple[str, ...]) -> KeyInfo:
    with request.app.state.session_factory() as session:
        return check_key(request, session, *scopes)


IngestKey = Annotated[KeyInfo, Depends(require("ingest"))]
ReadKey = Annotated[KeyInfo, Depends(require("read"))]
ControlKey = Annotated[KeyInfo, Depends(require("control"))]
AdminKey = Annotated[KeyInfo, Depends(require("admin"))]
# The trainer's key reads the command log of its run as well as acking (docs/design.md §4: ingest
# may "read and ack the run's commands").
CommandReaderKey = Annotated[KeyInfo, Depends(require("read", "ingest"))]


def load_run(session: Session, run_id: str, key: KeyInfo) -> Run:
    """The run, or 404 (also for a run outside the key's project)."""
    return authorized(session.get(Run, run_id), run_id, key)


RunT = TypeVar("RunT", bound=Any)  # an ORM Run, or the plain run that `run_lock` reads


def authorized(run: RunT | None, run_id: str, key: KeyInfo) -> RunT:
    """``run`` if it exists and the key may see it, else 404."""
    if run is None or not key.allows_project(run.project):
        raise HTTPException(404, run_not_found(run_id))
    return run
