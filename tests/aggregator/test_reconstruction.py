"""Noiseless recovery: exact marginals in, exact answers out (consistency, projection,
maximum entropy), over tree, cyclic, missing-attribute and duplicate view sets."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from calmkit_aggregator.reconstruction.consistency import (
    intersection_closure,
    make_consistent,
    norm_sub,
)
from calmkit_aggregator.reconstruction.marginal import MarginalTable
from calmkit_aggregator.reconstruction.maxent import answer_query

SIZES = (2, 3, 2, 4, 3)
VIEW_SETS = {
    "tree": [(0, 1), (1, 2), (1, 3), (3, 4)],
    "cycle": [(0, 1), (1, 2), (2, 3), (0, 3)],
    "missing-attribute": [(0, 1, 2), (1, 2, 3)],  # attribute 4 in no view
    "duplicate": [(0, 1, 2), (0, 1, 2), (2, 3, 4)],
    "nested": [(0, 1, 2, 3), (1, 2), (3, 4)],
}


def _joint(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(int(np.prod(SIZES)), 0.5)).reshape(SIZES)
    return p


def _marginal(joint: np.ndarray, attrs: tuple[int, ...]) -> np.ndarray:
    drop = tuple(i for i in range(joint.ndim) if i not in attrs)
    return joint.sum(axis=drop)


def _tables(joint: np.ndarray, views: list[tuple[int, ...]]) -> list[MarginalTable]:
    return [MarginalTable(v, _marginal(joint, v), 1e-4, 1000) for v in views]


@pytest.mark.parametrize("name", VIEW_SETS)
def test_consistency_changes_nothing_on_exact_views(name: str) -> None:
    joint = _joint(1)
    tables = _tables(joint, VIEW_SETS[name])
    result = make_consistent(tables)
    assert result.iterations == 1 and result.inconsistency <= 1e-12
    assert result.negativity == 0.0  # every cell > 0: "0 if none", not minus the least
    for before, after in zip(tables, result.tables):
        np.testing.assert_allclose(after.values, before.values, atol=1e-15)


@pytest.mark.parametrize("name", VIEW_SETS)
def test_query_inside_a_view_is_answered_exactly(name: str) -> None:
    joint = _joint(2)
    tables = _tables(joint, VIEW_SETS[name])
    for view in VIEW_SETS[name]:
        for k in range(1, len(view) + 1):
            for q in itertools.combinations(view, k):
                ans = answer_query(tables, q, [SIZES[a] for a in q])
                assert ans.method == "projection"
                np.testing.assert_allclose(ans.values, _marginal(joint, q), atol=1e-15)


@pytest.mark.parametrize("name", VIEW_SETS)
def test_maxent_reproduces_every_constraint(name: str) -> None:
    joint = _joint(3)
    views = VIEW_SETS[name]
    tables = _tables(joint, views)
    query = (0, 1, 2, 3, 4)
    ans = answer_query(tables, query, SIZES, tol=1e-12, max_iter=5000)
    assert ans.method == "maxent" and ans.residual <= 1e-12
    assert ans.values.sum() == pytest.approx(1.0, abs=1e-12)
    for view in views:
        np.testing.assert_allclose(_marginal(ans.values, view), _marginal(joint, view), atol=1e-10)
    if name == "missing-attribute":  # no information on attribute 4: uniform given the rest
        cond = ans.values / ans.values.sum(axis=4, keepdims=True)
        np.testing.assert_allclose(cond, 1 / 3, atol=1e-12)


def test_maxent_is_exact_for_a_product_distribution() -> None:
    rng = np.random.default_rng(4)
    factors = [rng.dirichlet(np.ones(s)) for s in SIZES]
    joint = np.einsum("a,b,c,d,e->abcde", *factors)
    tables = _tables(joint, [(0, 1), (2, 3), (3, 4), (1, 4)])
    for query in [(0, 2), (0, 2, 4), (0, 1, 2, 3, 4), (1, 2, 3)]:
        ans = answer_query(tables, query, [SIZES[a] for a in query], tol=1e-13)
        np.testing.assert_allclose(ans.values, _marginal(joint, query), atol=1e-12)


def test_maxent_is_exact_on_a_junction_tree() -> None:
    # a chain 0-1-2-3 Markov distribution is the max-ent fit of its pair marginals
    rng = np.random.default_rng(5)
    p0 = rng.dirichlet(np.ones(2))
    t01, t12, t23 = (rng.dirichlet(np.ones(b), size=a) for a, b in [(2, 3), (3, 2), (2, 4)])
    joint = np.einsum("a,ab,bc,cd->abcd", p0, t01, t12, t23)
    tables = [MarginalTable(v, _marginal(joint, v), 1e-4) for v in [(0, 1), (1, 2), (2, 3)]]
    ans = answer_query(tables, (0, 1, 2, 3), (2, 3, 2, 4), tol=1e-13)
    np.testing.assert_allclose(ans.values, joint, atol=1e-12)


def test_closure_includes_nested_intersections_and_empty_set() -> None:
    closure = intersection_closure([(0, 1, 2), (1, 2, 3), (2, 3, 4), (5, 6)])
    assert closure == [(), (2,), (1, 2), (2, 3)]  # (2,) = (1, 2) & (2, 3); no view itself
    assert intersection_closure([(0, 1), (0, 1)]) == [(), (0, 1)]
    # a view inside another is its own intersection with it; views that share nothing
    assert intersection_closure([(0, 1, 2, 3), (1, 2), (3, 4)]) == [(), (3,), (1, 2)]
    assert intersection_closure([(0, 1), (2, 3)]) == [()]


@pytest.mark.parametrize("extra", [[(0, 2, 4)], [(1, 2), (1, 2), (0, 1, 2)]])
def test_consistency_on_noisy_views_agrees_everywhere_and_sums_to_one(extra) -> None:
    # a cycle and a triple; or views inside others and a repeated one
    joint = _joint(6)
    rng = np.random.default_rng(7)
    views = VIEW_SETS["cycle"] + extra
    noisy = [
        MarginalTable(
            v, _marginal(joint, v) + rng.normal(0, 0.02, [SIZES[a] for a in v]), 4e-4, 1000
        )
        for v in views
    ]
    result = make_consistent(noisy, tol=1e-9, max_iter=500)
    assert result.inconsistency <= 1e-9 and result.negativity <= 1e-9
    for t in result.tables:
        assert t.values.sum() == pytest.approx(1.0, abs=1e-9)
    closure = intersection_closure(views)
    for attrs in closure:
        projections = [t.project(attrs).values for t in result.tables if set(attrs) <= set(t.attrs)]
        for a in projections[1:]:
            np.testing.assert_allclose(a, projections[0], atol=1e-9)


def test_norm_sub_is_the_simplex_projection() -> None:
    v = np.array([0.5, 0.4, -0.1, 0.3])
    out = norm_sub(v)
    assert out.sum() == pytest.approx(1.0) and out.min() >= 0
    # three positive cells share the excess 0.2: delta = 0.2 / 3
    np.testing.assert_allclose(out, [0.5 - 0.2 / 3, 0.4 - 0.2 / 3, 0.0, 0.3 - 0.2 / 3], atol=1e-12)
