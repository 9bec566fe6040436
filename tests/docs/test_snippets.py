"""Every ``python`` and ``bash`` block of the README and the docs runs against a real server
(auth on, a real key), so the docs cannot drift from the code; a block marked
``<!-- not-run: REASON -->`` is skipped, its reason shown (tests/docs/snippets.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docs.snippets import DATA_LANGUAGES, RUN_LANGUAGES, Block, all_blocks, blocks
from tests.helpers.cli import create_key
from tests.helpers.server import ServerProcess, start_server

# The address the snippets use for "your server"; the test points it at its own.
DOCS_SERVER = "http://127.0.0.1:8000"
BLOCKS = all_blocks()

pytestmark = pytest.mark.xdist_group("docs-snippets")  # one worker, one server


@pytest.fixture(scope="module")
def docs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One `vantage serve` with auth on, on SQLite, and the two keys the docs tell a user to make:
    the trainer's (ingest, read) and a lead's (read, control), so a snippet that uses the wrong
    one fails as it would for the user."""
    workdir = tmp_path_factory.mktemp("docs-server")
    server = start_server(f"sqlite:///{workdir / 'vantage.db'}", workdir)
    try:
        server.keys["trainer"] = create_key(server.database_url, "ingest,read", name="trainer")
        server.keys["lead"] = create_key(server.database_url, "read,control", name="lead")
        yield server
    finally:
        server.proc.terminate()
        server.proc.wait(timeout=30)


def _env(server: ServerProcess, workdir: Path) -> dict[str, str]:
    key = server.keys["trainer"]
    return {
        **os.environ,
        "VANTAGE_SERVER": server.url,
        "VANTAGE_API_KEY": key,
        "VANTAGE_CONTROL_KEY": server.keys["lead"],
        "KEY": key,
        "VANTAGE_SPOOL_DIR": str(workdir / "spool"),
    }


@pytest.mark.parametrize(
    "block",
    [b for b in BLOCKS if b.language in RUN_LANGUAGES],
    ids=lambda b: b.name,
)
def test_snippet_runs(block: Block, docs_server: ServerProcess, tmp_path: Path) -> None:
    if block.not_run:
        pytest.skip(f"marked not-run: {block.not_run}")
    code = block.code.replace(DOCS_SERVER, docs_server.url)
    env = _env(docs_server, tmp_path)
    if block.language == "python":
        script = tmp_path / "snippet.py"
        script.write_text(code)
        command = [sys.executable, str(script)]
    else:
        command = ["bash", "-euo", "pipefail", "-c", code]
    proc = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, (
        f"{block.name} exited {proc.returncode}\n--- code\n{code}\n--- stdout\n{proc.stdout}"
        f"\n--- stderr\n{proc.stderr}"
    )


def test_every_block_follows_the_convention() -> None:
    """A fence names its language, one that is run or data; a not-run marker sits on a block
    that would otherwise run, and says why."""
    problems = []
    for b in BLOCKS:
        if b.language not in RUN_LANGUAGES + DATA_LANGUAGES:
            problems.append(
                f"{b.name}: language {b.language!r} (name one of {RUN_LANGUAGES + DATA_LANGUAGES})"
            )
        elif b.not_run and b.language not in RUN_LANGUAGES:
            problems.append(f"{b.name}: a not-run marker on a {b.language} block")
    assert not problems, "\n".join(problems)
    assert sum(b.language in RUN_LANGUAGES and not b.not_run for b in BLOCKS) >= 5


def test_the_extractor_sees_markers_and_code(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# t\n\n<!-- not-run: needs a GPU -->\n```bash\nnvidia-smi\n```\n\n"
        "```python\nprint(1)\n```\n\n```text\nout\n```\n"
    )
    found = blocks(page)
    assert [(b.language, b.not_run, b.code) for b in found] == [
        ("bash", "needs a GPU", "nvidia-smi\n"),
        ("python", None, "print(1)\n"),
        ("text", None, "out\n"),
    ]
    page.write_text("```python\nprint(1)\n")
    with pytest.raises(ValueError, match="never closes"):
        blocks(page)
