"""Consistency on noisy views from real reports: unbiased, agreeing, summing to 1."""

from __future__ import annotations

import numpy as np
import pytest

from calmkit_aggregator import MarginalTable, estimate_views, make_consistent, reconstruct
from calmkit_aggregator.reconstruction import intersection_closure
from calmkit_client import Plan
from calmkit_simulator import collect_support, synthetic_population, true_view_counts
from tests.stats import assert_z

POP = synthetic_population(n=20_000, sizes=(2, 3, 2, 2, 3), strength=1.0, rng=4)
# cyclic views with unequal sizes (and so unequal variances)
PLAN = Plan(POP.schema, 1.0, [(0, 1), (1, 2, 3), (3, 4), (0, 4), (0, 2)], seed=1)


def test_weighted_average_is_unbiased() -> None:
    # The consistency step is linear with fixed weights (variances depend on n_j only),
    # so its expectation is the same step applied to each view's users' true marginals.
    n, true_counts = true_view_counts(POP, PLAN)
    exact = [
        MarginalTable(t.attrs, (c / n[j]).reshape(t.values.shape), t.variance, t.n)
        for j, (t, c) in enumerate(zip(estimate_views(collect_support(POP, PLAN, 0)), true_counts))
    ]
    expected = make_consistent(exact, nonnegative=False).tables
    reps = 200
    rng = np.random.default_rng(10)
    runs = []
    for _ in range(reps):
        tables = estimate_views(collect_support(POP, PLAN, rng))
        runs.append(make_consistent(tables, nonnegative=False).tables)
    for j in range(PLAN.m):
        samples = np.stack([r[j].values.reshape(-1) for r in runs])
        truth = expected[j].values.reshape(-1)
        # z of the mean over repetitions against its empirical standard error
        assert_z(samples.mean(axis=0), truth, samples.var(axis=0, ddof=1) / reps)


def test_consistent_views_agree_and_sum_to_one() -> None:
    est = reconstruct(collect_support(POP, PLAN, 3), tol=1e-10, max_iter=1000)
    assert est.views.inconsistency <= 1e-9 and est.views.negativity <= 1e-9
    for t in est.views.tables:
        assert t.values.sum() == pytest.approx(1.0, abs=1e-9)
    for attrs in intersection_closure(PLAN.views):
        proj = [t.project(attrs).values for t in est.views.tables if set(attrs) <= set(t.attrs)]
        for p in proj[1:]:
            np.testing.assert_allclose(p, proj[0], atol=1e-9)
    ans = est.answer(["a1", "a4", "a2"])  # no view covers it: max-ent
    assert ans.method == "maxent" and ans.values.sum() == pytest.approx(1.0)
