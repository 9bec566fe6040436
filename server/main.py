"""The ASGI application: API routers, error handling, and the dashboard at /dashboard/."""

from __future__ import annotations

import gc
import logging
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, Response
from fastapi_offline import FastAPIOffline
from sqlalchemy.exc import DataError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from vantage.client.schema import MAX_REQUEST_BYTES

from . import alerts
from .alert_worker import AlertWorker
from .db import UNAVAILABLE, UNAVAILABLE_RETRY_AFTER_S, first_line, make_engine, session_factory
from .models import run_not_found
from .routes import (
    EXTRA_SCHEMAS,
    acr,
    commands,
    health,
    ingest,
    known_query_only,
    metrics,
    plain_body_errors,
    runs,
)
from .routes import alerts as alert_routes
from .settings import Settings

log = logging.getLogger("vantage.server")


def _error(msg: str, loc: list | None = None, kind: str = "value_error") -> dict:
    """One entry of a 422's ``detail``, shaped as pydantic's validation errors are."""
    return {"type": kind, "loc": loc or [], "msg": msg}


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
        errors = [_error("cannot contain NUL characters", ["query", k]) for k in bad]
        return JSONResponse({"detail": errors}, status_code=422)
    reason = str(exc.orig).splitlines()[0] if exc.orig is not None else type(exc).__name__
    error = _error(f"the database refused a value: {reason}", kind="database_refused")
    return JSONResponse({"detail": [error]}, status_code=422)


async def _database_unavailable(request: Request, exc: Exception) -> JSONResponse:
    """503 with Retry-After for a database that cannot be reached or is too busy (connection
    refused or lost, pool exhausted, a lock or deadlock that outlived the route's redo): a
    condition that passes, where a 500 read as a bug and was plain text (a trial). The answer
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
    that every 422 lists its errors (README, "HTTP API"); ``loc`` is empty when the message
    concerns the request as a whole."""
    if exc.status_code == 422 and isinstance(exc.detail, str):
        exc = HTTPException(422, [_error(exc.detail)], headers=exc.headers)
    if exc.status_code == 400 and exc.detail == FASTAPI_BODY_ERROR:
        # FastAPI's answer to a body its JSON parser raised on (not a JSONDecodeError): a 400
        # without a word of why, where ingest's parser answered a 422 json_invalid (a trial)
        cause = exc.__cause__
        why = "nested too deeply" if isinstance(cause, RecursionError) else first_line(cause or exc)
        if isinstance(cause, UnicodeDecodeError):  # "'utf-16-le' codec can't decode…" (a trial)
            why = "the body is not UTF-8 text"
        return JSONResponse(
            {"detail": [_error(f"Invalid JSON: {why}", ["body"], "json_invalid")]}, status_code=422
        )
    return await http_exception_handler(request, exc)


_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]  # HEAD arrives as GET (`HeadAsGet`)


async def _no_route(request: Request, path: str) -> Response:
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


class HeadAsGet:
    """ASGI middleware: a HEAD request is routed as a GET and answered without its body
    (RFC 9110 §9.3.2), so every GET route takes HEAD (FastAPI's routes take only the methods
    they name; health checks and link checkers send HEAD)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            return await self.app(scope, receive, send)

        async def headers_only(message: dict) -> None:
            if message["type"] == "http.response.body":
                if message.get("more_body", False):
                    return
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, headers_only)


class BodyTooLarge(HTTPException):
    """A request body past MAX_REQUEST_BYTES, raised while it is read (413)."""

    def __init__(self) -> None:
        super().__init__(413, f"request body over the limit of {MAX_REQUEST_BYTES:,} bytes")


class BodyLimit:
    """ASGI middleware: no request body past MAX_REQUEST_BYTES (DESIGN.md §4), on every route.
    A declared ``Content-Length`` over it is refused before anything is read, and one within it
    passes untouched (the HTTP server delivers no more than declared: ingest's path, where the
    client always declares it, pays nothing); a body sent in chunks raises BodyTooLarge from
    ``receive`` once past the limit, which a route answers as its 413 and this middleware
    answers when a middleware was reading (nothing was stored either way)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        for k, v in scope["headers"]:
            if k == b"content-length" and v.isdigit():
                if int(v) > MAX_REQUEST_BYTES:
                    return await _too_large(scope, receive, send)
                return await self.app(scope, receive, send)
        size, started = 0, False

        async def limited() -> dict:
            nonlocal size
            message = await receive()
            size += len(message.get("body", b""))
            if size > MAX_REQUEST_BYTES:
                raise BodyTooLarge
            return message

        async def watched(message: dict) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            await self.app(scope, limited, watched)
        except BodyTooLarge:
            if started:
                raise
            await _too_large(scope, receive, send)


async def _too_large(scope: dict, receive: Any, send: Any) -> None:
    detail = BodyTooLarge().detail
    await JSONResponse({"detail": detail}, status_code=413)(scope, receive, send)


class JsonBodies:
    """ASGI middleware for API requests' bodies, which are always JSON:
    - a ``Content-Encoding`` (gzip, say) gets 415 naming it; the API reads plain JSON, and
      would otherwise answer "invalid JSON";
    - a body sent with another or no ``Content-Type`` (``curl -d`` sends a form's) is read as
      JSON all the same, as the raw-read ingest routes always did; FastAPI would otherwise
      answer a puzzling "Input should be a valid dictionary"."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/api/"):
            # a scan of the few headers, no dict: this runs on every ingest request
            encoding, content_type = b"", None
            for k, v in scope["headers"]:
                if k == b"content-encoding":
                    encoding = v.strip().lower()
                elif k == b"content-type":
                    content_type = v
            if encoding not in (b"", b"identity"):
                detail = (
                    f"Content-Encoding {encoding.decode('latin-1')} is not supported; "
                    "send the JSON body uncompressed"
                )
                response = JSONResponse({"detail": detail}, status_code=415)
                return await response(scope, receive, send)
            has_body = scope["method"] in ("POST", "PUT", "PATCH")  # a GET needs no rewrite
            if has_body and (content_type is None or b"json" not in content_type.lower()):
                headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
                scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        return await self.app(scope, receive, send)


async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
    # Inputs are left out: they may hold NaN, which JSON cannot carry, and can be large.
    errors = [
        {k: v for k, v in e.items() if k not in ("input", "ctx", "url")}
        for e in plain_body_errors(list(exc.errors()))
    ]
    return JSONResponse({"detail": errors}, status_code=422)


# The cyclic collector's thresholds while serving (Python's default: 700, 10, 10). Parsing an
# ingest batch makes a list per group, and at 700 new containers the collector ran every
# request or two, walking the lists still in use: about 6% of the event loop thread's CPU.
# Requests free nearly everything by reference counting; a collection every 20,000 containers
# leaves little garbage waiting. Side by side, two senders: +6.6% groups/s, −3.6% CPU a group.
GC_THRESHOLDS = (20_000, 20, 100)


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app for ``settings`` (default: from the environment). The schema must already
    be upgraded (``vantage serve`` does it before the app takes traffic)."""
    settings = settings or Settings()
    engine = make_engine(settings.database_url)
    evaluator = alerts.Evaluator(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI):  # noqa: ANN202
        # Everything imported and built so far lives as long as the process: keep it out of the
        # cyclic collector's scans, which otherwise re-walk it as requests allocate (ingest's
        # parse of a 1,000-group batch was measured about 1.5× slower without this).
        gc.freeze()
        gc.set_threshold(*GC_THRESHOLDS)
        worker = None
        if settings.alert_worker:  # periodic alert pass and webhook outbox (DESIGN.md §6)
            worker = AlertWorker(settings, app.state.session_factory, evaluator)
            worker.start()
        yield
        if worker is not None:
            worker.stop()
        engine.dispose()

    # FastAPIOffline: a FastAPI whose /docs and /redoc load Swagger UI and ReDoc from files
    # bundled with it, not from a CDN, so that they work on a cluster without internet.
    app = FastAPIOffline(
        static_url="/docs-assets",
        title="Vantage",
        version="0.1.0",
        lifespan=lifespan,
        description='Advantage-collapse monitoring for GRPO runs. The README ("HTTP API") '
        "defines the step and window metrics and the identity of groups.",
    )
    app.state.settings = settings
    app.state.engine = engine
    app.state.session_factory = session_factory(engine)
    app.state.evaluator = evaluator
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(DataError, _data_error)
    for unavailable in UNAVAILABLE:
        app.add_exception_handler(unavailable, _database_unavailable)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    # a probe or a scraper may add parameters of its own; ingest and /acr take no GET (and
    # ingest no dependency it does not need)
    for module in (health, ingest, acr):
        app.include_router(module.router)
    for module in (runs, metrics, commands, alert_routes):
        app.include_router(module.router, dependencies=[Depends(known_query_only)])
    app.add_api_route("/api/{path:path}", _no_route, methods=_METHODS, include_in_schema=False)
    _mount_dashboard(app, settings)
    # Last of ours, so before the catch-all that Dash appends at startup, which would answer
    # every other GET (/favicon.ico, a typo) with the dashboard's page and 200.
    app.add_api_route("/{path:path}", _no_route, methods=_METHODS, include_in_schema=False)
    app.add_middleware(HeadAsGet)
    app.add_middleware(JsonBodies)
    app.add_middleware(BodyLimit)  # outermost: every route's body, the dashboard's too
    _document_raw_bodies(app)
    return app


def _document_raw_bodies(app: FastAPI) -> None:
    base_openapi = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = base_openapi()
            components = schema.setdefault("components", {})
            components.setdefault("schemas", {}).update(EXTRA_SCHEMAS)
            # The key as a bearer token, so that /docs has an Authorize button and its "Try it
            # out" sends the key (the routes read the header themselves; found by a trial).
            components["securitySchemes"] = {
                "APIKey": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A key from `vantage keys create` (vtg_…). /healthz, "
                    "/readyz, /docs and /openapi.json need none.",
                }
            }
            schema["security"] = [{"APIKey": []}]
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _mount_dashboard(app: FastAPI, settings: Settings) -> None:
    try:
        from vantage import dashboard
    except ImportError:  # the dashboard needs the server extra's Dash; the API works without it
        return
    mount = getattr(dashboard, "mount", None)
    if mount is not None:
        mount(app, settings, app.state.session_factory)
