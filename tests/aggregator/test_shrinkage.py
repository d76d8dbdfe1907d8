"""Interaction shrinkage: its degrees of freedom, exactness without noise, consistency
and non-negativity kept, and no spurious signal on an independent population."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest
from scipy import stats

from calmkit_aggregator import MarginalTable, estimate_views, make_consistent
from calmkit_aggregator.reconstruction import intersection_closure
from calmkit_aggregator.reconstruction.shrinkage import interaction_dof, shrink_interactions
from calmkit_client import Plan, Schema
from calmkit_simulator import Population, collect_support, synthetic_population
from tests.stats import z_bound


def _marginal_rank(sizes: tuple[int, ...], shared: list[tuple[int, ...]]) -> int:
    """Rank of the linear maps "cell table -> its marginal over s" for every shared s,
    with the total: the dimension those marginals pin down."""
    cells = int(np.prod(sizes))
    rows = [np.ones(cells)]
    for s in shared:
        idx = np.indices(sizes).reshape(len(sizes), -1)
        key = np.ravel_multi_index(idx[list(s)], [sizes[a] for a in s])
        rows.extend((key == v).astype(float) for v in range(int(np.prod([sizes[a] for a in s]))))
    return int(np.linalg.matrix_rank(np.array(rows)))


def _contrast(plan: Plan, support) -> list[float]:
    return [o.contrast_variance(int(n)) for o, n in zip(plan.view_oracles, support.n)]


@pytest.mark.parametrize(
    "sizes, shared",
    [
        ((2, 2), [(0,), (1,)]),
        ((3, 4), [(0,), (1,)]),
        ((2, 2, 2), [(0, 1), (1, 2), (0, 2)]),
        ((2, 3, 4), [(0, 1), (2,)]),
        ((3, 2, 2, 3), [(0, 1, 2), (2, 3), (0,)]),
        ((2, 2, 2), []),
    ],
)
def test_interaction_dof_is_the_unpinned_dimension(sizes, shared) -> None:
    expected = math.prod(sizes) - _marginal_rank(sizes, shared)
    assert interaction_dof(dict(enumerate(sizes)), shared) == expected


def test_exact_views_are_unchanged() -> None:
    pop = synthetic_population(n=5000, sizes=(2, 3, 2, 2), strength=1.5, rng=1)
    tables = [MarginalTable(v, pop.marginal(v), 0.0, pop.n) for v in [(0, 1), (1, 2), (2, 3)]]
    shrunk = shrink_interactions(tables, [0.0] * len(tables))
    np.testing.assert_array_equal(shrunk.factors, 1.0)
    for a, b in zip(tables, shrunk.tables):
        np.testing.assert_allclose(b.values, a.values, atol=1e-12)


def test_shrunk_views_stay_consistent_and_nonnegative() -> None:
    pop = synthetic_population(n=20_000, sizes=(2, 3, 2, 2, 3), strength=1.0, rng=4)
    plan = Plan(pop.schema, 0.5, [(0, 1), (1, 2, 3), (3, 4), (0, 4), (0, 2)], seed=1)
    support = collect_support(pop, plan, 3)
    views = make_consistent(estimate_views(support), max_iter=1000)
    shrunk = shrink_interactions(views.tables, _contrast(plan, support))
    assert np.all((shrunk.factors >= 0) & (shrunk.factors <= 1))
    for t in shrunk.tables:
        assert t.values.min() >= 0 and t.values.sum() == pytest.approx(1.0, abs=1e-9)
    for attrs in intersection_closure(plan.views):
        before = [t.project(attrs).values for t in views.tables if set(attrs) <= set(t.attrs)]
        after = [t.project(attrs).values for t in shrunk.tables if set(attrs) <= set(t.attrs)]
        for b, a in zip(before, after):
            np.testing.assert_allclose(a, b, atol=1e-9)


def test_factors_on_an_independent_population_follow_the_noise_law() -> None:
    # Every pair is independent, so each view's spread around its max-ent base is
    # noise: X = ||T - base||^2 / c ~ chi^2_1 (c: the oracle's contrast variance; the
    # noise is a sum of many reports, so near normal) and the factor is max(0, 1 - 1/X).
    # The mean factor over m views must then lie within z sd / sqrt(m) of its
    # expectation. An under-estimated noise power would push it up, an over-estimated
    # one down.
    d, n = 24, 2**17
    gen = np.random.default_rng(5)
    probs = gen.uniform(0.1, 0.9, d)
    codes = (gen.random((n, d)) < probs).astype(np.uint8)
    pop = Population(Schema.from_sizes((2,) * d), codes, name="independent")
    views = list(itertools.combinations(range(d), 2))
    plan = Plan(pop.schema, 1.0, views, seed=2)
    support = collect_support(pop, plan, 6)
    tables = make_consistent(estimate_views(support)).tables
    factors = shrink_interactions(tables, _contrast(plan, support)).factors
    chi2 = stats.chi2(1)
    mean = chi2.expect(lambda x: 1 - 1 / x, lb=1)
    sd = math.sqrt(chi2.expect(lambda x: (1 - 1 / x) ** 2, lb=1) - mean**2)
    assert abs(factors.mean() - mean) <= z_bound(1) * sd / math.sqrt(len(views))


def test_a_view_inside_another_is_left_whole_and_stays_consistent() -> None:
    # (0, 1) lies inside (0, 1, 2): all of it is shared, so shrinking it alone toward its
    # 1-way margins would break its agreement with the larger view's projection.
    pop = synthetic_population(n=20_000, sizes=(2, 3, 2, 2), strength=1.5, rng=8)
    plan = Plan(pop.schema, 0.5, [(0, 1), (0, 1, 2), (2, 3)], seed=3)
    support = collect_support(pop, plan, 9)
    views = make_consistent(estimate_views(support), max_iter=1000)
    shrunk = shrink_interactions(views.tables, _contrast(plan, support))
    assert shrunk.factors[0] == 1.0
    np.testing.assert_array_equal(shrunk.tables[0].values, views.tables[0].values)
    np.testing.assert_allclose(
        shrunk.tables[1].project((0, 1)).values, shrunk.tables[0].values, atol=1e-9
    )


def test_the_factor_is_the_positive_part_james_stein_one() -> None:
    # one 3x4 view: nothing shared but its margins, so the base is their product and
    # dim = (3-1)(4-1) = 6; lambda = max(0, 1 - c * 6 / ||T - base||^2)
    rng = np.random.default_rng(3)
    values = rng.dirichlet(np.ones(12)).reshape(3, 4)
    base = np.outer(values.sum(axis=1), values.sum(axis=0))
    spread = float(((values - base) ** 2).sum())
    table = MarginalTable((0, 1), values, 1e-3)
    for c in (0.05 * spread / 6, 0.5 * spread / 6, 2.0 * spread / 6):
        shrunk = shrink_interactions([table], [c])
        expected = max(0.0, 1.0 - c * 6 / spread)
        assert shrunk.factors[0] == pytest.approx(expected, rel=1e-9, abs=1e-12)
        np.testing.assert_allclose(
            shrunk.tables[0].values, base + expected * (values - base), atol=1e-12
        )


def test_views_without_doubt_are_left_exactly_as_they_are() -> None:
    # one attribute (nothing unshared), an exact view (c = 0): factor 1, values untouched
    rng = np.random.default_rng(4)
    one = MarginalTable((2,), np.array([0.25, 0.75]), 1e-3)  # its own base, exactly
    exact = MarginalTable((0, 1), rng.dirichlet(np.ones(6)).reshape(2, 3), 0.0)
    shrunk = shrink_interactions([one, exact], [0.01, 0.0])
    np.testing.assert_array_equal(shrunk.factors, [1.0, 1.0])
    np.testing.assert_array_equal(shrunk.tables[0].values, one.values)
    np.testing.assert_array_equal(shrunk.tables[1].values, exact.values)


def test_a_view_at_its_base_gets_factor_zero_and_noise_1_shrinks_fully() -> None:
    # a uniform view is its own max-ent base (exactly, in binary): no spread, lambda = 0
    # (the formula's limit)
    flat = MarginalTable((0, 1), np.full((2, 2), 0.25), 1e-3)
    shrunk = shrink_interactions([flat], [0.01])
    assert shrunk.factors[0] == 0.0
    np.testing.assert_array_equal(shrunk.tables[0].values, flat.values)
    # noise power 1 per dimension dwarfs any spread of a distribution: all the way
    rng = np.random.default_rng(5)
    view = MarginalTable((0, 1), rng.dirichlet(np.ones(6)).reshape(2, 3), 1e-3)
    shrunk = shrink_interactions([view], [1.0])
    assert shrunk.factors[0] == 0.0
    margins = np.outer(view.values.sum(axis=1), view.values.sum(axis=0))
    np.testing.assert_allclose(shrunk.tables[0].values, margins, atol=1e-12)


def test_the_base_is_max_ent_to_1e_12_within_1000_sweeps(monkeypatch: pytest.MonkeyPatch) -> None:
    import calmkit_aggregator.reconstruction.shrinkage as shrinkage

    seen = []
    real = shrinkage.maximum_entropy

    def spy(shape, constraints, tol, max_iter):  # type: ignore[no-untyped-def]
        seen.append((tol, max_iter))
        return real(shape, constraints, tol, max_iter)

    monkeypatch.setattr(shrinkage, "maximum_entropy", spy)
    view = MarginalTable((0, 1), np.array([[0.3, 0.2], [0.1, 0.4]]), 1e-3)
    shrink_interactions([view], [0.001])
    assert seen == [(1e-12, 1000)]


def test_shrunk_views_are_frozen() -> None:
    view = MarginalTable((0, 1), np.array([[0.3, 0.2], [0.1, 0.4]]), 1e-3)
    shrunk = shrink_interactions([view], [0.001])
    with pytest.raises(dataclasses.FrozenInstanceError):
        shrunk.factors = np.ones(1)  # type: ignore[misc]
