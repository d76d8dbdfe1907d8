"""Bounds for statistical tests, derived from the variance formulas (no tuned atol).

Every check fixes its false-alarm probability ``alpha`` for the whole test and splits
it over the cells checked (Bonferroni), so with a fixed seed a failure means the
implementation, not luck, is off.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

ALPHA = 1e-4


def z_bound(cells: int, alpha: float = ALPHA) -> float:
    """Two-sided normal bound for ``cells`` simultaneous z-scores."""
    return float(stats.norm.isf(alpha / (2 * cells)))


def assert_z(
    estimate: np.ndarray, truth: np.ndarray, variance: np.ndarray | float, alpha: float = ALPHA
) -> None:
    """Every per-cell z-score of ``estimate`` within the Bonferroni normal bound."""
    z = (np.asarray(estimate) - np.asarray(truth)) / np.sqrt(variance)
    bound = z_bound(z.size, alpha)
    worst = int(np.argmax(np.abs(z)))
    assert np.all(np.abs(z) <= bound), f"cell {worst}: z = {z.flat[worst]:.2f} > {bound:.2f}"


def assert_variance(samples: np.ndarray, variance: np.ndarray, alpha: float = ALPHA) -> None:
    """Per-cell sample variances over repetitions (axis 0) against the formula:
    ``(R-1) s^2 / sigma^2`` within the chi-square(R-1) quantiles (Bonferroni)."""
    reps = samples.shape[0]
    stat = (reps - 1) * samples.var(axis=0, ddof=1) / np.asarray(variance)
    cells = stat.size
    lo = stats.chi2.ppf(alpha / (2 * cells), reps - 1)
    hi = stats.chi2.isf(alpha / (2 * cells), reps - 1)
    assert np.all(stat >= lo) and np.all(stat <= hi), (
        f"variance ratio out of [{lo / (reps - 1):.3f}, {hi / (reps - 1):.3f}]: "
        f"min {stat.min() / (reps - 1):.3f}, max {stat.max() / (reps - 1):.3f}"
    )


def assert_chisquare(observed: np.ndarray, expected: np.ndarray, alpha: float = ALPHA) -> None:
    """Pearson goodness of fit of counts against expected counts."""
    observed = np.asarray(observed, dtype=float)
    expected = np.asarray(expected, dtype=float)
    stat = float(((observed - expected) ** 2 / expected).sum())
    bound = float(stats.chi2.isf(alpha, observed.size - 1))
    assert stat <= bound, f"chi-square {stat:.1f} > {bound:.1f} (df {observed.size - 1})"
