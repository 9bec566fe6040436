"""The `vantage` command line. Imports stay inside each command so that a command whose extra is
missing exits 2 naming the extra, and `vantage serve` never imports torch."""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import math
import os
import socket
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

EXIT_MISSING_EXTRA = 2


def _needs(extra: str, modules: Sequence[str]) -> None:
    import importlib.util

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        print(
            f"error: this command needs the '{extra}' extra (missing: {', '.join(missing)}); "
            f"install it with: pip install 'vantage-rl[{extra}]'",
            file=sys.stderr,
        )
        raise SystemExit(EXIT_MISSING_EXTRA)


SERVER_MODULES = ("fastapi", "uvicorn", "sqlalchemy", "alembic", "pydantic_settings")


def settings_or_exit(args: argparse.Namespace, **overrides: Any):  # noqa: ANN202
    """The server's settings (environment, then ``--database-url`` and ``overrides``); a bad
    value exits 2 with one line naming its variable."""
    _needs("server", SERVER_MODULES)
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


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind_problem(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be bound now (the OS's words), or None when it can. Binds as
    uvicorn does (SO_REUSEADDR, so a port left in TIME_WAIT counts as free) and lets go."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            return exc.strerror or str(exc)
        except (TypeError, UnicodeError):  # bytes that are no text (an undecodable argument)
            return "Name or service not known"
    return None


def _host_problem(problem: str) -> bool:
    """Whether a `bind_problem` is the host's (a name that does not resolve, an address this
    machine does not have) rather than the port's."""
    words = ("not known", "assign requested address", "temporary failure", "no address")
    return any(w in problem.lower() for w in words)


def url_host(host: str) -> str:
    """``host`` as a URL writes it: an IPv6 address in brackets (``[::1]``)."""
    return f"[{host}]" if ":" in host else host


def free_port(host: str = "127.0.0.1") -> int:
    """A port of ``host`` that is free now (the OS's choice)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def cmd_serve(args: argparse.Namespace) -> int:
    if not args.host.strip():  # '' binds every interface, unasked (an unset shell variable)
        print("error: --host is empty; give a host, such as 127.0.0.1 or 0.0.0.0", file=sys.stderr)
        return 2
    if args.host.startswith("[") and args.host.endswith("]"):  # an IPv6 address as URLs write it
        args.host = args.host[1:-1]
    if args.insecure_no_auth and not _is_loopback(args.host):
        print(
            f"error: --insecure-no-auth only binds a loopback host, not {args.host}",
            file=sys.stderr,
        )
        return 2
    settings = settings_or_exit(args, auth_enabled=False if args.insecure_no_auth else None)
    import uvicorn

    from .main import create_app

    if problem := bind_problem(args.host, args.port):
        print(
            f"error: cannot serve on {url_host(args.host)}:{args.port}: {problem}; choose another "
            + ("--host" if _host_problem(problem) else "--port"),
            file=sys.stderr,
        )
        return 1
    if args.port == 0:  # the OS's choice, named below (uvicorn would not say it)
        args.port = free_port(args.host)
    if not args.no_upgrade and not upgrade_or_explain(settings.database_url):
        return 1
    if args.no_upgrade and not _schema_or_explain(settings.database_url):
        return 1
    print(
        f"Vantage API on http://{url_host(args.host)}:{args.port} (dashboard at /dashboard/)",
        file=sys.stderr,
    )
    options = dict(
        host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=5
    )
    workers = args.workers or settings.workers
    if workers <= 1:
        uvicorn.run(create_app(settings), **options)
        return 0
    # Worker processes build their own app from the environment: hand them what the command
    # line decided. They share nothing but the database (DESIGN.md §8, scale-out).
    os.environ["VANTAGE_DATABASE_URL"] = settings.database_url
    os.environ["VANTAGE_AUTH_ENABLED"] = "true" if settings.auth_enabled else "false"
    with _shared_counters():
        uvicorn.run("vantage.server.main:create_app", factory=True, workers=workers, **options)
    return 0


@contextlib.contextmanager
def _shared_counters() -> Iterator[None]:
    """A folder where the worker processes keep their Prometheus counters, so that a scrape of
    any of them answers the group's sums (`vantage.server.telemetry`); removed afterwards. A
    folder the environment already names is used as it is."""
    from .telemetry import MULTIPROC_ENV

    if os.environ.get(MULTIPROC_ENV):
        yield
        return
    with tempfile.TemporaryDirectory(prefix="vantage-metrics-") as folder:
        os.environ[MULTIPROC_ENV] = folder
        try:
            yield
        finally:
            del os.environ[MULTIPROC_ENV]


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from .db import safe_url

    settings = settings_or_exit(args)
    revisions = upgrade_or_explain(settings.database_url)
    if not revisions:
        return 1
    before, after = revisions
    where = safe_url(settings.database_url)
    if before is None:  # "at the newest schema" on a database it had just made: a trial
        print(f"created Vantage's schema (revision {after}) at {where}", file=sys.stderr)
    elif before != after:
        print(f"upgraded {where} from revision {before} to {after}", file=sys.stderr)
    else:
        print(f"{where} is at the newest schema already (revision {after})", file=sys.stderr)
    return 0


def upgrade_or_explain(database_url: str) -> tuple[str | None, str | None] | None:
    """Upgrade the schema; returns the revisions before and after (`migrate.upgrade`), or None
    on failure, said in one line (password hidden) instead of a traceback."""
    from .migrate import upgrade

    try:
        return upgrade(database_url)
    except Exception as exc:  # noqa: BLE001 - any failure here means the database is unusable
        _say_unusable(database_url, exc)
        return None


def _say_unusable(database_url: str, exc: Exception) -> None:
    """One line on stderr: the database (password hidden) and the first line of the error."""
    from .db import safe_url

    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    print(f"error: cannot use the database at {safe_url(database_url)}: {reason}", file=sys.stderr)


def _session(args: argparse.Namespace, create: bool = False):  # noqa: ANN202
    """A session on the command's database, at the newest schema. A database without Vantage's
    schema (a typo in the URL, say) exits 1 unless ``create``, which makes it and says so; a
    database that cannot be used exits 1 with the reason in one line."""
    url = settings_or_exit(args).database_url
    from .db import make_engine, safe_url, session_factory

    try:
        fresh = not _has_schema(url)
    except Exception as exc:  # noqa: BLE001 - any failure here means the database is unusable
        _say_unusable(url, exc)
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


def _schema_or_explain(url: str) -> bool:
    """`serve --no-upgrade`: the schema must be there already. On an empty database the server
    reported ready, answered every key with 401 and logged a traceback a second (a trial)."""
    from .db import safe_url

    try:
        present = _has_schema(url)
    except Exception as exc:  # noqa: BLE001 - any failure here means the database is unusable
        _say_unusable(url, exc)
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
    """`serve --no-upgrade` on a schema of another revision: refused, as this code's queries
    need its own (on an older schema a read or write that needs a newer table or column would
    fail with a 500, for every request of its kind)."""
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


def _has_schema(url: str) -> bool:
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


def cmd_keys_create(args: argparse.Namespace) -> int:
    from .keys import create_key, parse_scopes

    try:
        scopes = parse_scopes(args.scopes)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not args.name.strip():
        print("error: give the key a name (--name), to list and revoke it by", file=sys.stderr)
        return 2
    if args.project is not None and not args.project.strip():  # it made an unlimited key
        print(
            "error: --project needs a project name (leave it out for every project)",
            file=sys.stderr,
        )
        return 2
    for flag, value in (("--name", args.name), ("--project", args.project)):
        if problem := _key_text_problem(value):
            print(f"error: {flag} {problem}", file=sys.stderr)
            return 2
    with _session(args, create=True) as session:
        key = create_key(session, args.name, scopes, args.project)
        session.commit()
    print(
        f"created key '{args.name}' with scopes {','.join(sorted(scopes))}; "
        "it is shown once, store it now:",
        file=sys.stderr,
    )
    print(key)
    return 0


def _key_text_problem(value: str | None) -> str | None:
    """Why a key's name or project cannot be stored (at most 200 characters, as the database
    holds them; no control characters, which broke `keys list`'s tab-separated lines, nor
    bidirectional or invisible ones: `client.schema.check_shown_text`), or None."""
    if value is None:
        return None
    try:
        value.encode()
    except UnicodeEncodeError:  # bytes of the command line that are no UTF-8
        return "is not valid UTF-8 text"
    from vantage.client.schema import check_shown_text

    if len(value) > 200:
        return f"has {len(value)} characters; at most 200"
    try:  # as a run's name or project: a key of project "P\u200b" saw none of P's runs
        check_shown_text(value)
    except ValueError as exc:
        return str(exc)
    return None


def _key_line(k: dict) -> str:
    state = "revoked" if k["revoked"] else "active"
    return (
        f"{k['id']}\t{k['name']}\t{k['prefix']}…\t{k['scopes']}\t"
        f"{k['project'] or '*'}\t{state}\t{k['created_at']}"
    )


def cmd_keys_list(args: argparse.Namespace) -> int:
    from .keys import list_keys

    with _session(args) as session:
        keys = list_keys(session)
    print("id\tname\tprefix\tscopes\tproject\tstate\tcreated_at", file=sys.stderr)
    for k in keys:
        print(_key_line(k))
    return 0


def cmd_keys_revoke(args: argparse.Namespace) -> int:
    from .keys import AmbiguousKey, revoke_key

    try:
        with _session(args) as session:
            revoked = revoke_key(session, args.key, every_match=args.all)
    except AmbiguousKey as exc:
        print(f"error: {exc}; revoke one by its id, or all of them with --all:", file=sys.stderr)
        for k in exc.matches:
            print(_key_line(k), file=sys.stderr)
        return 1
    if not revoked:
        print(
            f"error: no active key is '{args.key}' or has it as id, name or prefix (the "
            "8 characters `keys list` shows, such as vtg_AbCd)",
            file=sys.stderr,
        )
        return 1
    for k in revoked:
        print(f"revoked {_key_line(k)}", file=sys.stderr)
    return 0


def cmd_runs_prune(args: argparse.Namespace) -> int:
    from .maintenance import prune_groups

    with _session(args) as session:
        n = prune_groups(session, args.older_than)
        session.commit()
    print(
        f"deleted {n} stored groups of runs idle for more than {args.older_than} days; "
        "per-step metrics are kept",
        file=sys.stderr,
    )
    return 0


def cmd_sync(args: argparse.Namespace) -> int:
    from vantage.client import spool
    from vantage.client.sender import server_url_problem

    where = Path(args.spool_dir)
    if not (where.is_dir() or (where.is_file() and where.name.endswith(spool.SPOOL_SUFFIX))):
        print(
            f"error: {args.spool_dir} is neither a spool folder nor a *{spool.SPOOL_SUFFIX} file",
            file=sys.stderr,
        )
        return 2
    if problem := server_url_problem(args.server):
        print(f"error: {problem}, such as http://127.0.0.1:8000", file=sys.stderr)
        return 2
    files = 1 if where.is_file() else len(list(where.glob(f"*{spool.SPOOL_SUFFIX}")))
    print(f"syncing {files} spool file(s) to {args.server} ...", file=sys.stderr, flush=True)
    result = spool.sync(args.spool_dir, server=args.server, api_key=args.api_key)
    print(json.dumps(result))
    if result["in_use"]:
        print(
            f"left {len(result['in_use'])} spool file(s) that a running process holds (a "
            "trainer's Monitor sends its own): sync them once it has ended",
            file=sys.stderr,
        )
    if not args.api_key and any("HTTP 401" in e for e in result["errors"]):
        print(
            "hint: the server asks for an API key: pass --api-key KEY or set VANTAGE_API_KEY",
            file=sys.stderr,
        )
    return 0 if not result.get("failed") else 1


def cmd_train(args: argparse.Namespace) -> int:
    _needs("trainer", ("torch", "transformers"))
    from vantage.trainer.signals import Interrupted, interrupt_on_signals

    try:  # the imports take seconds: a signal then ended it without a word, or a traceback
        with interrupt_on_signals():
            from vantage.trainer.run import main as train_main
    except Interrupted as exc:
        print(f"vantage train: {exc} while loading the trainer; nothing began", file=sys.stderr)
        return 128 + exc.signum
    return int(train_main([args.config, *sum((["--set", s] for s in args.set or []), [])]) or 0)


def cmd_demo(args: argparse.Namespace) -> int:
    _needs("server", SERVER_MODULES)
    _needs("trainer", ("torch", "transformers"))
    from .demo import run_demo

    try:
        return run_demo(args)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the demo has stopped its server
        print("vantage demo: stopped", file=sys.stderr)
        return 130


def _bounded_int(name: str, lo: int, hi: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, not {text!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{name} must be between {lo} and {hi}")
        return value

    return parse


_port = _bounded_int("the port", 0, 65_535)
_workers = _bounded_int("--workers", 1, 64)


def _positive_days(text: str) -> float:
    try:
        days = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"DAYS must be a number, not {text!r}") from None
    if not math.isfinite(days):  # inf (or 1e400) pruned nothing and said "inf days"
        raise argparse.ArgumentTypeError(f"DAYS must be a finite number, not {text!r}")
    if not days > 0:  # 0 would strip the groups of runs that are still sending
        raise argparse.ArgumentTypeError("DAYS must be above 0")
    return days


def _db_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--database-url",
        help="SQLAlchemy URL (default: VANTAGE_DATABASE_URL or "
        "a SQLite file in the user data folder)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vantage",
        description="Vantage: watch GRPO runs for advantage collapse and act on it. "
        "`vantage demo` shows it all; `vantage COMMAND --help` tells more.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="serve the API and dashboard")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=_port, default=8000)
    p.add_argument(
        "--insecure-no-auth", action="store_true", help="no API keys (loopback hosts only)"
    )
    p.add_argument("--no-upgrade", action="store_true", help="skip the schema upgrade on start")
    p.add_argument(
        "--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug")
    )
    p.add_argument(
        "--workers",
        type=_workers,
        default=None,
        help="server processes sharing the port (default VANTAGE_WORKERS, else 1; on "
        "PostgreSQL, 2 or more use more cores: each takes batches of its own)",
    )
    _db_arg(p)
    p.set_defaults(func=cmd_serve)

    db = sub.add_parser("db", help="database schema").add_subparsers(dest="db_cmd", required=True)
    p = db.add_parser("upgrade", help="upgrade the schema to the newest version")
    _db_arg(p)
    p.set_defaults(func=cmd_db_upgrade)

    keys = sub.add_parser("keys", help="API keys").add_subparsers(dest="keys_cmd", required=True)
    p = keys.add_parser("create", help="create a key; prints it once on the last line")
    p.add_argument("--name", required=True)
    p.add_argument("--scopes", required=True, help="comma-separated: ingest,read,control,admin")
    p.add_argument("--project")
    _db_arg(p)
    p.set_defaults(func=cmd_keys_create)
    p = keys.add_parser("list", help="list keys: id, name, prefix, scopes, project, state")
    _db_arg(p)
    p.set_defaults(func=cmd_keys_list)
    p = keys.add_parser("revoke", help="revoke a key by its id, name, prefix or itself")
    p.add_argument(
        "key",
        help="the key's id, name or prefix (its first 8 characters, as `keys list` shows), "
        "or the key itself",
    )
    p.add_argument(
        "--all", action="store_true", help="revoke every active key the name or prefix matches"
    )
    _db_arg(p)
    p.set_defaults(func=cmd_keys_revoke)

    runs = sub.add_parser("runs", help="run maintenance").add_subparsers(
        dest="runs_cmd", required=True
    )
    p = runs.add_parser("prune", help="delete stored groups, keep per-step metrics")
    p.add_argument("--older-than", type=_positive_days, required=True, metavar="DAYS")
    _db_arg(p)
    p.set_defaults(func=cmd_runs_prune)

    p = sub.add_parser("sync", help="upload a client spool left behind by a training run")
    p.add_argument(
        "spool_dir",
        metavar="SPOOL",
        help="a spool folder (every run's files) or one spool file (a close warning names it)",
    )
    p.add_argument(
        "--server",
        default=os.environ.get("VANTAGE_SERVER") or "http://127.0.0.1:8000",
        help="the server to upload to (default: $VANTAGE_SERVER, else http://127.0.0.1:8000)",
    )
    p.add_argument(
        "--api-key",
        default=os.environ.get("VANTAGE_API_KEY") or None,
        help="a key with the ingest scope (default: $VANTAGE_API_KEY)",
    )
    p.set_defaults(func=cmd_sync)

    p = sub.add_parser("train", help="run the bundled GRPO trainer")
    p.add_argument("config")
    p.add_argument("--set", action="append", metavar="KEY=VALUE")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("demo", help="server, dashboard and a CPU training run, end to end")
    p.add_argument("--quick", action="store_true", help="a shorter run; exit when done")
    p.add_argument("--no-browser", action="store_true")
    p.add_argument("--model", choices=("tiny", "smollm2"), default="tiny")
    p.add_argument("--port", type=_port, default=8000)
    _db_arg(p)
    p.set_defaults(func=cmd_demo)
    return parser


# Commands of the server's database: on a client-only install they exit naming the extra (they
# ended in a ModuleNotFoundError traceback: a trial).
DATABASE_COMMANDS = (
    cmd_db_upgrade,
    cmd_keys_create,
    cmd_keys_list,
    cmd_keys_revoke,
    cmd_runs_prune,
)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    if func in DATABASE_COMMANDS:
        _needs("server", SERVER_MODULES)
    return func(args)


if __name__ == "__main__":
    sys.exit(main())
