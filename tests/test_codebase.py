"""Rules every shipped module keeps: it cites papers by title, not by files a calmkit user
does not have; it uses no private name of another calmkit module; no calmkit modules
import each other in a cycle; no function (benchmarks included) runs over 100 lines.
And the repository tracks nothing a local run leaves behind."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = {
    "client": "calmkit_client",
    "aggregator": "calmkit_aggregator",
    "simulator": "calmkit_simulator",
    "protos": "calmkit_proto",
}
LOCAL_FILES = re.compile(r"papers/|DESIGN\.md|notes/")


def _modules() -> dict[str, Path]:
    """Every calmkit module by dotted name (a package by its ``__init__.py``)."""
    out = {}
    for source, package in SOURCES.items():
        for path in (ROOT / source / package).rglob("*.py"):
            parts = path.relative_to(ROOT / source).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _imports(name: str, tree: ast.AST) -> Iterator[tuple[ast.alias, str, str | None]]:
    """``(alias, module, imported name or None for a module)`` of every import in
    ``tree``, relative imports resolved against module ``name``."""
    package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((alias, alias.name, None) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            base = ".".join(p for p in (base, node.module) if p)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                yield (alias, sub, None) if sub in MODULES else (alias, base, alias.name)


def _imported_modules(name: str) -> set[str]:
    """The calmkit modules module ``name`` imports, at any depth (an import deferred into
    a function still ties the two modules together) but not under ``if TYPE_CHECKING``
    (never run); ``from package import name`` counts as importing the package."""
    tree = _tree(name)
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            node.body = []
    return {module for _, module, _ in _imports(name, tree) if module in MODULES} - {name}


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of ``graph`` (``[a, b, ..., a]``), or ``[]``."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return []

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return []


def _tree(name: str) -> ast.Module:
    return ast.parse(MODULES[name].read_text(encoding="utf-8"))


def _defined(tree: ast.AST) -> set[str]:
    """The names a module defines: functions, classes, variables, attributes set."""
    out = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    out |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    return out | {
        n.attr
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
    }


def _private_uses(name: str, anywhere: set[str]) -> list[str]:
    """Private names of other calmkit modules that module ``name`` imports or reads: by
    ``from m import _x``, ``m._x``, or ``obj._x`` for an ``_x`` the module never defines
    but another calmkit module does (``anywhere``; ``self._x`` and ``cls._x`` may come
    from a base class)."""
    tree = _tree(name)
    bound: dict[str, str] = {}  # local name -> calmkit module
    found = []
    for alias, module, what in _imports(name, tree):
        if not module.startswith("calmkit"):
            continue
        if what is not None and _private(what):
            found.append(f"from {module} import {what}")
        elif what is None:
            bound[alias.asname or alias.name.partition(".")[0]] = (
                module if alias.asname or "." not in alias.name else alias.name.partition(".")[0]
            )
    defined = _defined(tree)
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and _private(node.attr)):
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in bound:
            found.append(f"{bound[owner.id]}.{node.attr}")
        elif node.attr in anywhere - defined and not (
            isinstance(owner, ast.Name) and owner.id in ("self", "cls")
        ):
            found.append(f"{ast.unparse(node)} (line {node.lineno})")
    return found


def test_shipped_code_cites_no_local_files() -> None:
    assert len(MODULES) > 80
    hits = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in MODULES.values()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if LOCAL_FILES.search(line)
    ]
    assert hits == []


def test_no_module_uses_another_modules_private_names() -> None:
    mine = [name for name in MODULES if not name.startswith("calmkit_proto")]  # not generated
    anywhere = set().union(*(_defined(_tree(name)) for name in mine))
    found = {name: _private_uses(name, anywhere) for name in mine}
    assert {name: uses for name, uses in found.items() if uses} == {}


def test_no_import_cycles() -> None:
    graph = {name: _imported_modules(name) for name in MODULES}
    assert "calmkit_simulator.cluster" in graph["calmkit_simulator.grid"]  # deferred import
    assert _cycle(graph) == []
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]


# Small named parts: a function longer than this is split (tests and generated code aside).
LONGEST_FUNCTION = 100


def test_no_function_is_over_100_lines() -> None:
    paths = [*MODULES.values(), *(ROOT / "benchmarks").glob("*.py")]
    long = []
    for path in paths:
        if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > LONGEST_FUNCTION:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines})")
    assert long == []


# What a local run leaves behind: a SQLite store (``calmkit serve --db FILE``: FILE,
# FILE-wal, FILE-shm, FILE-journal, the key snapshots in FILE-keys/), result caches. A key
# snapshot from a local run was once committed by accident.
RUN_ARTEFACTS = re.compile(r"\.db(-|$)|\.(sqlite|snap)$")


def test_the_repository_tracks_no_run_artefacts() -> None:
    assert RUN_ARTEFACTS.search("a.db-keys/6331.snap") and RUN_ARTEFACTS.search("x/s.db")
    assert RUN_ARTEFACTS.search("s.db-wal") and not RUN_ARTEFACTS.search("docs/db.md")
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout (or git is absent): no tracked files to check")
    listed = subprocess.run([git, "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    tracked = listed.stdout.decode().split("\0")
    assert [path for path in tracked if RUN_ARTEFACTS.search(path)] == []
