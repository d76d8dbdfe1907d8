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

from calmkit_aggregator.pilot import PILOT_FRACTION
from calmkit_aggregator.planner import PLANNERS
from calmkit_client import CalmkitError

from .catalog import MIRROR_ENV
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
    from calmkit_aggregator.choose import choose_views
    from calmkit_aggregator.pilot import pilot_plan, pilot_size
    from calmkit_aggregator.planner import workload_of
    from calmkit_aggregator.planning import choose_plan
    from calmkit_client import Plan, Schema, SchemaError

    try:
        sizes = [int(x) for x in args.domain.split(",")]
    except ValueError:
        raise SchemaError(f"domain ({args.domain!r}) must be comma-separated ints") from None
    schema = Schema.from_sizes(sizes)
    names = schema.names
    if args.planner == "paper":
        choice = choose_views(schema.sizes, args.epsilon, args.n, args.k, theta=args.theta,
                              l=args.l, m=args.m)  # fmt: skip
        plan = Plan(schema, args.epsilon, choice.views)
        out: dict[str, object] = {
            "planner": "paper", "l": choice.l, "m": plan.m,
            "views": [list(v) for v in plan.views], "oracles": list(plan.oracles or ()),
            "rule": choice.rule,
        }  # fmt: skip
        if args.json:
            print(json.dumps(out))
        else:
            print(choice.summary())
            for v in out["views"]:  # type: ignore[attr-defined]
                print("  ", v)
        return 0
    pilot = args.pilot if (args.l is None or args.m is None) else 0.0
    fixed: tuple[tuple[int, ...], ...] = ()
    users: list[float] = []
    n_main = args.n
    if pilot > 0:
        first = pilot_plan(schema, args.epsilon)
        cut = pilot_size(args.n, pilot)
        fixed, n_main = first.views, args.n - cut
        users = [cut / first.m] * first.m
    chosen = choose_plan(schema.sizes, args.epsilon, n_main, workload_of(schema, args.k, None),
                         fixed_views=fixed, fixed_users=users, l=args.l, m=args.m)  # fmt: skip
    plan = Plan(schema, args.epsilon, chosen.views)
    ranked = sorted(chosen.candidates, key=lambda c: c.sse)
    out = {
        "planner": "pipeline",
        "l": chosen.l,
        "m": plan.m,
        "design": chosen.design,
        "views": [list(v) for v in plan.views],
        "oracles": list(plan.oracles or ()),
        "predicted_sse": chosen.predicted.sse,
        "predicted_noise": chosen.predicted.noise,
        "predicted_bias": chosen.predicted.bias,
        "profile": chosen.profile.to_dict(),
        "pilot": None if pilot <= 0 else {
            "fraction": pilot, "users": args.n - n_main, "views": [list(v) for v in fixed],
        },
        "not_collected": [names[a] for a in (*chosen.single, *chosen.predicted.uncollected)],
        "notes": chosen.notes(names),
        "candidates": [c.to_dict() for c in ranked],
    }  # fmt: skip
    if args.json:
        print(json.dumps(out))
        return 0
    if pilot > 0:
        print(
            f"pilot: {args.n - n_main} users ({pilot:.0%}) report on {len(fixed)} disjoint "
            "attribute pairs; the views below are chosen again from their reports"
        )
        print("second phase, as planned from the prior (before any report):")
    print(
        f"l = {chosen.l}, m = {plan.m} ({chosen.design}), predicted SSE "
        f"{chosen.predicted.sse:.3g} (noise {chosen.predicted.noise:.3g}, "
        f"bias {chosen.predicted.bias:.3g}); oracles {sorted(set(plan.oracles or ()))}"
    )
    for note in chosen.notes(names):
        print("note:", note)
    print("candidates (best first): " + ", ".join(
        f"l={c.l} m={c.m}{'' if c.design == 'spread' else ' ' + c.design} {c.sse:.3g}"
        for c in ranked[:8]))  # fmt: skip
    for v in out["views"][:20]:  # type: ignore[index]
        print("  ", v)
    if plan.m > 20:
        print(f"   ... {plan.m - 20} more (--json lists all)")
    return 0


def _simulate(args: argparse.Namespace) -> int:
    from .experiment import run_mechanism
    from .mechanisms import make_mechanism

    t0 = time.perf_counter()
    mechanism = make_mechanism(args.mechanism, theta=args.theta, m=args.m, l=args.l,
                               path=args.path, shrink=not args.no_shrink,
                               planner=args.planner, pilot=args.pilot,
                               rounds=args.rounds, strategy=args.strategy,
                               budgets=args.budgets, noise=args.noise, delta=args.delta,
                               workload=args.workload)  # fmt: skip
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
        "planner": getattr(mechanism, "planner", None),
        "chosen": chosen,
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
    if chosen.get("not_collected"):
        print(f"  not collected (one category, or too few users): {chosen['not_collected']}")
    print(f"  {out['seconds']:.1f} s ({out['seconds_per_rep']:.2f} s per rep)")
    return 0


def _experiment(args: argparse.Namespace) -> int:
    import os
    import shlex
    from pathlib import Path

    from .figures import build_figure
    from .grid import ResultCache, run_tasks
    from .report import write_outputs

    if args.figure == "planner":
        return _planner_experiment(args)
    figure = build_figure(args.figure, quick=args.quick, seed=args.seed, reps=args.reps,
                          queries=args.queries, n=args.n, dataset=args.dataset)  # fmt: skip
    out = Path(args.out)
    cache = ResultCache(out / ".cache" / "results.sqlite")
    tasks = figure.tasks()
    bar = None
    if sys.stderr.isatty():
        try:
            from tqdm import tqdm

            bar = tqdm(total=len({t.key() for t in tasks}), desc=figure.name, file=sys.stderr)
        except ImportError:  # progress bars are optional
            bar = None
    jobs = args.jobs or os.cpu_count() or 1
    command = "calmkit experiment " + shlex.join(sys.argv[2:] if args.argv is None else args.argv)
    unique = {t.key(): t for t in tasks}
    cached = len(cache.keys() & unique.keys())
    t0 = time.perf_counter()
    try:
        results = run_tasks(tasks, cache, args.data_dir, jobs=jobs,
                            progress=bar.update if bar else None)  # fmt: skip
        elapsed = time.perf_counter() - t0
        cache.log_run(figure.name, command, len(unique) - cached, elapsed, jobs)
        runs = cache.runs(figure.name)
    finally:
        if bar is not None:
            bar.close()
        cache.close()
    paths = write_outputs(figure, results, out, runs, plot=not args.no_plot)
    counts: dict[str, int] = {}
    for r in results.values():
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    summary = {
        "figure": figure.name,
        "tasks": len(results),
        "status": counts,
        "seconds": round(elapsed, 1),
        "outputs": {k: str(v) for k, v in paths.items()},
    }
    print(json.dumps(summary) if args.json else
          f"{figure.name}: {len(results)} tasks {counts} in {elapsed:.0f} s; "
          f"report {paths['results']}")  # fmt: skip
    return 0


def _planner_experiment(args: argparse.Namespace) -> int:
    """``calmkit experiment planner``: the default planner against the fixed grid."""
    import os
    import shlex
    from pathlib import Path

    from .grid import ResultCache, run_tasks
    from .planner_bench import model_check, planner_tasks, planning_times, write_planner_report

    if args.reps is not None and args.reps < 1:
        raise CalmkitError(f"reps ({args.reps}) must be >= 1")
    if args.queries < 1:
        raise CalmkitError(f"queries ({args.queries}) must be >= 1")
    tasks = planner_tasks(reps=args.reps or (2 if args.quick else 5), queries=args.queries,
                          seed=args.seed, quick=args.quick, data_dir=args.data_dir)  # fmt: skip
    out = Path(args.out)
    cache = ResultCache(out / ".cache" / "results.sqlite")
    unique = {t.task.key(): t.task for t in tasks}
    cached = len(cache.keys() & unique.keys())
    bar = _progress(len(unique), "planner")
    jobs = args.jobs or os.cpu_count() or 1
    command = "calmkit experiment " + shlex.join(sys.argv[2:] if args.argv is None else args.argv)
    t0 = time.perf_counter()
    try:
        results = run_tasks(list(unique.values()), cache, args.data_dir, jobs=jobs,
                            progress=bar.update if bar else None)  # fmt: skip
        elapsed = time.perf_counter() - t0
        cache.log_run("planner", command, len(unique) - cached, elapsed, jobs)
        runs = cache.runs("planner")
    finally:
        if bar is not None:
            bar.close()
        cache.close()
    timings = planning_times(repeats=1, dims=(16,)) if args.quick else planning_times(repeats=5)
    checks = model_check(tasks, args.data_dir)
    paths = write_planner_report(tasks, results, out, runs, timings, plot=not args.no_plot,
                                 checks=checks)  # fmt: skip
    counts: dict[str, int] = {}
    for r in results.values():
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    summary = {"figure": "planner", "tasks": len(results), "status": counts,
               "seconds": round(elapsed, 1),
               "outputs": {k: str(v) for k, v in paths.items()}}  # fmt: skip
    print(json.dumps(summary) if args.json else
          f"planner: {len(results)} tasks {counts} in {elapsed:.0f} s; "
          f"report {paths['md']}")  # fmt: skip
    return 0


def _datasets(args: argparse.Namespace) -> int:
    from .catalog import CATALOG, dataset_path, fetch
    from .datasets import default_data_dir, user_data_dir

    if args.action == "list":
        return _list_datasets(args, CATALOG, dataset_path, default_data_dir, user_data_dir)
    if args.action == "path":
        print(dataset_path(args.names[0], args.data_dir))
        return 0
    fetchable = sorted(n for n, s in CATALOG.items() if s.fetchable)
    names = fetchable if args.names == ["all"] else args.names

    def say(line: str) -> None:
        if not args.json:
            print(line, file=sys.stderr)

    for name in names:
        done = fetch(name, args.data_dir, args.mirror, progress=say)
        files = [str(p) for p in done.files]
        if args.json:
            print(json.dumps({"name": name, "already": done.already, "files": files}))
        else:
            verb = "already present" if done.already else "fetched and verified"
            print(f"{name}: {verb}: {', '.join(files)}")
    return 0


def _list_datasets(args, catalog, dataset_path, default_data_dir, user_data_dir) -> int:  # type: ignore[no-untyped-def]
    rows = []
    for src in catalog.values():
        where = dataset_path(src.name, args.data_dir)
        rows.append({
            "name": src.name, "title": src.title, "source": src.home,
            "licence": src.licence, "citation": src.citation,
            "downloads": [{"url": d.url, "sha256": d.sha256, "size": d.size}
                          for d in src.downloads],
            "files": dict(src.outputs), "fetchable": src.fetchable,
            "present": where.is_file(), "path": str(where),
            "notes": [*src.notes, *([src.manual] if src.manual else [])],
        })  # fmt: skip
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    folder = args.data_dir or default_data_dir() or user_data_dir()
    print(f"data folder: {folder}  (fetch writes to {args.data_dir or user_data_dir()})")
    for src, row in zip(catalog.values(), rows):
        size = sum(d.size or 0 for d in src.downloads)
        state = "present" if row["present"] else "fetchable" if src.fetchable else "manual"
        print(f"  {src.name:8s} {state:9s} {src.title}")
        print(f"           source: {src.home}")
        print(f"           licence: {src.licence}")
        print(f"           cite: {src.citation}")
        if size:
            print(f"           download: {size / 1e6:.1f} MB, SHA-256 pinned")
        for rel, digest in src.outputs.items():
            print(f"           {rel}  sha256 {digest}")
        for note in row["notes"]:
            print(f"           note: {note}")
    return 0


def _progress(total: int, desc: str):  # type: ignore[no-untyped-def]
    """A tqdm bar on a terminal, else None."""
    if not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # progress bars are optional
        return None
    return tqdm(total=total, desc=desc, file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="calmkit", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    add_commands(sub)

    data = sub.add_parser(
        "datasets",
        help="the datasets calmkit knows: list, fetch (download + verify), path",
        description="list: every dataset with its source, licence and SHA-256s; fetch NAME.. "
        "(or all): download from the official source, verify, unpack into the per-user data "
        "folder (or --data-dir); path NAME: where the loaders look for it.",
    )
    data.add_argument("action", choices=("list", "fetch", "path"), help="what to do")
    data.add_argument("names", nargs="*", metavar="NAME",
                      help="dataset names (fetch: one or more, or all; path: one)")  # fmt: skip
    data.add_argument("--data-dir", "--dir", default=None,
                      help="data folder (default: $CALMKIT_DATA, else the per-user "
                      "data folder)")  # fmt: skip
    data.add_argument("--mirror", default=None,
                      help=f"a folder or URL with the source files under their original names "
                      f"(default: the official sources; or ${MIRROR_ENV})")  # fmt: skip
    data.add_argument("--json", action="store_true", help="machine-readable output")
    data.set_defaults(run=_datasets)

    pop = sub.add_parser("population", help="load a dataset and describe it")
    pop.add_argument(
        "--dataset", default="synthetic", help="; ".join(f"{k}: {v}" for k, v in DATASETS.items())
    )
    pop.add_argument("--data-dir", default=None, help="default $CALMKIT_DATA, ../shared/datasets")
    pop.add_argument("--d", type=int, default=None)
    pop.add_argument("--max-categories", type=int, default=None)
    pop.add_argument("--json", action="store_true")
    pop.set_defaults(run=_population)

    plan = sub.add_parser("plan", help="choose the view size l, the count m and the views")
    plan.add_argument("--domain", required=True, help="category counts, e.g. 2,2,3,2")
    plan.add_argument("--n", type=int, required=True, help="expected users")
    plan.add_argument("--k", type=int, required=True, help="query size")
    plan.add_argument("--epsilon", type=float, required=True)
    plan.add_argument("--planner", choices=PLANNERS, default="pipeline",
                      help="pipeline (default): the views with the lowest predicted error "
                      "of the whole reconstruction; paper: CALM's Algorithm 1")  # fmt: skip
    plan.add_argument("--pilot", type=float, default=PILOT_FRACTION,
                      help="share of users in the pilot phase (pipeline planner; 0: none; "
                      f"default {PILOT_FRACTION})")  # fmt: skip
    plan.add_argument("--theta", type=float, default=0.001, help="Algorithm 1's threshold")
    plan.add_argument("--l", type=int, default=None, help="fix the view size")
    plan.add_argument("--m", type=int, default=None, help="fix the number of views")
    plan.add_argument("--json", action="store_true")
    plan.set_defaults(run=_plan)

    sim = sub.add_parser("simulate", help="run a mechanism and Uniform on a population; SSE")
    sim.add_argument(
        "--mechanism",
        default="calm",
        help="calm (default); LDP baselines uni, fc, am, ft, em, be; central references "
        "priview, mwem, datacube, wff",
    )
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
    sim.add_argument("--planner", choices=PLANNERS, default=None,
                     help="CALM's planner: pipeline (default; a pilot, then the views with "
                     "the lowest predicted error) or paper (Algorithm 1)")  # fmt: skip
    sim.add_argument("--pilot", type=float, default=None,
                     help=f"share of users in the pilot (pipeline planner; default "
                     f"{PILOT_FRACTION}; 0: none)")  # fmt: skip
    sim.add_argument("--queries", type=int, default=50)
    sim.add_argument("--reps", type=int, default=20)
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument("--path", choices=PATHS, default="fast")
    sim.add_argument(
        "--no-shrink",
        action="store_true",
        help="skip interaction shrinkage: the paper's CALM pipeline exactly",
    )
    central = sim.add_argument_group("central-DP references (datacube, MWEM, Fourier)")
    central.add_argument("--rounds", type=int, default=None, help="MWEM rounds T")
    central.add_argument("--strategy", choices=("fourier", "marginals"), default=None,
                         help="datacube strategy (default fourier)")  # fmt: skip
    central.add_argument("--budgets", choices=("optimal", "uniform"), default=None,
                         help="datacube budgets (default optimal)")  # fmt: skip
    central.add_argument("--noise", choices=("laplace", "gaussian"), default=None,
                         help="datacube noise (default laplace)")  # fmt: skip
    central.add_argument("--delta", type=float, default=None,
                         help="WFF delta (default 1e-6); datacube with Gaussian noise")  # fmt: skip
    central.add_argument("--workload", choices=("k", "upto-k"), default=None,
                         help="WFF workload (default k: all k-way marginals)")  # fmt: skip
    sim.add_argument("--json", action="store_true")
    sim.set_defaults(run=_simulate)

    from .figures import FIGURES

    exp = sub.add_parser("experiment", help="a figure of the paper: grid, CSV, PNG, results.md")
    exp.add_argument("figure", choices=[*sorted(FIGURES), "planner"],
                     help="a figure of the paper, or planner: the default planner against "
                     "a fixed grid of (l, m) (writes DIR/planner.md)")  # fmt: skip
    exp.add_argument("--quick", action="store_true", help="a reduced grid (seconds)")
    exp.add_argument("--out", default="results", help="output folder (default ./results)")
    exp.add_argument("--seed", type=int, default=0)
    exp.add_argument("--reps", type=int, default=None, help="repetitions (paper: 20)")
    exp.add_argument("--queries", type=int, default=50, help="random queries per repetition")
    exp.add_argument("--n", type=int, default=None, help="only the panels with this n")
    exp.add_argument("--dataset", default=None, help="run every panel on this dataset instead")
    exp.add_argument("--data-dir", default=None, help="default $CALMKIT_DATA, ../shared/datasets")
    exp.add_argument("--jobs", type=int, default=None, help="worker processes (default: cores)")
    exp.add_argument("--no-plot", action="store_true", help="skip the PNG (no matplotlib)")
    exp.add_argument("--json", action="store_true")
    exp.set_defaults(run=_experiment)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "datasets":
        if args.action == "path" and len(args.names) != 1:
            parser.error(f"datasets path takes one NAME ({len(args.names)} given)")
        if args.action == "fetch" and not args.names:
            parser.error("datasets fetch needs NAME... (or all)")
    args.argv = None if argv is None else list(argv)[1:]
    try:
        return int(args.run(args))
    except CalmkitError as exc:
        print(f"calmkit: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
