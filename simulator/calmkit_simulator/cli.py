"""The ``calmkit`` command line.

calmkit demo                     # server + client + queries on one machine
calmkit serve --db calmkit.db    # the aggregator service
calmkit population --dataset adult --max-categories 3
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

import numpy as np

from calmkit_client import CalmkitError

from .collect import PATHS
from .datasets import DATASETS, load_dataset
from .service_cli import add_commands


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


def _plan(args: argparse.Namespace) -> int:
    from calmkit_aggregator.planner import plan_collection
    from calmkit_client import Schema, SchemaError

    try:
        sizes = [int(x) for x in args.domain.split(",")]
    except ValueError:
        raise SchemaError(f"domain ({args.domain!r}) must be comma-separated ints") from None
    plan = plan_collection(
        Schema.from_sizes(sizes), args.epsilon, args.n, args.k, theta=args.theta, l=args.l, m=args.m
    )
    out = {
        "l": max(len(v) for v in plan.views),
        "m": plan.m,
        "views": [list(v) for v in plan.views],
        "oracles": list(plan.oracles or ()),
    }
    if args.json:
        print(json.dumps(out))
    else:
        print(f"l = {out['l']}, m = {out['m']}, oracles {sorted(set(out['oracles']))}")
        for v in out["views"]:
            print("  ", v)
    return 0


def _simulate(args: argparse.Namespace) -> int:
    from .experiment import run_mechanism
    from .mechanisms import make_mechanism

    t0 = time.perf_counter()
    mechanism = make_mechanism(args.mechanism, theta=args.theta, m=args.m, l=args.l,
                               path=args.path, shrink=not args.no_shrink)  # fmt: skip
    pop = load_dataset(args.dataset, args.data_dir, args.d, args.max_categories, rng=args.seed)
    if args.n and args.n != pop.n:
        pop = pop.resample(args.n, rng=args.seed)
    mechanism.check(pop.schema, pop.n, args.epsilon, args.k)  # fail before any work
    bar = None
    if sys.stderr.isatty() and not args.json:
        try:
            from tqdm import tqdm

            bar = tqdm(total=args.reps, desc="reps", file=sys.stderr)
        except ImportError:  # progress bars are optional
            bar = None
    results = run_mechanism(pop, mechanism, args.epsilon, args.k, args.queries, args.reps,
                            rng=args.seed, progress=bar.update if bar else None)  # fmt: skip
    if bar is not None:
        bar.close()
    errors = np.array([r.sse for r in results])
    chosen = results[0].chosen if results else {}
    out = {
        "mechanism": mechanism.name,
        "dataset": pop.name,
        "n": pop.n,
        "d": pop.d,
        "k": args.k,
        "epsilon": args.epsilon,
        "m": chosen.get("m"),
        "l": chosen.get("l"),
        "sse_mean": float(errors.mean()),
        "sse_std": float(errors.std(ddof=1)) if errors.size > 1 else 0.0,
        "uniform_sse_mean": float(np.mean([r.uniform_sse for r in results])),
        "seconds_per_rep": float(np.median([r.seconds for r in results])),
        "privacy_unit": mechanism.privacy_unit,
        "shrink": not args.no_shrink,
        "seconds": round(time.perf_counter() - t0, 3),
    }
    if args.json:
        print(json.dumps(out))
        return 0
    print(pop.describe())
    chose = ", ".join(f"{k_} = {v}" for k_, v in chosen.items())
    print(
        f"{out['mechanism']}{' (' + chose + ')' if chose else ''}: epsilon {args.epsilon}, "
        f"{args.queries} random {args.k}-way queries x {args.reps} reps"
    )
    print(
        f"  SSE  {out['mechanism']} {out['sse_mean']:.3g} +- {out['sse_std']:.2g}   "
        f"Uniform {out['uniform_sse_mean']:.3g}"
    )
    print(f"  {out['seconds']:.1f} s ({out['seconds_per_rep']:.2f} s per rep)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="calmkit", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    add_commands(sub)

    pop = sub.add_parser("population", help="load a dataset and describe it")
    pop.add_argument(
        "--dataset", default="synthetic", help="; ".join(f"{k}: {v}" for k, v in DATASETS.items())
    )
    pop.add_argument("--data-dir", default=None, help="default $CALMKIT_DATA, ../shared/datasets")
    pop.add_argument("--d", type=int, default=None)
    pop.add_argument("--max-categories", type=int, default=None)
    pop.add_argument("--json", action="store_true")
    pop.set_defaults(run=_population)

    plan = sub.add_parser("plan", help="CALM Algorithm 1: choose l, m and the views")
    plan.add_argument("--domain", required=True, help="category counts, e.g. 2,2,3,2")
    plan.add_argument("--n", type=int, required=True, help="expected users")
    plan.add_argument("--k", type=int, required=True, help="query size")
    plan.add_argument("--epsilon", type=float, required=True)
    plan.add_argument("--theta", type=float, default=0.001)
    plan.add_argument("--l", type=int, default=None, help="fix the view size")
    plan.add_argument("--m", type=int, default=None, help="fix the number of views")
    plan.add_argument("--json", action="store_true")
    plan.set_defaults(run=_plan)

    sim = sub.add_parser("simulate", help="run a mechanism and Uniform on a population; SSE")
    sim.add_argument("--mechanism", default="calm", help="calm (default), uni, ...")
    sim.add_argument(
        "--dataset", default="synthetic", help="; ".join(f"{k}: {v}" for k, v in DATASETS.items())
    )
    sim.add_argument("--data-dir", default=None, help="default $CALMKIT_DATA, ../shared/datasets")
    sim.add_argument("--d", type=int, default=None)
    sim.add_argument("--max-categories", type=int, default=None)
    sim.add_argument("--n", type=int, default=None, help="resample to n users (with replacement)")
    sim.add_argument("--k", type=int, required=True)
    sim.add_argument("--epsilon", type=float, required=True)
    sim.add_argument("--theta", type=float, default=0.001)
    sim.add_argument("--m", type=int, default=None)
    sim.add_argument("--l", type=int, default=None)
    sim.add_argument("--queries", type=int, default=50)
    sim.add_argument("--reps", type=int, default=20)
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument("--path", choices=PATHS, default="fast")
    sim.add_argument(
        "--no-shrink",
        action="store_true",
        help="skip interaction shrinkage: the paper's CALM pipeline exactly",
    )
    sim.add_argument("--json", action="store_true")
    sim.set_defaults(run=_simulate)
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
