"""`vantage keys create|list|revoke`: API keys."""

from __future__ import annotations

import argparse
import sys

from ..preflight import open_session
from .arguments import uses_database


def register(sub: argparse._SubParsersAction) -> None:
    """Add `keys` and its subcommands to the `vantage` parser."""
    keys = sub.add_parser("keys", help="API keys").add_subparsers(dest="keys_cmd", required=True)
    p = keys.add_parser("create", help="create a key; prints it once on the last line")
    p.add_argument("--name", required=True)
    p.add_argument("--scopes", required=True, help="comma-separated: ingest,read,control,admin")
    p.add_argument("--project")
    uses_database(p)
    p.set_defaults(func=cmd_keys_create)
    p = keys.add_parser("list", help="list keys: id, name, prefix, scopes, project, state")
    uses_database(p)
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
    uses_database(p)
    p.set_defaults(func=cmd_keys_revoke)


def cmd_keys_create(args: argparse.Namespace) -> int:
    """Create a key; its plaintext alone on the last line of stdout, everything else on stderr."""
    from ..keys import create_key, parse_scopes

    try:
        scopes = parse_scopes(args.scopes)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not args.name.strip():
        print("error: give the key a name (--name), to list and revoke it by", file=sys.stderr)
        return 2
    if args.project is not None and not args.project.strip():  # not an unlimited key, unasked
        print(
            "error: --project needs a project name (leave it out for every project)",
            file=sys.stderr,
        )
        return 2
    for flag, value in (("--name", args.name), ("--project", args.project)):
        if problem := _key_text_problem(value):
            print(f"error: {flag} {problem}", file=sys.stderr)
            return 2
    with open_session(args, create=True) as session:
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
    holds them; no control characters, which would break `keys list`'s tab-separated lines, nor
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
    try:  # as a run's name or project: a key of project "P\u200b" would see none of P's runs
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
    """One tab-separated line per key on stdout, the header on stderr."""
    from ..keys import list_keys

    with open_session(args) as session:
        keys = list_keys(session)
    print("id\tname\tprefix\tscopes\tproject\tstate\tcreated_at", file=sys.stderr)
    for k in keys:
        print(_key_line(k))
    return 0


def cmd_keys_revoke(args: argparse.Namespace) -> int:
    """Revoke the key that ``args.key`` names (every match with ``--all``)."""
    from ..keys import AmbiguousKey, revoke_key

    try:
        with open_session(args) as session:
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
