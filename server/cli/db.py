"""`vantage db upgrade`: the database's schema."""

from __future__ import annotations

import argparse
import sys

from ..preflight import settings_or_exit, upgrade_or_explain
from .arguments import uses_database


def register(sub: argparse._SubParsersAction) -> None:
    """Add `db` and its subcommands to the `vantage` parser."""
    db = sub.add_parser("db", help="database schema").add_subparsers(dest="db_cmd", required=True)
    p = db.add_parser("upgrade", help="upgrade the schema to the newest version")
    uses_database(p)
    p.set_defaults(func=cmd_db_upgrade)


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    """Upgrade the schema and say from which revision to which."""
    from ..db import safe_url

    settings = settings_or_exit(args)
    revisions = upgrade_or_explain(settings.database_url)
    if not revisions:
        return 1
    before, after = revisions
    where = safe_url(settings.database_url)
    if before is None:  # a database it has just made is "created", not "at the newest schema"
        print(f"created Vantage's schema (revision {after}) at {where}", file=sys.stderr)
    elif before != after:
        print(f"upgraded {where} from revision {before} to {after}", file=sys.stderr)
    else:
        print(f"{where} is at the newest schema already (revision {after})", file=sys.stderr)
    return 0
