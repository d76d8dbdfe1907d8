"""Maximum entropy and query answering at their edges: how targets are cleaned (negative
cells clipped, an empty target made uniform), 0/0 = 0, when IPF stops and what it
reports (rounds, residual), the defaults, and the checks on a query."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from calmkit_aggregator.reconstruction.marginal import MarginalTable
from calmkit_aggregator.reconstruction.maxent import Answer, answer_query, maximum_entropy
from calmkit_client import CalmkitError


def test_one_constraint_is_met_in_one_sweep() -> None:
    p, residual, it = maximum_entropy((2, 3), [((0,), np.array([0.3, 0.7]))])
    np.testing.assert_allclose(p, np.outer([0.3, 0.7], np.full(3, 1 / 3)), atol=1e-15)
    assert (residual, it) == (0.0, 1)


def test_no_constraint_is_uniform_at_residual_zero() -> None:
    p, residual, it = maximum_entropy((2, 2), [])
    np.testing.assert_array_equal(p, np.full((2, 2), 0.25))
    assert (residual, it) == (0.0, 1)


def test_contradicting_constraints_stop_on_the_cycle() -> None:
    # two targets for one margin: each sweep ends on the second, the same P every sweep,
    # so the second sweep moves nothing and IPF stops; the residual is their difference
    p, residual, it = maximum_entropy(
        (2, 3), [((0,), np.array([0.3, 0.7])), ((0,), np.array([0.6, 0.4]))]
    )
    assert it == 2 and residual == pytest.approx(0.3, abs=1e-15)
    np.testing.assert_allclose(p.sum(axis=1), [0.6, 0.4], atol=1e-15)
    # "moves nothing" includes exactly nothing: at tol 0 it stops there too
    cons = [((0,), np.array([0.5, 0.5])), ((0,), np.array([0.25, 0.75]))]
    assert maximum_entropy((2, 3), cons, tol=0.0)[1:] == (0.25, 2)


def test_negative_target_cells_are_clipped_and_an_empty_target_is_uniform() -> None:
    # a noisy margin [0.6, 0.5, -0.1] is [0.6, 0.5, 0] / 1.1; a margin with no positive
    # cell says nothing: uniform
    p, residual, it = maximum_entropy(
        (3, 2), [((0,), np.array([0.6, 0.5, -0.1])), ((1,), np.array([-0.2, -0.1]))]
    )
    np.testing.assert_allclose(p, np.outer([0.6 / 1.1, 0.5 / 1.1, 0.0], [0.5, 0.5]), atol=1e-15)
    assert residual <= 1e-15 and it == 1


def test_zero_over_zero_is_zero() -> None:
    # the first constraint empties row 1; the second asks for 0 there too: 0/0 = 0
    p, residual, it = maximum_entropy(
        (2, 2), [((0,), np.array([1.0, 0.0])), ((0, 1), np.array([[0.5, 0.5], [0.0, 0.0]]))]
    )
    np.testing.assert_array_equal(p, [[0.5, 0.5], [0.0, 0.0]])
    assert (residual, it) == (0.0, 1)
    # disjoint supports leave no mass at all: P stays 0 (not NaN) and the residual says so
    p, residual, _ = maximum_entropy(
        (2, 2), [((0,), np.array([1.0, 0.0])), ((0,), np.array([0.0, 1.0]))]
    )
    np.testing.assert_array_equal(p, np.zeros((2, 2)))
    assert residual == 1.0


def test_the_sweep_cap() -> None:
    cons = [((0,), np.array([0.3, 0.7])), ((0,), np.array([0.6, 0.4]))]
    # an unreachable tolerance: only the cap stops it, 1000 sweeps by default
    assert maximum_entropy((2, 3), cons, tol=-1.0)[2] == 1000
    assert maximum_entropy((2, 3), cons, tol=-1.0, max_iter=7)[2] == 7


def test_a_residual_equal_to_tol_stops() -> None:
    # "residual <= tol" stops on the tie. Dyadic targets make every step exact: the
    # sweep ends on B = [0.9375, 0.0625], A's residual is exactly 0.1875 while the sweep
    # moved P by 0.4375 > tol, so only the residual can stop it after one sweep
    a, b = np.array([0.75, 0.25]), np.array([0.9375, 0.0625])
    p, residual, it = maximum_entropy((2,), [((0,), a), ((0,), b)], tol=0.1875)
    assert (residual, it) == (0.1875, 1)
    np.testing.assert_array_equal(p, b)


def test_answer_query_stops_at_1000_sweeps_by_default() -> None:
    # constraints no table meets, each sweep moving P (the first margin changes with
    # the third's pair): no tolerance is reached, so only the cap stops IPF
    pair = np.array([[0.5, 0.0], [0.0, 0.5]])
    tables = [
        MarginalTable((0, 1), pair, 1e-4),
        MarginalTable((1, 2), pair, 1e-4),
        MarginalTable((0, 2), np.array([[0.0, 0.5], [0.5, 0.0]]), 1e-4),
    ]
    ans = answer_query(tables, (0, 1, 2), (2, 2, 2), tol=-1.0)
    assert ans.method == "maxent" and ans.iterations == 1000
    assert answer_query(tables, (0, 1, 2), (2, 2, 2), tol=-1.0, max_iter=5).iterations == 5


def test_the_default_tolerance_is_1e_10() -> None:
    # a cycle of three pair margins needs many sweeps: the defaults stop where tol=1e-10
    # does, well before the cap
    rng = np.random.default_rng(1)
    joint = rng.dirichlet(np.ones(8)).reshape(2, 2, 2)
    cons = [((0, 1), joint.sum(axis=2)), ((1, 2), joint.sum(axis=0)), ((0, 2), joint.sum(axis=1))]
    p, residual, it = maximum_entropy((2, 2, 2), cons)
    p2, residual2, it2 = maximum_entropy((2, 2, 2), cons, tol=1e-10, max_iter=1000)
    assert 2 < it == it2 < 1000 and residual == residual2 < 1e-9
    np.testing.assert_array_equal(p, p2)
    tables = [
        MarginalTable(v, joint.sum(axis=d), 1e-4)
        for v, d in [((0, 1), 2), ((1, 2), 0), ((0, 2), 1)]
    ]
    ans = answer_query(tables, (0, 1, 2), (2, 2, 2))
    assert ans.method == "maxent" and ans.iterations == it and ans.residual == residual


def test_a_projection_answer_is_clipped_and_renormalised() -> None:
    # a view with a negative cell (not Norm-Subbed): the projection is clipped to 0 and
    # scaled to sum to 1
    values = np.array([[0.5, 0.2], [0.4, -0.1]])  # sums to 1; margin of 1: [0.9, 0.1]
    table = MarginalTable((0, 1), values, 1e-3)
    ans = answer_query([table], (0, 1), (2, 2))
    np.testing.assert_allclose(ans.values, np.array([[0.5, 0.2], [0.4, 0.0]]) / 1.1, atol=1e-15)
    assert (ans.method, ans.residual, ans.iterations) == ("projection", 0.0, 0)


def test_a_query_is_distinct_attributes_matching_its_shape() -> None:
    table = MarginalTable((0, 1), np.full((2, 2), 0.25), 1e-3)
    with pytest.raises(CalmkitError, match=r"^query \(\[0, 0\]\) must be distinct attributes"):
        answer_query([table], [0, 0], (2, 2))
    with pytest.raises(CalmkitError, match=r"^query \(\[0, 1\]\) must be distinct attributes"):
        answer_query([table], [0, 1], (2,))


def test_an_answer_is_frozen() -> None:
    ans = answer_query([MarginalTable((0,), np.array([0.5, 0.5]), 1e-3)], (0,), (2,))
    assert isinstance(ans, Answer)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ans.method = "maxent"  # type: ignore[misc]
