"""The ``calmkit`` script as pyproject.toml declares it, run in a subprocess: on the base
install (every module an extra provides made unimportable) it lists every command, and
a command whose extra is missing says which one to install (exit 2, no traceback); with
only a command's extra it runs; with everything installed the commands dispatch."""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from calmkit_client.cli import build_parser, commands

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"

# Runs the entry point as the console script does, after a finder that refuses the
# modules named in argv[1] (JSON) is put first on the meta path.
RUNNER = """
import importlib, importlib.abc, json, sys
blocked = set(json.loads(sys.argv[1]))
class Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Missing())
module, function = sys.argv[2].split(":")
sys.argv = ["calmkit", *sys.argv[3:]]
raise SystemExit(getattr(importlib.import_module(module), function)())
"""


@cache
def _project() -> dict[str, Any]:
    with PYPROJECT.open("rb") as f:
        project: dict[str, Any] = tomllib.load(f)["project"]
    return project


def _name(requirement: str) -> str:
    """The distribution a requirement names, normalised (``psycopg[binary]>=3.2`` ->
    ``psycopg``)."""
    match = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert match, requirement
    return re.sub(r"[-_.]+", "-", match[0]).lower()


def _distributions(extra: str) -> set[str]:
    """The distributions an extra adds, with the extras it includes (calmkit[...])."""
    out: set[str] = set()
    for requirement in _project()["optional-dependencies"][extra]:
        if _name(requirement) == "calmkit":
            included = re.search(r"\[(.*)\]", requirement)
            assert included, requirement
            for name in included[1].split(","):
                out |= _distributions(name.strip())
        else:
            out.add(_name(requirement))
    return out


@cache
def _modules_by_distribution() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for module, dists in importlib.metadata.packages_distributions().items():
        for dist in dists:
            out.setdefault(_name(dist), set()).add(module)
    return out


def _modules(distributions: set[str]) -> set[str]:
    """Top-level modules of installed distributions (an absent one: its own name)."""
    known = _modules_by_distribution()
    return {m for d in distributions for m in known.get(d, {d.replace("-", "_")})}


def _extra_modules(*extras: str) -> set[str]:
    """The modules the extras add to the base install."""
    base = _modules({_name(r) for r in _project()["dependencies"]})
    return _modules(set().union(*(_distributions(e) for e in extras))) - base


EXTRAS = ("aggregator", "postgres", "simulator", "figures", "admission")
NO_EXTRAS = _extra_modules(*EXTRAS)
COMMANDS = commands(build_parser())


def _run(
    argv: list[str], missing: set[str] | None = None, timeout: float = 120, **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    entry = _project()["scripts"]["calmkit"]
    return subprocess.run(
        [sys.executable, "-c", RUNNER, json.dumps(sorted(missing or ())), entry, *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        **kwargs,
    )


def test_the_extras_are_pyprojects() -> None:
    assert set(EXTRAS) <= set(_project()["optional-dependencies"])
    for command, parser in COMMANDS.items():
        assert parser.extra is None or parser.extra in EXTRAS, (command, parser.extra)
    # the base install lacks what the extras bring, and keeps what the client needs
    assert {"scipy", "tqdm", "dask", "matplotlib", "psycopg", "grpc_health"} <= NO_EXTRAS
    assert not {"numpy", "grpc", "xxhash", "google", "platformdirs"} & NO_EXTRAS


def test_help_on_the_base_install_lists_every_command() -> None:
    out = _run(["--help"], NO_EXTRAS)
    assert (out.returncode, out.stderr) == (0, "")
    listed = set(re.findall(r"^    (\w+)", out.stdout, re.M))
    assert listed == set(COMMANDS) and len(listed) >= 9


def test_version_is_the_projects_on_the_base_install() -> None:
    from calmkit_client import __version__

    out = _run(["--version"], NO_EXTRAS)
    assert (out.returncode, out.stderr) == (0, "")
    assert out.stdout.strip() == f"calmkit {_project()['version']}" == f"calmkit {__version__}"


# one real invocation per command; each needs the extra its parser declares
INVOCATIONS = {
    "demo": ["demo", "--users", "2000", "--json"],
    "serve": ["serve", "--db", "{tmp}/agg.db"],
    "backup": ["backup", "--db", "{tmp}/agg.db", "{tmp}/backup.db"],
    "restore": ["restore", "{tmp}/backup.db", "--db", "{tmp}/restored.db"],
    "collection": ["collection", "list", "--address", "127.0.0.1:9"],
    "query": ["query", "--address", "127.0.0.1:9", "--collection", "c", "--attrs", "a0"],
    "datasets": ["datasets", "list", "--json", "--data-dir", "{tmp}"],
    "population": ["population", "--d", "3", "--json"],
    "plan": ["plan", "--domain", "2,2,3,2", "--n", "5000", "--k", "2", "--epsilon", "1", "--json"],
    "simulate": [
        "simulate",
        "--d",
        "4",
        "--k",
        "2",
        "--epsilon",
        "1",
        "--n",
        "2000",
        "--reps",
        "1",
        "--queries",
        "2",
        "--json",
    ],
    "experiment": ["experiment", "fig4", "--quick", "--no-plot", "--out", "{tmp}/out"],
    "evaluate": [
        "evaluate",
        "--d",
        "4",
        "--k",
        "2",
        "--n",
        "2000",
        "--reps",
        "2",
        "--queries",
        "2",
        "--no-plot",
        "--out",
        "{tmp}/ev",
        "--json",
    ],
    "admission": ["admission", "keygen", "--out", "{tmp}/issuer.key"],
}


def _argv(command: str, tmp: Path) -> list[str]:
    return [a.replace("{tmp}", str(tmp)) for a in INVOCATIONS[command]]


def test_every_command_has_an_invocation() -> None:
    assert set(INVOCATIONS) == set(COMMANDS)


@pytest.mark.parametrize("command", sorted(c for c, p in COMMANDS.items() if p.extra))
def test_a_command_without_its_extra_names_it(command: str, tmp_path: Path) -> None:
    extra = COMMANDS[command].extra
    advice = (
        f"calmkit: error: calmkit {command} needs the {extra} extra: pip install "
        f"'calmkit[{extra}]' ("
    )
    out = _run(_argv(command, tmp_path), NO_EXTRAS)
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith(advice) and out.stderr.count("\n") == 1, out.stderr
    assert out.stdout == "" and not list(tmp_path.iterdir())
    # --help: the options if they load without the extra, else the same advice
    shown = _run([command, "--help"], NO_EXTRAS)
    assert (shown.returncode, shown.stderr) in ((0, ""), (2, out.stderr)), shown.stderr


# query needs a running service: the service test below runs it on the base install;
# backup and restore need a database: the test after next runs them there
@pytest.mark.parametrize(
    "command",
    sorted(
        c for c, p in COMMANDS.items() if not p.extra and c not in ("query", "backup", "restore")
    ),
)
def test_a_command_without_an_extra_runs_on_the_base_install(command: str, tmp_path: Path) -> None:
    out = _run(_argv(command, tmp_path), NO_EXTRAS)
    assert (out.returncode, out.stderr) == (0, "")
    assert json.loads(out.stdout)


def test_backup_and_restore_run_on_the_base_install(tmp_path: Path) -> None:
    from calmkit_aggregator.service.storage import Storage
    from calmkit_client import Plan, Schema

    with Storage(tmp_path / "agg.db") as storage:
        plan = Plan(Schema.from_sizes((2, 3)), 1.0, [[0, 1]])
        storage.create_collection("c1", plan, 2, bytes(32))
    for argv in (INVOCATIONS["backup"], INVOCATIONS["restore"]):
        out = _run([a.replace("{tmp}", str(tmp_path)) for a in argv], NO_EXTRAS)
        assert (out.returncode, out.stderr) == (0, ""), out.stderr
        assert "1 collection(s), 0 reports" in out.stdout


def _only(extra: str) -> set[str]:
    """Unimportable on an install of the base and ``extra``."""
    return NO_EXTRAS - _extra_modules(extra)


@pytest.mark.parametrize("command", ["demo", "plan", "simulate"])
def test_a_command_runs_with_only_its_extra(command: str, tmp_path: Path) -> None:
    out = _run(_argv(command, tmp_path), _only(str(COMMANDS[command].extra)))
    assert (out.returncode, out.stderr) == (0, ""), out.stderr
    assert json.loads(out.stdout)


@pytest.fixture
def aggregator_only_server(tmp_path: Path) -> Iterator[str]:
    """``calmkit serve`` on an install of the base and the aggregator extra."""
    entry = _project()["scripts"]["calmkit"]
    argv = ["serve", "--db", str(tmp_path / "agg.db"), "--address", "127.0.0.1:0"]
    server = subprocess.Popen(
        [sys.executable, "-c", RUNNER, json.dumps(sorted(_only("aggregator"))), entry, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        match = re.search(r"listening on (\S+)", line)
        assert match, line + (server.stderr.read() if server.poll() is not None else "")
        yield match[1]
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_the_service_commands_run_with_only_the_aggregator_extra(
    aggregator_only_server: str,
) -> None:
    address, missing = aggregator_only_server, _only("aggregator")
    created = _run(
        [
            "collection",
            "create",
            "--address",
            address,
            "--domain",
            "2,3",
            "--epsilon",
            "1",
            "--k",
            "2",
            "--views",
            "0,1",
            "--json",
        ],
        missing,
    )
    assert (created.returncode, created.stderr) == (0, ""), created.stderr
    collection = json.loads(created.stdout)["collection_id"]
    listed = _run(["collection", "list", "--address", address, "--json"], missing)
    assert [c["collection_id"] for c in json.loads(listed.stdout)] == [collection]
    # query only talks to the service: the base install runs it
    query = _run(
        [
            "query",
            "--address",
            address,
            "--collection",
            collection,
            "--attrs",
            "a0,a1",
            "--format",
            "json",
        ],
        NO_EXTRAS,
    )
    # the query reached the server, which has nothing to answer from yet
    assert query.returncode == 2 and query.stderr.endswith("has no reports yet\n"), query.stderr


def test_experiment_options_load_with_only_the_simulator_extra() -> None:
    out = _run(["experiment", "--help"], _only("simulator"))
    assert (out.returncode, out.stderr) == (0, "")
    assert out.stdout.startswith("usage: calmkit experiment")


def test_with_every_extra_the_commands_dispatch(tmp_path: Path) -> None:
    planned = _run(_argv("plan", tmp_path))
    assert (planned.returncode, planned.stderr) == (0, "")
    assert json.loads(planned.stdout)["planner"] == "pipeline"
    described = _run(_argv("population", tmp_path))
    assert json.loads(described.stdout)["d"] == 3
    bad = _run(["plan", "--domain", "2,2", "--n", "0", "--k", "2", "--epsilon", "1"])
    assert bad.returncode == 2 and "n (0) must be an int >= 1" in bad.stderr
