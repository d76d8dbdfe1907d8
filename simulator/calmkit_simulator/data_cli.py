"""The offline commands of ``calmkit``: datasets, population, plan, simulate and
experiment (their options are defined in :mod:`calmkit_simulator.cli`)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np

from .datasets import load_dataset

MANY_CATEGORIES = 64  # above this, warn: a view's cells outnumber what reports can fill


def shape_warnings(pop: Any) -> list[str]:
    """What in a population's shape will make answers poor or partial: attributes with
    one category (nothing to collect) or very many (a view over one has that many
    cells, each estimated from a few noisy reports)."""
    out = []
    for attr in pop.schema.attributes:
        if attr.size == 1:
            out.append(
                f"attribute {attr.name!r} has one category ({attr.categories[0]!r}): its "
                "marginal is known, so no view collects it"
            )
        elif attr.size > MANY_CATEGORIES:
            out.append(
                f"attribute {attr.name!r} has {attr.size} categories: a view over it has "
                f">= {attr.size} cells to estimate from {pop.n} users' noisy reports, and its "
                "answers will be poor; --max-categories C keeps the C-1 most frequent "
                "categories and pools the rest"
            )
    return out


def _warn(lines: list[str]) -> None:
    for line in lines:
        print(f"calmkit: warning: {line}", file=sys.stderr)


def _population(args: argparse.Namespace) -> int:
    pop = load_dataset(args.dataset, args.data_dir, args.d, args.max_categories)
    warnings = shape_warnings(pop)
    if args.json:
        print(json.dumps({"name": pop.name, "n": pop.n, "d": pop.d,
                          "sizes": list(pop.schema.sizes), "notes": list(pop.notes),
                          "warnings": warnings}))  # fmt: skip
    else:
        _warn(warnings)
        print(pop.describe())
        for attr in pop.schema.attributes:
            print(f"  {attr.name}: {', '.join(attr.categories)}")
    return 0


def _plan(args: argparse.Namespace) -> int:
    from calmkit_aggregator.planning.algorithm1 import choose_views
    from calmkit_aggregator.planning.collection import workload_of
    from calmkit_aggregator.planning.pilot import pilot_plan, pilot_size
    from calmkit_aggregator.planning.search import choose_plan
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
        cut = pilot_size(args.n, pilot)
        first = pilot_plan(schema, args.epsilon, users=cut)
        fixed, n_main = first.views, args.n - cut
        users = [cut / first.m] * first.m
    chosen = choose_plan(schema.sizes, args.epsilon, n_main, workload_of(schema, args.k, None),
                         fixed_views=fixed, fixed_users=users, l=args.l, m=args.m,
                         reconstruction=args.reconstruct)  # fmt: skip
    plan = Plan(schema, args.epsilon, chosen.views)
    ranked = sorted(chosen.candidates, key=lambda c: c.sse)
    out = {
        "planner": "pipeline",
        "reconstruction": args.reconstruct,
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
    from .seeds import POPULATION, stream

    t0 = time.perf_counter()
    mechanism = make_mechanism(args.mechanism, theta=args.theta, m=args.m, l=args.l,
                               path=args.path, shrink=not args.no_shrink,
                               reconstruction=args.reconstruct,
                               planner=args.planner, pilot=args.pilot,
                               rounds=args.rounds, strategy=args.strategy,
                               budgets=args.budgets, noise=args.noise, delta=args.delta,
                               workload=args.workload)  # fmt: skip
    # the seed's streams (see calmkit_simulator.seeds): the synthetic dataset from the
    # root, the resample from its own, the queries and reports per repetition from theirs
    pop = load_dataset(args.dataset, args.data_dir, args.d, args.max_categories, rng=args.seed)
    if args.n is not None and args.n != pop.n:
        pop = pop.resample(args.n, rng=stream(args.seed, POPULATION))
    mechanism.check(pop.schema, pop.n, args.epsilon, args.k)  # fail before any work
    warnings = shape_warnings(pop)
    if not args.json:
        _warn(warnings)
    from .progress import Progress

    progress = Progress(args.reps, f"{args.mechanism} reps") if not args.json else None
    update = progress.update if progress is not None else None
    results = run_mechanism(pop, mechanism, args.epsilon, args.k, args.queries, args.reps,
                            rng=args.seed, progress=update)  # fmt: skip
    if progress is not None:
        progress.close()
    errors = np.array([r.sse for r in results])
    chosen = results[0].chosen if results else {}
    out = {
        "mechanism": mechanism.name,
        "dataset": pop.name,
        "n": pop.n,
        "d": pop.d,
        "k": args.k,
        "epsilon": args.epsilon,
        "seed": args.seed,
        "m": chosen.get("m"),
        "l": chosen.get("l"),
        "sse_mean": float(errors.mean()),
        "sse_std": float(errors.std(ddof=1)) if errors.size > 1 else 0.0,
        "uniform_sse_mean": float(np.mean([r.uniform_sse for r in results])),
        "seconds_per_rep": float(np.median([r.seconds for r in results])),
        "privacy_unit": mechanism.privacy_unit,
        "shrink": not args.no_shrink,
        "reconstruct": args.reconstruct,
        "planner": getattr(mechanism, "planner", None),
        "chosen": chosen,
        "reps": [{"sse": r.sse, "uniform_sse": r.uniform_sse,
                  "queries": [list(q) for q in r.queries]} for r in results],
        "warnings": warnings,
        "seconds": round(time.perf_counter() - t0, 3),
    }  # fmt: skip
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


NO_DATA_EXIT = 3  # calmkit experiment: some task's dataset was absent
INTERRUPTED_EXIT = 130


def _run_grid(name: str, tasks: list[Any], args: argparse.Namespace) -> dict[str, Any]:
    """Run (or recall) a grid's tasks with progress; on ^C keep what finished (every
    task is cached as it ends) and say so. Returns results, timing and the runs."""
    import os
    import shlex
    from pathlib import Path

    from .grid import ResultCache, run_tasks
    from .progress import Progress

    unique = {t.key(): t for t in tasks}
    cache = ResultCache(Path(args.out) / ".cache" / "results.sqlite")
    progress = Progress(len(unique), f"{name} tasks")
    jobs = args.jobs or os.cpu_count() or 1
    command = "calmkit experiment " + shlex.join(sys.argv[2:] if args.argv is None else args.argv)
    cached = len(cache.keys() & unique.keys())
    t0 = time.perf_counter()
    interrupted = False
    try:
        try:
            results = run_tasks(list(unique.values()), cache, args.data_dir, jobs=jobs,
                                progress=progress.update,
                                scheduler=getattr(args, "scheduler", None))  # fmt: skip
        except KeyboardInterrupt:
            interrupted = True
            results = {k: r for k, t in unique.items() if (r := cache.get(t)) is not None}
        elapsed = time.perf_counter() - t0
        cache.log_run(name, command, len(results) - cached, elapsed, jobs)
        runs = cache.runs(name)
    finally:
        progress.close()
        cache.close()
    return {"results": results, "elapsed": elapsed, "runs": runs, "interrupted": interrupted,
            "total": len(unique), "computed": len(results) - cached}  # fmt: skip


def _finish_grid(name: str, grid: dict[str, Any], paths: dict[str, Any] | None,
                 report_key: str, args: argparse.Namespace) -> int:  # fmt: skip
    """Print the summary; the exit status says what a script needs to know."""
    results = grid["results"]
    counts: dict[str, int] = {}
    for r in results.values():
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    missing = sorted({r["message"] for r in results.values() if r["status"] == "missing_data"})
    summary = {"figure": name, "tasks": len(results), "of": grid["total"], "status": counts,
               "computed": grid["computed"], "seconds": round(grid["elapsed"], 1),
               "interrupted": grid["interrupted"],
               "outputs": {k: str(v) for k, v in (paths or {}).items()},
               "kept_existing": paths is None}  # fmt: skip
    if args.json:
        print(json.dumps(summary))
    else:
        done = f"{len(results)} of {grid['total']} tasks" if grid["interrupted"] else (
            f"{len(results)} tasks")
        where = (f"report {paths[report_key]}" if paths is not None else
                 f"kept the existing report in {args.out}: it has more finished results "
                 "than this run")  # fmt: skip
        print(f"{name}: {done} {counts} in {grid['elapsed']:.0f} s; {where}")
    if grid["interrupted"]:
        print(f"calmkit: interrupted: {len(results)} of {grid['total']} tasks are done and "
              "cached; run the same command again to resume", file=sys.stderr)  # fmt: skip
        return INTERRUPTED_EXIT
    if missing:
        print(f"calmkit: error: {counts['missing_data']} tasks had no data ({missing[0]}"
              f"{f'; and {len(missing) - 1} more' if len(missing) > 1 else ''})",
              file=sys.stderr)  # fmt: skip
        return NO_DATA_EXIT
    return 0


def _experiment(args: argparse.Namespace) -> int:
    from .figures import build_figure
    from .report import write_outputs

    if args.figure == "planner":
        return _planner_experiment(args)
    figure = build_figure(args.figure, quick=args.quick, seed=args.seed, reps=args.reps,
                          queries=args.queries, n=args.n, dataset=args.dataset)  # fmt: skip
    grid = _run_grid(figure.name, figure.tasks(), args)
    paths = write_outputs(figure, grid["results"], args.out, grid["runs"],
                          plot=not args.no_plot)  # fmt: skip
    return _finish_grid(figure.name, grid, paths, "results", args)


def _planner_experiment(args: argparse.Namespace) -> int:
    """``calmkit experiment planner``: the default planner against the fixed grid."""
    from .planner_bench import model_check, planner_tasks, planning_times, write_planner_report

    tasks = planner_tasks(reps=args.reps or (2 if args.quick else 5), queries=args.queries,
                          seed=args.seed, quick=args.quick, data_dir=args.data_dir)  # fmt: skip
    grid = _run_grid("planner", [t.task for t in tasks], args)
    if grid["interrupted"]:
        return _finish_grid("planner", grid, None, "md", args)
    timings = planning_times(repeats=1, dims=(16,)) if args.quick else planning_times(repeats=5)
    checks = model_check(tasks, args.data_dir)
    paths = write_planner_report(tasks, grid["results"], args.out, grid["runs"], timings,
                                 plot=not args.no_plot, checks=checks)  # fmt: skip
    return _finish_grid("planner", grid, paths, "md", args)


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
