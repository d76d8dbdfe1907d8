"""CALM aggregator speed.

    python benchmarks/bench_calm.py [--runs 5]

1. Consistency + Norm-Sub and 50 random 8-way queries on a synthetic population,
   n = 2^18, d = 32 binary, eps = 1, Algorithm 1's plan (reports simulated once,
   outside the timing).  Baseline: the issue's budget of 2 s.
2. One ``calmkit simulate`` repetition at d = 16, k = 3, n = 2^16, eps = 1 (the Kosarak
   prefix when ``$CALMKIT_DATA`` or the per-user folder has it, else the synthetic
   default).  Baseline: the issue's budget of 10 s per repetition.

Prints the median of ``--runs`` runs and budget / median (above 1 = faster than asked).
"""

from __future__ import annotations

import argparse

import numpy as np
from timing import median_seconds

from calmkit_aggregator import plan_collection, reconstruct
from calmkit_simulator.collect import collect_support
from calmkit_simulator.datasets import DatasetError, load_dataset
from calmkit_simulator.experiment import random_queries, run_calm
from calmkit_simulator.synthetic import synthetic_population


def bench_reconstruct(runs: int) -> None:
    n, d, k, eps = 2**18, 32, 8, 1.0
    pop = synthetic_population(n=n, sizes=(2,) * d, rng=0)
    plan = plan_collection(pop.schema, eps, n, k, rng=0, planner="paper")
    support = collect_support(pop, plan, rng=1)
    queries = random_queries(d, k, 50, rng=2)
    size = max(len(v) for v in plan.views)
    state = {}

    def consistency() -> None:
        state["est"] = reconstruct(support)

    def answers() -> None:
        for q in queries:
            state["est"].answer(q)

    t_cons = median_seconds(consistency, runs)
    t_ans = median_seconds(answers, runs)
    total = t_cons + t_ans
    print(f"reconstruct: n=2^18 d={d} eps={eps} m={plan.m} l={size}, 50 random {k}-way queries")
    print(f"  consistency + Norm-Sub  {t_cons:8.3f} s (median of {runs})")
    print(f"  50 max-ent answers      {t_ans:8.3f} s")
    print(f"  total                   {total:8.3f} s   budget 2 s: {2.0 / total:.1f}x")


def bench_simulate(runs: int) -> None:
    n, k, eps = 2**16, 3, 1.0
    try:
        pop = load_dataset("kosarak", None, 16).resample(n, rng=0)
    except DatasetError:
        pop = synthetic_population(n=n, sizes=(2,) * 16, rng=0)
    plan = plan_collection(pop.schema, eps, n, k, rng=0, planner="paper")

    def one_rep() -> None:
        run_calm(pop, plan, k, queries=50, reps=1, rng=np.random.default_rng(3))

    t = median_seconds(one_rep, runs)
    size = max(len(v) for v in plan.views)
    print(f"simulate: {pop.name} n=2^16 d=16 k={k} eps={eps} m={plan.m} l={size}, 50 queries")
    print(f"  one repetition          {t:8.3f} s (median of {runs})   budget 10 s: {10.0 / t:.1f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    bench_reconstruct(args.runs)
    bench_simulate(args.runs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
