"""Checks a command makes before it uses the database: the extra it needs, the settings, the
schema. Each failure is one line on stderr (password hidden) and an exit status, never a
traceback. Used by the `vantage` commands and by `vantage demo`; imports of the server's extra
stay inside the functions, so that a client-only install gets the line that names the extra."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

EXIT_MISSING_EXTRA = 2
SERVER_MODULES = ("fastapi", "uvicorn", "sqlalchemy", "alembic", "pydantic_settings")
TRAINER_MODULES = ("torch", "transformers")


def needs(extra: str, modules: Sequence[str]) -> None:
    """Exit 2, naming ``extra``, when any of ``modules`` is not installed."""
    import importlib.util

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        print(
            f"error: this command needs the '{extra}' extra (missing: {', '.join(missing)}); "
            f"install it with: pip install 'vantage-rl[{extra}]'",
            file=sys.stderr,
        )
        raise SystemExit(EXIT_MISSING_EXTRA)


def settings_or_exit(args: argparse.Namespace, **overrides: Any):  # noqa: ANN201
    """The server's settings (environment, then ``--database-url`` and ``overrides``); a bad
    value exits 2 with one line naming its variable."""
    needs("server", SERVER_MODULES)
    from .settings import SettingsError, load_settings

    values = {k: v for k, v in overrides.items() if v is not None}
    if getattr(args, "database_url", None) is not None:
        if not args.database_url.strip():  # an unset shell variable: not the default database
            print("error: --database-url is empty; give a database URL", file=sys.stderr)
            raise SystemExit(2)
        values["database_url"] = args.database_url
    try:
        return load_settings(**values)
    except SettingsError as exc:
        said = str(exc)
        if "database_url" in values:  # the flag's value, not the environment's, was refused
            said = said.replace("VANTAGE_DATABASE_URL=", "--database-url ", 1)
        print(f"error: {said}", file=sys.stderr)
        raise SystemExit(2) from None


def upgrade_or_explain(database_url: str) -> tuple[str | None, str | None] | None:
    """Upgrade the schema; returns the revisions before and after (`migrate.upgrade`), or None
    on failure, said in one line (password hidden) instead of a traceback."""
    from .migrate import upgrade

    try:
        return upgrade(database_url)
    except Exception as exc:  # noqa: BLE001 - any failure here means the database is unusable
        say_unusable(database_url, exc)
        return None


def say_unusable(database_url: str, exc: Exception) -> None:
    """One line on stderr: the database (password hidden) and the first line of the error."""
    from .db import safe_url

    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    print(f"error: cannot use the database at {safe_url(database_url)}: {reason}", file=sys.stderr)


def open_session(args: argparse.Namespace, create: bool = False):  # noqa: ANN201
    """A session on the command's database, at the newest schema. A database without Vantage's
    schema (a typo in the URL, say) exits 1 unless ``create``, which makes it and says so; a
    database that cannot be used exits 1 with the reason in one line."""
    url = settings_or_exit(args).database_url
    from .db import make_engine, safe_url, session_factory

    try:
        fresh = not has_schema(url)
    except Exception as exc:  # noqa: BLE001 - any failure here means the database is unusable
        say_unusable(url, exc)
        raise SystemExit(1) from None
    if fresh and not create:
        print(
            f"error: no Vantage database at {safe_url(url)}; give the server's --database-url "
            "(or VANTAGE_DATABASE_URL)",
            file=sys.stderr,
        )
        raise SystemExit(1)
    if not upgrade_or_explain(url):
        raise SystemExit(1)
    if fresh:
        print(
            f"note: created a new Vantage database at {safe_url(url)} (it had no Vantage tables);"
            " a server on another database will not know what is stored here",
            file=sys.stderr,
        )
    return session_factory(make_engine(url))()


def schema_or_explain(url: str) -> bool:
    """`serve --no-upgrade`: the schema must be there already, at this code's revision. On an
    empty database the server would report ready and answer every key with 401."""
    from .db import safe_url

    try:
        present = has_schema(url)
    except Exception as exc:  # noqa: BLE001 - any failure here means the database is unusable
        say_unusable(url, exc)
        return False
    if not present:
        print(
            f"error: no Vantage schema at {safe_url(url)}; run `vantage db upgrade` first, or "
            "serve without --no-upgrade",
            file=sys.stderr,
        )
        return False
    return _schema_current_or_explain(url)


def _schema_current_or_explain(url: str) -> bool:
    """A schema of another revision is refused, as this code's queries need its own (on an
    older schema a request that needs a newer table or column would fail with a 500)."""
    from .db import safe_url
    from .migrate import revisions

    current, head = revisions(url)
    if current != head:
        print(
            f"error: the schema at {safe_url(url)} is at revision {current}, this server needs "
            f"{head}; run `vantage db upgrade` first, or serve without --no-upgrade",
            file=sys.stderr,
        )
    return current == head


def has_schema(url: str) -> bool:
    """Whether the database exists and holds Vantage's schema; never creates a SQLite file."""
    from sqlalchemy import inspect
    from sqlalchemy.engine import make_url

    from .db import make_engine, normalize_url

    parsed = make_url(normalize_url(url))
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database or ""
        if database in ("", ":memory:") or not Path(database).is_file():
            return False
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return inspect(conn).has_table("alembic_version")
    finally:
        engine.dispose()
