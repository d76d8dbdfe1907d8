"""Served variances against the real spread of the served answers.

    python benchmarks/bench_uncertainty.py [--reps 400] [--bases 5]

One fixed population (24,000 users, 5 attributes of 2-3 categories, 6 pair views)
is collected ``--reps`` times with the real client perturbation; the per-cell
variance of each served answer over those runs is the *empirical* variance. For
``--bases`` of the runs, the variance the service would serve is compared with it
(sum over the answer's cells, ratio served / empirical; median and range over the
bases):

- *before*: what the service served until now: for a projection, the covering
  view's f-independent variance times the cells summed (eqs. 1, 2); nothing
  (NaN) for a max-ent answer;
- *bootstrap B*: the noise-only parametric bootstrap of the whole reconstruction
  with B replicates (``plug_in="served"``, :mod:`calmkit_aggregator.reconstruction.uncertainty`);
  the total error the service serves is measured by ``bench_coverage.py``.

A second table checks the closed form for one view's raw estimate: the frequent
cell's variance from the f-independent formula and from the exact plug-in one
(:meth:`MarginalTable.cell_variance`), against the empirical one.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from calmkit_aggregator.reconstruction.estimate import estimate_views
from calmkit_aggregator.reconstruction.pipeline import reconstruct
from calmkit_aggregator.reconstruction.support import SupportCounts
from calmkit_aggregator.reconstruction.uncertainty import bootstrap
from calmkit_client import Plan, Schema

QUERIES = {"projection (0,1)": (0, 1), "max-ent (0,1,2)": (0, 1, 2)}


def population(eps: float) -> tuple[Plan, np.ndarray, list[np.ndarray]]:
    rng = np.random.default_rng(3)
    schema = Schema.from_sizes([2, 3, 2, 2, 3])
    n = 24_000
    a = rng.integers(0, 2, n)
    b = (a + rng.integers(0, 2, n)) % 3
    c = (b > 0).astype(np.int64) ^ (rng.random(n) < 0.2)
    d = rng.integers(0, 2, n)
    e = np.where(rng.random(n) < 0.7, (a + d) % 3, rng.integers(0, 3, n))
    codes = np.stack([a, b, c, d, e], axis=1)
    plan = Plan(schema, eps, [(0, 1), (1, 2), (2, 3), (3, 4), (0, 4), (0, 2)], seed=0)
    views = plan.assign_many(np.arange(n, dtype=np.uint64))
    per_view = np.bincount(views, minlength=plan.m).astype(np.int64)
    truth = [
        np.bincount(schema.cell_index(codes[views == j], v), minlength=plan.view_oracles[j].L)
        for j, v in enumerate(plan.views)
    ]
    return plan, per_view, truth


def perturbed(
    plan: Plan, n: np.ndarray, truth: list[np.ndarray], gen: np.random.Generator
) -> SupportCounts:
    counts = []
    for oracle, cells in zip(plan.view_oracles, truth):
        counts.append(oracle.support(oracle.perturb(np.repeat(np.arange(oracle.L), cells), gen)))
    return SupportCounts(plan, n, tuple(counts))


def before(estimator_tables: list, query: tuple[int, ...]) -> float:
    covering = [t for t in estimator_tables if set(query) <= set(t.attrs)]
    if not covering:
        return float("nan")
    best = min((t.project(query) for t in covering), key=lambda t: t.variance)
    return best.variance * best.cells


def fmt(ratios: list[float]) -> str:
    if np.all(np.isnan(ratios)):
        return "none"
    return f"{np.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=400)
    ap.add_argument("--bases", type=int, default=5)
    args = ap.parse_args()
    t0 = time.perf_counter()
    print(
        f"# served / empirical variance ({args.reps} collections; median (range) over "
        f"{args.bases} served answers)\n"
    )
    print("| eps | answer | empirical (sum) | before | bootstrap 32 | bootstrap 200 |")
    print("|---|---|---|---|---|---|")
    raw_rows = []
    for eps in (0.5, 1.0, 3.0):
        plan, n, truth = population(eps)
        gen = np.random.default_rng(8)
        supports = [perturbed(plan, n, truth, gen) for _ in range(args.reps)]
        runs = [reconstruct(s) for s in supports]
        bases = list(range(args.bases))
        boots = {
            b: [bootstrap(supports[i], runs[i], b, rng=i, plug_in="served") for i in bases]
            for b in (32, 200)
        }
        for label, q in QUERIES.items():
            emp = np.stack([r.answer(q).values for r in runs]).var(axis=0, ddof=1).sum()
            old = [before(estimate_views(supports[i]), q) / emp for i in bases]
            new = {b: [bt.variance(q).sum() / emp for bt in boots[b]] for b in boots}
            print(
                f"| {eps:g} | {label} | {emp:.3g} | {fmt(old)} | {fmt(new[32])} | {fmt(new[200])} |"
            )
        # one view's raw estimate: its most frequent cell
        j = 0
        est = np.stack([estimate_views(s)[j].values.reshape(-1) for s in supports])
        cell = int(np.argmax(truth[j]))
        emp_cell = est[:, cell].var(ddof=1)
        tables = [estimate_views(supports[i])[j] for i in bases]
        exact = [t.cell_variance().reshape(-1)[cell] / emp_cell for t in tables]
        flat = tables[0].variance / emp_cell
        raw_rows.append((eps, plan.view_oracles[j].name, plan.view_oracles[j].L, flat, exact))
    print("\n# one view's raw estimate, its most frequent cell: served / empirical\n")
    print("| eps | oracle | L | f-independent (before) | exact plug-in |")
    print("|---|---|---|---|---|")
    for eps, name, L, flat, exact in raw_rows:
        print(f"| {eps:g} | {name} | {L} | {flat:.2f} | {fmt(exact)} |")
    print(f"\n{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
