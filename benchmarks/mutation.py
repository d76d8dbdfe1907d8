"""Mutation check of the statistical core with cosmic-ray (``pip install -e ".[mutation]"``).

    python benchmarks/mutation.py [MODULE ...] [--jobs 2] [--out docs/data/mutation]
                                  [--since COMMIT]

MODULE: any of the keys of ``MODULES`` (default: all). For each module, in a copy of
the working tree (the real files are never touched), cosmic-ray applies one mutation
at a time and runs the tests that cover that module (``MODULES``), stopping at the
first failure. Operators: the usual mutmut-like set (``OPERATORS``: + <-> -, * <-> /,
comparisons to their boundary or negation, not/and/or, True/False, numbers +-1, break
<-> continue, loops run zero times). Each module's survivors go to
``OUT/MODULE.json`` (line, operator, the mutated line) and a summary table is printed;
docs/testing.md says, for every survivor, why it is equivalent or which test kills it.
``--since COMMIT`` mutates only the lines changed since that commit (``git diff``),
for a module rewritten after its full run. ``--recheck`` instead applies each survivor
stored in ``OUT/MODULE.json`` again (``patch``) to a copy of today's tree and runs the
module's tests: which survivors today's tests kill (written back into the JSON as each
survivor's ``recheck``).

Not in the default CI path: the whole run takes hours on two cores.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("client", "aggregator", "simulator", "protos")
AGG = "aggregator/calmkit_aggregator"
T = "tests"

# module -> (file, tests that cover it)
MODULES: dict[str, tuple[str, tuple[str, ...]]] = {
    "oracles": (
        "client/calmkit_client/oracles.py",
        (
            f"{T}/client/test_oracles_stats.py",
            f"{T}/client/test_oracles_privacy.py",
            f"{T}/client/test_grr_exact_privacy.py",
            f"{T}/client/test_oue_exact_privacy.py",
            f"{T}/client/test_report.py",
            f"{T}/simulator/test_collect.py",
        ),
    ),
    "estimate": (
        f"{AGG}/reconstruction/estimate.py",
        (
            f"{T}/aggregator/test_estimate.py",
            f"{T}/aggregator/test_reconstruction.py",
            f"{T}/aggregator/test_uncertainty.py",
            f"{T}/integration/test_calm_end_to_end.py",
        ),
    ),
    "consistency": (
        f"{AGG}/reconstruction/consistency.py",
        (
            f"{T}/aggregator/test_consistency_weights.py",
            f"{T}/aggregator/test_consistency_levels.py",
            f"{T}/aggregator/test_consistency_noisy.py",
            f"{T}/aggregator/test_reconstruction.py",
            f"{T}/integration/test_calm_end_to_end.py",
        ),
    ),
    "shrinkage": (
        f"{AGG}/reconstruction/shrinkage.py",
        (
            f"{T}/aggregator/test_shrinkage.py",
            f"{T}/aggregator/test_reconstruction.py",
            f"{T}/integration/test_calm_end_to_end.py",
        ),
    ),
    "maxent": (
        f"{AGG}/reconstruction/maxent.py",
        (
            f"{T}/aggregator/test_maxent.py",
            f"{T}/aggregator/test_reconstruction.py",
            f"{T}/aggregator/test_shrinkage.py",
            f"{T}/integration/test_calm_end_to_end.py",
        ),
    ),
    "planning": (
        f"{AGG}/planning/search.py",
        (
            f"{T}/aggregator/test_planning_search.py",
            f"{T}/aggregator/test_planning.py",
            f"{T}/aggregator/test_error_model.py",
        ),
    ),
    "error_model": (
        f"{AGG}/planning/error_model.py",
        (f"{T}/aggregator/test_error_model.py", f"{T}/aggregator/test_planning.py"),
    ),
    "profile": (
        f"{AGG}/planning/profile.py",
        (
            f"{T}/aggregator/test_profile.py",
            f"{T}/aggregator/test_planning.py",
            f"{T}/aggregator/test_error_model.py",
        ),
    ),
    "designs": (
        f"{AGG}/planning/designs.py",
        (f"{T}/aggregator/test_designs.py", f"{T}/aggregator/test_planning.py"),
    ),
    "pilot": (
        f"{AGG}/planning/pilot.py",
        (
            f"{T}/aggregator/test_planning.py",
            f"{T}/aggregator/test_storage_phases.py",
            f"{T}/integration/test_phases.py",
        ),
    ),
    "phases": (
        f"{AGG}/phases.py",
        (
            f"{T}/aggregator/test_planning.py",
            f"{T}/aggregator/test_storage_phases.py",
            f"{T}/integration/test_phases.py",
        ),
    ),
    "planner": (
        f"{AGG}/planning/collection.py",
        (f"{T}/aggregator/test_planning.py", f"{T}/simulator/test_calm_plan_cache.py"),
    ),
    "choose": (f"{AGG}/planning/algorithm1.py", (f"{T}/aggregator/test_choose.py",)),
    "global_model": (
        f"{AGG}/reconstruction/global_model.py",
        (f"{T}/aggregator/test_global_model.py", f"{T}/aggregator/test_reconstruction.py"),
    ),
}

_BINARY = (
    "Add_Sub",
    "Sub_Add",
    "Mul_Div",
    "Div_Mul",
    "FloorDiv_Div",
    "Mod_FloorDiv",
    "Pow_Mul",
    "BitOr_BitAnd",
    "BitAnd_BitOr",
    "BitXor_BitOr",
    "LShift_RShift",
    "RShift_LShift",
)
_COMPARE = (
    "Lt_LtE",
    "LtE_Lt",
    "Gt_GtE",
    "GtE_Gt",
    "Eq_NotEq",
    "NotEq_Eq",
    "Is_IsNot",
    "IsNot_Is",
    "In_NotIn",
    "NotIn_In",
)
_UNARY = ("Delete_USub", "USub_UAdd", "Delete_Not", "Delete_Invert")
OPERATORS = (
    *(f"core/ReplaceBinaryOperator_{b}" for b in _BINARY),
    *(f"core/ReplaceComparisonOperator_{c}" for c in _COMPARE),
    *(f"core/ReplaceUnaryOperator_{u}" for u in _UNARY),
    "core/AddNot",
    "core/ReplaceTrueWithFalse",
    "core/ReplaceFalseWithTrue",
    "core/ReplaceAndWithOr",
    "core/ReplaceOrWithAnd",
    "core/ReplaceBreakWithContinue",
    "core/ReplaceContinueWithBreak",
    "core/NumberReplacer",
    "core/ZeroIterationForLoop",
)


def _workspace(into: Path) -> None:
    """The working tree's files (tracked ones with uncommitted edits, and new ones not
    ignored) under ``into``."""
    files = (
        subprocess.run(
            [
                "git",
                "-C",
                str(ROOT),
                "ls-files",
                "-z",
                "--cached",
                "--others",
                "--exclude-standard",
            ],
            check=True,
            capture_output=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            dst = into / name
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)


def changed_lines(file: str, since: str) -> list[str]:
    """Line ranges ("a-b") of ``file`` changed since commit ``since`` (git diff -U0)."""
    diff = subprocess.run(
        ["git", "-C", str(ROOT), "diff", "-U0", since, "--", file],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    out = []
    for m in re.finditer(r"^@@ -\S+ \+(\d+)(?:,(\d+))? @@", diff, flags=re.M):
        start, count = int(m.group(1)), int(m.group(2) or 1)
        if count:
            out.append(f"{start}-{start + count - 1}")
    return out


def _config(
    path: Path, module: Path, tests: tuple[str, ...], timeout: float, lines: list[str] | None
) -> None:
    keep = "|".join(re.escape(op) for op in OPERATORS)
    test = " ".join(_pytest(tests))
    only = (
        ""
        if lines is None
        else "[cosmic-ray.filters.line-filter]\n"
        f"lines = {{ {json.dumps(str(module))} = {json.dumps(lines)} }}\n"
    )
    path.write_text(
        "[cosmic-ray]\n"
        f"module-path = {json.dumps(str(module))}\n"
        f"timeout = {timeout}\n"
        "excluded-modules = []\n"
        f"test-command = {json.dumps(test)}\n"
        "[cosmic-ray.distributor]\n"
        'name = "local"\n'
        "[cosmic-ray.filters.operators-filter]\n"
        f"exclude-operators = [{json.dumps(f'^(?!({keep})$).*')}]\n" + only
    )


def _pytest(tests: tuple[str, ...]) -> list[str]:
    """The command that runs a module's tests, stopping at the first failure."""
    return [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]


def _scratch(work: Path) -> dict[str, str]:
    """Copy the packages and tests into ``work``; the environment that imports them."""
    _workspace(work)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(work / p) for p in PACKAGES))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def check(name: str, out: Path, timeout: float, since: str | None = None) -> dict[str, Any]:
    """Mutate ``name``'s module in a scratch copy (only the lines changed since commit
    ``since`` if given); its survivors, written to ``out``."""
    file, tests = MODULES[name]
    lines = None if since is None else changed_lines(file, since)
    with tempfile.TemporaryDirectory(prefix=f"mutation-{name}-") as tmp:
        work = Path(tmp)
        env = _scratch(work)
        config, session = work / "cosmic-ray.toml", work / "session.sqlite"
        _config(config, work / file, tests, timeout, lines)
        bin_dir = Path(sys.executable).parent
        started = time.perf_counter()
        _run([str(bin_dir / "cosmic-ray"), "init", str(config), str(session)], work, env)
        _run([str(bin_dir / "cr-filter-operators"), str(session), str(config)], work, env)
        if lines is not None:
            _run(
                [str(bin_dir / "cr-filter-lines"), "--config", str(config), str(session)], work, env
            )
        _run([str(bin_dir / "cosmic-ray"), "baseline", str(config)], work, env)
        _run([str(bin_dir / "cosmic-ray"), "exec", str(config), str(session)], work, env)
        dump = _run([str(bin_dir / "cosmic-ray"), "dump", str(session)], work, env)
        seconds = time.perf_counter() - started
        source = (work / file).read_text().splitlines()  # as mutated, not as edited since
    outcomes: dict[str, int] = {}
    survivors = []
    for row in filter(None, dump.splitlines()):
        item, result = json.loads(row)
        if result is None:
            outcomes["not run"] = outcomes.get("not run", 0) + 1
            continue
        if item.get("mutations") and any(
            m["operator_name"] not in OPERATORS for m in item["mutations"]
        ):
            continue  # filtered out (kept in the session as skipped)
        outcome = result.get("test_outcome") or result.get("worker_outcome")
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        if outcome == "survived":
            m = item["mutations"][0]
            line = int(m["start_pos"][0])
            survivors.append(
                {
                    "line": line,
                    "column": int(m["start_pos"][1]),
                    "operator": m["operator_name"].removeprefix("core/"),
                    "occurrence": m["occurrence"],
                    "source": source[line - 1].strip(),
                    "diff": result.get("diff", ""),
                }
            )
    survivors.sort(key=lambda s: (s["line"], s["column"], s["operator"]))
    summary = {
        "module": file,
        "tests": list(tests),
        "outcomes": outcomes,
        "survivors": survivors,
        "seconds": round(seconds),
    }
    if since is not None:
        summary["since"], summary["lines"] = since, lines
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def recheck(name: str, out: Path) -> dict[str, int]:
    """Apply each survivor of ``out/name.json`` to a copy of today's tree and run the
    module's tests; record ``killed``/``survived``/``patch failed`` per survivor."""
    file, tests = MODULES[name]
    path = out / f"{name}.json"
    summary = json.loads(path.read_text())
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    counts: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix=f"recheck-{name}-") as tmp:
        work = Path(tmp)
        env = _scratch(work)
        target = work / file
        original = target.read_text()
        for survivor in summary["survivors"]:
            patch = ["patch", "-s", "--no-backup-if-mismatch", str(target)]
            patched = subprocess.run(patch, input=survivor["diff"], text=True, capture_output=True)
            if patched.returncode != 0:
                result = "patch failed"
            else:
                done = subprocess.run(_pytest(tests), cwd=work, env=env, capture_output=True)
                result = "killed" if done.returncode else "survived"
            target.write_text(original)
            survivor["recheck"] = {"commit": head, "result": result}
            counts[result] = counts.get(result, 0) + 1
            print(f"{name}:{survivor['line']} {survivor['operator']}: {result}", flush=True)
    path.write_text(json.dumps(summary, indent=1) + "\n")
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", choices=[[], *MODULES], default=[])
    parser.add_argument("--jobs", type=int, default=1, help="modules checked at once")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per mutant")
    parser.add_argument("--out", default=str(ROOT / "docs" / "data" / "mutation"))
    parser.add_argument(
        "--recheck",
        action="store_true",
        help="apply the stored survivors to today's tree and tests",
    )
    parser.add_argument(
        "--since", default=None, help="mutate only the lines changed since this commit"
    )
    args = parser.parse_args()
    if shutil.which("cosmic-ray", path=str(Path(sys.executable).parent)) is None:
        raise SystemExit('cosmic-ray is not installed: pip install -e ".[mutation]"')
    names = args.modules or list(MODULES)
    if args.recheck:
        for name in names:
            print(name, recheck(name, Path(args.out)))
        return 0
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        summaries = list(
            pool.map(lambda n: check(n, Path(args.out), args.timeout, args.since), names)
        )
    print("| module | mutants | killed | survived | other | minutes |")
    print("|---|---|---|---|---|---|")
    for s in summaries:
        o = s["outcomes"]
        other = sum(v for k, v in o.items() if k not in ("killed", "survived"))
        print(
            f"| {s['module']} | {sum(o.values())} | {o.get('killed', 0)} | "
            f"{o.get('survived', 0)} | {other} | {s['seconds'] / 60:.0f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
