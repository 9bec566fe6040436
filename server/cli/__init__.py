"""The `vantage` command line: one module per command group. Imports of an extra stay inside
each command, so that a command whose extra is missing exits 2 naming the extra, and
`vantage serve` never imports torch."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

from ..preflight import SERVER_MODULES, needs
from . import db, demo, diagnose, keys, runs, serve, sync, train

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The `vantage` parser with every command."""
    parser = argparse.ArgumentParser(
        prog="vantage",
        description="Vantage: watch GRPO runs for advantage collapse and act on it. "
        "`vantage demo` shows it all; `vantage COMMAND --help` tells more.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for group in (serve, db, keys, runs, sync, train, demo, diagnose):
        group.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command ``argv`` (default: this process's arguments) names; its exit status."""
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    if getattr(args, "needs_database", False):
        needs("server", SERVER_MODULES)
    return func(args)
