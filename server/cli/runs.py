"""`vantage runs prune`: run maintenance."""

from __future__ import annotations

import argparse
import math
import sys

from ..preflight import open_session
from .arguments import uses_database


def register(sub: argparse._SubParsersAction) -> None:
    """Add `runs` and its subcommands to the `vantage` parser."""
    runs = sub.add_parser("runs", help="run maintenance").add_subparsers(
        dest="runs_cmd", required=True
    )
    p = runs.add_parser("prune", help="delete stored groups, keep per-step metrics")
    p.add_argument("--older-than", type=_positive_days, required=True, metavar="DAYS")
    uses_database(p)
    p.set_defaults(func=cmd_runs_prune)


def cmd_runs_prune(args: argparse.Namespace) -> int:
    """Delete the stored groups of runs idle for more than ``--older-than`` days."""
    from ..maintenance import prune_groups

    with open_session(args) as session:
        n = prune_groups(session, args.older_than)
        session.commit()
    print(
        f"deleted {n} stored groups of runs idle for more than {args.older_than} days; "
        "per-step metrics are kept",
        file=sys.stderr,
    )
    return 0


def _positive_days(text: str) -> float:
    try:
        days = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"DAYS must be a number, not {text!r}") from None
    if not math.isfinite(days):  # inf (or 1e400) would prune nothing and say "inf days"
        raise argparse.ArgumentTypeError(f"DAYS must be a finite number, not {text!r}")
    if not days > 0:  # 0 would strip the groups of runs that are still sending
        raise argparse.ArgumentTypeError("DAYS must be above 0")
    return days
