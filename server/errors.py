"""Error handlers: every error answers JSON, every 422 lists its errors in pydantic's shape
(`field_error`), and a database that cannot be reached answers 503 with Retry-After."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, Response
from sqlalchemy.exc import DataError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from .db import UNAVAILABLE, UNAVAILABLE_RETRY_AFTER_S, first_line
from .models import run_not_found

log = logging.getLogger("vantage.server")


def field_error(msg: str, loc: list[Any] | None = None, kind: str = "value_error") -> dict:
    """One entry of a 422's ``detail``, shaped as pydantic's validation errors are; ``loc`` is
    empty when the message concerns the request as a whole."""
    return {"type": kind, "loc": loc or [], "msg": msg}


def plain_body_errors(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``errors`` (pydantic's, each ``loc`` starting with "body") with the messages about the
    body as a whole said plainly: pydantic's "Input should be a valid dictionary or object to
    extract fields from" and "Field required" name no field a user could look for."""
    for error in errors:
        loc = tuple(error["loc"])
        if error["type"] == "json_invalid" and len(loc) == 2 and loc[0] == "body":
            # FastAPI's own parse: the position rides in loc, the reason in ctx
            why = (error.get("ctx") or {}).get("error") or "JSON decode error"
            error["loc"], error["msg"] = ["body"], f"Invalid JSON: {why} at character {loc[1]}"
        if loc != ("body",):
            continue
        if error["type"] == "missing":
            error["msg"] = "the request has no body; send a JSON object"
        elif error["type"] in ("model_attributes_type", "model_type", "dict_type"):
            error["msg"] = "the request body must be a JSON object ({...})"
    return errors


def add_error_handlers(app: FastAPI) -> None:
    """Install the handlers below on ``app``."""
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(DataError, _data_error)
    for unavailable in UNAVAILABLE:
        app.add_exception_handler(unavailable, _database_unavailable)
    app.add_exception_handler(StarletteHTTPException, _http_error)


async def _data_error(request: Request, exc: DataError) -> JSONResponse:
    # The database refused a value the schema let through (e.g. a NUL byte in a JSON string on
    # PostgreSQL): the transaction was rolled back, so answer 422 rather than 500. An id in the
    # path that PostgreSQL cannot even compare names nothing that exists: 404, as on SQLite.
    run_id = str(request.path_params.get("run_id", ""))
    if "\x00" in run_id:  # the message SQLite's lookup gives
        return JSONResponse({"detail": run_not_found(run_id)}, status_code=404)
    if any("\x00" in str(v) for v in request.path_params.values()):
        return JSONResponse({"detail": "not found (an id never contains NUL)"}, status_code=404)
    bad = [k for k, v in request.query_params.multi_items() if "\x00" in v]
    if bad:
        errors = [field_error("cannot contain NUL characters", ["query", k]) for k in bad]
        return JSONResponse({"detail": errors}, status_code=422)
    reason = str(exc.orig).splitlines()[0] if exc.orig is not None else type(exc).__name__
    error = field_error(f"the database refused a value: {reason}", kind="database_refused")
    return JSONResponse({"detail": [error]}, status_code=422)


async def _database_unavailable(request: Request, exc: Exception) -> JSONResponse:
    """503 with Retry-After for a database that cannot be reached or is too busy (connection
    refused or lost, pool exhausted, a lock or deadlock that outlived the route's redo): a
    condition that passes, where a 500 read as a bug and was plain text. The answer
    names only the error's type: its text can name hosts and ports."""
    reason = first_line(exc)
    log.warning("%s %s: database unavailable: %s", request.method, request.url.path, reason)
    detail = f"the database is unavailable or busy ({_cause(exc)}); try again shortly"
    return JSONResponse(
        {"detail": detail},
        status_code=503,
        headers={"Retry-After": str(UNAVAILABLE_RETRY_AFTER_S)},
    )


def _cause(exc: Exception) -> str:
    orig = getattr(exc, "orig", None)
    return type(orig if orig is not None else exc).__name__


FASTAPI_BODY_ERROR = "There was an error parsing the body"


async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
    """FastAPI's answer, except that a 422 given as one message becomes a one-entry list, so
    that every 422 lists its errors (docs/reference/http-api.md); ``loc`` is empty when the message
    concerns the request as a whole."""
    if exc.status_code == 422 and isinstance(exc.detail, str):
        exc = HTTPException(422, [field_error(exc.detail)], headers=exc.headers)
    if exc.status_code == 400 and exc.detail == FASTAPI_BODY_ERROR:
        # FastAPI's answer to a body its JSON parser raised on (not a JSONDecodeError): a 400
        # without a word of why, where ingest's parser answered a 422 json_invalid
        cause = exc.__cause__
        why = "nested too deeply" if isinstance(cause, RecursionError) else first_line(cause or exc)
        if isinstance(cause, UnicodeDecodeError):  # "'utf-16-le' codec can't decode…"
            why = "the body is not UTF-8 text"
        return JSONResponse(
            {"detail": [field_error(f"Invalid JSON: {why}", ["body"], "json_invalid")]},
            status_code=422,
        )
    return await http_exception_handler(request, exc)


async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
    # Inputs are left out: they may hold NaN, which JSON cannot carry, and can be large.
    errors = [
        {k: v for k, v in e.items() if k not in ("input", "ctx", "url")}
        for e in plain_body_errors(list(exc.errors()))
    ]
    return JSONResponse({"detail": errors}, status_code=422)


NO_ROUTE_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]  # HEAD arrives as GET


async def no_route(request: Request, path: str) -> Response:
    """A request that no route of ours serves (the catch-alls of /api/ and of the root, which
    come before the dashboard's and Dash's own catch-alls that would answer with the
    dashboard's HTML and 200): 405 where an earlier route serves the path with other methods,
    else a JSON 404; a GET of the root leads to the dashboard."""
    for route in request.app.router.routes:  # the routes before this one
        if route is request.scope.get("route"):
            break
        if route.matches(request.scope)[0] is Match.PARTIAL:
            return JSONResponse({"detail": "Method Not Allowed"}, status_code=405)
    path = request.scope["path"]  # as sent: request.url reads "//api/..." as a host
    if path == "/" and getattr(request.app.state, "dash_app", None) is not None:
        if request.method != "GET":  # HEAD arrives as GET (`HeadAsGet`)
            return JSONResponse({"detail": "Method Not Allowed"}, status_code=405)
        return RedirectResponse("/dashboard/", status_code=307)
    if path.startswith("/api/"):
        detail = f"no such API route: {request.method} {path}"
    else:
        detail = f"not found: {path} (the API is under /api/v1/, the dashboard at /dashboard/)"
    return JSONResponse({"detail": detail}, status_code=404)
