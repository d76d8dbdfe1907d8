"""The margins' shrinkage towards uniform, against the pipeline without it and against
James-Stein's factor per margin.

    python benchmarks/bench_margin_shrinkage.py [--reps 10] [--data-dir DIR]

For every setting (dataset, eps, view size l, view count m, query size k) and
repetition: m views spread evenly over the attributes (``spread_views``, seed =
repetition), one draw of their reports, 50 random k-way queries (seed = repetition);
from the same support counts:

- **paper**: ``reconstruct(support, shrink=False)``, the paper's pipeline;
- **before** (the baseline): consistency, Norm-Sub and the interaction shrinkage
  without the margins' step, calmkit's default until the margins' step was added;
- **James-Stein**: each margin shrunk by James-Stein's factor alone
  (``shrink_margins(..., pooled=False)``), calmkit's default until 2026-11-28;
- **default**: ``reconstruct(support)``: each attribute's nearly flat margin (4 or more
  categories) shrunk towards uniform first (``shrink_margins``), by the law of the
  signal fitted over all those margins (``margin_prior``);
- **uniform**: every answer uniform (what the reports add nothing to).

*default / before* and *default / James-Stein* are ratios of mean SSEs with their 90%
intervals by a paired bootstrap over repetitions (2000 resamples, seed 0); *shrunk*:
the share of the attributes whose margin was shrunk and their mean factor. Binary and
3-category attributes are never shrunk, so settings with only those give exactly 1.00,
and with one attribute of 4 or more categories the two shrinkages are the same. SSE
means over repetitions (fractions). Writes ``docs/margin-shrinkage.md``. Post-processing only:
no privacy is spent.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from calmkit_aggregator import make_consistent, reconstruct
from calmkit_aggregator.planning.designs import spread_views
from calmkit_aggregator.reconstruction.estimate import contrast_variances, estimate_views
from calmkit_aggregator.reconstruction.pipeline import MarginalEstimator
from calmkit_aggregator.reconstruction.shrinkage import shrink_interactions, shrink_margins
from calmkit_client import Plan
from calmkit_simulator.collect import collect_support
from calmkit_simulator.datasets import load_dataset
from calmkit_simulator.experiment import random_queries, sse

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "margin-shrinkage.md"
# (dataset, load options, n or None, eps, l, m, k)
SETTINGS = [
    ("synthetic:30-40", {"d": 4}, 2_000, 0.2, 1, 4, 2),
    ("synthetic:30-40", {"d": 8}, 20_000, 0.5, 1, 8, 3),
    ("synthetic:8-40", {"d": 20}, 100_000, 1.0, 1, 20, 3),
    ("synthetic:8-40", {"d": 20}, 100_000, 1.0, 2, 100, 3),
    # few users for many categories: 30 attributes of 2-20 categories at 10,000 users
    ("synthetic:2-20", {"d": 30}, 10_000, 1.0, 1, 30, 3),
    ("synthetic:2-20", {"d": 30}, 10_000, 2.0, 1, 30, 3),
    ("synthetic:2-20", {"d": 17}, 27_000, 1.0, 2, 34, 3),
    ("adult", {"max_categories": 20}, 27_000, 0.5, 1, 15, 3),
    ("adult", {}, None, 0.5, 1, 15, 3),
    ("adult", {}, None, 1.0, 1, 15, 3),
    ("adult", {}, None, 2.0, 1, 15, 3),
    ("adult", {}, None, 1.0, 2, 45, 3),
    ("adult", {}, None, 0.5, 1, 15, 2),
    ("demo", {}, 20_000, 1.0, 2, 20, 3),
    ("nltcs", {}, None, 1.0, 2, 32, 3),
]


def _before(support) -> MarginalEstimator:  # type: ignore[no-untyped-def]
    """The pipeline without the margins' step (the baseline)."""
    views = make_consistent(estimate_views(support))
    shrunk = shrink_interactions(views.tables, contrast_variances(support), closure=views.closure)
    return MarginalEstimator(support.plan, replace(views, tables=shrunk.tables))


def _james_stein(support) -> MarginalEstimator:  # type: ignore[no-untyped-def]
    """The pipeline with each margin shrunk by James-Stein's factor alone."""
    contrast = contrast_variances(support)
    margins = shrink_margins(estimate_views(support), contrast, pooled=False)
    views = make_consistent(margins.tables)
    shrunk = shrink_interactions(views.tables, contrast, closure=views.closure)
    return MarginalEstimator(support.plan, replace(views, tables=shrunk.tables))


def _ratio_interval(new: np.ndarray, old: np.ndarray) -> tuple[float, float]:
    gen = np.random.default_rng(0)
    idx = gen.integers(0, new.size, (2000, new.size))
    ratios = new[idx].mean(axis=1) / old[idx].mean(axis=1)
    return float(np.quantile(ratios, 0.05)), float(np.quantile(ratios, 0.95))


def _setting(name, options, n, eps, l, m, k, reps, data_dir):  # type: ignore[no-untyped-def]  # noqa: E741
    population = load_dataset(name, data_dir, rng=0, **options)
    if n is not None and n != population.n:
        population = population.resample(n, rng=0)
    keys = ("paper", "before", "james_stein", "default", "uniform")
    sums: dict[str, list[float]] = {key: [] for key in keys}
    shares, factors = [], []
    for rep in range(reps):
        views = spread_views(range(population.schema.d), l, m, rng=rep)
        plan = Plan(population.schema, eps, views, seed=rep)
        support = collect_support(population, plan, np.random.default_rng([11, rep]))
        queries = random_queries(population.schema.d, k, 50, np.random.default_rng([12, rep]))
        truths = [population.marginal(q) for q in queries]
        lam = shrink_margins(estimate_views(support), contrast_variances(support)).factors
        shrunk = [f for f in lam.values() if f < 1]
        shares.append(len(shrunk) / len(lam))
        factors.extend(shrunk)
        for key, est in (
            ("paper", reconstruct(support, shrink=False)),
            ("before", _before(support)),
            ("james_stein", _james_stein(support)),
            ("default", reconstruct(support)),
        ):
            sums[key].append(
                float(np.mean([sse(t, est.answer(q).values) for q, t in zip(queries, truths)]))
            )
        sums["uniform"].append(
            float(np.mean([sse(t, np.full(t.shape, 1 / t.size)) for t in truths]))
        )
    arr = {key: np.array(v) for key, v in sums.items()}
    sizes = population.schema.sizes
    return {
        "data": f"{name} (n={population.n}, d={population.schema.d}, "
        f"{min(sizes)}-{max(sizes)} categories)",
        "eps": eps,
        "k": k,
        "l, m": f"{l}, {m}",
        **{key: float(a.mean()) for key, a in arr.items()},
        "ratio": float(arr["default"].mean() / arr["before"].mean()),
        "interval": _ratio_interval(arr["default"], arr["before"]),
        "js_ratio": float(arr["default"].mean() / arr["james_stein"].mean()),
        "js_interval": _ratio_interval(arr["default"], arr["james_stein"]),
        "shrunk": float(np.mean(shares)),
        "factor": float(np.mean(factors)) if factors else float("nan"),
    }


def _table(rows: list[dict[str, object]]) -> list[str]:
    lines = [
        "| data | eps | k | l, m | paper | before | James-Stein | **default** | uniform "
        "| default / before | default / James-Stein | shrunk (mean factor) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lo, hi = r["interval"]  # type: ignore[misc]
        js_lo, js_hi = r["js_interval"]  # type: ignore[misc]
        factor = "" if np.isnan(r["factor"]) else f" ({r['factor']:.2f})"  # type: ignore[call-overload]
        lines.append(
            f"| {r['data']} | {r['eps']} | {r['k']} | {r['l, m']} | {r['paper']:.3g} | "
            f"{r['before']:.3g} | {r['james_stein']:.3g} | **{r['default']:.3g}** | "
            f"{r['uniform']:.3g} | {r['ratio']:.2f} ({lo:.2f}-{hi:.2f}) | "
            f"**{r['js_ratio']:.2f}** ({js_lo:.2f}-{js_hi:.2f}) | {r['shrunk']:.0%}{factor} |"
        )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--out", type=Path, default=DOC)
    args = ap.parse_args()
    start = time.perf_counter()
    rows = []
    for setting in SETTINGS:
        try:
            rows.append(_setting(*setting, args.reps, args.data_dir))
        except Exception as exc:  # a dataset folder absent: say so, run the rest
            print(f"skipped {setting[0]}: {exc}")
            continue
        print("\n".join(_table(rows)[-1:]), flush=True)
    text = [
        "# Margin shrinkage",
        "",
        f"Generated by `python benchmarks/bench_margin_shrinkage.py --reps {args.reps}` "
        f"(do not edit by hand; {time.perf_counter() - start:.0f} s), "
        f"{args.reps} repetitions.",
        "",
        __doc__.split("\n\n", 2)[2].replace("Writes ``docs/margin-shrinkage.md``. ", "").strip(),
        "",
        *_table(rows),
        "",
    ]
    args.out.write_text("\n".join(text))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
