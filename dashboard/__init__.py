"""The Vantage dashboard: a Dash app mounted by the server at /dashboard/ (DESIGN.md §2).

Importing this package is cheap; Dash is imported only when ``mount`` runs."""

from __future__ import annotations

from typing import Any


def mount(app: Any, settings: Any, session_factory: Any) -> Any:
    """Create the dashboard on the FastAPI ``app``: pages at /dashboard/, /dashboard →
    /dashboard/, the API-key login, CSV downloads. ``settings`` gives ``auth_enabled``,
    ``public_url`` and ``dashboard_refresh_s``; ``session_factory()`` opens a SQLAlchemy session.
    Returns the Dash app."""
    from .app import mount as _mount

    return _mount(app, settings, session_factory)
