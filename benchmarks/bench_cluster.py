"""A figure's task grid on a Dask LocalCluster against worker processes (``--jobs``).

    python benchmarks/bench_cluster.py [--figure fig4] [--n 65536] [--reps 20]
        [--jobs 2] [--data-dir DIR]

Runs the grid twice in this process, each time with an empty result cache: first with
``jobs`` worker processes (the baseline, ``calmkit experiment --jobs``), then on a
``LocalCluster`` of ``jobs`` one-thread workers (``--scheduler local``). Prints both
wall times, their ratio, and whether every task's result is identical (all fields
but the per-repetition timings). Data: ``--data-dir``, else ../shared/datasets when
present, else the per-user dataset folder.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from calmkit_simulator.figures import build_figure
from calmkit_simulator.grid import ResultCache, run_tasks

SHARED = Path(__file__).resolve().parents[2] / "shared" / "datasets"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--figure", default="fig4")
    parser.add_argument("--n", type=int, default=1 << 16)
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--data-dir", default=None)
    args = parser.parse_args()
    data = args.data_dir or (str(SHARED) if SHARED.is_dir() else None)
    tasks = build_figure(args.figure, reps=args.reps, n=args.n).tasks()
    unique = len({t.key() for t in tasks})
    print(f"{args.figure} n={args.n}: {unique} tasks, reps {tasks[0].reps}, jobs {args.jobs}, "
          f"data {data or 'default folder'}", flush=True)  # fmt: skip
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, scheduler in (("--jobs", None), ("--scheduler local", "local")):
            cache = ResultCache(Path(tmp) / f"{scheduler or 'pool'}.sqlite")
            t0 = time.perf_counter()
            results = run_tasks(tasks, cache, data, jobs=args.jobs, scheduler=scheduler)
            seconds = time.perf_counter() - t0
            cache.close()
            runs[name] = (seconds, results)
            statuses: dict[str, int] = {}
            for r in results.values():
                statuses[r["status"]] = statuses.get(r["status"], 0) + 1
            print(f"  {name:<18} {seconds:8.1f} s  {statuses}", flush=True)
    (base, pool), (took, dask) = runs["--jobs"], runs["--scheduler local"]
    same = pool.keys() == dask.keys() and all(
        dict(pool[k], seconds=None) == dict(dask[k], seconds=None) for k in pool
    )
    print(f"| figure | tasks | reps | --jobs {args.jobs} (s) | LocalCluster {args.jobs} (s) "
          "| ratio | identical results |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {args.figure} n={args.n} | {unique} | {tasks[0].reps} | {base:.1f} | {took:.1f} | "
          f"{took / base:.3f} | {'yes' if same else 'NO'} |")  # fmt: skip
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
