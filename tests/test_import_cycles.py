"""No import cycles between the project's modules (docs/design.md §2).

Every ``import`` counts, at any depth: one inside a function or under ``TYPE_CHECKING`` still ties
two modules into one concern. A package's ``__init__`` counts as a module of its own; the import of
a module's own ancestor packages, which Python makes before any submodule, does not.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("client", "server", "dashboard", "trainer", "migrations")


def module_files() -> dict[str, Path]:
    """``vantage.<dotted name>`` → file, for every module under the project's folders."""
    mods = {}
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            parts = ["vantage", *path.relative_to(ROOT).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            mods[".".join(parts)] = path
    return mods


def imported_modules(name: str, path: Path, known: set[str]) -> Iterator[str]:
    """The project modules that ``name`` (in ``path``) imports, anywhere in the file."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            # `from pkg import sub` imports the submodule when there is one; pkg itself runs first.
            targets = [base, *(f"{base}.{a.name}" for a in node.names)]
        else:
            continue
        # A module's own ancestor packages are imported before it by construction, not by design.
        yield from (t for t in targets if t in known and t != name and not name.startswith(f"{t}."))


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one member."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_checker_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert strongly_connected(graph) == [["a", "b", "c"]]


def test_no_import_cycles_between_modules():
    mods = module_files()
    known = set(mods)
    graph = {name: set(imported_modules(name, path, known)) for name, path in mods.items()}
    cycles = [" <-> ".join(c) for c in strongly_connected(graph)]
    assert not cycles, (
        "import cycles (merge the modules or give the shared piece its own home):\n"
        + ("\n".join(cycles))
    )
