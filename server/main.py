"""The ASGI application: settings, database, alert evaluation, middlewares, error handlers,
the API routers and the dashboard at /dashboard/, put together."""

from __future__ import annotations

import gc
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI
from fastapi_offline import FastAPIOffline

from .alerts import AlertWorker, Evaluator
from .db import make_engine, session_factory
from .errors import NO_ROUTE_METHODS, add_error_handlers, no_route
from .middleware import BodyLimit, HeadAsGet, JsonBodies
from .routes import (
    acr,
    commands,
    document_raw_bodies,
    health,
    ingest,
    known_query_only,
    metrics,
    runs,
    samples,
)
from .routes import alerts as alert_routes
from .settings import Settings

# The cyclic collector's thresholds while serving (Python's default: 700, 10, 10). Parsing an
# ingest batch makes a list per group, and at 700 new containers the collector ran every
# request or two, walking the lists still in use. Requests free nearly everything by reference
# counting; a collection every 20,000 containers leaves little garbage waiting.
GC_THRESHOLDS = (20_000, 20, 100)


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app for ``settings`` (default: from the environment). The schema must already
    be upgraded (``vantage serve`` does it before the app takes traffic)."""
    settings = settings or Settings()
    engine = make_engine(settings.database_url)
    evaluator = Evaluator(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI):  # noqa: ANN202
        # Everything imported and built so far lives as long as the process: keep it out of the
        # cyclic collector's scans, which otherwise re-walk it as requests allocate.
        gc.freeze()
        gc.set_threshold(*GC_THRESHOLDS)
        worker = None
        if settings.alert_worker:  # periodic alert pass and webhook outbox (docs/design.md §6)
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
        description="Advantage-collapse monitoring for GRPO runs. The docs site defines the step "
        "and window metrics (docs/concepts.md) and the rules every endpoint shares: auth, errors, "
        "limits, the identity of groups (docs/reference/http-api.md).",
    )
    app.state.settings = settings
    app.state.engine = engine
    app.state.session_factory = session_factory(engine)
    app.state.evaluator = evaluator
    add_error_handlers(app)
    # a probe or a scraper may add parameters of its own; ingest and /acr take no GET (and
    # ingest no dependency it does not need)
    for module in (health, ingest, acr):
        app.include_router(module.router)
    for module in (runs, metrics, commands, samples, alert_routes):
        app.include_router(module.router, dependencies=[Depends(known_query_only)])
    app.add_api_route(
        "/api/{path:path}", no_route, methods=NO_ROUTE_METHODS, include_in_schema=False
    )
    _mount_dashboard(app, settings)
    # Last of ours, so before the catch-all that Dash appends at startup, which would answer
    # every other GET (/favicon.ico, a typo) with the dashboard's page and 200.
    app.add_api_route("/{path:path}", no_route, methods=NO_ROUTE_METHODS, include_in_schema=False)
    app.add_middleware(HeadAsGet)
    app.add_middleware(JsonBodies)
    app.add_middleware(BodyLimit)  # outermost: every route's body, the dashboard's too
    document_raw_bodies(app)
    return app


def _mount_dashboard(app: FastAPI, settings: Settings) -> None:
    try:
        from vantage.dashboard.app import mount
    except ImportError:  # the dashboard needs the server extra's Dash; the API works without it
        return
    mount(app, settings, app.state.session_factory)
