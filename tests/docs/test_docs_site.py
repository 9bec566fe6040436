"""The docs site builds with `mkdocs build --strict` (no network: mkdocs.yml turns off external
fonts and plugins that fetch), and its generated reference pages hold what the code has."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import docs_hooks  # noqa: E402  (scripts/ is no package: the hooks mkdocs.yml names)


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    # As on a clean clone: the hooks make the package link mkdocstrings reads (rmtree unlinks
    # the link, never follows it).
    shutil.rmtree(ROOT / "build" / "docs-pkg", ignore_errors=True)
    site = tmp_path / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    page = lambda path: (site / path / "index.html").read_text()  # noqa: E731
    assert "/api/v1/runs/{run_id}/steps" in page("reference/openapi")
    assert "vantage keys create" in page("reference/cli")
    assert "VANTAGE_WEBHOOK_SECRET" in page("reference/configuration")
    assert "log_groups" in page("reference/python")  # mkdocstrings read Monitor's docstrings
    assert (site / "design" / "index.html").exists()


def test_every_setting_is_described_and_none_is_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    from vantage.server.settings import Settings

    table = docs_hooks._settings()
    for name in Settings.model_fields:
        assert f"`VANTAGE_{name.upper()}`" in table
    monkeypatch.delitem(docs_hooks.SETTING_DOCS, "workers")
    with pytest.raises(ValueError, match=r"missing \['workers'\]"):
        docs_hooks._settings()
    monkeypatch.setitem(docs_hooks.SETTING_DOCS, "workers", "x")
    monkeypatch.setitem(docs_hooks.SETTING_DOCS, "gone", "x")
    with pytest.raises(ValueError, match=r"stale \['gone'\]"):
        docs_hooks._settings()


def test_the_cli_page_has_every_command() -> None:
    from vantage.server.cli import build_parser

    names = [name for name, _ in docs_hooks._help_sections()]
    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    for command in commands:
        assert f"vantage {command}" in names
    assert "vantage keys create" in names


def test_an_unknown_generated_section_fails_the_build() -> None:
    with pytest.raises(ValueError, match="unknown generated section 'nope'"):
        docs_hooks.on_page_markdown("x\n<!-- generated: nope -->\n")


def test_the_readme_is_a_front_page() -> None:
    """At most 200 lines, no prose line over 400 characters, and the two commands first (CI and
    users copy them from there)."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, len(lines)
    fence = False
    for number, line in enumerate(lines, 1):
        if line.startswith("```"):
            fence = not fence
        elif not fence and not line.startswith("|"):
            assert len(line) <= 400, f"README.md:{number} has {len(line)} characters"
    first = lines.index("```bash")
    assert lines[first + 1].startswith("bash scripts/demo.sh ")
    assert lines[first + 2].startswith("bash scripts/test.sh ")
    assert lines[first + 3] == "```"
