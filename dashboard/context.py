"""What the dashboard's callbacks share: the server's session factory and settings, and the
caller's API key (read from the login cookie, checked against the keys table).

``mount`` stores them on the FastAPI app (``app.state.vantage_dashboard``); a callback finds
them through its request's app, so several apps in one process (tests) each read their own
database. Outside a request (tests and benchmarks calling functions directly) the most recently
mounted app's state is used.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

COOKIE_NAME = "vantage_dashboard_key"
# A revoked key stops working within this many seconds (cached so that a 2 s live update does
# not hash and look up the key on every call).
KEY_CACHE_S = 5.0


@dataclass
class DashboardState:
    settings: Any
    session_factory: Callable[[], Any]
    key_cache: dict[str, tuple[float, Any]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    app: Any = None  # the FastAPI app it is mounted on (in-process API calls outside a request)


_latest: DashboardState | None = None


def configure(settings: Any, session_factory: Callable[[], Any], app: Any = None) -> DashboardState:
    """Make the dashboard's state for ``app`` (and the default outside requests)."""
    global _latest
    _latest = DashboardState(settings, session_factory, app=app)
    if app is not None:
        app.state.vantage_dashboard = _latest
    return _latest


def request_app() -> Any:
    """The FastAPI app of the request being answered, or None outside one."""
    try:
        from dash.backends._fastapi import get_current_request

        return get_current_request().app
    except Exception:  # no request in this context, or another Dash backend
        return None


def state(app: Any = None) -> DashboardState:
    """The state of ``app``, else of the current request's app, else the latest mounted."""
    app = app if app is not None else request_app()
    found = getattr(getattr(app, "state", None), "vantage_dashboard", None)
    if found is not None:
        return found
    if _latest is None:
        raise RuntimeError("vantage.dashboard.app.mount() has not been called")
    return _latest


@contextmanager
def session() -> Iterator[Any]:
    with state().session_factory() as s:
        yield s


def in_thread(func: Callable) -> Callable:
    """Run a callback's database work in a worker thread.

    Dash's FastAPI backend runs a plain callback on the event loop, so a 1 s first load of a
    100,000-step run would stall every API request of the process, ingest included. An async
    callback is awaited instead; ``asyncio.to_thread`` carries the callback context (cookies)."""

    @functools.wraps(func)
    async def run(*args, **kwargs):
        return await asyncio.to_thread(func, *args, **kwargs)

    return run


def auth_enabled(app: Any = None) -> bool:
    return bool(getattr(state(app).settings, "auth_enabled", True))


# A browser's longest timer (ms): a longer interval overflows and fires at once, every time.
MAX_INTERVAL_MS = 2**31 - 1


def refresh_ms(times: int = 1) -> int:
    """The live-update interval (``times`` the server's `dashboard_refresh_s`) in ms, at most
    MAX_INTERVAL_MS (the compare page's twice the longest refresh flooded the server)."""
    seconds = float(getattr(state().settings, "dashboard_refresh_s", 2.0) or 2.0)
    return min(MAX_INTERVAL_MS, int(1000 * seconds * times))


def key_info(plaintext: str | None, app: Any = None):
    """The KeyInfo of a key (cached for KEY_CACHE_S), the all-access identity when auth is off,
    or None for a missing, unknown or revoked key."""
    from vantage.server import keys

    st = state(app)
    if not bool(getattr(st.settings, "auth_enabled", True)):
        return keys.ALL_ACCESS
    if not plaintext:
        return None
    now = time.monotonic()
    with st.lock:
        hit = st.key_cache.get(plaintext)
    if hit is not None and hit[0] > now:
        return hit[1]
    with st.session_factory() as s:
        info = keys.authenticate(s, plaintext)
    with st.lock:
        if len(st.key_cache) > 1000:
            st.key_cache.clear()
        st.key_cache[plaintext] = (now + KEY_CACHE_S, info)
    return info


def current_key():
    """The caller of the running Dash callback, from its login cookie."""
    from dash import callback_context

    try:
        cookies = callback_context.cookies or {}
    except Exception:  # outside a request (direct calls from tests and benchmarks)
        cookies = {}
    return key_info(cookies.get(COOKIE_NAME))


def can(info: Any, scope: str) -> bool:
    return info is not None and scope in info.scopes


def can_see(info: Any, run: dict | None) -> bool:
    """Read scope, and the run's project when the key is limited to one project."""
    if run is None or not can(info, "read"):
        return False
    project = getattr(info, "project", None)
    return project is None or project == run.get("project")
