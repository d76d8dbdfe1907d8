"""The offline commands of ``calmkit``: datasets, population, plan, simulate and
experiment, each with its options beside the code that runs it (:func:`register` adds
them to the ``calmkit`` parser). datasets and population need only the base install;
plan needs the aggregator extra (the planner), simulate and experiment the simulator
extra."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from calmkit_client import CalmkitError
from calmkit_client.commands import (
    NON_NEGATIVE,
    POSITIVE,
    add_command,
    int_at_least,
    json_option,
    positive_float,
)

__all__ = [
    "MANY_CATEGORIES",
    "bins_option",
    "data_options",
    "load_population",
    "register",
    "shape_warnings",
    "warn",
]

MANY_CATEGORIES = 64  # above this, warn: a view's cells outnumber what reports can fill


def shape_warnings(pop: Any) -> list[str]:
    """What in a population's shape will make answers poor or partial: attributes with
    one category (nothing to collect) or very many (a view over one has that many
    cells, each estimated from a few noisy reports), and what the loader warned of
    (most of a CSV's rows dropped for empty fields)."""
    out = list(pop.warnings)
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


def register(subparsers: Any) -> None:
    """Add datasets, population, plan, simulate and experiment to the ``calmkit``
    parser's ``subparsers``."""
    add_command(
        subparsers,
        "datasets",
        "the datasets calmkit knows: list, fetch (download + verify), path",
        run=_datasets,
        options=_datasets_options,
        extra=None,
        description="list: every dataset with its source, licence and SHA-256s; "
        "fetch NAME.. (or all): download from the official source, verify, unpack "
        "into the per-user data folder (or --data-dir); path NAME: where the "
        "loaders look for it.",
    )
    add_command(
        subparsers,
        "population",
        "load a dataset and describe it (attributes, categories, users)",
        run=_population,
        options=_population_options,
        extra=None,
    )
    add_command(
        subparsers,
        "plan",
        "choose the view size l, the count m and the views for a collection",
        run=_plan,
        options=_plan_options,
        extra="aggregator",
    )
    add_command(
        subparsers,
        "simulate",
        "run a mechanism and Uniform on a population; report the error (SSE)",
        run=_simulate,
        options=_simulate_options,
        extra="simulator",
    )
    add_command(
        subparsers,
        "experiment",
        "a figure of the paper (or the planner comparison): task grid, CSV, PNG and results.md",
        run=_experiment,
        options=_experiment_options,
        extra="simulator",
        epilog="Exit status: 0 all tasks ran; 3 some task had no data (`calmkit "
        "datasets fetch NAME`); 130 interrupted (finished tasks are cached: the "
        "same command resumes). Outputs of an earlier run with more finished tasks "
        "are never overwritten.",
    )


def _data_dir_option(parser: argparse.ArgumentParser) -> None:
    """--data-dir: where the datasets are read from."""
    parser.add_argument(
        "--data-dir",
        default=None,
        metavar="DIR",
        help="dataset folder (default: $CALMKIT_DATA, else the per-user "
        "folder that `calmkit datasets fetch` fills)",
    )


def bins_option(text: str) -> dict[str, int]:
    """An argparse type: ``COL=B[,COL=B...]`` with B an int >= 2."""
    out: dict[str, int] = {}
    for part in text.split(","):
        col, _, count = part.partition("=")
        try:
            value = int(count)
        except ValueError:
            value = 0
        if not col.strip() or value < 2:
            raise argparse.ArgumentTypeError(f"({part!r}) must be COLUMN=B with B an int >= 2")
        out[col.strip()] = value
    return out


def data_options(parser: argparse.ArgumentParser, dataset_help: str = "the population") -> None:
    """Which population a command loads: --dataset, --data-dir, --d, --max-categories."""
    from .datasets import DATASETS

    names = "; ".join(f"{k}: {v}" for k, v in DATASETS.items())
    parser.add_argument(
        "--dataset", default="synthetic", metavar="NAME", help=f"{dataset_help}: {names}"
    )
    _data_dir_option(parser)
    parser.add_argument(
        "--d",
        type=POSITIVE,
        default=None,
        help="keep the first d attributes (transaction data: the d most "
        "frequent items; synthetic: d attributes; default: all, or 8)",
    )
    parser.add_argument(
        "--max-categories",
        type=int_at_least(2),
        default=None,
        metavar="C",
        help="cap every attribute at C categories (the C-1 most frequent "
        "plus one for the rest; default: no cap)",
    )
    parser.add_argument(
        "--bins",
        type=bins_option,
        default=None,
        metavar="COL=B,...",
        help="cut numeric columns of a csv: dataset into at most B ranges of about "
        "equal counts, e.g. --bins age=8,income=5 (default: none; every distinct "
        "value is a category)",
    )
    parser.add_argument(
        "--missing",
        choices=("drop", "category"),
        default="drop",
        help="what an empty field of a csv: dataset means: drop drops its row; "
        "category keeps the row, the field in a category of its own, '(missing)' "
        "(default: drop)",
    )


def warn(lines: list[str]) -> None:
    for line in lines:
        print(f"calmkit: warning: {line}", file=sys.stderr)


def _population_options(parser: argparse.ArgumentParser) -> None:
    data_options(parser)
    json_option(parser)


def load_population(args: argparse.Namespace, rng: int | None = 0) -> Any:
    """The population :func:`data_options`' arguments name (``rng``: the synthetic
    datasets' seed)."""
    from .datasets import load_dataset

    return load_dataset(
        args.dataset,
        args.data_dir,
        args.d,
        args.max_categories,
        rng=rng,
        bins=args.bins,
        missing=args.missing,
    )


def _population(args: argparse.Namespace) -> int:
    pop = load_population(args)
    warnings = shape_warnings(pop)
    if args.json:
        print(
            json.dumps(
                {
                    "name": pop.name,
                    "n": pop.n,
                    "d": pop.d,
                    "sizes": list(pop.schema.sizes),
                    "notes": list(pop.notes),
                    "warnings": warnings,
                }
            )
        )
    else:
        warn(warnings)
        print(pop.describe())
        for attr in pop.schema.attributes:
            print(f"  {attr.name}: {_labels(attr.categories)}")
    return 0


MAX_LABELS_SHOWN = 12


def _labels(categories: tuple[str, ...]) -> str:
    """An attribute's labels, at most :data:`MAX_LABELS_SHOWN` of them and each cut to
    40 characters: ``a, b, ..., z (5,000 labels)``."""
    shown = [c if len(c) <= 40 else c[:39] + "…" for c in categories]
    if len(shown) <= MAX_LABELS_SHOWN:
        return ", ".join(shown)
    head = ", ".join(shown[: MAX_LABELS_SHOWN - 2])
    return f"{head}, ..., {shown[-1]} ({len(shown):,} labels)"


def _plan_options(parser: argparse.ArgumentParser) -> None:
    from calmkit_aggregator.reconstruction.methods import RECONSTRUCTIONS
    from calmkit_aggregator.service.cli import planning_options

    parser.add_argument(
        "--domain",
        required=True,
        metavar="SIZES",
        help="category counts of the attributes, e.g. 2,2,3,2",
    )
    parser.add_argument("--n", type=POSITIVE, required=True, help="expected users")
    parser.add_argument(
        "--k", type=POSITIVE, required=True, help="the size of the marginals to be queried"
    )
    parser.add_argument(
        "--epsilon", type=positive_float, required=True, help="each user's LDP budget"
    )
    planning_options(parser)
    parser.add_argument(
        "--reconstruct",
        choices=RECONSTRUCTIONS,
        default="local",
        help="how the answers will be reconstructed, which the pipeline "
        "planner's predicted error accounts for (see simulate --reconstruct)",
    )
    # --pilot and --theta stay None unless given (_check_planner_options fills them in)
    parser.set_defaults(planner="pipeline")
    json_option(parser)


def _plan(args: argparse.Namespace) -> int:
    from calmkit_client import Schema, SchemaError

    try:
        sizes = [int(x) for x in args.domain.split(",")]
    except ValueError:
        raise SchemaError(f"domain ({args.domain!r}) must be comma-separated ints") from None
    schema = Schema.from_sizes(sizes)
    _check_planner_options(args)
    if args.planner == "paper":
        return _plan_paper(args, schema)
    return _plan_pipeline(args, schema)


def _check_planner_options(args: argparse.Namespace) -> None:
    """``--theta`` belongs to Algorithm 1 and ``--pilot`` to the pipeline planner: one
    given with the other planner would be dropped in silence, so it is an error. Then
    both take their defaults where not given."""
    from calmkit_aggregator.planning.algorithm1 import DEFAULT_THETA
    from calmkit_aggregator.planning.pilot import PILOT_FRACTION
    from calmkit_client import CalmkitError

    paper = args.planner == "paper"
    if not paper and args.theta is not None:
        raise CalmkitError(
            f"theta ({args.theta}) must go with --planner paper: the pipeline planner "
            "has no threshold"
        )
    if paper and getattr(args, "pilot", None) is not None:
        raise CalmkitError(
            f"pilot ({args.pilot}) must go with the pipeline planner: Algorithm 1 plans "
            "in one phase"
        )
    args.theta = DEFAULT_THETA if args.theta is None else args.theta
    args.pilot = PILOT_FRACTION if getattr(args, "pilot", None) is None else args.pilot


def _plan_paper(args: argparse.Namespace, schema: Any) -> int:
    """``calmkit plan --planner paper``: Algorithm 1's l, m and views."""
    from calmkit_aggregator.planning.algorithm1 import choose_views
    from calmkit_client import Plan

    choice = choose_views(
        schema.sizes, args.epsilon, args.n, args.k, theta=args.theta, l=args.l, m=args.m
    )
    plan = Plan(schema, args.epsilon, choice.views)
    out: dict[str, Any] = {
        "planner": "paper",
        "l": choice.l,
        "m": plan.m,
        "views": [list(v) for v in plan.views],
        "oracles": list(plan.oracles or ()),
        "rule": choice.rule,
    }
    if args.json:
        print(json.dumps(out))
    else:
        print(choice.summary())
        for v in out["views"]:
            print("  ", v)
    return 0


def _plan_pipeline(args: argparse.Namespace, schema: Any) -> int:
    """``calmkit plan`` with the default planner: a pilot on attribute pairs (unless l
    and m are fixed), then the views of the lowest predicted error."""
    from calmkit_aggregator.planning.collection import workload_of
    from calmkit_aggregator.planning.pilot import start_pilot
    from calmkit_aggregator.planning.search import choose_plan
    from calmkit_client import Plan

    names = schema.names
    pilot = args.pilot if (args.l is None or args.m is None) else 0.0
    fixed: tuple[tuple[int, ...], ...] = ()
    users: list[float] = []
    n_main = args.n
    first_round = 0
    if pilot > 0:
        start = start_pilot(schema, args.epsilon, args.n, pilot)
        first_round = start.first_round
        fixed, n_main = start.plan.views, args.n - start.reports
        users = [(first_round or start.reports) / start.plan.m] * start.plan.m
    chosen = choose_plan(
        schema.sizes,
        args.epsilon,
        n_main,
        workload_of(schema, args.k, None),
        fixed_views=fixed,
        fixed_users=users,
        l=args.l,
        m=args.m,
        reconstruction=args.reconstruct,
    )
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
        "predicted_range": list(chosen.sse_range),
        "predicted_noise": chosen.predicted.noise,
        "predicted_bias": chosen.predicted.bias,
        "profile": chosen.profile.to_dict(),
        "pilot": None
        if pilot <= 0
        else {
            "fraction": pilot,
            "users": args.n - n_main,
            "first_round": first_round,
            "views": [list(v) for v in fixed],
        },
        "not_collected": [names[a] for a in (*chosen.single, *chosen.predicted.uncollected)],
        "notes": chosen.notes(names),
        "candidates": [c.to_dict() for c in ranked],
    }
    if args.json:
        print(json.dumps(out))
    else:
        _print_pipeline_plan(out, chosen, ranked, plan)
    return 0


def _print_pipeline_plan(out: dict[str, Any], chosen: Any, ranked: list[Any], plan: Any) -> None:
    pilot = out["pilot"]
    if pilot is not None:
        pairs = sum(len(view) > 1 for view in pilot["views"])
        what = (
            f"{pairs} attribute pair{'s' * (pairs != 1)}"
            if pairs
            else "single attributes (margins only)"
        )
        views = f"{len(pilot['views'])} views, {what}"
        if pilot["first_round"]:
            print(
                f"pilot: {pilot['users']} users ({pilot['fraction']:.0%}) in two rounds: "
                f"{pilot['first_round']} report on {views}, the others on pairs chosen "
                "from their reports; the views below are chosen again from all of them"
            )
        else:
            print(
                f"pilot: {pilot['users']} users ({pilot['fraction']:.0%}) report on "
                f"{views}; the views below are chosen again from their reports"
            )
        print("main phase, as planned from the prior (before any report):")
    print(
        f"l = {chosen.l}, m = {plan.m} ({chosen.design}), predicted SSE "
        f"{chosen.predicted.sse:.3g} (noise {chosen.predicted.noise:.3g}, "
        f"bias {chosen.predicted.bias:.3g}); oracles {sorted(set(plan.oracles or ()))}"
    )
    low, high = out["predicted_range"]
    print(
        f"  {low:.3g} to {high:.3g} over what the pair dependence may be (its 10% to 90% "
        "quantile; before any report, the prior's)"
    )
    for note in out["notes"]:
        print("note:", note)
    print(
        "candidates (best first): "
        + ", ".join(
            f"l={c.l} m={c.m}{'' if c.design == 'spread' else ' ' + c.design} {c.sse:.3g}"
            for c in ranked[:8]
        )
    )
    for v in out["views"][:20]:
        print("  ", v)
    if plan.m > 20:
        print(f"   ... {plan.m - 20} more (--json lists all)")


def _simulate_options(parser: argparse.ArgumentParser) -> None:
    from calmkit_aggregator.planning.algorithm1 import DEFAULT_THETA
    from calmkit_aggregator.reconstruction.methods import RECONSTRUCTIONS
    from calmkit_aggregator.service.cli import planning_options

    from .collect import PATHS
    from .mechanisms import MECHANISMS

    parser.add_argument(
        "--mechanism",
        default="calm",
        choices=tuple(MECHANISMS),
        metavar="NAME",
        help="calm (default); LDP baselines uni, fc, am, ft, em, be; central-DP "
        "references priview, mwem, datacube, wff",
    )
    data_options(parser)
    parser.add_argument(
        "--n",
        type=POSITIVE,
        default=None,
        help="resample the population to n users, with replacement (default: the dataset's users)",
    )
    parser.add_argument(
        "--k", type=POSITIVE, required=True, help="the size of the queried marginals"
    )
    parser.add_argument("--epsilon", type=positive_float, required=True, help="the privacy budget")
    planning_options(parser)
    parser.set_defaults(theta=DEFAULT_THETA)
    parser.add_argument(
        "--queries", type=POSITIVE, default=50, help="random k-way queries per repetition"
    )
    parser.add_argument(
        "--reps",
        type=POSITIVE,
        default=20,
        help="repetitions (fresh reports each); the SSE is their mean ± sd",
    )
    parser.add_argument(
        "--seed",
        type=NON_NEGATIVE,
        default=0,
        help="fixes the synthetic dataset, the resample to --n users, each "
        "repetition's queries and the method's randomness, as independent "
        "streams: runs that differ only in --mechanism, --planner, --l/--m "
        "or other method options answer the same queries on the same "
        "users",
    )
    parser.add_argument(
        "--path",
        choices=PATHS,
        default="fast",
        help="fast: sample each view's support counts directly; faithful: "
        "every user through the client code (same distribution)",
    )
    parser.add_argument(
        "--no-shrink",
        action="store_true",
        help="skip the margins' and the interactions' shrinkage: the paper's CALM pipeline exactly",
    )
    parser.add_argument(
        "--reconstruct",
        choices=RECONSTRUCTIONS,
        default="local",
        help="calm, be: how queries are answered from the views; local: maximum "
        "entropy per query over the views' projections (the paper's); "
        "global: also one model fitted to all views at once, which answers "
        "the pairs no view holds",
    )
    _central_options(parser)
    json_option(parser)


def _central_options(parser: argparse.ArgumentParser) -> None:
    """simulate's options of the central-DP references."""
    central = parser.add_argument_group("central-DP references (mwem, datacube, wff)")
    central.add_argument(
        "--rounds", type=POSITIVE, default=None, help="MWEM rounds T (default: the paper's rule)"
    )
    central.add_argument(
        "--strategy",
        choices=("fourier", "marginals"),
        default=None,
        help="datacube strategy (default fourier)",
    )
    central.add_argument(
        "--budgets",
        choices=("optimal", "uniform"),
        default=None,
        help="datacube budget allocation (default optimal)",
    )
    central.add_argument(
        "--noise",
        choices=("laplace", "gaussian"),
        default=None,
        help="datacube noise (default laplace)",
    )
    central.add_argument(
        "--delta",
        type=positive_float,
        default=None,
        help="delta of (epsilon, delta)-DP: WFF (default 1e-6), datacube with Gaussian noise",
    )
    central.add_argument(
        "--workload",
        choices=("k", "upto-k"),
        default=None,
        help="WFF workload (default k: all k-way marginals)",
    )


def _simulate(args: argparse.Namespace) -> int:
    from .experiment import run_mechanism
    from .mechanisms import make_mechanism
    from .progress import Progress
    from .seeds import POPULATION, stream

    t0 = time.perf_counter()
    mechanism = make_mechanism(args.mechanism, **_mechanism_options(args))
    ignored = _ignored_warnings(args)
    warn(ignored)  # before the run, which may be long
    # the seed's streams (see calmkit_simulator.seeds): the synthetic dataset from the
    # root, the resample from its own, the queries and reports per repetition from theirs
    pop = load_population(args, args.seed)
    if args.n is not None and args.n != pop.n:
        pop = pop.resample(args.n, rng=stream(args.seed, POPULATION))
    mechanism.check(pop.schema, pop.n, args.epsilon, args.k)  # fail before any work
    warnings = shape_warnings(pop)
    if not args.json:
        warn(warnings)
    warnings = [*ignored, *warnings]
    progress = Progress(args.reps, f"{args.mechanism} reps") if not args.json else None
    update = progress.update if progress is not None else None
    results = run_mechanism(
        pop,
        mechanism,
        args.epsilon,
        args.k,
        args.queries,
        args.reps,
        rng=args.seed,
        progress=update,
    )
    if progress is not None:
        progress.close()
    out = _simulation(args, mechanism, pop, results, warnings)
    out["seconds"] = round(time.perf_counter() - t0, 3)
    if out["sse_mean"] >= out["uniform_sse_mean"]:
        beaten = (
            f"{out['mechanism']}'s mean SSE ({out['sse_mean']:.3g}) is no better than "
            f"answering every marginal as uniform ({out['uniform_sse_mean']:.3g}): at "
            f"{pop.n} users and epsilon {args.epsilon} the noise outweighs what the reports "
            "tell; fewer categories (--bins, --max-categories), more users or a larger "
            "epsilon would help"
        )
        out["warnings"].append(beaten)
        if not args.json:
            warn([beaten])
    if args.json:
        print(json.dumps(out))
        return 0
    _print_simulation(out, pop, args)
    return 0


def _mechanism_options(args: argparse.Namespace) -> dict[str, Any]:
    """The mechanism options simulate's flags set, for every mechanism
    (:func:`~.mechanisms.make_mechanism` passes each the ones it takes)."""
    return {
        "theta": args.theta,
        "m": args.m,
        "l": args.l,
        "path": args.path,
        "shrink": not args.no_shrink,
        "reconstruction": args.reconstruct,
        "planner": args.planner,
        "pilot": args.pilot,
        "rounds": args.rounds,
        "strategy": args.strategy,
        "budgets": args.budgets,
        "noise": args.noise,
        "delta": args.delta,
        "workload": args.workload,
    }


# the flag that sets a mechanism option, where it is not --OPTION
_FLAGS = {"shrink": "--no-shrink", "reconstruction": "--reconstruct"}


def _given_options(args: argparse.Namespace) -> dict[str, Any]:
    """Of :func:`_mechanism_options`, those the user set: not at simulate's defaults."""
    parser = argparse.ArgumentParser()
    _simulate_options(parser)
    defaults = _mechanism_options(parser.parse_args(["--k", "1", "--epsilon", "1"]))
    return {k: v for k, v in _mechanism_options(args).items() if v != defaults[k]}


def _ignored_warnings(args: argparse.Namespace) -> list[str]:
    """A warning naming the flags the user set that the mechanism does not take, and
    one naming those of another planner than the one it runs (``--theta`` without
    ``--planner paper``, ``--pilot`` with it)."""
    from .mechanisms import MECHANISMS, unused_options

    given = _given_options(args)
    unused = unused_options(args.mechanism, given)
    accepted = MECHANISMS[args.mechanism][1]
    other = [k for k in unused if k not in accepted]
    planner = [k for k in unused if k in accepted]
    where = f"{args.mechanism} with --planner {args.planner or 'pipeline'}"
    return [
        _ignored(names, given, what)
        for names, what in ((other, args.mechanism), (planner, where))
        if names
    ]


def _ignored(names: list[str], given: dict[str, Any], what: str) -> str:
    """``--l (3), --m (4) do not apply to fc and were ignored``."""
    flags = ", ".join(
        _FLAGS.get(k, f"--{k}") + ("" if isinstance(given[k], bool) else f" ({given[k]})")
        for k in names
    )
    many = len(names) > 1
    return (
        f"{flags} {'do' if many else 'does'} not apply to {what} and "
        f"{'were' if many else 'was'} ignored"
    )


def _simulation(
    args: argparse.Namespace, mechanism: Any, pop: Any, results: list[Any], warnings: list[str]
) -> dict[str, Any]:
    """What ``calmkit simulate --json`` prints (but the seconds it took)."""
    import numpy as np

    from .mechanisms import MECHANISMS

    errors = np.array([r.sse for r in results])
    chosen = results[0].chosen if results else {}
    accepted = MECHANISMS[args.mechanism][1]
    return {
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
        # the options the mechanism took (None: it takes no such option)
        "shrink": not args.no_shrink if "shrink" in accepted else None,
        "reconstruct": args.reconstruct if "reconstruction" in accepted else None,
        "planner": getattr(mechanism, "planner", None),
        "chosen": chosen,
        "reps": [
            {"sse": r.sse, "uniform_sse": r.uniform_sse, "queries": [list(q) for q in r.queries]}
            for r in results
        ],
        "warnings": warnings,
    }


def _print_simulation(out: dict[str, Any], pop: Any, args: argparse.Namespace) -> None:
    chosen = out["chosen"]
    print(pop.describe())
    # printed on lines of their own
    listed = ("not_collected", "notes", "predicted_sse", "median_sse", "sse_range")
    chose = ", ".join(f"{k_} = {_readable(v)}" for k_, v in chosen.items() if k_ not in listed)
    print(
        f"{out['mechanism']}{' (' + chose + ')' if chose else ''}: epsilon {args.epsilon}, "
        f"{args.queries} random {args.k}-way queries x {args.reps} reps"
    )
    print(
        f"  SSE  {out['mechanism']} {out['sse_mean']:.3g} +- {out['sse_std']:.2g} "
        f"(sd over reps)   Uniform {out['uniform_sse_mean']:.3g}"
    )
    if "median_sse" in chosen:
        low, high = chosen["sse_range"]
        print(
            f"  predicted SSE (the planner, first rep): {chosen['median_sse']:.3g} at the "
            f"pilot's median dependence, {low:.3g}-{high:.3g} at its 10%-90% quantiles, "
            f"{chosen['predicted_sse']:.3g} averaged over them"
        )
    if chosen.get("not_collected"):
        print(f"  not collected (one category, or too few users): {chosen['not_collected']}")
    for note in chosen.get("notes", ()):
        print(f"  note: {note}")
    print(f"  {out['seconds']:.1f} s ({out['seconds_per_rep']:.2f} s per rep)")


def _readable(value: Any) -> str:
    """A chosen plan's field for the terminal: floats to 3 significant digits (the
    JSON output keeps them whole)."""
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, list) and value and all(isinstance(v, float) for v in value):
        return "[" + ", ".join(f"{v:.3g}" for v in value) + "]"
    return str(value)


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
            results = run_tasks(
                list(unique.values()),
                cache,
                args.data_dir,
                jobs=jobs,
                progress=progress.update,
                scheduler=getattr(args, "scheduler", None),
            )
        except KeyboardInterrupt:
            interrupted = True
            results = {k: r for k, t in unique.items() if (r := cache.get(t)) is not None}
        elapsed = time.perf_counter() - t0
        cache.log_run(name, command, len(results) - cached, elapsed, jobs)
        runs = cache.runs(name)
    finally:
        progress.close()
        cache.close()
    return {
        "results": results,
        "elapsed": elapsed,
        "runs": runs,
        "interrupted": interrupted,
        "total": len(unique),
        "computed": len(results) - cached,
    }


def _finish_grid(
    name: str,
    grid: dict[str, Any],
    paths: dict[str, Any] | None,
    report_key: str,
    args: argparse.Namespace,
) -> int:
    """Print the summary; the exit status says what a script needs to know."""
    results = grid["results"]
    counts: dict[str, int] = {}
    for r in results.values():
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    missing = sorted({r["message"] for r in results.values() if r["status"] == "missing_data"})
    _warn_unfit(results, args)
    summary = {
        "figure": name,
        "tasks": len(results),
        "of": grid["total"],
        "status": counts,
        "computed": grid["computed"],
        "seconds": round(grid["elapsed"], 1),
        "interrupted": grid["interrupted"],
        "outputs": {k: str(v) for k, v in (paths or {}).items()},
        "kept_existing": paths is None,
    }
    if args.json:
        print(json.dumps(summary))
    else:
        done = (
            f"{len(results)} of {grid['total']} tasks"
            if grid["interrupted"]
            else (f"{len(results)} tasks")
        )
        where = (
            f"report {paths[report_key]}"
            if paths is not None
            else f"kept the existing report in {args.out}: it has more finished results "
            "than this run"
        )
        print(f"{name}: {done} {counts} in {grid['elapsed']:.0f} s; {where}")
    if grid["interrupted"]:
        print(
            f"calmkit: interrupted: {len(results)} of {grid['total']} tasks are done and "
            "cached; run the same command again to resume",
            file=sys.stderr,
        )
        return INTERRUPTED_EXIT
    if missing:
        print(
            f"calmkit: error: {counts['missing_data']} tasks had no data ({missing[0]}"
            f"{f'; and {len(missing) - 1} more' if len(missing) > 1 else ''})",
            file=sys.stderr,
        )
        return NO_DATA_EXIT
    return 0


def _warn_unfit(results: dict[str, Any], args: argparse.Namespace) -> None:
    """A warning (text output) saying why tasks were invalid for their dataset."""
    from .tasks import UNFIT

    unfit = [
        r["message"]
        for r in results.values()
        if r["status"] == "invalid" and r["message"].startswith(UNFIT)
    ]
    if unfit and not args.json:
        reasons = sorted(set(unfit))
        more = f"; and {len(reasons) - 1} more" if len(reasons) > 1 else ""
        warn([f"{len(unfit)} tasks were invalid for their dataset ({reasons[0]}{more})"])


def _experiment_options(parser: argparse.ArgumentParser) -> None:
    from .figures import FIGURES

    parser.add_argument(
        "figure",
        choices=[*sorted(FIGURES), "planner"],
        help="a figure of the paper, or planner: the default planner against "
        "a fixed grid of (l, m) (writes DIR/planner.md)",
    )
    parser.add_argument("--quick", action="store_true", help="a reduced grid (seconds)")
    parser.add_argument("--out", default="results", metavar="DIR", help="output folder")
    parser.add_argument(
        "--seed",
        type=NON_NEGATIVE,
        default=0,
        help="seed of every task: fixes each population's resample, the "
        "queries of each repetition and the classification split, shared by "
        "every mechanism of a setting, and each task's own randomness",
    )
    parser.add_argument(
        "--reps",
        type=POSITIVE,
        default=None,
        help="repetitions per setting (default: the paper's 20; --quick: 2)",
    )
    parser.add_argument(
        "--queries", type=POSITIVE, default=50, help="random queries per repetition"
    )
    parser.add_argument(
        "--n",
        type=POSITIVE,
        default=None,
        help="only the panels with this n (default: every panel)",
    )
    parser.add_argument(
        "--dataset",
        default=None,
        metavar="NAME",
        help="run every panel on this dataset instead of the paper's (default: the "
        "paper's datasets)",
    )
    _data_dir_option(parser)
    parser.add_argument(
        "--jobs", type=POSITIVE, default=None, help="worker processes (default: all cores)"
    )
    parser.add_argument(
        "--scheduler",
        default=None,
        metavar="ADDRESS",
        help="run the tasks on a Dask cluster: 'local' starts a LocalCluster "
        "of --jobs workers, tcp://host:8786 uses a running scheduler (its "
        "workers need calmkit installed); same results as --jobs (default: local "
        "worker processes)",
    )
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG (no matplotlib)")
    json_option(parser, "print a JSON summary instead of text")


def _experiment(args: argparse.Namespace) -> int:
    from .figures import build_figure
    from .report import write_outputs

    if args.figure == "planner":
        return _planner_experiment(args)
    figure = build_figure(
        args.figure,
        quick=args.quick,
        seed=args.seed,
        reps=args.reps,
        queries=args.queries,
        n=args.n,
        dataset=args.dataset,
    )
    tasks = figure.tasks()
    if not tasks:
        raise CalmkitError(_no_tasks(args))
    grid = _run_grid(figure.name, tasks, args)
    paths = write_outputs(figure, grid["results"], args.out, grid["runs"], plot=not args.no_plot)
    return _finish_grid(figure.name, grid, paths, "results", args)


def _no_tasks(args: argparse.Namespace) -> str:
    """Why a figure's grid came out empty: the filters given, against what it has."""
    from .figures import build_figure

    every = build_figure(args.figure, quick=args.quick).tasks()
    given, has = [], []
    if args.n is not None:
        given.append(f"--n {args.n}")
        has.append(f"n in {sorted({t.n for t in every if t.n is not None})}")
    if args.dataset is not None:
        given.append(f"--dataset {args.dataset}")
        has.append(f"datasets {sorted({t.dataset for t in every})}")
    return (
        f"experiment {args.figure} has no task with {' '.join(given)} (its tasks use "
        f"{' and '.join(has)}); nothing was run"
    )


def _planner_experiment(args: argparse.Namespace) -> int:
    """``calmkit experiment planner``: the default planner against the fixed grid."""
    from .planner_bench import model_check, planner_tasks, planning_times, write_planner_report

    tasks = planner_tasks(
        reps=args.reps or (2 if args.quick else 5),
        queries=args.queries,
        seed=args.seed,
        quick=args.quick,
        data_dir=args.data_dir,
    )
    grid = _run_grid("planner", [t.task for t in tasks], args)
    if grid["interrupted"]:
        return _finish_grid("planner", grid, None, "md", args)
    timings = planning_times(repeats=1, dims=(16,)) if args.quick else planning_times(repeats=5)
    checks = model_check(tasks, args.data_dir)
    paths = write_planner_report(
        tasks,
        grid["results"],
        args.out,
        grid["runs"],
        timings,
        plot=not args.no_plot,
        checks=checks,
    )
    return _finish_grid("planner", grid, paths, "md", args)


def _datasets_options(parser: argparse.ArgumentParser) -> None:
    from .catalog import MIRROR_ENV

    parser.add_argument("action", choices=("list", "fetch", "path"), help="what to do")
    parser.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help="dataset names (fetch: one or more, or all; path: one)",
    )
    parser.add_argument(
        "--data-dir",
        "--dir",
        default=None,
        metavar="DIR",
        help="data folder (default: $CALMKIT_DATA, else the per-user data folder)",
    )
    parser.add_argument(
        "--mirror",
        default=None,
        metavar="URL_OR_DIR",
        help="a folder or URL with the source files under their original "
        f"names (default: the official sources; or ${MIRROR_ENV})",
    )
    json_option(parser, "machine-readable output")


def _datasets(args: argparse.Namespace) -> int:
    from .catalog import CATALOG, dataset_path, fetch
    from .datasets import default_data_dir, fetch_dir

    if args.action == "path" and len(args.names) != 1:
        raise CalmkitError(f"datasets path takes one NAME ({len(args.names)} given)")
    if args.action == "fetch" and not args.names:
        raise CalmkitError("datasets fetch needs NAME... (or all)")
    if args.action == "list":
        return _list_datasets(args, CATALOG, dataset_path, default_data_dir, fetch_dir)
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


def _list_datasets(args, catalog, dataset_path, default_data_dir, fetch_dir) -> int:  # type: ignore[no-untyped-def]
    rows = []
    for src in catalog.values():
        where = dataset_path(src.name, args.data_dir)
        rows.append(
            {
                "name": src.name,
                "title": src.title,
                "source": src.home,
                "licence": src.licence,
                "citation": src.citation,
                "downloads": [
                    {"url": d.url, "sha256": d.sha256, "size": d.size} for d in src.downloads
                ],
                "files": dict(src.outputs),
                "fetchable": src.fetchable,
                "present": where.is_file(),
                "path": str(where),
                "notes": [*src.notes, *([src.manual] if src.manual else [])],
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    folder = args.data_dir or default_data_dir() or fetch_dir()
    print(f"data folder: {folder}  (fetch writes to {args.data_dir or fetch_dir()})")
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
