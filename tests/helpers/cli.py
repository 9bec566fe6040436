"""Running the installed `vantage` command, and the key commands the fixtures need."""

from __future__ import annotations

import os
import subprocess

from vantage.server.launcher import VANTAGE

__all__ = ["VANTAGE", "create_key", "revoke_key", "run_cli"]


def run_cli(*args: str, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """Run `vantage ARGS` (``env`` added to this process's environment); with ``check``, raise
    AssertionError with its stderr when it exits non-zero."""
    proc = subprocess.run(
        [VANTAGE, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"vantage {' '.join(args)} failed: {proc.stderr}")
    return proc


def create_key(
    database_url: str, scopes: str, name: str | None = None, project: str | None = None
) -> str:
    """`vantage keys create` on ``database_url``; returns the plaintext key (the last line)."""
    limited = ("--project", project) if project is not None else ()
    out = run_cli(
        "keys",
        "create",
        "--name",
        name or f"k-{scopes}",
        "--scopes",
        scopes,
        *limited,
        "--database-url",
        database_url,
    )
    return out.stdout.strip().splitlines()[-1]


def revoke_key(database_url: str, name: str) -> None:
    """`vantage keys revoke NAME` on ``database_url``."""
    run_cli("keys", "revoke", name, "--database-url", database_url)
