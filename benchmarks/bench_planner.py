"""Planning time of the default (pipeline) planner against Algorithm 1.

    python benchmarks/bench_planner.py [--runs 5]

For d in {16, 64, 128} binary attributes, k in {2, 3, 4}, n = 2^20, eps = 1: the
median seconds of ``choose_plan`` (the prior profile, no pilot: the planning a
service does when a pilot ends) and of Algorithm 1 (``choose_views``, the named
baseline) on the same input, after one untimed call each (covering designs and the
James-Stein tables are cached per process); the same measurement
``calmkit experiment planner`` writes into docs/planner.md. Prints the ratio
default / Algorithm 1 and whether the default stays within the 1 s budget.
"""

from __future__ import annotations

import argparse

from calmkit_simulator.planner_bench import planning_times

BUDGET = 1.0  # seconds per plan at d = 128, k <= 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    print(f"{'d':>4} {'k':>2} {'default (s)':>12} {'Alg. 1 (s)':>11} {'ratio':>7}  budget")
    for row in planning_times(repeats=args.runs):
        ours, base = row["pipeline"], row["paper"]
        ok = "ok" if ours <= BUDGET else "OVER"
        print(f"{row['d']:>4} {row['k']:>2} {ours:>12.3f} {base:>11.3f} {ours / base:>7.2f}  {ok}")


if __name__ == "__main__":
    main()
