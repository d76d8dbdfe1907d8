"""The ``calmkit`` command line.

calmkit demo                     # synthetic users -> client reports -> estimates
calmkit population --dataset adult --max-categories 3
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections.abc import Sequence

import numpy as np

from calmkit_client import CalmkitError, Plan

from .collect import PATHS, collect_support, true_view_counts
from .datasets import DATASETS, load_dataset
from .synthetic import synthetic_population


def _demo(args: argparse.Namespace) -> int:
    """Every synthetic user reports once through the client; the aggregator estimates
    each 2-way view and compares the error with the variance formula."""
    t0 = time.perf_counter()
    pop = synthetic_population(n=args.n, sizes=(2,) * args.d, rng=args.seed)
    views = list(itertools.combinations(range(args.d), 2))
    plan = Plan(pop.schema, args.epsilon, views, seed=args.seed)
    support = collect_support(pop, plan, rng=args.seed + 1, path=args.path)
    n, true_counts = true_view_counts(pop, plan)
    measured, expected = [], []
    for j, oracle in enumerate(plan.view_oracles):
        truth = true_counts[j] / n[j]
        estimate = oracle.estimate(support.counts[j], int(n[j]))
        measured.append(float(((estimate - truth) ** 2).sum()))
        expected.append(float(oracle.variance(int(n[j]), truth).sum()))
    seconds = time.perf_counter() - t0
    result = {
        "population": pop.describe().splitlines()[0],
        "epsilon": args.epsilon,
        "views": plan.m,
        "oracles": sorted(set(plan.oracles or ())),
        "plan_digest": plan.digest,
        "reports": int(support.n.sum()),
        "path": args.path,
        "sse_per_view_mean": float(np.mean(measured)),
        "sse_per_view_expected": float(np.mean(expected)),
        "seconds": round(seconds, 3),
    }
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"calmkit demo: {result['population']}")
    print(
        f"  plan {plan.digest[:12]}: {plan.m} two-way views, epsilon {args.epsilon}, "
        f"oracles {', '.join(result['oracles'])}"
    )
    print(f"  {result['reports']} reports made through the client ({args.path} path)")
    print(
        f"  SSE per view: measured {result['sse_per_view_mean']:.3g}, "
        f"expected from the variance formula {result['sse_per_view_expected']:.3g}"
    )
    print(f"  done in {seconds:.2f} s")
    return 0


def _population(args: argparse.Namespace) -> int:
    pop = load_dataset(args.dataset, args.data_dir, args.d, args.max_categories)
    if args.json:
        print(
            json.dumps(
                {
                    "name": pop.name,
                    "n": pop.n,
                    "d": pop.d,
                    "sizes": list(pop.schema.sizes),
                    "notes": list(pop.notes),
                }
            )
        )
    else:
        print(pop.describe())
        for attr in pop.schema.attributes:
            print(f"  {attr.name}: {', '.join(attr.categories)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="calmkit", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="synthetic users report through the client; estimate")
    demo.add_argument("--n", type=int, default=1 << 16, help="users (default 65536)")
    demo.add_argument("--d", type=int, default=8, help="binary attributes (default 8)")
    demo.add_argument("--epsilon", type=float, default=1.0, help="LDP budget (default 1)")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--path", choices=PATHS, default="faithful")
    demo.add_argument("--json", action="store_true", help="one JSON object")
    demo.set_defaults(run=_demo)

    pop = sub.add_parser("population", help="load a dataset and describe it")
    pop.add_argument(
        "--dataset", default="synthetic", help="; ".join(f"{k}: {v}" for k, v in DATASETS.items())
    )
    pop.add_argument("--data-dir", default=None, help="default $CALMKIT_DATA, ../shared/datasets")
    pop.add_argument("--d", type=int, default=None)
    pop.add_argument("--max-categories", type=int, default=None)
    pop.add_argument("--json", action="store_true")
    pop.set_defaults(run=_population)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args))
    except CalmkitError as exc:
        print(f"calmkit: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
