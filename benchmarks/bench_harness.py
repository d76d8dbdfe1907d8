"""Evaluation-harness speed.

    python benchmarks/bench_harness.py [--runs 3]

1. EM (the CALM paper's §3.6) answering one repetition's 50 random 3-way queries
   at d = 16, n = 2^16, eps = 1: ``Release.answer_many`` (all queries' EM iterations
   at once) against the named baseline, ``answer`` one query at a time.
2. One Fig. 4 point (CALM, FC, AM, FT, Uni at eps = 1, 5 repetitions, Kosarak or
   synthetic d = 16, k = 3, n = 2^16) through the grid runner, which computes each
   repetition's true marginals once for all mechanisms, against the named baseline of
   ``run_mechanism`` per mechanism (truth recomputed for each).

Prints medians of ``--runs`` runs and baseline / median (above 1 = faster).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from timing import median_seconds

from calmkit_simulator.datasets import DatasetError, load_dataset
from calmkit_simulator.experiment import random_queries, run_mechanism
from calmkit_simulator.grid import ResultCache, run_tasks
from calmkit_simulator.mechanisms import ExpectationMaximization, make_mechanism
from calmkit_simulator.tasks import Task


def _population(d: int):  # type: ignore[no-untyped-def]
    try:
        return "kosarak", load_dataset("kosarak", None, d).resample(1 << 16, rng=0)
    except DatasetError:
        return "synthetic", load_dataset("synthetic", None, d)


def bench_em(runs: int) -> None:
    name, pop = _population(16)
    release = ExpectationMaximization().run(pop, 1.0, 3, 0)
    queries = random_queries(pop.d, 3, 50, 1)
    base = median_seconds(lambda: [release.answer(q) for q in queries], runs)
    fast = median_seconds(lambda: release.answer_many(queries), runs)
    print(f"EM, 50 3-way queries ({name}, d = 16, n = 2^16, eps = 1)")
    print(f"  baseline answer() one at a time  {base:8.3f} s")
    print(f"  answer_many (batched EM)         {fast:8.3f} s   x{base / fast:.1f}")


def bench_panel(runs: int) -> None:
    name, pop = _population(16)
    mechanisms = ("calm", "fc", "am", "ft", "uni")
    tasks = [
        Task(dataset=name, mechanism=m, epsilon=1.0, k=3, query_k=3, d=16, n=1 << 16, reps=5)
        for m in mechanisms
    ]

    def grid() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            run_tasks(tasks, ResultCache(Path(tmp) / "c.sqlite"))

    def one_by_one() -> None:
        for m in mechanisms:
            run_mechanism(pop, make_mechanism(m), 1.0, 3, 50, 5, rng=0)

    base = median_seconds(one_by_one, runs)
    fast = median_seconds(grid, runs)
    print(f"one Fig. 4 point: CALM, FC, AM, FT, Uni x 5 reps ({name}, d = 16, k = 3, eps = 1)")
    print(f"  baseline run_mechanism per method {base:8.3f} s")
    print(f"  grid runner (truth shared)        {fast:8.3f} s   x{base / fast:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    bench_em(args.runs)
    bench_panel(args.runs)


if __name__ == "__main__":
    main()
