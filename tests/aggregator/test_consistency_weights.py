"""Consistency pools a shared marginal with inverse-variance weights ``w_i ∝ 1 / (C_i
var_i)`` (consistency.py's docstring; CALM §4.4 with the views' own variances), not
with any other unbiased weighting: exactly on a fixed example, and in distribution (the
pooled cell's variance equals ``1 / sum_i 1 / (C_i var_i)``, the smallest any linear
unbiased pooling reaches)."""

from __future__ import annotations

import numpy as np

from calmkit_aggregator import MarginalTable, make_consistent

# views (0, 1) and (1, 2) over attributes of 2, 3 and 4 categories share attribute 1;
# a cell of its marginal sums C_A = 2 cells of view A and C_B = 4 of view B
VAR_A, VAR_B = 1e-4, 2e-3


def _projected(table: MarginalTable, keep: int) -> np.ndarray:
    axis = table.attrs.index(keep)
    return table.values.sum(axis=tuple(ax for ax in range(table.values.ndim) if ax != axis))


def test_shared_marginal_is_the_inverse_variance_mean() -> None:
    rng = np.random.default_rng(0)
    a = rng.dirichlet(np.ones(6)).reshape(2, 3)
    b = rng.dirichlet(np.ones(12)).reshape(3, 4)
    views = [MarginalTable((0, 1), a, VAR_A), MarginalTable((1, 2), b, VAR_B)]
    out = make_consistent(views, nonnegative=False).tables
    w_a, w_b = 1 / (2 * VAR_A), 1 / (4 * VAR_B)
    expected = (w_a * a.sum(axis=0) + w_b * b.sum(axis=1)) / (w_a + w_b)
    np.testing.assert_allclose(_projected(out[0], 1), expected, atol=1e-12)
    np.testing.assert_allclose(_projected(out[1], 1), expected, atol=1e-12)
    # equal weights (the paper's 1/C_i at equal variances) would land elsewhere
    plain = (a.sum(axis=0) / 2 + b.sum(axis=1) / 4) / (1 / 2 + 1 / 4)
    assert np.abs(expected - plain).max() > 1e-3


def test_pooled_variance_matches_the_formula() -> None:
    """400 noisy replicates of both views (iid normal cells with their variances): the
    pooled attribute-1 cells' sample variance against ``1 / (1/(2 var_A) + 1/(4
    var_B))``. A sample variance over R draws has relative standard error sqrt(2/(R-1));
    the test allows 4 of them."""
    rng = np.random.default_rng(1)
    a0 = np.full((2, 3), 1 / 6)
    b0 = np.full((3, 4), 1 / 12)
    reps = 400
    pooled = np.empty((reps, 3))
    for r in range(reps):
        a = a0 + rng.normal(0, np.sqrt(VAR_A), a0.shape)
        b = b0 + rng.normal(0, np.sqrt(VAR_B), b0.shape)
        views = [MarginalTable((0, 1), a, VAR_A), MarginalTable((1, 2), b, VAR_B)]
        pooled[r] = _projected(make_consistent(views, nonnegative=False).tables[0], 1)
    formula = 1 / (1 / (2 * VAR_A) + 1 / (4 * VAR_B))
    # the total is fixed to 1 by consistency, which removes 1/3 of each cell's variance
    # (3 cells summing to a constant): the covariance-corrected target
    target = formula * (1 - 1 / 3)
    measured = pooled.var(axis=0, ddof=1)
    margin = 4 * np.sqrt(2 / (reps - 1))
    assert np.all(np.abs(measured / target - 1) < margin), (measured / target, margin)
