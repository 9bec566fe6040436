"""MkDocs hooks (mkdocs.yml `hooks:`): the reference pages that come from the code are written at
build time, so they cannot drift from it.

A page holds a marker line ``<!-- generated: NAME -->``; ``on_page_markdown`` replaces it with the
markdown of ``GENERATORS[NAME]``:

- ``openapi``: every path and schema of the server's OpenAPI document (``create_app().openapi()``,
  the same document the server serves at ``/openapi.json``);
- ``cli``: ``vantage --help`` and ``vantage COMMAND [SUBCOMMAND] --help`` of every command;
- ``settings``: every field of ``server/settings.py``'s ``Settings`` with its variable, type,
  default and the description in ``SETTING_DOCS``. A field without a description there, or a
  description of a field that no longer exists, fails the build.

Nothing here touches the network or a database (the app is built, never started).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The subpackages of `vantage` that docs/reference/python.md documents with mkdocstrings.
DOCUMENTED_PACKAGES = ("client",)

MARKER = re.compile(r"^<!-- generated: ([a-z]+) -->$", re.MULTILINE)

# One line per Settings field: what it does (units, where it matters). Keep in step with
# server/settings.py: the build fails on a missing or stale entry.
SETTING_DOCS: dict[str, str] = {
    "database_url": "`sqlite:///PATH`, `postgresql://…` or `postgresql+psycopg://…`. Default: "
    "SQLite in the user data folder. A URL's password shows as `***` in errors.",
    "db_host": "A PostgreSQL database by its parts, used when `VANTAGE_DATABASE_URL` is unset.",
    "db_port": "Port of the `VANTAGE_DB_*` database.",
    "db_user": "User of the `VANTAGE_DB_*` database.",
    "db_password": "Password of the `VANTAGE_DB_*` database: any character (in a URL, "
    "`/ @ # ? %` and blanks must be percent-encoded); never echoed.",
    "db_name": "Name of the `VANTAGE_DB_*` database.",
    "auth_enabled": "API keys required. Turned off only by `vantage serve --insecure-no-auth`, "
    "which refuses non-loopback hosts.",
    "public_url": "Base of the dashboard links in webhook and e-mail messages "
    "(the public `https://` address behind a TLS proxy).",
    "metrics_token": "When set, `/metrics` needs it as a bearer token (set it on a server "
    "shared by several projects: `/metrics` labels each run's latest ACR with its id and name).",
    "default_mitigation_mode": "`auto`, `suggest` or `off` for new runs (what an alert rule's "
    "mitigation does).",
    "webhook_allow": "Restrict webhook targets: comma-separated URL prefixes "
    "(`https://hooks.slack.com/`), IPs or CIDR ranges (`10.0.0.0/8`) and host names "
    "(`*.example.com` matches subdomains). Unset: any target but link-local and cloud-metadata "
    "addresses.",
    "webhook_secret": "At least 16 characters, blanks not counted. Each webhook message then "
    'carries `X-Vantage-Signature: t=<unix time>,v1=<hex HMAC-SHA256 of "<t>." + raw body>`. '
    "Never echoed.",
    "smtp_host": "Mail server of `mailto:` targets (with `VANTAGE_SMTP_FROM`; an e-mail target "
    "while either is unset is a 422).",
    "smtp_port": "Mail server port.",
    "smtp_user": "Mail server login (unset: no login).",
    "smtp_password": "Mail server password; never echoed.",
    "smtp_from": "Sender: `vantage@example.com` or `Vantage <vantage@example.com>`.",
    "smtp_starttls": "STARTTLS before login and message, certificate verified (`SSL_CERT_FILE` "
    "names other CAs); `false` for a relay without it.",
    "command_ttl_s": "A command not acked within this many seconds expires.",
    "dashboard_refresh_s": "Dashboard live-update interval, 0.5 s to 2,147,483 s "
    "(a browser's longest timer).",
    "step_complete_after_s": "A step is evaluated by the alert rules once every rank sent it, "
    "a later step arrived, or this long after its first record.",
    "periodic_pass_s": "Period of the alert pass that handles stale runs, expired silences and "
    "commands.",
    "webhook_timeout_s": "How long a webhook target may take to answer; a message it took "
    "without answering in time counts as sent (logged), never sent twice.",
    "webhook_max_backoff_s": "Longest wait between retries of a failing webhook message.",
    "webhook_min_interval_s": "At most one message per URL this often.",
    "webhook_give_up_s": "A failing message is retried this long after it was queued, then "
    "given up (at once on a 4xx other than 408/429, or a redirect).",
    "outbox_poll_s": "How often a server process looks for messages other replicas queued.",
    "samples_keep_days": "Completion samples are deleted this many days after they arrive "
    "(up to 36,600).",
    "samples_keep_steps": "When set, samples beyond each run's last this many steps are deleted.",
    "samples_prune_s": "How often sample retention is applied.",
    "alert_worker": "Run the periodic alert pass and the outbox sender in this process.",
    "workers": "Server processes sharing the port (`vantage serve --workers` overrides); "
    "more use more cores on PostgreSQL. Each runs its own alert pass and outbox sender.",
}


def _openapi() -> str:
    from vantage.server.main import create_app
    from vantage.server.settings import Settings

    with tempfile.TemporaryDirectory() as tmp:
        # Building the app opens no connection; the URL only has to be valid.
        app = create_app(Settings(database_url=f"sqlite:///{tmp}/docs.db"))
        schema = app.openapi()
    return openapi_markdown(schema)


def _type_of(prop: dict[str, Any]) -> str:
    if "$ref" in prop:
        name = prop["$ref"].rsplit("/", 1)[-1]
        return f"[`{name}`](#{name.lower()})"
    if "anyOf" in prop:
        return " or ".join(_type_of(p) for p in prop["anyOf"])
    if prop.get("type") == "array":
        return f"array of {_type_of(prop.get('items', {}))}"
    if "enum" in prop:
        return " / ".join(f"`{v}`" for v in prop["enum"])
    if "const" in prop:
        return f"`{prop['const']}`"
    return prop.get("type", "any")


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ").strip()


def openapi_markdown(schema: dict[str, Any]) -> str:
    """Markdown for an OpenAPI 3 document: one section per path and method, then the schemas."""
    out: list[str] = [
        f"OpenAPI {schema.get('openapi', '')}, API version {schema['info']['version']}.",
        "",
    ]
    for path, methods in schema["paths"].items():
        for method, op in methods.items():
            out.append(f"### `{method.upper()} {path}`")
            out.append("")
            if op.get("summary"):
                out.append(f"**{_cell(op['summary'])}**")
                out.append("")
            if op.get("description"):
                out.append(op["description"].strip())
                out.append("")
            params = op.get("parameters", [])
            if params:
                out += ["| parameter | in | type | required |", "|---|---|---|---|"]
                for p in params:
                    out.append(
                        f"| `{p['name']}` | {p['in']} | {_cell(_type_of(p.get('schema', {})))}"
                        f" | {'yes' if p.get('required') else 'no'} |"
                    )
                out.append("")
            body = op.get("requestBody", {}).get("content", {})
            for ctype, media in body.items():
                out.append(f"Body ({ctype}): {_type_of(media.get('schema', {}))}")
                out.append("")
            codes = ", ".join(
                f"`{c}` {_cell(r.get('description', ''))}"
                for c, r in op.get("responses", {}).items()
            )
            if codes:
                out += [f"Responses: {codes}", ""]
    out += ["## Schemas", ""]
    for name, sch in sorted(schema.get("components", {}).get("schemas", {}).items()):
        out += [f"### {name}", ""]
        if sch.get("description"):
            out += [sch["description"].strip(), ""]
        props = sch.get("properties", {})
        if props:
            required = set(sch.get("required", []))
            out += ["| field | type | required | description |", "|---|---|---|---|"]
            for field, prop in props.items():
                out.append(
                    f"| `{field}` | {_cell(_type_of(prop))} | "
                    f"{'yes' if field in required else 'no'} | "
                    f"{_cell(prop.get('description', ''))} |"
                )
            out.append("")
    return "\n".join(out)


def _help_sections() -> list[tuple[str, str]]:
    from vantage.server.cli import build_parser

    sections: list[tuple[str, str]] = []

    def walk(parser: argparse.ArgumentParser, name: str) -> None:
        sections.append((name, parser.format_help()))
        for action in parser._actions:  # argparse exposes subcommands only through this
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    walk(sub, f"{name} {sub_name}")

    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps help to the terminal: fix it for the page
    try:
        walk(build_parser(), "vantage")
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old
    return sections


def _cli() -> str:
    out: list[str] = []
    for name, text in _help_sections():
        out += [f"## `{name}`", "", "```text", text.rstrip(), "```", ""]
    return "\n".join(out)


def _kind(annotation: Any) -> tuple[str, list[Any]]:
    """A setting's type in words, and the constraints hidden in its ``Annotated`` parts:
    ``Optional[Annotated[float, Field(gt=0)]]`` is ("float or unset", [the Field's metadata])."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        kind, metadata = _kind(args[0])
        for extra in args[1:]:
            metadata += [extra, *getattr(extra, "metadata", [])]
        return kind, metadata
    if origin in (typing.Union, types.UnionType):
        parts = [_kind(a) for a in args if a is not type(None)]
        kind = " or ".join(k for k, _ in parts)
        if type(None) in args:
            kind += " or unset"
        return kind, [m for _, ms in parts for m in ms]
    if isinstance(annotation, type):
        return annotation.__name__, []
    return str(annotation).replace("typing.", "").replace("pydantic.types.", ""), []


def _settings() -> str:
    from pydantic_core import PydanticUndefined
    from vantage.server.settings import Settings

    fields = Settings.model_fields
    missing = sorted(set(fields) - set(SETTING_DOCS))
    stale = sorted(set(SETTING_DOCS) - set(fields))
    if missing or stale:
        raise ValueError(f"scripts/docs_hooks.py SETTING_DOCS: missing {missing}, stale {stale}")
    out = ["| variable | type | default | meaning |", "|---|---|---|---|"]
    for name, field in fields.items():
        if field.default_factory is not None:
            default = "computed"
        elif field.default is PydanticUndefined or field.default is None:
            default = "unset"
        else:
            default = f"`{json.dumps(field.default)}`"
        kind, metadata = _kind(field.annotation)
        bounds = [
            f"{label} {getattr(m, attr)}"
            for m in [*field.metadata, *metadata]
            for attr, label in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<"))
            if getattr(m, attr, None) is not None
        ]
        kind = _cell(kind + (f" ({', '.join(bounds)})" if bounds else ""))
        out.append(
            f"| `VANTAGE_{name.upper()}` | {kind} | {default} | {_cell(SETTING_DOCS[name])} |"
        )
    return "\n".join(out)


GENERATORS: dict[str, Callable[[], str]] = {
    "openapi": _openapi,
    "cli": _cli,
    "settings": _settings,
}


def on_startup(**_: Any) -> None:
    """Make ``build/docs-pkg/vantage/client`` a link to ``client/``: the import name ``vantage``
    is the repository root (pyproject's ``package-dir``), which griffe cannot follow through the
    editable install's import hook, and linking the root itself would make it read ``.venv``.
    Done at startup: mkdocstrings drops a search path that does not exist when it configures."""
    root = Path(__file__).resolve().parents[1]
    pkg = root / "build" / "docs-pkg" / "vantage"
    pkg.mkdir(parents=True, exist_ok=True)
    for name in DOCUMENTED_PACKAGES:
        link = pkg / name
        if link.is_symlink() and link.resolve() != (root / name).resolve():
            link.unlink()  # a checkout moved or copied elsewhere: point at this one
        if not link.is_symlink():
            link.symlink_to(root / name, target_is_directory=True)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """Replace each ``<!-- generated: NAME -->`` line by ``GENERATORS[NAME]()``."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise ValueError(f"unknown generated section {name!r} (known: {sorted(GENERATORS)})")
        return GENERATORS[name]()

    return MARKER.sub(replace, markdown)
