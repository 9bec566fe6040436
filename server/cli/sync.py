"""`vantage sync`: upload a spool a training run left behind."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    """Add `sync` to the `vantage` parser."""
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


def cmd_sync(args: argparse.Namespace) -> int:
    """Send every spooled request; a JSON summary on stdout; exit 1 if any failed."""
    from vantage.client.spool import SPOOL_SUFFIX
    from vantage.client.sync import sync
    from vantage.client.transport import server_url_problem

    where = Path(args.spool_dir)
    if not (where.is_dir() or (where.is_file() and where.name.endswith(SPOOL_SUFFIX))):
        print(
            f"error: {args.spool_dir} is neither a spool folder nor a *{SPOOL_SUFFIX} file",
            file=sys.stderr,
        )
        return 2
    if problem := server_url_problem(args.server):
        print(f"error: {problem}, such as http://127.0.0.1:8000", file=sys.stderr)
        return 2
    files = 1 if where.is_file() else len(list(where.glob(f"*{SPOOL_SUFFIX}")))
    print(f"syncing {files} spool file(s) to {args.server} ...", file=sys.stderr, flush=True)
    result = sync(args.spool_dir, server=args.server, api_key=args.api_key)
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
