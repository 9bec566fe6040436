"""Typed FastAPI dependencies: the session of a request and the key that guards a route."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Annotated, Any, TypeVar

from fastapi import Depends, HTTPException, Request
from sqlalchemy.orm import Session

from .keys import ALL_ACCESS, KeyInfo, authenticate
from .models import Run
from .settings import Settings


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_session(request: Request) -> Iterator[Session]:
    with request.app.state.session_factory() as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session)]
SettingsDep = Annotated[Settings, Depends(get_settings)]


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return request.cookies.get("vantage_key")


def require(scope: str) -> Callable[..., KeyInfo]:
    """A dependency that answers 401 for a missing/unknown key and 403 for a missing scope."""

    def check(request: Request, session: SessionDep, settings: SettingsDep) -> KeyInfo:
        if not settings.auth_enabled:
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
        if scope not in key.scopes:
            raise HTTPException(403, f"this key lacks the '{scope}' scope")
        return key

    return check


IngestKey = Annotated[KeyInfo, Depends(require("ingest"))]
ReadKey = Annotated[KeyInfo, Depends(require("read"))]
ControlKey = Annotated[KeyInfo, Depends(require("control"))]
AdminKey = Annotated[KeyInfo, Depends(require("admin"))]


def load_run(session: Session, run_id: str, key: KeyInfo) -> Run:
    """The run, or 404 (also for a run outside the key's project)."""
    return authorized(session.get(Run, run_id), run_id, key)


RunT = TypeVar("RunT", bound=Any)  # an ORM Run, or the plain run that `run_lock` reads


def authorized(run: RunT | None, run_id: str, key: KeyInfo) -> RunT:
    """``run`` if it exists and the key may see it, else 404."""
    if run is None or not key.allows_project(run.project):
        raise HTTPException(404, f"run {run_id} not found")
    return run
