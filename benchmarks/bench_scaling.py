"""Simulation at scale: CPU seconds per stage of one CALM repetition, current code
against a baseline checkout, in the same run.

    python benchmarks/bench_scaling.py [--d 32 64 128] [--k 3 6] [--log2n 20 22]
        [--baseline-ref 17a4a4d] [--planner paper]

For every (d, k, n) setting there is a synthetic population of binary attributes (the
same seed for both designs). One repetition is timed by stage, in CPU seconds of a
fresh process that imports the design's code:
- plan: ``plan_collection``;
- collect: every user's report under the plan, as support counts (the fast path);
- reconstruct: estimates, consistency, shrinkage;
- answer: 50 random k-way queries and their true marginals.
Also printed: peak memory (max RSS) over the population's codes, and consistency's
rounds and final residual.

baseline: the code at ``--baseline-ref``, checked out with ``git worktree``; by default
the commit before the vectorised consistency, grouped counting and single validation.
"""

from __future__ import annotations

import argparse
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


def _measure(code: str, d: int, k: int, log2n: int, planner: str) -> dict[str, Any]:
    sys.path[:0] = [str(Path(code) / p) for p in PACKAGES]
    import numpy as np

    from calmkit_aggregator.calm import reconstruct
    from calmkit_aggregator.planner import plan_collection
    from calmkit_simulator import synthetic_population
    from calmkit_simulator.collect import collect_support

    pop = synthetic_population(n=1 << log2n, sizes=(2,) * d, strength=1.0, rng=0)
    gen = np.random.default_rng(1)
    out: dict[str, Any] = {}

    def stage(name: str, fn: Any) -> Any:
        t0 = time.process_time()
        value = fn()
        out[name] = time.process_time() - t0
        return value

    plan = stage("plan", lambda: plan_collection(pop.schema, 1.0, pop.n, k, planner=planner,
                                                 seed=3, rng=3))  # fmt: skip
    support = stage("collect", lambda: collect_support(pop, plan, gen))
    estimator = stage("reconstruct", lambda: reconstruct(support))
    queries = [tuple(sorted(gen.choice(d, size=k, replace=False).tolist())) for _ in range(50)]

    def answer() -> float:
        sse = 0.0
        for q in queries:
            sse += float(((estimator.answer(q).values - pop.marginal(q)) ** 2).sum())
        return sse / len(queries)

    out["sse"] = stage("answer", answer)
    out["total"] = sum(out[s] for s in ("plan", "collect", "reconstruct", "answer"))
    out["m"], out["l"] = plan.m, max(len(v) for v in plan.views)
    views = estimator.views
    out["rounds"], out["residual"] = views.iterations, views.inconsistency
    out["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
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
    parser.add_argument("--planner", default="paper", choices=["paper", "pipeline"])
    args = parser.parse_args()
    worktree = None
    if args.baseline_ref and shutil.which("git"):
        worktree = Path(tempfile.mkdtemp()) / "baseline"
        made = subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach",
                               str(worktree), args.baseline_ref], capture_output=True)  # fmt: skip
        if made.returncode != 0:
            print(f"baseline skipped: {made.stderr.decode().strip()}")
            worktree = None
    print("| d | k | n | m, l | design | plan | collect | reconstruct | answer | total CPU-s "
          "| rounds | residual | peak MB (codes MB) | speed-up |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    try:
        for d in args.d:
            for k in args.k:
                for log2n in args.log2n:
                    runs = [("current", _run(str(ROOT), d, k, log2n, args.planner))]
                    if worktree is not None:
                        runs.append(("baseline", _run(str(worktree), d, k, log2n, args.planner)))
                    for name, r in runs:
                        ratio = runs[-1][1]["total"] / r["total"] if name == "current" else 1.0
                        print(f"| {d} | {k} | 2^{log2n} | {r['m']}, {r['l']} | {name} | "
                              f"{r['plan']:.2f} | {r['collect']:.2f} | {r['reconstruct']:.2f} | "
                              f"{r['answer']:.2f} | {r['total']:.2f} | {r['rounds']} | "
                              f"{r['residual']:.1e} | {r['peak_mb']:.0f} ({r['codes_mb']:.0f}) | "
                              f"{ratio:.1f}x |", flush=True)  # fmt: skip
    finally:
        if worktree is not None:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                            str(worktree)], capture_output=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
