"""Planning time of the default (pipeline) planner against Algorithm 1.

    python benchmarks/bench_planner.py [--runs 5]

For d in {16, 64, 128} binary attributes, k in {2, 3, 4}, n = 2^20, eps = 1: the
median CPU seconds of ``choose_plan`` with the prior profile (no pilot) and with a
pilot-like profile (skewed marginals, pair weights from them, an uncertain
dependence: the planning a service does when a pilot ends, dependent designs
included), and of Algorithm 1 (``choose_views``, the named baseline) on the same
input, after one untimed call each (covering designs and the James-Stein tables are
cached per process); the same measurement ``calmkit experiment planner`` writes into
docs/planner.md. Prints the ratios to Algorithm 1 and whether the default stays
within the 1 s budget.
"""

from __future__ import annotations

import argparse

from calmkit_simulator.planner_bench import planning_times

BUDGET = 1.0  # seconds per plan at d = 128, k <= 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    print(
        f"{'d':>4} {'k':>2} {'prior (s)':>10} {'pilot (s)':>10} {'Alg. 1 (s)':>11} "
        f"{'ratios':>13}  budget"
    )
    for row in planning_times(repeats=args.runs):
        prior, pilot, base = row["pipeline"], row["pilot"], row["paper"]
        ok = "ok" if max(prior, pilot) <= BUDGET else "OVER"
        print(
            f"{row['d']:>4} {row['k']:>2} {prior:>10.3f} {pilot:>10.3f} {base:>11.3f} "
            f"{prior / base:>6.2f} {pilot / base:>6.2f}  {ok}"
        )


if __name__ == "__main__":
    main()
