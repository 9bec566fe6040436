"""`vantage demo`: server, dashboard and a CPU training run, end to end (`vantage.server.demo`).
The demo and the trainer are imported only in the command."""

from __future__ import annotations

import argparse
import sys

from ..preflight import SERVER_MODULES, TRAINER_MODULES, needs
from .arguments import add_database_url, port


def register(sub: argparse._SubParsersAction) -> None:
    """Add `demo` to the `vantage` parser."""
    p = sub.add_parser("demo", help="server, dashboard and a CPU training run, end to end")
    p.add_argument("--quick", action="store_true", help="a shorter run; exit when done")
    p.add_argument("--no-browser", action="store_true")
    p.add_argument("--model", choices=("tiny", "smollm2"), default="tiny")
    p.add_argument("--port", type=port, default=8000)
    add_database_url(p)
    p.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    """Run the demo; 130 when Ctrl-C or SIGTERM stops it."""
    needs("server", SERVER_MODULES)
    needs("trainer", TRAINER_MODULES)
    from ..demo import run_demo

    try:
        return run_demo(args)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the demo has stopped its server
        print("vantage demo: stopped", file=sys.stderr)
        return 130
