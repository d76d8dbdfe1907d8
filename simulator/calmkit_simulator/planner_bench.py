"""The planner benchmark (``calmkit experiment planner``): the default planner side by
side with a fixed grid of view sizes and counts, Algorithm 1 and Uniform, on the same
queries and the same report seeds, written to ``DIR/planner.md`` (+ CSV, PNG).

Grid per setting (valid points only: m <= C(d, l), every view >= 2 cells and
expecting at least as many users as an l-way view has cells on average): l in {1, 2,
3, 4} (up to the setting's ``max_l``); m in {ceil(d/l), 2x, 4x that, Algorithm 1's m,
the covering size CoverDesign(d, k, l) when it is <= n/50}; each point is CALM with
Algorithm 1's view selection at that fixed (l, m), as ``calmkit simulate --planner
paper --l L --m M``, its views drawn afresh in every repetition. Every task of a
setting shares the queries of each repetition and the mechanism seeds
(``Task.shared_seed``).
"""

from __future__ import annotations

import csv
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from calmkit_aggregator.planning.algorithm1 import choose_views, expected_cells
from calmkit_aggregator.planning.covering import construct_cover, cover_lower_bound
from calmkit_client import Plan, Schema

from .datasets import DatasetError, load_dataset
from .tasks import Task

__all__ = [
    "SETTINGS",
    "PlannerTask",
    "Setting",
    "model_check",
    "planner_tasks",
    "planning_times",
    "ratio_interval",
    "write_planner_report",
]

# Covering designs are built for the grid only up to this lower bound (their cost).
_COVER_LIMIT = 3000
# Resamples of the bootstrap interval of default / best, and its coverage.
_BOOTSTRAP = 2000
_COVERAGE = 0.9
# The default planner's target: SSE within this factor of the best grid point.
_TARGET = 1.15


@dataclass(frozen=True)
class Setting:
    """One dataset configuration of the benchmark."""

    dataset: str
    label: str
    k: int
    epsilons: tuple[float, ...]
    d: int | None = None
    n: int | None = None
    max_categories: int | None = None
    max_l: int = 4


SETTINGS = (
    Setting("kosarak", "Kosarak d=16, n=2^16", 3, (0.2, 0.5, 1.0, 2.0), d=16, n=1 << 16),
    Setting("kosarak", "Kosarak d=32, n=2^16", 3, (0.5, 1.0), d=32, n=1 << 16),
    Setting("adult", "Adult (cap 3), n=45,222", 3, (0.5, 1.0, 2.0), max_categories=3),
    Setting("nltcs", "NLTCS, n=21,574", 3, (0.5, 1.0, 2.0)),
    Setting("plants", "plants d=69, n=23,215", 3, (0.5, 1.0, 2.0)),
    Setting("dna", "dna d=180, n=3,186", 2, (1.0, 2.0)),
    Setting("synthetic", "synthetic d=64, n=10^5", 3, (1.0,), d=64, n=100_000),
    # the shapes users bring: domains of 2-41 categories, and 23 binary attributes
    Setting("adult", "Adult (uncapped), n=45,222", 2, (0.5, 1.0, 2.0), max_l=3),
    Setting("adult", "Adult (uncapped), n=45,222", 3, (0.5, 1.0, 2.0), max_l=3),
    Setting("acs", "ACS d=23, n=47,461", 3, (0.5, 1.0, 2.0)),
    Setting(
        "synthetic:8-40",
        "synthetic d=20, 8-40 categories, n=10^5",
        3,
        (1.0,),
        d=20,
        n=100_000,
        max_l=3,
    ),
    # the demo's own population (8 attributes of 2-4 categories, strong dependence), at
    # the demo's default size and at 20,000 users
    Setting("demo", "demo population, n=10^5", 3, (1.0,)),
    Setting("demo", "demo population, n=20,000", 3, (1.0,), n=20_000),
)
QUICK_SETTINGS = (Setting("synthetic", "synthetic d=8, n=2^12", 3, (0.5, 2.0), d=8, n=1 << 12),)


@dataclass(frozen=True)
class PlannerTask:
    """A benchmark task: its setting and epsilon, its role (``"default"``, ``"paper"``
    = Algorithm 1, ``"grid"``) and, for grid points, (l, m)."""

    setting: Setting
    epsilon: float
    role: str
    task: Task
    l: int | None = None  # noqa: E741
    m: int | None = None


def grid_points(
    sizes: tuple[int, ...], n: int, k: int, epsilon: float, max_l: int = 4
) -> list[tuple[int, int]]:
    """The fixed grid of the module docstring for one setting."""
    d = len(sizes)
    alg = choose_views(sizes, epsilon, n, k)
    points = set()
    for lv in range(1, min(d, max_l) + 1):
        base = math.ceil(d / lv)
        ms = {base, 2 * base, 4 * base, alg.m}
        if lv >= k and cover_lower_bound(d, k, lv) <= min(_COVER_LIMIT, n / 50):
            size = len(construct_cover(d, k, lv, rng=0))
            if size <= n / 50:
                ms.add(size)
        # a view needs >= 2 cells: l = 1 only when every attribute has >= 2 categories
        if lv == 1 and min(sizes) < 2:
            continue
        cells = expected_cells(sizes, lv)
        points |= {(lv, mv) for mv in ms if 1 <= mv <= math.comb(d, lv) and n / mv >= cells}
    return sorted(points)


def planner_tasks(
    reps: int = 5,
    queries: int = 50,
    seed: int = 0,
    quick: bool = False,
    data_dir: str | None = None,
    pilot: float | None = None,
) -> list[PlannerTask]:
    """Every task of the benchmark; a setting whose dataset is missing contributes
    its default and Algorithm 1 tasks only (they then report ``missing_data``)."""
    out = []
    for s in QUICK_SETTINGS if quick else SETTINGS:
        try:
            pop = load_dataset(s.dataset, data_dir, s.d, s.max_categories, rng=seed)
            n: int | None = s.n or pop.n
            sizes = pop.schema.sizes
        except DatasetError:
            n, sizes = s.n, None
        for eps in s.epsilons:

            def task(
                options: tuple[tuple[str, Any], ...], s: Setting = s, eps: float = eps
            ) -> Task:
                return Task(
                    s.dataset,
                    "calm",
                    float(eps),
                    s.k,
                    s.k,
                    d=s.d,
                    n=s.n,
                    max_categories=s.max_categories,
                    options=options,
                    reps=reps,
                    queries=queries,
                    seed=seed,
                    shared_seed=True,
                )

            default: tuple[tuple[str, Any], ...] = (("planner", "pipeline"),)
            if pilot is not None:
                default += (("pilot", pilot),)
            out.append(PlannerTask(s, eps, "default", task(default)))
            # the views of Algorithm 1 and of each grid point are drawn afresh in every
            # repetition (its seed), as the default draws its pilot: the SSE of an
            # (l, m) point, not of one draw's luck in which pairs it holds
            paper = (("planner", "paper"), ("replan", True))
            out.append(PlannerTask(s, eps, "paper", task(paper)))
            if sizes is None or n is None:
                continue
            for lv, mv in grid_points(sizes, n, s.k, eps, s.max_l):
                opts = (*paper, ("l", lv), ("m", mv))
                out.append(PlannerTask(s, eps, "grid", task(opts), lv, mv))
    return out


def planning_times(repeats: int = 5, dims: tuple[int, ...] = (16, 64, 128)) -> list[dict[str, Any]]:
    """Median CPU seconds of the default planner and of Algorithm 1 for d in ``dims``
    binary attributes, k in {2, 3, 4}, n = 2^20, eps = 1. The default planner runs
    with the prior profile and with a pilot-like one (skewed marginals, pair weights
    from them, an uncertain dependence), which also scores dependent designs. One
    BLAS/OpenMP thread, as the benchmark's workers run: CPU seconds would otherwise
    count the spinning of idle BLAS threads."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        return _planning_times(repeats, dims)


def _planning_times(repeats: int, dims: tuple[int, ...]) -> list[dict[str, Any]]:
    from calmkit_aggregator.planning.error_model import Workload
    from calmkit_aggregator.planning.profile import DataProfile, marginal_pair_weights
    from calmkit_aggregator.planning.search import choose_plan

    rows = []
    for d in dims:
        gen = np.random.default_rng(d)
        margs = [gen.dirichlet(np.ones(2)) for _ in range(d)]
        pilot_like = DataProfile(
            tuple(margs),
            0.02,
            "pilot",
            1 << 17,
            0.02,
            (0.004, 0.011, 0.02, 0.032, 0.06),
            marginal_pair_weights(margs),
        )
        for k in (2, 3, 4):
            sizes = (2,) * d
            times = {}
            runs: dict[str, Callable[[], object]] = {
                "pipeline": partial(choose_plan, sizes, 1.0, 1 << 20, Workload(k=k)),
                "pilot": partial(choose_plan, sizes, 1.0, 1 << 20, Workload(k=k), pilot_like),
                "paper": partial(choose_views, sizes, 1.0, 1 << 20, k),
            }
            for name, run in runs.items():
                run()  # warm caches (covering designs, James-Stein tables)
                samples = []
                for _ in range(repeats):
                    t0 = time.process_time()
                    run()
                    samples.append(time.process_time() - t0)
                times[name] = float(np.median(samples))
            rows.append({"d": d, "k": k, **times})
    return rows


def repetition_plan(task: PlannerTask, schema: Schema, n: int, rep: int) -> Plan:
    """The plan repetition ``rep`` of a grid task measures: Algorithm 1's views at its
    (l, m), drawn from the repetition's seed as CALM draws them (``replan``)."""
    from calmkit_aggregator.planning.collection import plan_collection

    from .mechanisms.calm import repetition_seed

    seed = repetition_seed(np.random.default_rng(task.task.rep_seed(rep)))
    return plan_collection(
        schema, task.epsilon, n, task.setting.k, planner="paper", l=task.l, m=task.m, rng=seed
    )


# Repetitions whose views the model check averages its prediction over.
MODEL_DESIGNS = 5


def model_check(tasks: list[PlannerTask], data_dir: str | None = None) -> dict[str, float]:
    """The error model's prediction for every grid point from the data's own profile
    (its exact marginals and every pair's dependence): what the model says when the
    profile is right, to set beside the measured SSE. Keyed by task key; the mean
    over the views Algorithm 1 draws at the point's (l, m) in the first
    :data:`MODEL_DESIGNS` repetitions, as the runs draw them (which pairs a design of
    pairs holds moves its SSE by up to a fifth on data whose dependence sits in a few
    pairs)."""
    import itertools

    from calmkit_aggregator.planning.error_model import Workload, predict_error
    from calmkit_aggregator.planning.profile import DataProfile, pair_dependence

    out: dict[str, float] = {}
    for setting in dict.fromkeys(t.setting for t in tasks):
        grid = [t for t in tasks if t.setting == setting and t.role == "grid"]
        if not grid:
            continue
        first = grid[0].task
        pop = load_dataset(
            setting.dataset, data_dir, setting.d, setting.max_categories, rng=first.seed
        )
        if setting.n is not None and setting.n != pop.n:
            pop = pop.resample(setting.n, rng=first.seed)
        schema, sizes = pop.schema, pop.schema.sizes
        margs = [pop.marginal((a,)).reshape(-1) for a in range(schema.d)]
        weights = np.zeros((schema.d, schema.d))
        deps = []
        for a, b in itertools.combinations(range(schema.d), 2):
            if sizes[a] > 1 and sizes[b] > 1:
                dep = pair_dependence(pop.marginal((a, b)).reshape(sizes[a], sizes[b]))
                weights[a, b] = weights[b, a] = dep
                deps.append(dep)
        profile = DataProfile.from_marginals(
            margs, float(np.mean(deps)) if deps else 0.0, pair_weights=weights
        )
        for t in grid:
            sse = []
            for rep in range(min(t.task.reps, MODEL_DESIGNS)):
                plan = repetition_plan(t, schema, pop.n, rep)
                users = [pop.n / len(plan.views)] * len(plan.views)
                sse.append(
                    predict_error(
                        sizes, plan.views, users, t.epsilon, Workload(k=setting.k), profile, n=pop.n
                    ).sse
                )
            out[t.task.key()] = float(np.mean(sse))
    return out


# -- the report ---------------------------------------------------------------------------------
def _stats(result: dict[str, Any] | None) -> tuple[float, float]:
    """Mean SSE and its standard error over repetitions (nan if not ok)."""
    if result is None or result.get("status") != "ok":
        return math.nan, math.nan
    vals = np.asarray(result["sse"], dtype=float)
    se = float(vals.std(ddof=1) / math.sqrt(vals.size)) if vals.size > 1 else 0.0
    return float(vals.mean()), se


def ratio_interval(
    default: np.ndarray, grid: np.ndarray, rng: int = 0, coverage: float = _COVERAGE
) -> tuple[float, float]:
    """A paired bootstrap interval of default / best grid point.

    Args:
        default: (R,) the default's SSE per repetition.
        grid: (G, R) every grid point's SSE per repetition: repetition r of every row
            shares the queries and report seeds of ``default[r]``, so repetitions are
            resampled together.
        rng: seed of the resampling.

    Each resample draws R repetitions with replacement, takes the mean of the default
    and of every grid point over them and divides by the smallest grid mean, the best
    point being chosen afresh (the table's best point is the minimum of noisy means,
    so its own noise is part of the ratio's). Returns the central ``coverage``
    percentile interval (float64)."""
    default = np.asarray(default, dtype=np.float64)
    grid = np.asarray(grid, dtype=np.float64)
    if grid.ndim != 2 or grid.shape[1] != default.size or default.size < 2:
        raise ValueError(f"grid {grid.shape} must be (G, {default.size}) with >= 2 repetitions")
    gen = np.random.default_rng(rng)
    idx = gen.integers(default.size, size=(_BOOTSTRAP, default.size))
    ratios = default[idx].mean(axis=1) / grid[:, idx].mean(axis=2).min(axis=0)
    tail = (1.0 - coverage) / 2
    lo, hi = np.quantile(ratios, [tail, 1.0 - tail])
    return float(lo), float(hi)


def _median_seconds(result: dict[str, Any] | None) -> float:
    """Median wall seconds of one repetition (plan, collect, reconstruct, answer)."""
    secs = (result or {}).get("seconds") or []
    return float(np.median(secs)) if secs else math.nan


def _fmt(v: float) -> str:
    if not math.isfinite(v):
        return "—"
    return f"{v:.3g}" if abs(v) >= 1e-3 else f"{v:.2e}"


def summarize(tasks: list[PlannerTask], results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (setting, epsilon): the default, the best grid point, Algorithm 1,
    Uniform, the ratios and the default's predicted SSE."""
    rows = []
    keys = list(dict.fromkeys((t.setting, t.epsilon) for t in tasks))
    for setting, eps in keys:
        group = [t for t in tasks if t.setting == setting and t.epsilon == eps]
        by_role = {t.role: t for t in group if t.role != "grid"}
        default = results.get(by_role["default"].task.key())
        paper = results.get(by_role["paper"].task.key())
        d_mean, d_se = _stats(default)
        p_mean, _ = _stats(paper)
        grid = [(t, *_stats(results.get(t.task.key()))) for t in group if t.role == "grid"]
        grid = [g for g in grid if math.isfinite(g[1])]
        best = min(grid, key=lambda g: g[1]) if grid else None
        per_rep = [np.asarray(results[g[0].task.key()]["sse"], dtype=float) for g in grid]
        d_reps = np.asarray((default or {}).get("sse") or [], dtype=float)
        paired = (
            best is not None and d_reps.size >= 2 and all(r.size == d_reps.size for r in per_rep)
        )
        lo, hi = ratio_interval(d_reps, np.array(per_rep)) if paired else (math.nan, math.nan)
        p_reps = np.asarray((paper or {}).get("sse") or [], dtype=float)
        # default / Algorithm 1, paired the same way (a one-row "grid": its own mean)
        vs_paper = (
            ratio_interval(d_reps, p_reps[None, :])
            if d_reps.size >= 2 and p_reps.size == d_reps.size
            else (math.nan, math.nan)
        )
        chosen = (default or {}).get("chosen") or {}
        row = {
            "setting": setting.label,
            "k": setting.k,
            "epsilon": eps,
            "status": (default or {}).get("status", "missing"),
            "default_l": chosen.get("l"),
            "default_m": chosen.get("m"),
            "pilot_m": chosen.get("pilot_m"),
            "default_sse": d_mean,
            "default_se": d_se,
            "best_l": best[0].l if best else None,
            "best_m": best[0].m if best else None,
            "best_sse": best[1] if best else math.nan,
            "best_se": best[2] if best else math.nan,
            "paper_l": ((paper or {}).get("chosen") or {}).get("l"),
            "paper_m": ((paper or {}).get("chosen") or {}).get("m"),
            "paper_sse": p_mean,
            "uniform_sse": _mean_of(default, "uniform"),
            "predicted_sse": _mean_of(default, "predicted"),
            "median_sse": _mean_of(default, "median"),
            "range_low": _mean_of(default, "range_low"),
            "range_high": _mean_of(default, "range_high"),
            "grid_points": len(grid),
            "default_seconds": _median_seconds(default),
            "paper_seconds": _median_seconds(paper),
        }
        row["default_over_best"] = row["default_sse"] / row["best_sse"] if best else math.nan
        row["default_over_best_lo"], row["default_over_best_hi"] = lo, hi
        row["paper_over_best"] = row["paper_sse"] / row["best_sse"] if best else math.nan
        row["default_over_paper"] = row["default_sse"] / row["paper_sse"]
        row["default_over_paper_lo"], row["default_over_paper_hi"] = vs_paper
        row["predicted_over_measured"] = row["predicted_sse"] / row["default_sse"]
        row["median_over_measured"] = row["median_sse"] / row["default_sse"]
        rows.append(row)
    return rows


def write_planner_report(
    tasks: list[PlannerTask],
    results: dict[str, dict[str, Any]],
    out: Path | str,
    runs: list[dict[str, Any]],
    timings: list[dict[str, Any]] | None = None,
    plot: bool = True,
    checks: dict[str, float] | None = None,
) -> dict[str, Path] | None:
    """``DIR/data/planner.csv`` (every task), ``DIR/planner.md`` (the summary table,
    the planning times, every grid point) and ``DIR/figures/planner.png``. An existing
    report with more finished tasks is kept (None), as in
    :func:`~calmkit_simulator.report.write_outputs`."""
    from .report import existing_ok_rows

    root = Path(out)
    paths = {"csv": root / "data" / "planner.csv", "md": root / "planner.md"}
    finished = sum((results.get(t.task.key()) or {}).get("status") == "ok" for t in tasks)
    if existing_ok_rows(paths["csv"]) > finished:
        return None
    (root / "data").mkdir(parents=True, exist_ok=True)
    with paths["csv"].open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(
            [
                "setting",
                "k",
                "epsilon",
                "role",
                "l",
                "m",
                "status",
                "sse_mean",
                "sse_se",
                "uniform",
                "chosen",
                "reps",
                "seed",
                "message",
            ]
        )
        for t in tasks:
            res = results.get(t.task.key()) or {}
            mean, se = _stats(res)
            chosen = res.get("chosen") or {}
            writer.writerow(
                [
                    t.setting.label,
                    t.setting.k,
                    t.epsilon,
                    t.role,
                    t.l if t.l is not None else chosen.get("l", ""),
                    t.m if t.m is not None else chosen.get("m", ""),
                    res.get("status", "missing"),
                    mean,
                    se,
                    float(np.mean(res["uniform"])) if res.get("uniform") else "",
                    ";".join(f"{k}={v}" for k, v in chosen.items()),
                    t.task.reps,
                    t.task.seed,
                    res.get("message", ""),
                ]
            )
    summary = summarize(tasks, results)
    if plot:
        paths["png"] = _plot(summary, root / "figures" / "planner.png")
    paths["md"].write_text(_markdown(tasks, results, summary, runs, timings, plot, checks or {}))
    return paths


# What the report says the default planner does (its opening paragraph).
_DEFAULT_PLANNER = (
    "`pipeline`: a pilot of 20% of the users on "
    "attribute pairs, in two rounds where half of it can measure pairs (10% on as many "
    "random matchings as keep every pair informative, then 10% on the pairs whose "
    "attributes the first round found most dependent; *pilot* in the table counts "
    "both rounds' views), else in one round, an attribute alone where its pairs' "
    "tables are too large for the pilot to tell dependence from noise, then the views whose "
    "predicted pipeline error is lowest, unless it does not beat the safe designs, one "
    "attribute per view and Algorithm 1's plan, by more than the prediction's "
    "uncertainty, at the pilot's estimated margins and at both ends of their range: "
    "then the safe design or the best design that holds every query in a "
    "view, whichever has the smaller regret, or a design of its view size laid out as "
    "evenly that is predicted no worse at every quantile of the dependence; the "
    "pilot's tables are part of the answers unless the views planned for the other "
    "users alone are predicted lower on average over the dependence quantiles; a "
    "pilot set aside still counts in the attributes' margins"
)


def _markdown(
    tasks: list[PlannerTask],
    results: dict[str, dict[str, Any]],
    summary: list[dict[str, Any]],
    runs: list[dict[str, Any]],
    timings: list[dict[str, Any]] | None,
    plot: bool,
    checks: dict[str, float],
) -> str:
    reps = sorted({t.task.reps for t in tasks})
    lines = [
        "# The default planner against a fixed grid",
        "",
        "Generated by `calmkit experiment planner` (do not edit by hand). Each setting "
        f"runs CALM with the default planner ({_DEFAULT_PLANNER}), with "
        "Algorithm 1 (`paper`), and at every point of a fixed grid of view "
        "sizes l and counts m (Algorithm 1's view selection at that l, m, its views drawn "
        "afresh in every repetition as the default draws its pilot); all on the "
        f"same queries and report seeds per repetition ({', '.join(map(str, reps))} "
        "repetitions of "
        f"{tasks[0].task.queries if tasks else 0} random k-way queries). SSE: sum of "
        "squared errors of a k-way marginal, mean ± standard error over repetitions. "
        "*best grid*: the grid point with the lowest mean SSE; *default / best* and "
        "*paper / best* divide by it; in parentheses the 90% interval of default / best "
        "by a paired bootstrap over repetitions (repetitions resampled together for every "
        "task, the best grid point chosen afresh in each resample, "
        f"{_BOOTSTRAP} resamples). *default / Alg. 1*: the default's mean SSE over "
        "Algorithm 1's, with its 90% interval by the same paired bootstrap. *predicted*: "
        "the default planner's own prediction "
        "of its SSE at the pilot profile's median dependence (mean over repetitions) and "
        "its ratio to the measured SSE; *expected*: its expectation over the profile's "
        "dependence quantiles, which the planner's choice weighs (an uninformed pilot's "
        "upper quantiles dominate it).",
        "",
    ]
    if plot:
        lines += ["![planner](figures/planner.png)", ""]
    for run in runs:
        lines.append(
            f"- run `{run['command']}`: {run['computed']} tasks computed in "
            f"{run['seconds']:.0f} s with {run['jobs']} worker(s), finished "
            f"{run['at']}"
        )
    if runs:
        lines.append("")
    lines += _summary_table(summary)
    ok = [r for r in summary if r["status"] == "ok" and math.isfinite(r["default_over_best"])]
    lines += _verdict(ok)
    lines += _time_table(ok)
    if timings:
        lines += [
            "",
            "## Planning time",
            "",
            "Median CPU seconds of one plan (n = 2^20, eps = 1, binary attributes) against "
            "Algorithm 1 on the same input: the default planner with the prior profile (no "
            "pilot) and with a pilot-like profile (skewed marginals, pair weights from them, "
            "an uncertain dependence: dependent designs are scored too); one BLAS thread.",
            "",
            "| d | k | default, prior (CPU-s) | default, pilot-like (CPU-s) "
            "| Algorithm 1 (CPU-s) |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {t['d']} | {t['k']} | {t['pipeline']:.3f} | {t['pilot']:.3f} | {t['paper']:.3f} |"
            for t in timings
        ]
    pairs = [
        (checks[t.task.key()], _stats(results.get(t.task.key()))[0])
        for t in tasks
        if t.role == "grid" and t.task.key() in checks
    ]
    pairs = [(p, m) for p, m in pairs if math.isfinite(m) and m > 0]
    if pairs:
        ratio = np.array([p / m for p, m in pairs])
        inside = int(((ratio >= 0.5) & (ratio <= 2.0)).sum())
        lines += [
            "",
            "## The error model with the data's own profile",
            "",
            "The *model* column of the grid below is the error model's prediction at each "
            "grid point from the data's exact marginals and every pair's dependence (what the "
            "planner would predict with a perfect pilot), averaged over the views of the "
            f"first {MODEL_DESIGNS} repetitions. Predicted / measured over all "
            f"{ratio.size} grid points: geometric mean {np.exp(np.log(ratio).mean()):.2f}, "
            f"{inside} of {ratio.size} within 2x, range {ratio.min():.2f} to {ratio.max():.2f}.",
        ]
    lines += _grid_table(tasks, results, summary, checks)
    return "\n".join(lines) + "\n"


def _mean_of(result: dict[str, Any] | None, key: str) -> float:
    """The mean over repetitions of a per-repetition figure of ``result`` (nan if none)."""
    values = [float(x) for x in (result or {}).get(key) or []]
    return float(np.mean(values)) if values else math.nan


def _verdict(ok: list[dict[str, Any]]) -> list[str]:
    """The ratios' summary and the settings above the target."""
    if not ok:
        return []
    lines: list[str] = []
    ratios = np.array([r["default_over_best"] for r in ok])
    paper = np.array([r["paper_over_best"] for r in ok])
    pred = np.array([r["median_over_measured"] for r in ok])
    expected = np.array([r["predicted_over_measured"] for r in ok])
    lines += [
        "",
        f"default / best grid: geometric mean {np.exp(np.log(ratios).mean()):.2f}, worst "
        f"{ratios.max():.2f}; Algorithm 1 / best grid: geometric mean "
        f"{np.exp(np.log(paper).mean()):.2f}, worst {paper.max():.2f}; predicted / "
        f"measured between {pred.min():.2f} and {pred.max():.2f} (expected / measured "
        f"{expected.min():.2f} to {expected.max():.2f}).",
    ]
    ranged = [r for r in ok if not math.isnan(r["range_low"])]
    outside = [r for r in ranged if not r["range_low"] <= r["default_sse"] <= r["range_high"]]
    if ranged:
        lines += [
            "",
            "The measured SSE lies within the default planner's own predicted range (its "
            "SSE at the 10% and at the 90% quantile of the profile's pair dependence, "
            f"mean over repetitions) in {len(ranged) - len(outside)} of {len(ranged)} "
            "settings; outside it: "
            + (
                ", ".join(
                    f"{r['setting']} eps {r['epsilon']:g} ({_fmt(r['default_sse'])} "
                    f"against {_fmt(r['range_low'])}-{_fmt(r['range_high'])})"
                    for r in outside
                )
                or "none"
            )
            + ".",
        ]
    above = [r for r in ok if r["default_over_best_lo"] > _TARGET]
    near = [
        r
        for r in ok
        if r["default_over_best"] > _TARGET and not r["default_over_best_lo"] > _TARGET
    ]
    lines += [
        "",
        f"Above the target of {_TARGET} x the best grid point: "
        + (", ".join(_label(r) for r in above) or "none")
        + " with the whole interval above it; "
        + (", ".join(_label(r) for r in near) or "none")
        + " above it in the mean only (the interval reaches below).",
    ]
    worse = [r for r in ok if r["default_over_paper_lo"] > 1.0]
    lines += [
        "",
        "Above Algorithm 1's SSE beyond the 90% interval of default / Algorithm 1: "
        + (
            ", ".join(
                f"{r['setting']} eps {r['epsilon']:g} ({r['default_over_paper']:.2f}, "
                f"{r['default_over_paper_lo']:.2f}-{r['default_over_paper_hi']:.2f})"
                for r in worse
            )
            or "none"
        )
        + ".",
    ]
    return lines


def _summary_table(summary: list[dict[str, Any]]) -> list[str]:
    """One row per setting: the default, the best grid point, Algorithm 1, Uniform and
    the default's predictions."""
    lines: list[str] = []
    lines += [
        "| setting | k | eps | default (l, m) | default SSE | best grid (l, m) | best SSE | "
        "default / best | Algorithm 1 (l, m) | Alg. 1 SSE | Alg. 1 / best | default / Alg. 1 | "
        "Uniform | predicted | predicted / measured | expected / measured |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in summary:
        if r["status"] != "ok":
            lines.append(
                f"| {r['setting']} | {r['k']} | {r['epsilon']:g} | {r['status']} |" + " |" * 11
            )
            continue
        pilot = f" + pilot {r['pilot_m']}" if r["pilot_m"] else ""
        lines.append(
            f"| {r['setting']} | {r['k']} | {r['epsilon']:g} | "
            f"({r['default_l']}, {r['default_m']}){pilot} | "
            f"{_fmt(r['default_sse'])} ± {_fmt(r['default_se'])} | "
            f"({r['best_l']}, {r['best_m']}) | {_fmt(r['best_sse'])} ± {_fmt(r['best_se'])} | "
            f"**{r['default_over_best']:.2f}**{_interval(r)} | ({r['paper_l']}, {r['paper_m']}) | "
            f"{_fmt(r['paper_sse'])} | {r['paper_over_best']:.2f} | "
            f"{r['default_over_paper']:.2f}{_interval(r, 'default_over_paper')} | "
            f"{_fmt(r['uniform_sse'])} | "
            f"{_fmt(r['median_sse'])} | {r['median_over_measured']:.2f} | "
            f"{r['predicted_over_measured']:.2f} |"
        )
    return lines


def _grid_table(
    tasks: list[PlannerTask],
    results: dict[str, dict[str, Any]],
    summary: list[dict[str, Any]],
    checks: dict[str, float],
) -> list[str]:
    """Every grid point's SSE, its ratio to the best, and the model's prediction."""
    lines = [
        "",
        "## Every grid point",
        "",
        "| setting | k | eps | (l, m) | SSE | / best | model | model / SSE |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in summary:
        group = [
            t
            for t in tasks
            if t.setting.label == r["setting"]
            and t.setting.k == r["k"]
            and t.epsilon == r["epsilon"]
            and t.role == "grid"
        ]
        for t in sorted(group, key=lambda t: (t.l or 0, t.m or 0)):
            mean, se = _stats(results.get(t.task.key()))
            if math.isfinite(mean):
                ratio = mean / r["best_sse"]
                model = checks.get(t.task.key(), math.nan)
                lines.append(
                    f"| {r['setting']} | {r['k']} | {r['epsilon']:g} | ({t.l}, {t.m}) | "
                    f"{_fmt(mean)} ± {_fmt(se)} | {ratio:.2f} | {_fmt(model)} | "
                    f"{model / mean:.2f} |"
                )
    return lines


def _time_table(ok: list[dict[str, Any]]) -> list[str]:
    """The seconds per repetition of the default and Algorithm 1, per setting."""
    timed = [r for r in ok if math.isfinite(r["default_seconds"] + r["paper_seconds"])]
    if not timed:
        return []
    lines = [
        "",
        "## Time per repetition",
        "",
        "Median wall seconds of one repetition of the default and of Algorithm 1 in the "
        "run above (same worker pool, same reports and queries): the pilot, planning, "
        "collecting, reconstruction and the answers.",
        "",
        "| setting | k | eps | default (s) | Algorithm 1 (s) | default / Alg. 1 |",
        "|---|---|---|---|---|---|",
    ]
    for r in timed:
        ours, theirs = r["default_seconds"], r["paper_seconds"]
        lines.append(
            f"| {r['setting']} | {r['k']} | {r['epsilon']:g} | {ours:.2f} | "
            f"{theirs:.2f} | {ours / theirs:.2f} |"
        )
    return lines


def _interval(row: dict[str, Any], ratio: str = "default_over_best") -> str:
    """`` (lo-hi)``: the interval of a ratio (default / best), or nothing when there is
    none."""
    lo, hi = row[f"{ratio}_lo"], row[f"{ratio}_hi"]
    return f" ({lo:.2f}-{hi:.2f})" if math.isfinite(lo) else ""


def _label(row: dict[str, Any]) -> str:
    return f"{row['setting']} eps {row['epsilon']:g}{_interval(row)}"


def _plot(summary: list[dict[str, Any]], path: Path) -> Path:
    from .plots import pyplot

    plt = pyplot()
    ok = [r for r in summary if r["status"] == "ok" and math.isfinite(r["default_over_best"])]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(ok) + 2), 4.2))
    x = np.arange(len(ok))
    ax.bar(x - 0.2, [r["default_over_best"] for r in ok], 0.4, label="default planner")
    ax.bar(x + 0.2, [r["paper_over_best"] for r in ok], 0.4, label="Algorithm 1")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.axhline(1.15, color="gray", lw=0.8, ls="--", label="1.15x the best grid point")
    ax.set_yscale("log")
    ax.set_ylabel("SSE / best grid point")
    ax.set_xticks(
        x,
        [f"{r['setting'].split(',')[0]}\neps {r['epsilon']:g}" for r in ok],
        rotation=90,
        fontsize=7,
    )
    ax.legend(fontsize=8)
    ax.set_title("Planner vs the best fixed (l, m)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
