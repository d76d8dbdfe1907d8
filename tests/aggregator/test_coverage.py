"""Coverage of the served error bars over repeated collections (fixed seeds).

The served per-cell ``variance`` is a mean squared total error, so the interval
``answer +- 1.96 sqrt(variance)`` should hold the population's true marginal in at
least 95% of cells. Cells of one table are correlated, so the runs, not the cells,
count as the independent trials: if every run covered at least 95% of its cells in
expectation, the observed share over ``R`` runs falls below
``0.95 - Z sqrt(0.95 * 0.05 / R)`` with probability below 0.1% (``Z = 3.09``, normal
approximation of the binomial, whose variance bounds a share's). Each test also checks
that the bound has power: the noise-only bootstrap (what the service served before,
replicates drawn from the served reconstruction) fails it where the bias is visible.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from calmkit_aggregator.reconstruction.pipeline import reconstruct
from calmkit_aggregator.reconstruction.support import SupportCounts
from calmkit_aggregator.reconstruction.uncertainty import bootstrap, sample_support
from calmkit_client import Plan, Schema

NOMINAL, Z = 0.95, 3.09


def coverage_floor(runs: int) -> float:
    """The share of covered cells below which a 95% interval is rejected (module
    docstring)."""
    return NOMINAL - Z * math.sqrt(NOMINAL * (1 - NOMINAL) / runs)


def _chain(n: int, rng: np.random.Generator) -> np.ndarray:
    """Four binary attributes, each copying the previous one 85% of the time: a pair
    two links apart is dependent, though no pair view holds it."""
    a = rng.integers(0, 2, n)
    b = np.where(rng.random(n) < 0.85, a, 1 - a)
    c = np.where(rng.random(n) < 0.85, b, 1 - b)
    d = np.where(rng.random(n) < 0.8, c, rng.integers(0, 2, n))
    return np.stack([a, b, c, d], axis=1)


def _collection(n: int, eps: float) -> tuple[Plan, np.ndarray, list[np.ndarray], np.ndarray]:
    """A plan of three chained pair views over a fixed population: users per view,
    each view's true cell counts, and the population's codes."""
    schema = Schema.from_sizes([2, 2, 2, 2])
    codes = _chain(n, np.random.default_rng(0))
    plan = Plan(schema, eps, [(0, 1), (1, 2), (2, 3)], seed=0)
    views = plan.assign_many(np.arange(n, dtype=np.uint64))
    per_view = np.bincount(views, minlength=plan.m).astype(np.int64)
    truth = [
        np.bincount(schema.cell_index(codes[views == j], v), minlength=plan.view_oracles[j].L)
        for j, v in enumerate(plan.views)
    ]
    return plan, per_view, truth, codes


def _marginal(codes: np.ndarray, query: tuple[int, ...]) -> np.ndarray:
    cells = np.ravel_multi_index(tuple(codes[:, a] for a in query), (2,) * len(query))
    return np.bincount(cells, minlength=2 ** len(query)).reshape((2,) * len(query)) / len(codes)


def _coverage(
    query: tuple[int, ...], runs: int, n: int, eps: float, noise_only: bool = False
) -> tuple[float, float]:
    """Shares of covered cells over ``runs`` collections: (served total error,
    noise-only bootstrap if ``noise_only``, else nan); 32 replicates, as served."""
    plan, per_view, truth, codes = _collection(n, eps)
    gen = np.random.default_rng(1)
    target = _marginal(codes, query)
    total = noise = 0
    for run in range(runs):
        support: SupportCounts = sample_support(plan, per_view, truth, gen)
        estimator = reconstruct(support)
        err = np.abs(estimator.answer(query).values - target)
        served = bootstrap(support, estimator, 32, rng=run)
        total += int((err <= 1.96 * np.sqrt(served.mean_squared_error(query, estimator))).sum())
        if noise_only:
            old = bootstrap(support, estimator, 32, rng=run, plug_in="served")
            noise += int((err <= 1.96 * np.sqrt(old.variance(query))).sum())
    cells = runs * target.size
    return total / cells, (noise / cells if noise_only else math.nan)


def test_max_ent_interval_covers_a_dependence_no_view_holds() -> None:
    """Pair (0, 2) is answered by max-ent as independent; the truth is not."""
    runs = 12
    served, noise_only = _coverage((0, 2), runs, n=1500, eps=1.0, noise_only=True)
    floor = coverage_floor(runs)
    assert served >= floor, (served, floor)
    assert noise_only < floor, (noise_only, floor)  # the bound has power


def test_projection_interval_covers_over_repeated_collections() -> None:
    runs = 12
    served, _ = _coverage((0, 1), runs, n=1500, eps=1.0)
    assert served >= coverage_floor(runs), (served, coverage_floor(runs))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("query", "eps"), [((0, 1), 0.5), ((0, 1, 2), 1.0), ((0, 2), 0.5), ((1, 3), 1.0)]
)
def test_total_error_interval_covers_over_many_collections(
    query: tuple[int, ...], eps: float
) -> None:
    runs = 60
    served, _ = _coverage(query, runs, n=1500, eps=eps)
    assert served >= coverage_floor(runs), (served, coverage_floor(runs))
