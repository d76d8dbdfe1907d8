"""The estimation engine (every calmkit_aggregator module outside ``service/``) does not
import gRPC, protobuf, storage or service code, so it runs in-process without the
service. (The client package it uses for plans carries its own gRPC Collector.) The
packages' exports are lazy, so the storage loads neither the planner nor scipy, and
every export resolves to what type checkers see."""

from __future__ import annotations

import ast
import importlib.util
import json
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import calmkit_aggregator

ENGINE = sorted(
    m.name.removeprefix("calmkit_aggregator.")
    for m in pkgutil.walk_packages(calmkit_aggregator.__path__, "calmkit_aggregator.")
    if not m.ispkg and not m.name.startswith("calmkit_aggregator.service")
)
FORBIDDEN = re.compile(
    r"^\s*(import|from)\s+(grpc|google\.protobuf|calmkit_proto|sqlite3|"
    r"psycopg|\.+service|calmkit_aggregator\.service)\b",
    re.M,
)


def test_engine_modules_import_no_service_code() -> None:
    assert "reconstruction.maxent" in ENGINE and "planning.search" in ENGINE and len(ENGINE) > 10
    root = Path(calmkit_aggregator.__file__).parent
    offending = {
        m: FORBIDDEN.findall((root / (m.replace(".", "/") + ".py")).read_text()) for m in ENGINE
    }
    assert {m: hits for m, hits in offending.items() if hits} == {}
    # and at run time: importing all of the engine loads nothing of the service
    probe = (
        "import sys\n"
        f"for name in {ENGINE!r}: __import__('calmkit_aggregator.' + name)\n"
        "print(','.join(m for m in sys.modules if m.startswith('calmkit_aggregator.service')"
        " or m.split('.')[0] == 'psycopg'))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def _run(code: str) -> str:
    """``code``'s output in a fresh interpreter (nothing of calmkit imported yet)."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_storage_loads_neither_the_planner_nor_scipy() -> None:
    """The packages' exports are lazy: importing the storage modules (or the package
    alone) runs no planning or reconstruction imports."""
    probe = (
        "import sys\n"
        "import calmkit_aggregator\n"
        "for name in ('service.storage', 'service.pg_storage', 'service.store', 'phases'):\n"
        "    __import__('calmkit_aggregator.' + name)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'scipy'\n"
        "             or m.startswith(('calmkit_aggregator.planning',\n"
        "                              'calmkit_aggregator.reconstruction.pipeline'))))\n"
    )
    assert _run(probe) == "[]"


PACKAGES = (
    "calmkit_client",
    "calmkit_aggregator",
    "calmkit_aggregator.planning",
    "calmkit_aggregator.reconstruction",
    "calmkit_simulator",
)


def _exports(package: str) -> tuple[dict[str, str], dict[str, str]]:
    """Of ``package``'s ``__init__``: what type checkers see (name -> the module its
    ``if TYPE_CHECKING:`` block imports it from) and what runs (name -> the module its
    ``lazy_exports`` map names), both as absolute module names."""
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.origin is not None
    tree = ast.parse(Path(spec.origin).read_text())
    block = next(
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
    )
    seen, lazy = {}, {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom)
        module = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
        seen.update({alias.name: module for alias in node.names})
    call = next(
        node
        for node in ast.walk(ast.Module(block.orelse, type_ignores=[]))
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "lazy_exports"
    )
    for module, names in ast.literal_eval(call.args[1]).items():
        lazy.update({name: importlib.util.resolve_name(module, package) for name in names})
    return seen, lazy


def test_every_export_resolves_to_what_type_checkers_see() -> None:
    """Each package's lazy map names the modules its ``if TYPE_CHECKING:`` imports
    name, for exactly the names of its ``__all__``; and each name, resolved lazily in a
    fresh interpreter, is the very object those imports name. A wrong, missing or
    extra entry of a lazy map fails here."""
    expected = {}
    for package in PACKAGES:
        seen, lazy = _exports(package)
        assert lazy == seen, package
        expected[package] = seen
    probe = (
        "import importlib, json\n"
        f"expected = {expected!r}\n"
        "bad = []\n"
        "for package, names in expected.items():\n"
        "    pkg = importlib.import_module(package)\n"
        "    if sorted(pkg.__all__) != sorted(names):\n"
        "        bad.append([package, '__all__', sorted(set(pkg.__all__) ^ set(names))])\n"
        "    for name, module in names.items():\n"
        "        try:\n"
        "            same = getattr(pkg, name) is getattr(importlib.import_module(module), name)\n"
        "        except Exception as exc:\n"
        "            same = repr(exc)\n"
        "        if same is not True or name not in dir(pkg):\n"
        "            bad.append([package, name, same])\n"
        "print(json.dumps(bad))\n"
    )
    assert json.loads(_run(probe)) == []


def test_lazy_exports_star_import_submodules_and_unknown_names() -> None:
    probe = (
        "import calmkit_aggregator as ca\n"
        "namespace = {}\n"
        "exec('from calmkit_aggregator import *', namespace)\n"
        "assert set(ca.__all__) <= set(namespace)\n"
        "assert ca.planning.search.__name__ == 'calmkit_aggregator.planning.search'\n"
        "assert ca.service.__name__ == 'calmkit_aggregator.service'\n"
        "assert not hasattr(ca, 'plan_colection') and not hasattr(ca.planning, '_x')\n"
        "print('ok')\n"
    )
    assert _run(probe) == "ok"
