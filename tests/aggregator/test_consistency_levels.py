"""Consistency runs each level of the intersection closure at once (all sets of one
size together, over views stacked by shape). On random view sets (mixed sizes and
category counts, exact and noisy views) it must give what the plain one-set-at-a-time
algorithm gives, to rounding, in the same number of rounds, and it must meet its
stated residuals (it converges before ``max_iter`` on every one of them)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from calmkit_aggregator import MarginalTable, make_consistent
from calmkit_aggregator.reconstruction import intersection_closure, norm_sub
from calmkit_aggregator.reconstruction.consistency import _steps


def _reference(tables: list[MarginalTable], tol: float = 1e-9, max_iter: int = 1000):  # type: ignore[no-untyped-def]
    """The sequential algorithm: one closure set at a time, one member at a time."""
    steps = _steps(tables, intersection_closure([t.attrs for t in tables]))
    values = [t.values.copy() for t in tables]

    def project(step):  # type: ignore[no-untyped-def]
        return [values[i].sum(axis=ax) for i, ax in zip(step.members, step.drop)]

    def inconsistency() -> float:
        spread = [np.ptp(np.stack(project(s)), axis=0).max() for s in steps if s.attrs]
        return float(max(spread, default=0.0))

    rounds = 0
    while rounds < max_iter:
        rounds += 1
        for step in steps:
            projected = project(step)
            target = sum(w * p for w, p in zip(step.weights, projected)) if step.attrs else 1.0
            for i, p, c, shape in zip(step.members, projected, step.cells, step.bshape):
                values[i] = values[i] + ((target - p) / c).reshape(shape)
        if min(float(v.min()) for v in values) >= -tol:
            break
        values = [norm_sub(v) for v in values]
        if inconsistency() <= tol:
            break
    return values, rounds, inconsistency()


def _random_views(seed: int) -> list[MarginalTable]:
    rng = np.random.default_rng(seed)
    d = int(rng.integers(4, 10))
    sizes = rng.integers(2, 4, d)
    picks = {
        tuple(sorted(rng.choice(d, size=int(rng.integers(1, 5)), replace=False).tolist()))
        for _ in range(int(rng.integers(2, 14)))
    }
    tables = []
    for k, view in enumerate(sorted(picks)):
        shape = tuple(int(sizes[a]) for a in view)
        truth = rng.dirichlet(np.ones(int(np.prod(shape)))).reshape(shape)
        variance = 0.0 if k == 0 and seed % 4 == 0 else float(rng.uniform(1e-4, 1e-2))
        noise = rng.normal(0, np.sqrt(max(variance, 1e-4)), shape)
        tables.append(MarginalTable(view, truth + noise, variance))
    return tables


@pytest.mark.parametrize("seed", range(40))
def test_levels_at_once_equal_one_set_at_a_time(seed: int) -> None:
    tables = _random_views(seed)
    out = make_consistent(tables)
    values, rounds, spread = _reference(tables)
    assert out.iterations == rounds
    for table, expected in zip(out.tables, values):
        np.testing.assert_allclose(table.values, expected, rtol=0, atol=1e-12)
    assert out.inconsistency == pytest.approx(spread, abs=1e-12)
    # it converges: stops on its own, well before the guard, with the residuals it states
    assert out.iterations < 1000
    assert out.inconsistency <= 1e-9 and out.negativity <= 1e-9


def test_views_sharing_nothing_take_one_round_even_at_tol_zero() -> None:
    # Only the totals are shared: one consistency pass and one Norm-Sub leave nothing
    # inconsistent (exactly 0), so the loop stops after the first round.
    rng = np.random.default_rng(3)
    tables = [MarginalTable(v, rng.normal(0.25, 0.3, (2, 2)), 1e-3) for v in [(0, 1), (2, 3)]]
    assert min(float(t.values.min()) for t in tables) < 0
    out = make_consistent(tables, tol=0.0)
    assert out.iterations == 1 and out.inconsistency == 0.0 and out.negativity == 0.0


def test_the_round_cap_defaults_to_1000() -> None:
    # An unreachable tolerance (negative) never stops the loop: the cap does.
    rng = np.random.default_rng(4)
    tables = [MarginalTable(v, rng.normal(0.25, 0.3, (2, 2)), 1e-3) for v in [(0, 1), (1, 2)]]
    assert make_consistent(tables, tol=-1.0).iterations == 1000
    assert make_consistent(tables, tol=-1.0, max_iter=7).iterations == 7


def test_the_result_is_frozen() -> None:
    out = make_consistent(_random_views(2))
    with pytest.raises(dataclasses.FrozenInstanceError):
        out.iterations = 0  # type: ignore[misc]


def test_a_cell_at_exactly_minus_tol_is_non_negative_enough() -> None:
    # "within tol" includes tol: the view (summing to 1, nothing shared) is kept as is
    values = np.array([[0.75, 0.5], [0.0, -0.25]])
    out = make_consistent([MarginalTable((0, 1), values, 1e-3)], tol=0.25)
    assert out.iterations == 1 and out.negativity == 0.25
    np.testing.assert_array_equal(out.tables[0].values, values)
