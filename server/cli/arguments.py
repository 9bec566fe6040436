"""Argument types and options that several `vantage` commands share."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def bounded_int(name: str, lo: int, hi: int) -> Callable[[str], int]:
    """An argparse type: an integer from ``lo`` to ``hi``; a message naming ``name`` otherwise."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, not {text!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{name} must be between {lo} and {hi}")
        return value

    return parse


port = bounded_int("the port", 0, 65_535)


def add_database_url(p: argparse.ArgumentParser) -> None:
    """The ``--database-url`` option of every command that uses the server's database."""
    p.add_argument(
        "--database-url",
        help="SQLAlchemy URL (default: VANTAGE_DATABASE_URL or "
        "a SQLite file in the user data folder)",
    )


def uses_database(p: argparse.ArgumentParser) -> None:
    """Mark a command of the server's database: on a client-only install `main` exits 2 naming
    the extra before the command imports SQLAlchemy."""
    add_database_url(p)
    p.set_defaults(needs_database=True)
