"""Login with an API key, and the gate in front of every dashboard request.

The login form posts a key; a key with the ``read`` scope is stored in an HttpOnly,
SameSite=Strict cookie (Secure over HTTPS) limited to ``/dashboard/`` (docs/design.md §8). The gate
checks that cookie on every page and callback request: pages without it redirect to the login,
callbacks get 401. Actions check the ``control`` scope again inside their callbacks.
"""

from __future__ import annotations

import html
import json
import logging
from urllib.parse import parse_qs, quote

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse
from starlette.types import ASGIApp, Receive, Scope, Send
from vantage.server.db import UNAVAILABLE, UNAVAILABLE_RETRY_AFTER_S

from . import context

log = logging.getLogger("vantage.dashboard")

PREFIX = "/dashboard"
# Static files carry no data: Dash's JavaScript bundles and our CSS.
PUBLIC = (
    f"{PREFIX}/login",
    f"{PREFIX}/logout",
    f"{PREFIX}/_dash-component-suites/",
    f"{PREFIX}/assets/",
    f"{PREFIX}/_favicon.ico",
)
COOKIE_MAX_AGE_S = 7 * 24 * 3600


def _cookie(scope: Scope) -> str | None:
    for name, value in scope.get("headers", []):
        if name == b"cookie":
            for part in value.decode("latin-1").split(";"):
                k, _, v = part.strip().partition("=")
                if k == context.COOKIE_NAME:
                    return v
    return None


class DashboardGate:
    """ASGI middleware: requests under /dashboard need a key with the read scope."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if (
            scope["type"] not in ("http", "websocket")
            or not path.startswith(PREFIX + "/")  # /dashboard itself only redirects
            or path.startswith(PUBLIC)
            or not context.auth_enabled(scope.get("app"))
        ):
            await self.app(scope, receive, send)
            return
        try:
            info = await _run_sync(context.key_info, _cookie(scope), scope.get("app"))
        except UNAVAILABLE as exc:
            await _database_unavailable(scope, receive, send, exc)
            return
        if context.can(info, "read"):
            await _serve(self.app, scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})  # policy violation
            return
        if "/_dash-" in path or scope.get("method") != "GET":
            body = {"detail": "log in at /dashboard/login with an API key that has the read scope"}
            response = HTMLResponse(json.dumps(body), 401, media_type="application/json")
        else:
            query = scope.get("query_string", b"").decode("latin-1")
            target = path + ("?" + query if query else "")
            response = RedirectResponse(f"{PREFIX}/login?next={quote(target)}", 303)
        await response(scope, receive, send)


async def _serve(app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
    """``app``, with a database that cannot be reached answered as `_database_unavailable`
    while no response has started (a page, a callback or an export reading it)."""
    started = False

    async def tracked(message: dict) -> None:
        nonlocal started
        started = started or message["type"] == "http.response.start"
        await send(message)

    try:
        await app(scope, receive, tracked)
    except UNAVAILABLE as exc:
        if started or scope["type"] != "http":
            raise
        await _database_unavailable(scope, receive, send, exc)


async def _database_unavailable(scope: Scope, receive: Receive, send: Send, exc: Exception) -> None:
    """503 with Retry-After and one log line, as the API answers (an open page's live updates
    got plain-text 500s and logged a traceback each, every 2 s); the page keeps its
    numbers and says they are old until the database is back."""
    log.warning("%s: database unavailable: %s", scope.get("path"), type(exc).__name__)
    headers = {"Retry-After": str(UNAVAILABLE_RETRY_AFTER_S)}
    detail = "the database is unavailable or busy; try again shortly"
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1013})  # try again later
        return
    await JSONResponse({"detail": detail}, 503, headers=headers)(scope, receive, send)


async def _run_sync(func, *args):
    from starlette.concurrency import run_in_threadpool

    return await run_in_threadpool(func, *args)


def _safe_next(target: str | None) -> str:
    """Only redirect inside the dashboard (no open redirect to another site)."""
    if target and target.startswith(PREFIX + "/") and not target.startswith("//"):
        return target
    return PREFIX + "/"


LOGIN_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Vantage · log in</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body {{ font-family: system-ui, sans-serif; background: #f3f4f6; margin: 0; }}
main {{ max-width: 420px; margin: 12vh auto; background: white; padding: 2rem;
  border-radius: 10px; box-shadow: 0 1px 4px rgba(0,0,0,.1); }}
h1 {{ font-size: 1.3rem; margin-top: 0; }} p {{ color: #4b5563; line-height: 1.4; }}
input[type=password] {{ width: 100%; box-sizing: border-box; padding: .6rem; font-size: 1rem;
  border: 1px solid #d1d5db; border-radius: 6px; }}
button {{ margin-top: 1rem; padding: .6rem 1.2rem; font-size: 1rem; background: #1f2937;
  color: white; border: 0; border-radius: 6px; cursor: pointer; }}
.error {{ color: #b91c1c; }} code {{ background: #f3f4f6; padding: 0 .2rem; }}
</style></head>
<body><main>
<h1>Vantage: advantage-collapse monitor</h1>
<p>Log in with an API key. A key with the <code>read</code> scope shows runs; the
<code>control</code> scope also lets you send commands to trainers. Create one with
<code>vantage keys create --name you --scopes read,control</code>.</p>
{error}
<form method="post" action="{prefix}/login">
<label for="key">API key</label>
<input id="key" name="key" type="password" autocomplete="off" placeholder="vtg_..." required>
<input type="hidden" name="next" value="{next}">
<button id="login" type="submit">Log in</button>
</form></main></body></html>"""


def login_page(next_url: str, error: str | None = None, status: int = 200) -> HTMLResponse:
    err = f'<p class="error" id="login-error">{html.escape(error)}</p>' if error else ""
    return HTMLResponse(
        LOGIN_PAGE.format(error=err, prefix=PREFIX, next=html.escape(next_url, quote=True)),
        status_code=status,
    )


async def login_get(request: Request):
    # `expired`: assets/session.js came here because an open page's key stopped working
    said = (
        "Your key no longer works (revoked?): log in again."
        if "expired" in request.query_params
        else None
    )
    return login_page(_safe_next(request.query_params.get("next")), said)


async def login_post(request: Request):
    form = parse_qs((await request.body()).decode("utf-8", "replace"))
    key = (form.get("key") or [""])[0].strip()
    next_url = _safe_next((form.get("next") or [""])[0])
    info = await _run_sync(context.key_info, key, request.app)
    if info is None:
        return login_page(next_url, "Unknown or revoked key.", 401)
    if not context.can(info, "read"):
        return login_page(next_url, "This key lacks the read scope the dashboard needs.", 403)
    response = RedirectResponse(next_url, status_code=303)
    public_url = getattr(context.state(request.app).settings, "public_url", None) or ""
    secure = (
        request.url.scheme == "https"
        or request.headers.get("x-forwarded-proto") == "https"
        or public_url.startswith("https://")
    )
    response.set_cookie(
        context.COOKIE_NAME,
        key,
        max_age=COOKIE_MAX_AGE_S,
        path=PREFIX + "/",
        httponly=True,
        samesite="strict",
        secure=secure,
    )
    return response


async def logout(request: Request):
    response = RedirectResponse(f"{PREFIX}/login", status_code=303)
    response.delete_cookie(context.COOKIE_NAME, path=PREFIX + "/")
    return response
