"""Packaging and the import rules of docs/design.md §2."""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("client", "server", "dashboard", "trainer", "migrations")

BLOCKER = """
import importlib.abc, sys
class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in BLOCKED:
            raise ImportError(f'{name} is blocked for this test')
sys.meta_path.insert(0, _Block())
"""


def _run_blocked(blocked: set[str], code: str) -> subprocess.CompletedProcess:
    script = f"BLOCKED = {sorted(blocked)!r}\n{BLOCKER}\n{code}"
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd="/"
    )


def test_wheel_contains_every_module(tmp_path: Path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    wheel = next(tmp_path.glob("vantage_rl-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = set()
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*"):
            if "__pycache__" in path.parts or not path.is_file():
                continue
            if path.suffix in (".py", ".yaml", ".mako", ".ini") or path.parent.name == "assets":
                expected.add(f"vantage/{path.relative_to(ROOT).as_posix()}")
    missing = sorted(expected - names)
    assert not missing, (
        f"modules left out of the wheel (list the subpackage in pyproject): {missing}"
    )


def test_client_imports_without_torch_dash_or_database_driver():
    proc = _run_blocked(
        {"torch", "dash", "plotly", "psycopg", "sqlalchemy", "numpy", "fastapi", "transformers"},
        "import vantage.client, vantage.client.acr, vantage.client.schema; print('ok')",
    )
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr


def test_server_and_app_import_without_torch(tmp_path: Path):
    code = (
        "from vantage.server.settings import Settings\n"
        "from vantage.server.migrate import upgrade\n"
        "from vantage.server.main import create_app\n"
        f"url = 'sqlite:///{tmp_path}/x.db'\n"
        "upgrade(url)\n"
        "create_app(Settings(database_url=url))\n"
        "import sys; assert 'torch' not in sys.modules; print('ok')\n"
    )
    proc = _run_blocked({"torch", "transformers", "accelerate"}, code)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(module, top_level) for every `vantage.*` or relative-parent import in a file."""
    tree = ast.parse(path.read_text())
    out = []
    top_level_nodes = set(map(id, tree.body))
    package = ["vantage", *path.relative_to(ROOT).parent.parts]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.append((mod, id(node) in top_level_nodes))
        elif isinstance(node, ast.Import):
            out += [(a.name, id(node) in top_level_nodes) for a in node.names]
    return [(m, t) for m, t in out if m.startswith("vantage.")]


ALLOWED = {
    "client": {"client"},
    "trainer": {"client", "trainer"},
    "dashboard": {"client", "dashboard", "server"},
    "server": {"client", "server", "migrations"},
    "migrations": {"server", "migrations"},
}


@pytest.mark.parametrize("pkg", sorted(ALLOWED))
def test_import_rules(pkg: str):
    bad = []
    for path in (ROOT / pkg).rglob("*.py"):
        for mod, top_level in _imports(path):
            target = mod.split(".")[1] if "." in mod else ""
            if target in ALLOWED[pkg]:
                continue
            rel = path.relative_to(ROOT).as_posix()
            if pkg == "server" and target == "dashboard" and rel == "server/main.py":
                continue
            if (
                pkg == "server"
                and target == "trainer"
                and not top_level
                and rel in ("server/cli/train.py", "server/demo.py")
            ):
                continue
            bad.append(f"{rel} imports {mod}")
    assert not bad, bad


def _module_level_imports(folder: Path) -> set[str]:
    """Top-level names of the modules that files under ``folder`` import at module level."""
    names = set()
    for path in folder.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names


def test_server_extra_covers_what_the_server_imports():
    """`pip install vantage-rl[server]` (the Docker image) must bring every third-party module
    that the server, dashboard, migrations and client import at module level."""
    import importlib.metadata
    import re
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["server"]]
    norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()  # noqa: E731
    declared = {norm(re.split(r"[\[<>=~! ]", req)[0]) for req in wanted}
    providers = importlib.metadata.packages_distributions()
    via_fastapi = {"starlette"}  # FastAPI's own dependency
    missing = []
    for folder in ("server", "dashboard", "migrations", "client"):
        for name in sorted(_module_level_imports(ROOT / folder)):
            if name in sys.stdlib_module_names or name in via_fastapi or name == "vantage":
                continue
            dists = {norm(d) for d in providers.get(name, [name])}
            if not dists & declared:
                missing.append(f"{folder}: {name} ({', '.join(sorted(dists))})")
    assert not missing, f"imported but not in the base or server dependencies: {missing}"
