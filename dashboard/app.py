"""Builds the Dash app on the server's FastAPI app: pages, login, gate, CSV downloads."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dash
from dash import Dash, Input, Output, dcc, html
from fastapi import FastAPI
from fastapi.responses import RedirectResponse, Response, StreamingResponse
from starlette.requests import Request  # at module level: FastAPI resolves annotations here
from vantage.server.routes.metrics import PromptSide, Split

from . import auth, components, context, data
from .callback_requests import CallbackRequests

log = logging.getLogger("vantage.dashboard")

HERE = Path(__file__).parent
URL_BASE = auth.PREFIX + "/"


def _shell() -> html.Div:
    """The frame around every page: navigation, the caller's identity, the page itself."""
    return html.Div(
        [
            dcc.Location(id="url", refresh="callback-nav"),
            html.Header(
                [
                    dcc.Link("Vantage", href=URL_BASE, className="brand"),
                    html.Span(
                        "advantage-collapse monitor for GRPO runs",
                        className="tagline",
                        title=(
                            "ACR (advantage collapse rate) is the share of a step's prompt groups "
                            "in which every completion got the same reward, so the group gives no "
                            "gradient. This dashboard shows it per run and lets you act on it."
                        ),
                    ),
                    html.Nav(
                        [
                            dcc.Link("Runs", href=URL_BASE, id="nav-runs"),
                            dcc.Link("Compare", href=URL_BASE + "compare", id="nav-compare"),
                            dcc.Link("Alerts", href=URL_BASE + "alerts", id="nav-alerts"),
                            dcc.Link("Rules", href=URL_BASE + "rules", id="nav-rules"),
                        ]
                    ),
                    html.Span(id="whoami", className="whoami"),
                ],
                className="topbar",
            ),
            html.Main(dash.page_container, className="page"),
        ]
    )


def _register_shell_callbacks(app: Dash) -> None:
    @app.callback(Output("whoami", "children"), Input("url", "pathname"))
    @context.in_thread
    def whoami(_pathname: str | None) -> Any:
        if not context.auth_enabled():
            return html.Span("auth off (loopback only)", title="vantage serve --insecure-no-auth")
        info = context.current_key()
        if info is None:
            return html.A("log in", href=URL_BASE + "login")
        scopes = ", ".join(sorted(info.scopes))
        return [
            html.Span(f"{info.name} ({scopes})", id="whoami-name"),
            html.A("log out", href=URL_BASE + "logout", className="logout"),
        ]


def _csv_routes(app: FastAPI) -> None:
    """CSV downloads behind the login cookie (the API's CSV needs a Bearer header, which a
    plain link cannot send)."""

    def csv_response(text: str | Iterator[str] | None, filename: str) -> Response:
        if text is None:
            return Response("run not found", status_code=404)
        headers = {"content-disposition": f'attachment; filename="{filename}"'}
        if isinstance(text, str):
            return Response(text, media_type="text/csv", headers=headers)
        return StreamingResponse(text, media_type="text/csv", headers=headers)

    def as_caller(request: Request, build) -> Any:
        # Bind this request as Dash's current one, so the data layer finds this app's database.
        from dash.backends._fastapi import reset_current_request, set_current_request

        token = set_current_request(request)
        try:
            return build(context.key_info(request.cookies.get(context.COOKIE_NAME), request.app))
        finally:
            reset_current_request(token)

    def full_id(info, run_id: str) -> str:
        # the short id the pages show names a run here too (it was a 404); a start that
        # several runs share stays as asked, so it is not found
        if data.visible_run(info, run_id) is not None or len(run_id) < components.SHORT_ID:
            return run_id
        ids = [r["run_id"] for r in data.visible_runs(info)]
        chosen, _, _ = components.resolve_run_ids([run_id], ids)
        return chosen[0] if chosen else run_id

    # the API's parameters and checks: `?split=` applies, and a bad side or split answers 422
    def metrics_csv(request: Request, run_id: str, split: Split | None = None) -> Response:
        def build(info) -> tuple[Any, str]:
            full = full_id(info, run_id)
            return data.metrics_csv(info, full, split), full

        text, full = as_caller(request, build)
        return csv_response(text, f"{full}.csv")

    def prompts_csv(
        request: Request, run_id: str, side: PromptSide | None = None, split: Split | None = None
    ) -> Response:
        def build(info) -> tuple[Any, str]:
            full = full_id(info, run_id)
            return data.prompts_csv(info, full, side, split), full

        text, full = as_caller(request, build)
        return csv_response(text, f"{full}-prompts.csv")

    def no_such_export(run_id: str, name: str) -> Response:  # not the page index, as 200
        return Response(f"no export '{name}': metrics.csv or prompts.csv", 404)

    base = f"{auth.PREFIX}/export/{{run_id}}"
    app.add_api_route(f"{base}/metrics.csv", metrics_csv, include_in_schema=False)
    app.add_api_route(f"{base}/prompts.csv", prompts_csv, include_in_schema=False)
    app.add_api_route(f"{base}/{{name:path}}", no_such_export, include_in_schema=False)


def _catchall(app: FastAPI, dash_app: Dash) -> None:
    """Serve the Dash index for every page path (/dashboard/runs/<id>, /dashboard/compare).

    Dash adds such a route itself at startup, but to whichever Dash app was created last in
    the process; this one is bound to ours, so several apps (tests) each serve their own pages.
    """
    from dash.backends._fastapi import reset_current_request, set_current_request

    async def index(request: Request, path: str = ""):
        token = set_current_request(request)
        try:
            # Dash's first-request setup (callbacks, pages router, inline scripts) runs in its
            # middleware, which only sees /dashboard/ and /_dash-* paths: run it here too, or a
            # first visit straight to a page gets an index without the pages' scripts.
            for setup in dash_app.backend._before_request_funcs:
                result = setup()
                if inspect.isawaitable(result):
                    await result
            # an address no page answers gets Dash's "not found" page with a 404, not a 200
            status = 200 if _is_page(dash_app, request.url.path) else 404
            return Response(content=dash_app.index(), media_type="text/html", status_code=status)
        finally:
            reset_current_request(token)

    app.add_api_route(
        f"{auth.PREFIX}/{{path:path}}", index, methods=["GET"], include_in_schema=False
    )


def _is_page(dash_app: Dash, path: str) -> bool:
    """Whether a page answers ``path``, as Dash Pages' router decides (its own matcher)."""
    from dash._pages import _path_to_page

    page, _variables = _path_to_page(dash_app.strip_relative_path(path) or "")
    return bool(page)


def _log_callback_error(err: Exception) -> None:
    """Dash answers a callback that raised with a 500 and logs nothing:
    log its traceback, naming the callback's trigger, then let Dash answer as before."""
    log.error("dashboard callback failed (triggered by %s)", dash.ctx.triggered_id, exc_info=err)
    raise err


def _no_websocket(app: FastAPI, dash_app: Dash) -> None:
    """Callbacks go over HTTP only, through the login gate.

    Dash 4's FastAPI backend always opens a WebSocket for callbacks, even when none asks for
    one; its connect handler also resets ``window.dash_clientside``, which loses the pages'
    title callback. We use no WebSocket callbacks, so the route and the client config go."""
    dash_app.backend.websocket_capability = False
    ws_path = dash_app.config.routes_pathname_prefix + "_dash-ws-callback"
    app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", None) != ws_path]


def mount(app: FastAPI, settings: Any, session_factory) -> Dash:
    """Create the dashboard on the FastAPI ``app``: pages at /dashboard/, /dashboard →
    /dashboard/, the API-key login, CSV downloads. ``settings`` gives ``auth_enabled``,
    ``public_url`` and ``dashboard_refresh_s``; ``session_factory()`` opens a SQLAlchemy session.
    Returns the Dash app."""
    from dash import _callback

    context.configure(settings, session_factory, app)
    # Pages register their callbacks globally (dash.callback) each time a Dash app imports
    # them; drop any left from an earlier app in this process so none is registered twice.
    _callback.GLOBAL_CALLBACK_LIST.clear()
    _callback.GLOBAL_CALLBACK_MAP.clear()

    # Routes that must win over Dash's catch-all come first.
    app.add_api_route(
        auth.PREFIX,
        lambda: RedirectResponse(URL_BASE, status_code=307),
        methods=["GET"],
        include_in_schema=False,
    )
    app.add_api_route(  # browsers ask for it on every page (a console 404 otherwise)
        "/favicon.ico",
        lambda: RedirectResponse(f"{URL_BASE}_favicon.ico", status_code=301),
        methods=["GET"],
        include_in_schema=False,
    )
    app.add_api_route(
        f"{auth.PREFIX}/login", auth.login_get, methods=["GET"], include_in_schema=False
    )
    app.add_api_route(
        f"{auth.PREFIX}/login", auth.login_post, methods=["POST"], include_in_schema=False
    )
    app.add_api_route(
        f"{auth.PREFIX}/logout", auth.logout, methods=["GET"], include_in_schema=False
    )
    _csv_routes(app)

    dash_app = Dash(
        __name__,
        server=app,
        url_base_pathname=URL_BASE,
        use_pages=True,
        pages_folder=str(HERE / "pages"),
        assets_folder=str(HERE / "assets"),
        title="Vantage",
        update_title=None,
        suppress_callback_exceptions=True,
        compress=False,
        on_error=_log_callback_error,
    )
    _no_websocket(app, dash_app)
    dash_app.layout = _shell
    _register_shell_callbacks(dash_app)
    # Claim the pages' global callbacks for this app now, not at its first request (by then a
    # second app in this process may have re-registered them; tests build several).
    for key in list(_callback.GLOBAL_CALLBACK_MAP):
        dash_app.callback_map[key] = _callback.GLOBAL_CALLBACK_MAP.pop(key)
    dash_app._callback_list.extend(_callback.GLOBAL_CALLBACK_LIST)
    _callback.GLOBAL_CALLBACK_LIST.clear()
    _catchall(app, dash_app)
    app.add_middleware(CallbackRequests, dash_app=dash_app)
    app.add_middleware(auth.DashboardGate)  # outermost: no body is read before the key is known
    app.state.dash_app = dash_app
    return dash_app
