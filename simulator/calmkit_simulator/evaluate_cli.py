"""``calmkit evaluate``: "what would I get on my data?" in one command.

The population (your CSV, or a named dataset) is replayed as users. At each epsilon,
the same queries are answered, with the same seeds, by:

- the default planner (views chosen by the predicted error of the whole
  reconstruction, after a pilot);
- Algorithm 1 of the CALM paper (Zhang et al., "CALM: Consistent Adaptive Local
  Marginal for Marginal Release under Local Differential Privacy", CCS 2018, §4.3);
- one attribute per view (l = 1) for every user, no pilot: the plan that can never be
  misled by dependence;
- Uniform (answering 1/cells everywhere: knowing nothing);
- and any ``--mechanism`` asked for.

It prints a table of the mean SSE with a 95% interval per method, the plans chosen, the
attributes coarsened or left out, and writes the table (CSV) and a plot of SSE against
epsilon with the intervals. Everything runs through the harness of ``calmkit simulate``
(:func:`~calmkit_simulator.experiment.run_mechanism`), so a row here equals
``calmkit simulate`` with the same options.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

from calmkit_client import CalmkitError
from calmkit_client.commands import NON_NEGATIVE, POSITIVE, add_command, json_option

from .data_cli import data_options, load_population, shape_warnings, warn

__all__ = ["VARIANTS", "register"]

# (label, mechanism, options): the methods every evaluation compares
VARIANTS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("default planner", "calm", {}),
    ("Algorithm 1", "calm", {"planner": "paper"}),
    ("l = 1", "calm", {"l": 1, "pilot": 0}),  # the plain design: every user, no pilot
    ("Uniform", "uni", {}),
)


def register(subparsers: Any) -> None:
    """Add ``calmkit evaluate`` to the ``calmkit`` parser's ``subparsers``."""
    add_command(
        subparsers,
        "evaluate",
        "what would I get on my data: the default planner, Algorithm 1, one attribute "
        "per view and Uniform on the same queries, at several epsilons (table and plot)",
        run=_evaluate,
        options=_options,
        extra="simulator",
    )


def _epsilons(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"({text!r}) must be numbers separated by commas"
        ) from None
    if not values or not all(math.isfinite(v) and 0 < v <= 44 for v in values):
        raise argparse.ArgumentTypeError(f"({text!r}) must be numbers in (0, 44]")
    return values


def _options(parser: argparse.ArgumentParser) -> None:
    data_options(parser, "the population: csv:FILE for your own data, or")
    parser.add_argument(
        "--n", type=POSITIVE, default=None, help="resample to n users (default: the data's users)"
    )
    parser.add_argument(
        "--epsilon",
        type=_epsilons,
        default=(0.5, 1.0, 2.0),
        metavar="E1,E2,...",
        help="the privacy budgets compared (default: 0.5,1,2)",
    )
    parser.add_argument("--k", type=POSITIVE, default=3, help="query size (default: 3)")
    parser.add_argument(
        "--queries", type=POSITIVE, default=50, help="random k-way queries per rep (default: 50)"
    )
    parser.add_argument(
        "--reps", type=POSITIVE, default=5, help="repetitions, fresh reports each (default: 5)"
    )
    parser.add_argument(
        "--seed",
        type=NON_NEGATIVE,
        default=0,
        help="fixes the queries and every method's randomness; each method answers the "
        "same queries (default: 0)",
    )
    parser.add_argument(
        "--mechanism",
        action="append",
        default=[],
        metavar="NAME",
        help="also compare this mechanism (repeatable; see calmkit simulate --help)",
    )
    parser.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="where the CSV and the plot go (default: evaluate-<dataset name>)",
    )
    parser.add_argument("--no-plot", action="store_true", help="write no plot")
    json_option(parser)


def _evaluate(args: argparse.Namespace) -> int:
    from .seeds import POPULATION, stream

    t0 = time.perf_counter()
    pop = load_population(args, args.seed)
    if args.n is not None and args.n != pop.n:
        pop = pop.resample(args.n, rng=stream(args.seed, POPULATION))
    if args.k > pop.d:
        raise CalmkitError(f"k ({args.k}) must be at most the attributes ({pop.d})")
    warnings = shape_warnings(pop)
    if not args.json:
        warn(warnings)
    rows = [
        _run(pop, label, name, opts, eps, args)
        for eps in args.epsilon
        for label, name, opts in _variants(args)
    ]
    out_dir = Path(args.out or f"evaluate-{pop.name}")
    files = _write(rows, out_dir, plot=not args.no_plot)
    summary = {
        "dataset": pop.name,
        "n": pop.n,
        "d": pop.d,
        "sizes": list(pop.schema.sizes),
        "k": args.k,
        "queries": args.queries,
        "reps": args.reps,
        "seed": args.seed,
        "notes": list(pop.notes),
        "warnings": warnings,
        "rows": rows,
        "files": files,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    if args.json:
        print(json.dumps(summary))
    else:
        _print(summary, args.epsilon)
    return 0


def _variants(args: argparse.Namespace) -> list[tuple[str, str, dict[str, Any]]]:
    from .mechanisms import MECHANISMS

    extra: list[tuple[str, str, dict[str, Any]]] = []
    for name in args.mechanism:
        if name not in MECHANISMS:
            raise CalmkitError(f"mechanism ({name!r}) must be one of {sorted(MECHANISMS)}")
        extra.append((name, name, {}))
    return [*VARIANTS, *extra]


def _run(
    pop: Any, label: str, name: str, options: dict[str, Any], eps: float, args: argparse.Namespace
) -> dict[str, Any]:
    """One method at one epsilon: its SSE per repetition and what it chose, or why it
    could not run."""
    import numpy as np

    from .experiment import run_mechanism
    from .mechanisms import make_mechanism

    row: dict[str, Any] = {"method": label, "epsilon": eps}
    try:
        reps = run_mechanism(
            pop,
            make_mechanism(name, **options),
            eps,
            args.k,
            args.queries,
            args.reps,
            rng=args.seed,
        )
    except CalmkitError as exc:
        return {**row, "not_run": str(exc)}
    sse = np.array([r.sse for r in reps])
    chosen = reps[0].chosen
    low, high = _interval(sse)
    return {
        **row,
        "sse": sse.tolist(),
        "sse_mean": float(sse.mean()),
        "low": low,
        "high": high,
        "uniform_sse": float(np.mean([r.uniform_sse for r in reps])),
        "m": chosen.get("m"),
        "l": chosen.get("l"),
        "not_collected": chosen.get("not_collected") or [],
        "seconds_per_rep": float(np.median([r.seconds for r in reps])),
    }


def _interval(sse: Any) -> tuple[float | None, float | None]:
    """A 95% t-interval of the mean over the repetitions (none for one: a single
    repetition says nothing of the spread)."""
    from scipy import stats

    mean = float(sse.mean())
    if sse.size < 2:
        return None, None
    half = float(stats.t.ppf(0.975, sse.size - 1) * sse.std(ddof=1) / math.sqrt(sse.size))
    return max(mean - half, 0.0), mean + half


def _write(rows: list[dict[str, Any]], out: Path, plot: bool) -> dict[str, str]:
    """The table as CSV, and the plot of SSE against epsilon (log scale, 95% intervals)."""
    import csv

    out.mkdir(parents=True, exist_ok=True)
    table = out / "evaluate.csv"
    fields = ["method", "epsilon", "sse_mean", "low", "high", "m", "l", "not_run"]
    with table.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    files = {"table": str(table)}
    if plot:
        files["plot"] = str(_plot(rows, out / "evaluate.png"))
    return files


def _plot(rows: list[dict[str, Any]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for method in dict.fromkeys(r["method"] for r in rows):
        done = [r for r in rows if r["method"] == method and "sse_mean" in r]
        if not done:
            continue
        x = [r["epsilon"] for r in done]
        y = [r["sse_mean"] for r in done]
        ax.errorbar(x, y, yerr=_error_bars(done), marker="o", capsize=3, label=method)
    epsilons = sorted({r["epsilon"] for r in rows})
    ax.set_xscale("log")
    ax.set_xticks(epsilons, [f"{e:g}" for e in epsilons])
    ax.minorticks_off()
    ax.set_xlabel("epsilon")
    ax.set_ylabel("mean SSE per query (95% interval)")
    ax.set_yscale("log")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _error_bars(rows: list[dict[str, Any]]) -> list[list[float]] | None:
    """The rows' intervals as matplotlib's (below, above) bars; none without them."""
    if any(r["low"] is None for r in rows):
        return None
    return [[r["sse_mean"] - r["low"] for r in rows], [r["high"] - r["sse_mean"] for r in rows]]


def _print(summary: dict[str, Any], epsilons: tuple[float, ...]) -> None:
    print(
        f"evaluate: {summary['dataset']}, n={summary['n']}, d={summary['d']}, domain sizes "
        f"{summary['sizes']}; {summary['queries']} random {summary['k']}-way queries x "
        f"{summary['reps']} reps, seed {summary['seed']} (every method answers the same queries)"
    )
    for note in summary["notes"]:
        print(f"  note: {note}")
    methods = list(dict.fromkeys(r["method"] for r in summary["rows"]))
    what = (
        "[95% interval]"
        if summary["reps"] > 1
        else "(one repetition: no interval; --reps 2 or more gives one)"
    )
    print(f"\n  mean SSE per query {what}; * marks the lowest at each epsilon")
    for eps in epsilons:
        here = [r for r in summary["rows"] if r["epsilon"] == eps]
        best = min((r["sse_mean"] for r in here if "sse_mean" in r), default=None)
        print(f"  epsilon {eps:g}:")
        for method in methods:
            r = next(x for x in here if x["method"] == method)
            print("    " + _line(r, best))
    dropped = sorted({a for r in summary["rows"] for a in r.get("not_collected", [])})
    if dropped:
        print(f"  not collected (one category, or too few users): {dropped}")
    print(f"  wrote {', '.join(summary['files'].values())} in {summary['seconds']:.0f} s")


def _line(r: dict[str, Any], best: float | None) -> str:
    name = f"{r['method']:<16}"
    if "not_run" in r:
        return f"{name} not run: {r['not_run']}"
    mark = "*" if r["sse_mean"] == best else " "
    plan = f"  (m = {r['m']}, l = {r['l']})" if r.get("m") is not None else ""
    interval = f" [{r['low']:.3g}, {r['high']:.3g}]" if r["low"] is not None else ""
    return f"{name}{mark} {r['sse_mean']:.3g}{interval}{plan}"
