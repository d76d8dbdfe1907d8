"""A figure's task grid on a Dask LocalCluster against worker processes (``--jobs``).

    python benchmarks/bench_cluster.py [--figure fig4] [--n 65536] [--reps 20]
        [--jobs 2] [--runs 3] [--data-dir DIR]

Runs the grid ``2 * runs`` times in this process, alternating, each time with an empty
result cache: with ``jobs`` worker processes (the baseline, ``calmkit experiment
--jobs``) and on a ``LocalCluster`` of ``jobs`` one-thread workers (``--scheduler
local``, the cluster's start and stop included). Prints each run, the median wall
times, their ratio, and whether every task's result is identical in every run (all
fields but the per-repetition timings). Data: ``--data-dir``, else ../shared/datasets when
present, else the per-user dataset folder.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from calmkit_simulator.figures import build_figure
from calmkit_simulator.grid import ResultCache, run_tasks

SHARED = Path(__file__).resolve().parents[2] / "shared" / "datasets"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--figure", default="fig4")
    parser.add_argument("--n", type=int, default=1 << 16)
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--data-dir", default=None)
    args = parser.parse_args()
    data = args.data_dir or (str(SHARED) if SHARED.is_dir() else None)
    tasks = build_figure(args.figure, reps=args.reps, n=args.n).tasks()
    unique = len({t.key() for t in tasks})
    print(
        f"{args.figure} n={args.n}: {unique} tasks, reps {tasks[0].reps}, jobs {args.jobs}, "
        f"data {data or 'default folder'}",
        flush=True,
    )
    seconds: dict[str, list[float]] = {"--jobs": [], "--scheduler local": []}
    results: list[dict[str, dict[str, Any]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(args.runs):
            for name, scheduler in (("--jobs", None), ("--scheduler local", "local")):
                cache = ResultCache(Path(tmp) / f"{scheduler or 'pool'}{run}.sqlite")
                t0 = time.perf_counter()
                got = run_tasks(tasks, cache, data, jobs=args.jobs, scheduler=scheduler)
                seconds[name].append(time.perf_counter() - t0)
                cache.close()
                results.append(got)
                statuses: dict[str, int] = {}
                for r in got.values():
                    statuses[r["status"]] = statuses.get(r["status"], 0) + 1
                print(
                    f"  run {run + 1} {name:<18} {seconds[name][-1]:8.1f} s  {statuses}", flush=True
                )
    first = results[0]
    same = all(
        got.keys() == first.keys()
        and all(dict(got[k], seconds=None) == dict(first[k], seconds=None) for k in first)
        for got in results
    )
    base = statistics.median(seconds["--jobs"])
    took = statistics.median(seconds["--scheduler local"])
    print(
        f"| figure | tasks | reps | runs | --jobs {args.jobs}: median s | LocalCluster "
        f"{args.jobs}: median s | ratio | identical results |"
    )
    print("|---|---|---|---|---|---|---|---|")
    print(
        f"| {args.figure} n={args.n} | {unique} | {tasks[0].reps} | {args.runs} | {base:.1f} "
        f"| {took:.1f} | "
        f"{took / base:.3f} | {'yes' if same else 'NO'} |"
    )
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
