"""`vantage serve`: the API and the dashboard."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ipaddress
import multiprocessing
import os
import signal
import sys
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastapi import FastAPI

from ..launcher import bind_problem, free_port, url_host
from ..preflight import schema_or_explain, settings_or_exit, upgrade_or_explain
from .arguments import add_database_url, bounded_int, port


def register(sub: argparse._SubParsersAction) -> None:
    """Add `serve` to the `vantage` parser."""
    p = sub.add_parser("serve", help="serve the API and dashboard")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=port, default=8000)
    p.add_argument(
        "--insecure-no-auth", action="store_true", help="no API keys (loopback hosts only)"
    )
    p.add_argument("--no-upgrade", action="store_true", help="skip the schema upgrade on start")
    p.add_argument(
        "--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug")
    )
    p.add_argument(
        "--workers",
        type=bounded_int("--workers", 1, 64),
        default=None,
        help="server processes sharing the port (default VANTAGE_WORKERS, else 1; on "
        "PostgreSQL, 2 or more use more cores: each takes batches of its own)",
    )
    add_database_url(p)
    p.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    """Check the host, port and database, upgrade the schema, then serve until stopped."""
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

    from ..main import create_app

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
    if args.no_upgrade and not schema_or_explain(settings.database_url):
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
    # line decided. They share nothing but the database (docs/design.md §8, scale-out).
    os.environ["VANTAGE_DATABASE_URL"] = settings.database_url
    os.environ["VANTAGE_AUTH_ENABLED"] = "true" if settings.auth_enabled else "false"
    with _shared_counters():
        uvicorn.run(f"{__name__}:worker_app", factory=True, workers=workers, **options)
    return 0


def worker_app() -> FastAPI:
    """The app of one `--workers N` process, which ends with its parent."""
    from ..main import create_app

    exit_with_parent()
    return create_app()


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def exit_with_parent() -> None:
    """Have the kernel send this process SIGTERM when its parent dies (Linux; elsewhere
    nothing). uvicorn's workers hold the listening socket: after a `kill -9` of `vantage serve`
    they went on serving the port, and a new server could not bind it."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        return
    # a parent that died before the prctl sends nothing: this process has another parent now
    parent = multiprocessing.parent_process()
    if parent is not None and os.getppid() != parent.pid:
        os.kill(os.getpid(), signal.SIGTERM)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _host_problem(problem: str) -> bool:
    """Whether a `bind_problem` is the host's (a name that does not resolve, an address this
    machine does not have) rather than the port's."""
    words = ("not known", "assign requested address", "temporary failure", "no address")
    return any(w in problem.lower() for w in words)


@contextlib.contextmanager
def _shared_counters() -> Iterator[None]:
    """A folder where the worker processes keep their Prometheus counters, so that a scrape of
    any of them answers the group's sums (`vantage.server.telemetry`); removed afterwards. A
    folder the environment already names is used as it is."""
    from ..telemetry import MULTIPROC_ENV

    if os.environ.get(MULTIPROC_ENV):
        yield
        return
    with tempfile.TemporaryDirectory(prefix="vantage-metrics-") as folder:
        os.environ[MULTIPROC_ENV] = folder
        try:
            yield
        finally:
            del os.environ[MULTIPROC_ENV]
