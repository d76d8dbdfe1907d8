"""The margins' signal law (reconstruction.margin_prior): fitted to many margins it
shrinks as the Bayes rule of the law that drew them does (its excess risk within the
paired standard error, where James-Stein's is not), keeps a margin its reports hold,
and refuses malformed input naming it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from calmkit_aggregator.reconstruction.margin_prior import (
    JamesStein,
    SignalPrior,
    fit_signal_prior,
)
from calmkit_client import CalmkitError
from tests.stats import z_bound


def _margins(n: int, seed: int) -> tuple[np.ndarray, ...]:
    """``n`` margins drawn from the model: dim in {3, 7, 15}, noise in [0.5, 2], signal
    per dimension t = 0 (70%) or 3 (30%); mu ~ N(0, t I), z = mu + N(0, noise I)."""
    gen = np.random.default_rng(seed)
    dim = gen.choice([3, 7, 15], n)
    noise = gen.uniform(0.5, 2.0, n)
    t = np.where(gen.random(n) < 0.3, 3.0, 0.0)
    mu = [gen.standard_normal(k) * math.sqrt(s) for k, s in zip(dim, t)]
    z = [m + gen.standard_normal(k) * math.sqrt(v) for m, k, v in zip(mu, dim, noise)]
    return dim, noise, mu, z


def _loss(factors: np.ndarray, mu: list[np.ndarray], z: list[np.ndarray]) -> np.ndarray:
    return np.array([((f * zi - m) ** 2).sum() for f, m, zi in zip(factors, mu, z)])


def test_the_fitted_law_shrinks_as_the_bayes_rule_of_the_true_one() -> None:
    # The true law is known here, so its Bayes factor E[t / (t + noise) | ||z||^2] is
    # exact. The fitted law's excess squared error over it, paired per margin, must lie
    # within z sd / sqrt(n) of 0; James-Stein's (each margin alone) must not, which
    # shows the test can tell them apart.
    n = 3000
    dim, noise, mu, z = _margins(n, seed=1)
    spread = np.array([(zi**2).sum() for zi in z])
    truth = SignalPrior(np.array([0.0, 3.0]), np.array([0.7, 0.3]))
    bayes = _loss(truth.factors(spread, dim, noise), mu, z)
    fitted = _loss(fit_signal_prior(spread, dim, noise).factors(spread, dim, noise), mu, z)
    james_stein = _loss(JamesStein().factors(spread, dim, noise), mu, z)

    def excess(loss: np.ndarray) -> tuple[float, float]:
        diff = loss - bayes
        return float(diff.mean()), z_bound(1) * float(diff.std()) / math.sqrt(n)

    mean, bound = excess(fitted)
    assert mean <= bound, (mean, bound)
    mean, bound = excess(james_stein)
    assert mean > bound, (mean, bound)


def test_a_margin_far_above_its_noise_keeps_its_signal() -> None:
    # 29 margins of pure noise and one whose spread is 20 x its noise: the law learnt
    # from the 29 must not drown the one (its likelihood peaks far from 0). James-Stein
    # keeps 1 - 9 / 180 = 0.95 of it; the fitted law's grid is 26% apart, so within
    # two steps of t = 19 its factor is at least 0.93. The 29 it shrinks harder than
    # James-Stein does, each alone.
    gen = np.random.default_rng(2)
    dim = np.full(30, 9)
    noise = np.ones(30)
    spread = np.array([*(gen.chisquare(9, 29)), 180.0])
    law = fit_signal_prior(spread, dim, noise)
    factors = law.factors(spread, dim, noise)
    assert factors[-1] >= 0.93, factors[-1]
    alone = JamesStein().factors(spread, dim, noise)
    assert factors[:-1].mean() < alone[:-1].mean(), (factors[:-1].mean(), alone[:-1].mean())


def test_a_margin_known_exactly_or_flat_gives_factors_in_range() -> None:
    law = fit_signal_prior(np.array([0.0, 4.0, 50.0]), np.array([3, 3, 3]), np.ones(3))
    factors = law.factors(np.array([0.0, 4.0, 50.0]), np.array(3), np.array(1.0))
    assert np.all((factors >= 0) & (factors <= 1))
    assert factors[0] < factors[1] < factors[2]  # more spread, more kept
    np.testing.assert_allclose(law.weights.sum(), 1.0)


@pytest.mark.parametrize(
    ("spread", "dim", "noise", "match"),
    [
        ([1.0, 2.0], [3], [1.0, 1.0], r"sizes 2, 1, 2"),
        ([], [], [], r"sizes 0, 0, 0"),
        ([1.0], [3], [0.0], r"margin 0 \(spread 1.0, dim 3.0, noise 0.0\): noise must"),
        ([1.0, 1.0], [3, 0], [1.0, 1.0], r"margin 1 \(spread 1.0, dim 0.0, noise 1.0\)"),
        ([-1.0], [3], [1.0], r"margin 0 \(spread -1.0,"),
        ([1.0], [3], [np.inf], r"noise inf\): noise must be finite"),
    ],
)
def test_malformed_margins_are_refused(
    spread: list[float], dim: list[int], noise: list[float], match: str
) -> None:
    with pytest.raises(CalmkitError, match=match):
        fit_signal_prior(np.array(spread), np.array(dim), np.array(noise))
