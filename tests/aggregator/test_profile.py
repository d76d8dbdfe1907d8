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
    _pair_statistics,
    estimate_profile,
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
    values, variances = _pair_statistics(tables, [oracle] * len(tables), margs)
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
