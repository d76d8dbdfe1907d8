"""Simulation at scale: CPU seconds per stage of one CALM repetition, current code
against a baseline checkout, in the same run.

    python benchmarks/bench_scaling.py [--d 32 64 128] [--k 3 6] [--log2n 20 22]
        [--baseline-ref 6107690] [--planner pipeline|paper]

For every (d, k, n) setting there is a synthetic population of binary attributes (the
same seed for both designs). One repetition is timed by stage, in CPU seconds of a
fresh process that imports the design's code:
- plan: ``plan_collection``;
- collect: every user's report under the plan, as support counts (the fast path);
- reconstruct: estimates, consistency, shrinkage;
- answer: 50 random k-way queries and their true marginals.
Each measurement runs with one BLAS thread (CPU seconds of one core).
``--planner pipeline`` (the default, as ``calmkit simulate``): a pilot of 10% of the
users on attribute pairs, then the planned views; plan counts both planning steps,
collect both phases. Also printed: peak memory (max RSS above the interpreter and
imports, making the population included) as a multiple of the population's codes,
consistency's rounds and final residual (the larger of inconsistency and negativity),
and the CPU seconds of making the population (not part of the repetition).

baseline: the code at ``--baseline-ref``, checked out with ``git worktree``; by default
the commit before the vectorised consistency, grouped counting and single validation.
"""

from __future__ import annotations

import argparse
import inspect
import multiprocessing as mp
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("client", "aggregator", "simulator", "protos")
BASELINE_REF = "6107690"  # before the simulation hot paths were vectorised


def _rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize() / 2**20


def _measure(code: str, d: int, k: int, log2n: int, planner: str) -> dict[str, Any]:
    sys.path[:0] = [str(Path(code) / p) for p in PACKAGES]
    import numpy as np
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)  # one core: threaded BLAS would add other cores' (or spinning) time

    from calmkit_aggregator.phases import combine_phases
    from calmkit_aggregator.planning.collection import plan_collection, workload_of
    from calmkit_aggregator.planning.pilot import pilot_plan, pilot_size, plan_after_pilot
    from calmkit_aggregator.reconstruction.pipeline import reconstruct
    from calmkit_simulator import synthetic_population
    from calmkit_simulator.collect import collect_support

    before = _rss_mb()  # the interpreter and the imports
    out: dict[str, Any] = {}

    def stage(name: str, fn: Any) -> Any:
        t0 = time.process_time()
        value = fn()
        out[name] = out.get(name, 0.0) + time.process_time() - t0
        return value

    pop = stage(
        "population",
        lambda: synthetic_population(n=1 << log2n, sizes=(2,) * d, strength=1.0, rng=0),
    )
    gen = np.random.default_rng(1)
    if planner == "paper":
        plan = stage(
            "plan",
            lambda: plan_collection(pop.schema, 1.0, pop.n, k, planner=planner, seed=3, rng=3),
        )
        support = stage("collect", lambda: collect_support(pop, plan, gen))
        out["m"], out["l"] = plan.m, max(len(v) for v in plan.views)
    else:  # the default: a pilot of 10% on pairs, then the planned views (calmkit simulate)
        first = stage("plan", lambda: pilot_plan(pop.schema, 1.0, seed=3))
        cut = pilot_size(pop.n, 0.1)
        users = np.sort(gen.permutation(pop.n)[:cut])
        if "rows" in inspect.signature(collect_support).parameters:  # counted in place
            rest = np.ones(pop.n, dtype=bool)
            rest[users] = False
            pilot = stage("collect", lambda: collect_support(pop, first, gen, rows=users))
            part = {"rows": rest}
        else:  # the baseline copies each phase's users out
            others = np.setdiff1d(np.arange(pop.n), users)
            pilot = stage(
                "collect", lambda: collect_support(pop.take(users), first, gen, user_ids=users)
            )
            part = {"population": pop.take(others), "user_ids": others}
        main = stage(
            "plan",
            lambda: plan_after_pilot(pilot, pop.n - cut, workload_of(pop.schema, k, None), seed=4),
        )
        later = stage(
            "collect", lambda: collect_support(part.pop("population", pop), main.plan, gen, **part)
        )
        support = stage("reconstruct", lambda: combine_phases([pilot, later]))
        out["m"], out["l"] = main.plan.m, max(len(v) for v in main.plan.views)
    estimator = stage("reconstruct", lambda: reconstruct(support))
    queries = [tuple(sorted(gen.choice(d, size=k, replace=False).tolist())) for _ in range(50)]

    def answer() -> float:
        sse = 0.0
        for q in queries:
            sse += float(((estimator.answer(q).values - pop.marginal(q)) ** 2).sum())
        return sse / len(queries)

    out["sse"] = stage("answer", answer)
    out["total"] = sum(out[s] for s in ("plan", "collect", "reconstruct", "answer"))
    views = estimator.views
    out["rounds"], out["residual"] = views.iterations, views.inconsistency
    out["negativity"] = views.negativity
    out["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - before
    out["codes_mb"] = pop.codes.nbytes / 2**20
    return out


def _child(args: tuple[Any, ...], queue: mp.Queue) -> None:
    try:
        queue.put(_measure(*args))
    except BaseException:
        queue.put(traceback.format_exc())


def _run(*args: Any) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(args, queue))
    proc.start()
    result = queue.get()
    proc.join()
    if isinstance(result, str):
        raise SystemExit(f"measurement failed:\n{result}")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", type=int, nargs="+", default=[32, 64, 128])
    parser.add_argument("--k", type=int, nargs="+", default=[3, 6])
    parser.add_argument("--log2n", type=int, nargs="+", default=[20, 22])
    parser.add_argument("--baseline-ref", default=BASELINE_REF)
    parser.add_argument(
        "--baseline-max-cells",
        type=int,
        default=1 << 28,
        help="skip the baseline where n*d exceeds this (its population "
        "is int64 and re-validated per attribute: 4 GiB and over 10 "
        "minutes at d=128, n=2^22)",
    )
    parser.add_argument("--planner", default="pipeline", choices=["paper", "pipeline"])
    args = parser.parse_args()
    worktree = None
    if args.baseline_ref and shutil.which("git"):
        worktree = Path(tempfile.mkdtemp()) / "baseline"
        made = subprocess.run(
            [
                "git",
                "-C",
                str(ROOT),
                "worktree",
                "add",
                "--detach",
                str(worktree),
                args.baseline_ref,
            ],
            capture_output=True,
        )
        if made.returncode != 0:
            print(f"baseline skipped: {made.stderr.decode().strip()}")
            worktree = None
    print(f"planner: {args.planner}; tolerance of consistency 1e-09; CPU seconds")
    print(
        "| d | k | n | m, l | design | plan | collect | reconstruct | answer | rep CPU-s "
        "| speed-up | rounds | residual | peak MB over imports (x codes) | population CPU-s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    try:
        for d in args.d:
            for k in args.k:
                for log2n in args.log2n:
                    runs = [("current", _run(str(ROOT), d, k, log2n, args.planner))]
                    skip = worktree is not None and d << log2n > args.baseline_max_cells
                    if worktree is not None and not skip:
                        runs.append(("baseline", _run(str(worktree), d, k, log2n, args.planner)))
                    for name, r in runs:
                        ratio = (
                            f"{runs[-1][1]['total'] / r['total']:.1f}x" if len(runs) > 1 else "-"
                        )
                        residual = max(r["residual"], r.get("negativity", 0.0))
                        print(
                            f"| {d} | {k} | 2^{log2n} | {r['m']}, {r['l']} | {name} | "
                            f"{r['plan']:.2f} | {r['collect']:.2f} | {r['reconstruct']:.2f} | "
                            f"{r['answer']:.2f} | {r['total']:.2f} | {ratio} | "
                            f"{r['rounds']} | {residual:.1e} | {r['peak_mb']:.0f} "
                            f"({r['peak_mb'] / r['codes_mb']:.2f}x) | "
                            f"{r['population']:.1f} |",
                            flush=True,
                        )
                    if skip:
                        print(
                            f"| {d} | {k} | 2^{log2n} | | baseline | skipped: n*d above "
                            f"{args.baseline_max_cells} | | | | | | | | | |",
                            flush=True,
                        )
    finally:
        if worktree is not None:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)],
                capture_output=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
