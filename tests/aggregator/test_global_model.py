"""The global model: noiseless recovery (exact marginals in, exact answers out for
every query, not only those inside a view) on trees, cycles and overlapping cliques;
a distribution with a known junction tree; the clique cap; non-negativity; refusal of
oversized dense answers; junction-tree invariants."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from calmkit_aggregator.reconstruction.global_model import (
    fit_global,
    i_projection,
    reconstruct_global,
)
from calmkit_aggregator.reconstruction.junction import (
    TableTooLarge,
    fit_maxent,
    junction_tree,
    project,
)
from calmkit_aggregator.reconstruction.marginal import MarginalTable
from calmkit_aggregator.reconstruction.maxent import maximum_entropy, query_constraints
from calmkit_aggregator.reconstruction.pipeline import reconstruct
from calmkit_client import CalmkitError, Plan, Schema

SIZES = (2, 3, 2, 3, 2, 2)
ALL = tuple(range(len(SIZES)))
VIEW_SETS = {
    "tree": [(0, 1), (1, 2), (1, 3), (3, 4), (4, 5)],
    "cycle": [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (0, 5)],
    "overlapping": [(0, 1, 2), (1, 2, 3), (2, 3, 4), (0, 4, 5), (1, 5)],
    "missing-attribute": [(0, 1, 2), (1, 2, 3), (3, 4)],  # attribute 5 in no view
    "duplicate": [(0, 1), (0, 1), (1, 2, 3), (3, 4, 5), (2, 3)],
}
TOL = 1e-12


def _log_linear(views: list[tuple[int, ...]], seed: int) -> np.ndarray:
    """A joint that factorises over ``views`` (random log-potentials): the maximum-
    entropy distribution given its own view marginals, so the model can recover it."""
    rng = np.random.default_rng(seed)
    log_p = np.zeros(SIZES)
    for v in views:
        shape = [SIZES[a] if a in v else 1 for a in ALL]
        log_p = log_p + rng.normal(0.0, 1.0, size=shape)
    p = np.exp(log_p - log_p.max())
    out: np.ndarray = p / p.sum()
    return out


def _exact(views: list[tuple[int, ...]], joint: np.ndarray) -> tuple[Plan, list[MarginalTable]]:
    plan = Plan(Schema.from_sizes(SIZES), 1.0, views)
    return plan, [MarginalTable(v, project(ALL, joint, v), 0.0, 1000) for v in views]


def _queries() -> list[tuple[int, ...]]:
    return [q for k in (1, 2, 3, len(SIZES)) for q in itertools.combinations(ALL, k)]


@pytest.mark.parametrize("name", VIEW_SETS)
def test_exact_marginals_give_exact_answers_to_every_query(name: str) -> None:
    views = VIEW_SETS[name]
    joint = _log_linear(views, seed=1)
    plan, tables = _exact(views, joint)
    est = fit_global(plan, tables, tol=TOL, max_iter=5000, answers="model")
    assert all(est.held) and est.residual <= TOL
    for q in _queries():  # most of them inside no view
        ans = est.answer(q)
        assert ans.method == "model"
        # IPF stops at residual TOL; its fixed point is the joint, so a query errs by
        # at most a few TOL per cell
        np.testing.assert_allclose(ans.values, project(ALL, joint, q), atol=1e3 * TOL)


@pytest.mark.parametrize("name", VIEW_SETS)
def test_pairs_answers_are_maxent_given_the_views_and_the_unheld_pairs(name: str) -> None:
    # the default answer: max-ent over the views' projections onto the query and the
    # model's marginals of the query's pairs that no view holds (exact marginals in, so
    # the model's pairs are the joint's)
    views = VIEW_SETS[name]
    joint = _log_linear(views, seed=1)
    plan, tables = _exact(views, joint)
    est = fit_global(plan, tables, tol=TOL, max_iter=5000)
    from_model = 0
    for q in _queries():
        constraints = query_constraints(tables, q)
        free = [
            (i, j)
            for i, j in itertools.combinations(range(len(q)), 2)
            if not any({i, j} <= set(axes) for axes, _ in constraints)
        ]
        pairs = [((i, j), project(ALL, joint, (q[i], q[j]))) for i, j in free]
        shape = tuple(SIZES[a] for a in q)
        expected, _, _ = maximum_entropy(shape, [*pairs, *constraints], tol=TOL, max_iter=5000)
        ans = est.answer(q)
        assert ans.method == (
            "maxent+model"
            if free
            else "projection"
            if any(set(q) <= set(v) for v in views)
            else "maxent"
        )
        from_model += bool(free)
        np.testing.assert_allclose(ans.values, expected, atol=1e-9)
        if len(q) <= 2:  # a pair is the joint's, held or not
            np.testing.assert_allclose(ans.values, project(ALL, joint, q), atol=1e-9)
    assert from_model > 0


def test_a_known_junction_tree_is_recovered_in_one_sweep() -> None:
    # P = prod beta_C / prod beta_S on cliques (0,1,2) - (1,2,3) - (3,4) - (4,5)
    rng = np.random.default_rng(2)
    cliques = [(0, 1, 2), (1, 2, 3), (3, 4), (4, 5)]
    joint = np.ones(SIZES)
    for c in cliques:  # a chain of conditionals: decomposable by construction
        shape = [SIZES[a] if a in c else 1 for a in ALL]
        joint = joint * rng.dirichlet(np.ones(int(np.prod(shape))) * 0.7).reshape(shape)
    joint /= joint.sum()
    tree = junction_tree(cliques, SIZES)
    assert sorted(tree.cliques) == sorted(cliques)
    fit = fit_maxent(tree, [(c, project(ALL, joint, c)) for c in cliques], tol=TOL)
    # one sweep scales each clique to its target once; the second finds every target met
    assert fit.iterations == 2 and fit.residual <= TOL
    for q in _queries():
        np.testing.assert_allclose(
            fit.model.marginal(q, 1 << 20), project(ALL, joint, q), atol=1e-14
        )


def test_model_beats_per_query_maxent_on_an_unobserved_pair() -> None:
    # a chain 0 - 1 - 2 with strong dependence: the pair (0, 2) is in no view; the
    # model carries the dependence through 1, per-query max-ent over (0, 2) cannot
    views = [(0, 1), (1, 2)]
    joint = _log_linear(views, seed=3)
    plan, tables = _exact(views, joint)
    truth = project(ALL, joint, (0, 2))
    for answers in ("pairs", "model"):
        est = fit_global(plan, tables, tol=TOL, answers=answers)
        np.testing.assert_allclose(est.answer((0, 2)).values, truth, atol=1e-12)
        # the chain's 3-way marginal is pairwise log-linear: both answers are exact
        np.testing.assert_allclose(
            est.answer((0, 1, 2)).values, project(ALL, joint, (0, 1, 2)), atol=1e-10
        )
    independent = np.outer(truth.sum(axis=1), truth.sum(axis=0))
    assert np.abs(independent - truth).max() > 0.01  # the pair is dependent


@pytest.mark.parametrize("answers", ["pairs", "model"])
def test_a_clique_cap_keeps_every_view_in_the_answers(answers: str) -> None:
    views = VIEW_SETS["overlapping"]
    joint = _log_linear(views, seed=4)
    plan, tables = _exact(views, joint)
    est = fit_global(plan, tables, tol=TOL, max_iter=5000, max_clique=18, answers=answers)
    assert not all(est.held) and any(est.held)
    assert est.model.tree.largest <= 18
    for q in _queries():
        ans = est.answer(q)
        assert ans.method == "model+ipf" if answers == "model" else ans.method != "model+ipf"
        assert ans.values.min() >= 0 and ans.values.sum() == pytest.approx(1.0, abs=1e-12)
        for v in views:  # every view's projection onto the query holds
            common = tuple(a for a in q if a in v)
            if common:
                np.testing.assert_allclose(
                    project(q, ans.values, common), project(ALL, joint, common), atol=1e-9
                )
    for v in views:  # a query inside a view is its projection
        np.testing.assert_allclose(est.answer(v).values, project(ALL, joint, v), atol=1e-9)


def test_noisy_reports_give_non_negative_answers_summing_to_one() -> None:
    from calmkit_simulator.collect import collect_support
    from calmkit_simulator.synthetic import synthetic_population

    pop = synthetic_population(n=20_000, sizes=(2, 3, 2, 2, 3, 2, 2, 2), rng=5)
    views = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6), (6, 7), (0, 7), (1, 5)]
    plan = Plan(pop.schema, 0.5, views, seed=5)
    support = collect_support(pop, plan, np.random.default_rng(5))
    for shrink in (True, False):
        est = reconstruct_global(support, shrink=shrink)
        local = reconstruct(support, shrink=shrink)
        assert (est.shrinkage is not None) == shrink and (est.prior is not None) == shrink
        methods = set()
        for q in [*itertools.combinations(range(8), 2), *itertools.combinations(range(8), 3)]:
            ans = est.answer(q)
            values = ans.values
            assert values.shape == pop.schema.shape(q)
            assert values.min() >= 0.0 and values.sum() == pytest.approx(1.0, abs=1e-12)
            methods.add(ans.method)
            if ans.method != "maxent+model":  # every pair held: the local answer
                np.testing.assert_allclose(values, local.answer(q).values, atol=1e-12)
            for v in views:  # what the views hold is the local pipeline's, shrinkage and all
                common = tuple(a for a in q if a in v)
                if len(common) == 2:
                    target = local.views.tables[views.index(v)].project(common).values
                    np.testing.assert_allclose(project(q, values, common), target, atol=1e-6)
        assert methods == {"projection", "maxent+model"}


def test_oversized_dense_answers_are_refused_with_their_size() -> None:
    sizes = (10,) * 10
    views = [(a, a + 1) for a in range(9)]
    plan = Plan(Schema.from_sizes(sizes), 1.0, views)
    uniform = np.full((10, 10), 0.01)
    tables = [MarginalTable(v, uniform, 0.0, 100) for v in views]
    est = fit_global(plan, tables)
    with pytest.raises(TableTooLarge, match=r"8 attributes \(100000000 cells\)"):
        est.answer(tuple(range(8)))  # 10^8 cells: 800 MB dense, refused before allocating
    assert isinstance(TableTooLarge("x"), CalmkitError)
    with pytest.raises(TableTooLarge, match="100000000 cells"):
        est.model.marginal(tuple(range(8)), est.max_cells)
    # an answer within the budget but with a too large intermediate table is refused too
    with pytest.raises(TableTooLarge, match="intermediate"):
        est.model.marginal((0, 9), 500)  # the answer has 100 cells, a message 1000
    assert est.answer((0, 9)).values.shape == (10, 10)


def test_i_projection_from_uniform_is_maximum_entropy() -> None:
    joint = _log_linear(VIEW_SETS["cycle"], seed=6)
    constraints = [(v, project(ALL, joint, v)) for v in VIEW_SETS["cycle"]]
    start = np.full(SIZES, 1.0 / joint.size)
    ours, residual, _ = i_projection(start, constraints, tol=TOL, max_iter=5000)
    reference, _, _ = maximum_entropy(SIZES, constraints, tol=TOL, max_iter=5000)
    assert residual <= TOL
    np.testing.assert_allclose(ours, reference, atol=1e-12)
    np.testing.assert_allclose(ours, joint, atol=1e-9)  # the joint is itself max-ent


@pytest.mark.parametrize("seed", range(5))
def test_junction_trees_hold_every_view_and_run_intersection(seed: int) -> None:
    rng = np.random.default_rng(seed)
    d = 12
    sizes = tuple(int(s) for s in rng.integers(2, 4, size=d))
    views = [
        tuple(sorted(rng.choice(d, size=int(rng.integers(2, 4)), replace=False).tolist()))
        for _ in range(10)
    ]
    tree = junction_tree(views, sizes)
    assert all(tree.home(v) is not None for v in views)
    assert {a for c in tree.cliques for a in c} == set(range(d))
    for a in range(d):  # the cliques holding a form a connected subtree
        holders = {i for i, c in enumerate(tree.cliques) if a in c}
        tops = [i for i in holders if tree.parent[i] not in holders]
        assert len(tops) == 1


def test_a_one_category_attribute_needs_nothing_from_the_model() -> None:
    # attribute 2 has one category and is in no view: its pairs are known exactly
    # (the other attribute's marginal), so no query asks the model for them
    sizes = (2, 3, 1, 2)
    views = [(0, 1), (1, 3)]
    joint = np.random.default_rng(8).dirichlet(np.ones(12)).reshape(sizes)
    plan = Plan(Schema.from_sizes(sizes), 1.0, views)
    tables = [MarginalTable(v, project((0, 1, 2, 3), joint, v), 0.0, 1000) for v in views]
    est = fit_global(plan, tables, tol=TOL)
    for q in [(0, 2), (2, 3), (1, 2, 3)]:
        ans = est.answer(q)
        assert ans.method in ("projection", "maxent"), (q, ans.method)
        np.testing.assert_allclose(ans.values, project((0, 1, 2, 3), joint, q), atol=1e-9)
    assert est.answer((0, 2, 3)).method == "maxent+model"  # (0, 3) is in no view
