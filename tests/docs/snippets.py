"""The fenced code blocks of the README and the docs site, for tests/docs/test_snippets.py.

The convention (docs/contributing.md): every fence names its language; ``python`` and ``bash``
blocks are run against a real server; a block whose previous line is
``<!-- not-run: REASON -->`` is not, and REASON says why in the page. Other languages (``json``,
``text``) are data or output, never run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN_LANGUAGES = ("python", "bash")
DATA_LANGUAGES = ("json", "text", "yaml", "toml")
NOT_RUN = re.compile(r"^<!-- not-run: (\S.*\S) -->$")
FENCE = re.compile(r"^```(\S*)\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language, its code, and why it is not run (if so)."""

    path: Path
    line: int  # 1-based line of the opening fence
    language: str
    code: str
    not_run: str | None

    @property
    def name(self) -> str:
        """``file:line``, relative to the repository."""
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def documents() -> list[Path]:
    """The README and every page of the docs site."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of a markdown file (fences at the start of a line). Raises ValueError
    for a fence left open."""
    lines = path.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        start = i
        previous = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = NOT_RUN.match(previous.strip())
        i += 1
        while i < len(lines) and lines[i].rstrip() != "```":
            i += 1
        if i == len(lines):
            raise ValueError(f"{path}:{start + 1}: a fence that never closes")
        code = "\n".join(lines[start + 1 : i]) + "\n"
        found.append(Block(path, start + 1, match.group(1), code, marker and marker.group(1)))
        i += 1
    return found


def all_blocks() -> list[Block]:
    """Every fenced block of the README and the docs."""
    return [b for path in documents() for b in blocks(path)]
