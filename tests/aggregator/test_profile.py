"""The data profile: the prior's exact moments, the pilot's dependence estimate
(unbiased, with the stated variance), the posterior and validation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from calmkit_aggregator.marginal import MarginalTable
from calmkit_aggregator.profile import (
    DEPENDENCE_PRIOR,
    DataProfile,
    _dependence_posterior,
    _pair_posterior,
    _pair_statistics,
    estimate_profile,
    marginal_pair_weights,
    pair_dependence,
)
from calmkit_client import CalmkitError, Schema, choose_oracle

MARGIN = 4.0  # standard errors


def test_the_prior_has_the_dirichlet_distance_from_uniform() -> None:
    schema = Schema.from_sizes([2, 3, 5, 1])
    prior = DataProfile.prior(schema)
    for p, size in zip(prior.marginals, schema.sizes):
        expected = (size - 1) / (size * (size + 1))  # E ||p - u||^2 under Dirichlet(1)
        assert ((p - 1 / size) ** 2).sum() == pytest.approx(expected, rel=1e-12)
    lo, hi = DEPENDENCE_PRIOR
    assert prior.dependence == pytest.approx(math.sqrt(lo * hi))
    assert prior.dependence_quantiles[0] > lo and prior.dependence_quantiles[-1] < hi
    assert prior.source == "prior" and prior.reports == 0


def _pair_tables(truth: np.ndarray, n: int, eps: float, count: int, seed: int):  # type: ignore[no-untyped-def]
    """``count`` pilot views of one pair, each estimated from ``n`` reports."""
    oracle = choose_oracle(truth.size, eps)
    gen = np.random.default_rng(seed)
    p, q = oracle.p, oracle.q
    tables = []
    for _ in range(count):
        if oracle.name == "GRR":
            counts = gen.multinomial(n, (p - q) * truth.reshape(-1) + q)
        else:
            cells = gen.multinomial(n, truth.reshape(-1))
            counts = gen.binomial(cells, p) + gen.binomial(n - cells, q)
        est = ((counts / n - q) / (p - q)).reshape(truth.shape)
        tables.append(MarginalTable((0, 1), est, oracle.variance(n), n))
    return tables, oracle


@pytest.mark.parametrize(
    ("truth", "n", "eps"),
    [
        (np.array([[0.6, 0.1], [0.1, 0.2]]), 70, 2.0),  # dependent, few users (GRR)
        (np.array([[0.6, 0.1], [0.1, 0.2]]), 300, 1.0),
        (np.full((2, 2), 0.25), 300, 1.0),  # independent: the estimate centres on 0
        (np.array([[0.3, 0.05, 0.05], [0.05, 0.3, 0.25]]), 2000, 0.5),  # OUE (6 cells)
    ],
)
def test_the_pilot_dependence_is_unbiased_with_its_stated_variance(
    truth: np.ndarray, n: int, eps: float
) -> None:
    tables, oracle = _pair_tables(truth, n, eps, count=1500, seed=3)
    margs = [truth.sum(axis=1), truth.sum(axis=0)]
    _, values, variances = _pair_statistics(tables, [oracle] * len(tables), margs)
    se = values.std(ddof=1) / math.sqrt(values.size)
    assert abs(values.mean() - pair_dependence(truth)) <= MARGIN * se
    # the stated variance never understates the statistic's (it is what the posterior
    # trusts): the observed variance is at most the stated one plus 4 of its own
    # standard errors, sqrt((m4 - var^2) / count)
    centred = values - values.mean()
    var_se = math.sqrt(((centred**4).mean() - values.var() ** 2) / values.size)
    assert values.var(ddof=1) <= variances.mean() + MARGIN * var_se


def test_the_posterior_follows_precise_data_and_the_prior_otherwise() -> None:
    median, sd, quantiles = _dependence_posterior(0.05, 1e-8)
    assert median == pytest.approx(0.05, rel=1e-2) and sd < 1e-3
    assert list(quantiles) == sorted(quantiles) and len(quantiles) == 5
    lo, hi = DEPENDENCE_PRIOR
    weak, _, weak_q = _dependence_posterior(0.0, 100.0)  # no information: the prior
    assert weak == pytest.approx(math.sqrt(lo * hi), rel=1e-2)
    assert weak_q[0] == pytest.approx(lo * (hi / lo) ** 0.1, rel=1e-2)
    assert _dependence_posterior(-1.0, 1e-6)[0] == pytest.approx(lo, rel=1e-2)


def test_estimate_profile_recovers_marginals_and_dependence() -> None:
    schema = Schema.from_sizes([2, 2])
    truth = np.array([[0.5, 0.1], [0.1, 0.3]])
    tables, oracle = _pair_tables(truth, 20_000, 2.0, count=1, seed=5)
    profile = estimate_profile(schema, tables, [oracle])
    assert profile.source == "pilot" and profile.reports == 20_000
    np.testing.assert_allclose(profile.marginals[0], truth.sum(axis=1), atol=0.02)
    assert profile.dependence == pytest.approx(pair_dependence(truth), rel=0.15)


def test_bad_profiles_are_refused_naming_the_field() -> None:
    with pytest.raises(CalmkitError, match=r"marginals\[0\] must be a distribution"):
        DataProfile.from_marginals([np.array([0.7, 0.7])], 0.0)
    with pytest.raises(CalmkitError, match=r"dependence \(-0.1\) must be finite and >= 0"):
        DataProfile.from_marginals([np.array([0.5, 0.5])], -0.1)
    with pytest.raises(CalmkitError, match="dependence_quantiles"):
        DataProfile((np.array([0.5, 0.5]),), 0.1, dependence_quantiles=(0.2, 0.1))
    with pytest.raises(CalmkitError, match="must match the schema"):
        DataProfile.prior(Schema.from_sizes([2, 2])).check(Schema.from_sizes([2, 3]))


def test_marginal_pair_weights_give_the_dependence_of_binary_pairs_exactly() -> None:
    # binary pair: ||D||^2 = 4 cov^2 and phi^2 = cov^2 / (p_a q_a p_b q_b), so its
    # dependence per unit of interaction dimension is phi^2 times its weight
    gen = np.random.default_rng(12)
    for _ in range(20):
        t = gen.dirichlet(np.ones(4)).reshape(2, 2)
        pa, pb = t.sum(axis=1), t.sum(axis=0)
        phi2 = float((((t - np.outer(pa, pb)) ** 2) / np.outer(pa, pb)).sum())
        w = marginal_pair_weights([pa, pb])
        assert w[0, 1] == w[1, 0] and w[0, 0] == 0.0
        assert pair_dependence(t) == pytest.approx(phi2 * w[0, 1], rel=1e-12)


def test_pair_weights_are_normalised_and_validated() -> None:
    margs = [np.array([0.5, 0.5]), np.array([0.9, 0.1]), np.array([1.0]), np.array([0.2, 0.8])]
    raw = marginal_pair_weights(margs)
    profile = DataProfile.from_marginals(margs, 0.02, pair_weights=raw)
    w = profile.weights
    live = [(0, 1), (0, 3), (1, 3)]  # attribute 2 has one category: no pair with it
    assert np.mean([w[a, b] for a, b in live]) == pytest.approx(1.0, rel=1e-12)
    assert w[0, 2] == w[2, 3] == 0.0 and profile.uneven
    np.testing.assert_allclose(w[0, 1] / w[0, 3], raw[0, 1] / raw[0, 3], rtol=1e-12)
    even = DataProfile.from_marginals(margs, 0.02)
    assert not even.uneven and even.weights[0, 1] == even.weights[1, 3] == 1.0
    with pytest.raises(CalmkitError, match=r"pair_weights \(shape \(2, 2\)\) must be \(4, 4\)"):
        DataProfile.from_marginals(margs, 0.02, pair_weights=np.ones((2, 2)))
    with pytest.raises(CalmkitError, match="pair_weights must be symmetric"):
        DataProfile.from_marginals(margs, 0.02, pair_weights=np.triu(np.ones((4, 4)), 1))


def test_a_precisely_measured_pair_takes_its_measurement_and_a_noisy_one_its_prior() -> None:
    values = np.array([0.30, 0.30, 0.02, 0.0])
    variances = np.array([1e-8, 10.0, 1e-8, 10.0])
    expected = np.full(4, 0.1)
    r = _pair_posterior(values, variances, expected)
    assert r[0] == pytest.approx(3.0, rel=1e-2) and r[2] == pytest.approx(0.2, rel=1e-2)
    assert 0.7 < r[1] < 1.3 and 0.7 < r[3] < 1.3  # the prior's mean, 1


def test_the_pilot_profile_weights_pairs_by_their_marginals() -> None:
    schema = Schema.from_sizes([2] * 6)
    flat, skewed = np.array([0.5, 0.5]), np.array([0.9, 0.1])
    pilot, oracles = [], []
    for seed, (a, b), (pa, pb) in [(8, (0, 1), (flat, flat)), (9, (2, 3), (skewed, skewed)),
                                   (10, (4, 5), (flat, skewed))]:  # fmt: skip
        tables, oracle = _pair_tables(np.outer(pa, pb), 50_000, 2.0, count=1, seed=seed)
        pilot.append(MarginalTable((a, b), tables[0].values, tables[0].variance, 50_000))
        oracles.append(oracle)
    profile = estimate_profile(schema, pilot, oracles)
    w = profile.weights
    # pairs the pilot did not measure: weighted by what their margins allow
    assert w[0, 4] > w[0, 2] > w[2, 5]
    raw = marginal_pair_weights(profile.marginals)
    assert w[0, 4] / w[2, 5] == pytest.approx(raw[0, 4] / raw[2, 5], rel=1e-12)
    assert raw[0, 4] / raw[2, 5] == pytest.approx(1 / (4 * 0.09) ** 2, rel=0.1)
