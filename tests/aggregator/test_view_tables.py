"""The error model's representative view tables (:mod:`calmkit_aggregator.planning.
view_tables`): exact margins, no negative cell, the profile's pair dependence where
the margins allow it, the product of the margins without dependence, and, on dense
views of dependent data, a Norm-Sub error closer to the one the true tables give than
the product's."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calmkit_aggregator.planning.error_model import _simulate
from calmkit_aggregator.planning.profile import DataProfile, pair_dependence
from calmkit_aggregator.planning.view_tables import view_tables
from calmkit_client import choose_oracle
from calmkit_simulator.synthetic import synthetic_population


def _tables(profile: DataProfile, view: tuple[int, ...], dependence: float) -> np.ndarray:
    shape = tuple(profile.sizes[a] for a in view)
    return view_tables(profile, np.array([view]), shape, dependence)[0].reshape(shape)


def _margin(table: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    out: np.ndarray = table.sum(axis=tuple(i for i in range(table.ndim) if i not in axes))
    return out


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 6), min_size=2, max_size=5),
    dependence=st.floats(0.0, 0.5),
    seed=st.integers(0, 2**31),
)
def test_margins_are_exact_and_no_cell_is_negative(
    sizes: list[int], dependence: float, seed: int
) -> None:
    gen = np.random.default_rng(seed)
    raw = gen.exponential(size=(len(sizes), len(sizes)))
    margins = [gen.dirichlet(np.full(s, 0.5)) for s in sizes]
    profile = DataProfile.from_marginals(margins, dependence, pair_weights=raw + raw.T)
    table = _tables(profile, tuple(range(len(sizes))), dependence)
    assert np.all(np.isfinite(table)) and table.min() >= 0.0
    assert table.sum() == pytest.approx(1.0, abs=1e-12)
    for a, p in enumerate(margins):
        np.testing.assert_allclose(_margin(table, (a,)), p, atol=1e-12)


def test_without_dependence_a_view_is_the_product_of_its_margins() -> None:
    gen = np.random.default_rng(3)
    margins = [gen.dirichlet(np.ones(s)) for s in (2, 3, 4)]
    profile = DataProfile.from_marginals(margins, 0.02)
    product = np.multiply.outer(np.multiply.outer(margins[0], margins[1]), margins[2])
    np.testing.assert_allclose(_tables(profile, (0, 1, 2), 0.0), product, atol=1e-15)


def test_pairs_carry_the_profiles_dependence_where_the_margins_allow_it() -> None:
    # near-even margins leave room for every tilt, and the prior's weights are
    # products of the margins' concentration (rank one): every pair of the table
    # holds exactly the profile's dependence for it
    gen = np.random.default_rng(5)
    margins = [gen.dirichlet(np.full(s, 40.0)) for s in (2, 3, 2, 4)]
    profile = DataProfile.from_marginals(margins, 0.01)
    table = _tables(profile, (0, 1, 2, 3), 0.01)
    target = profile.pair_dependence(0.01)
    for a, b in itertools.combinations(range(4), 2):
        assert pair_dependence(_margin(table, (a, b))) == pytest.approx(target[a, b], rel=1e-6)


def test_dense_views_of_dependent_data_clip_as_the_true_tables_do() -> None:
    # eight views of 7 of 8 attributes (up to 576 cells, 1,000 users each, eps 1) of a
    # strongly dependent population: Norm-Sub's error simulated on the representative
    # tables is closer to the error on the true tables than the product of the
    # margins' (which is flatter: fewer cells near zero, so it under-states what
    # clipping costs), every draw of every view from the oracles' exact law
    sizes = (2, 3, 2, 2, 4, 2, 3, 2)
    pop = synthetic_population(n=8000, sizes=sizes, strength=1.5, rng=0)
    margins = [pop.marginal((a,)).reshape(-1) for a in range(len(sizes))]
    weights = np.zeros((len(sizes), len(sizes)))
    for a, b in itertools.combinations(range(len(sizes)), 2):
        dep = pair_dependence(pop.marginal((a, b)))
        weights[a, b] = weights[b, a] = dep
    mean = float(weights[np.triu_indices(len(sizes), 1)].mean())
    profile = DataProfile.from_marginals(margins, mean, pair_weights=weights)
    errors = {"true": 0.0, "representative": 0.0, "product": 0.0}
    for drop in range(len(sizes)):
        view = tuple(a for a in range(len(sizes)) if a != drop)
        shape = tuple(sizes[a] for a in view)
        oracle = choose_oracle(math.prod(shape), 1.0)
        truths = {
            "true": pop.marginal(view).reshape(-1),
            "representative": _tables(profile, view, mean).reshape(-1),
            "product": _tables(profile, view, 0.0).reshape(-1),
        }
        for name, truth in truths.items():
            gen = np.random.default_rng(drop)  # the same draws for the three truths
            sim = _simulate(oracle, np.array([1000.0]), truth[None], gen)
            errors[name] += float((sim**2).sum(axis=2).mean())
    assert abs(math.log(errors["representative"] / errors["true"])) < abs(
        math.log(errors["product"] / errors["true"])
    ), errors


def test_kept_tables_are_the_profile_s_own_and_read_only() -> None:
    # the planner scores one profile's views many times and keeps their tables: a
    # second profile over the same views gets its own, never the first one's
    views = np.array([[0, 1], [1, 2]])
    first = DataProfile.from_marginals([np.array([0.7, 0.2, 0.1])] * 3, 0.0)
    second = DataProfile.from_marginals([np.array([0.2, 0.3, 0.5])] * 3, 0.0)
    kept = view_tables(first, views, (3, 3), 0.05)
    assert view_tables(first, views, (3, 3), 0.05) is kept and not kept.flags.writeable
    other = view_tables(second, views, (3, 3), 0.05)
    np.testing.assert_allclose(other[0].reshape(3, 3).sum(axis=1), [0.2, 0.3, 0.5])
    np.testing.assert_allclose(kept[0].reshape(3, 3).sum(axis=1), [0.7, 0.2, 0.1])


def test_the_kept_tables_stay_within_their_byte_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    from calmkit_aggregator.planning import view_tables as module

    kept = module._Kept(3 * 2 * 9 * 8)  # three results of two 3 x 3 tables
    monkeypatch.setattr(module, "_KEPT", kept)
    profile = DataProfile.from_marginals([np.array([0.7, 0.2, 0.1])] * 4, 0.0)
    first = view_tables(profile, np.array([[0, 1], [1, 2]]), (3, 3), 0.05)
    for a in range(3):
        view_tables(profile, np.array([[a, a + 1], [0, 3]]), (3, 3), 0.05 + a)
    assert kept.bytes == sum(t.nbytes for _, t in kept.items.values()) <= kept.budget
    assert len(kept.items) == 3  # the oldest went first
    again = view_tables(profile, np.array([[0, 1], [1, 2]]), (3, 3), 0.05)
    assert again is not first
    np.testing.assert_array_equal(again, first)
