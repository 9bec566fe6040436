"""Database URLs: the two backends Vantage keeps its data in, and the driver each uses. Settings
check the URL when they load, before any engine exists."""

from __future__ import annotations

import os
from urllib.parse import quote, urlsplit

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError


def normalize_url(url: str) -> str:
    """Map a bare ``postgresql://`` (and ``postgres://``) URL to psycopg 3."""
    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://") :]
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://") :]
    return url


def compose_url(host: str, port: int, user: str | None, password: str | None, database: str) -> str:
    """A PostgreSQL URL from its parts; the user name and password percent-encoded whole, so
    that any character of theirs is safe (SQLAlchemy's own rendering leaves a blank as it is)."""
    where = URL.create("postgresql+psycopg", host=host, port=port, database=database)
    user_info = quote(user or "", safe="")
    if password is not None:
        user_info += ":" + quote(password, safe="")
    scheme, _, rest = where.render_as_string().partition("://")
    return f"{scheme}://{user_info}@{rest}"


# What a password written into a URL must not hold unescaped; said when such a URL is refused.
_ESCAPE_HINT = (
    " (a password with / @ # ? % or a blank must be percent-encoded in a URL; or give the "
    "database as VANTAGE_DB_HOST, VANTAGE_DB_USER, VANTAGE_DB_PASSWORD, VANTAGE_DB_NAME)"
)


def check_url(url: str) -> str:
    """The backend of a database URL, ``"sqlite"`` or ``"postgresql"``. Raises ValueError for a
    URL that does not parse or names another database (Vantage's queries and migrations are for
    those two)."""
    scheme, _, rest = url.partition("://")
    user_info = rest.rpartition("@")[0]
    if scheme.startswith("postgres") and any(c in user_info for c in "/?#@ "):
        # such a URL parses, but as another host: the rest of the password was then shown
        # as the host name, and waited for 60 s
        raise ValueError("has a user name or password that is not percent-encoded" + _ESCAPE_HINT)
    try:
        urlsplit(url).port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        # SQLAlchemy's own message was "invalid literal for int() with base 10: 'x'"
        raise ValueError(
            "has a port that is not a number from 0 to 65535: give "
            "postgresql://USER@HOST:PORT/DATABASE" + (_ESCAPE_HINT if "@" in url else "")
        ) from None
    try:
        parsed = make_url(normalize_url(url))
        backend = parsed.get_backend_name()
    except (ArgumentError, ValueError):
        raise ValueError(
            "is not a database URL: give sqlite:///PATH or postgresql://USER@HOST/DATABASE"
            + (_ESCAPE_HINT if "@" in url else "")
        ) from None
    if backend not in ("sqlite", "postgresql"):
        raise ValueError(
            f"Vantage keeps its data in SQLite or PostgreSQL, not {backend}: give "
            "sqlite:///PATH or postgresql://USER@HOST/DATABASE"
        )
    driver = parsed.get_driver_name()
    if driver not in ("pysqlite", "psycopg"):  # the drivers the server extra installs
        raise ValueError(
            f"names the {backend} driver {driver}, which Vantage does not use: give "
            + (
                "sqlite:///PATH"
                if backend == "sqlite"
                else "postgresql://USER@HOST/DATABASE (psycopg 3)"
            )
        )
    if backend == "sqlite" and (parsed.database or ":memory:") == ":memory:":
        # each connection would get an empty database of its own: the server said it was
        # ready, then answered every request with a 500 (no such table)
        raise ValueError(
            "names an in-memory SQLite database, which each connection sees empty: give a file, "
            "sqlite:///PATH"
        )
    if backend == "postgresql" and not (
        parsed.database or parsed.query.get("dbname") or os.environ.get("PGDATABASE")
    ):
        # libpq then connects to the database named after the user, and the schema went into
        # the `postgres` maintenance database
        raise ValueError(
            "names no database: give postgresql://USER@HOST/DATABASE (libpq would pick the "
            "database named after the user)"
        )
    return backend
