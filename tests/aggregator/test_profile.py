"""The data profile: the prior's exact moments, the pilot's dependence estimate
(unbiased, with the stated variance), the posterior and validation."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from calmkit_aggregator.marginal import MarginalTable
from calmkit_aggregator.profile import (
    CONTINGENCY_PRIOR,
    HETEROGENEITY_PRIOR,
    DataProfile,
    _dependence_posterior,
    _normalised_weights,
    _pair_posterior,
    _pair_statistics,
    dependence_range,
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
    lo, hi = dependence_range(prior.marginals)
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
    bounds = lo, hi = (1e-3, 0.3)
    # precise data from very many pairs (their mean has no spread left): the data
    median, sd, quantiles = _dependence_posterior(0.05, 1e-8, 1e6, bounds)
    assert median == pytest.approx(0.05, rel=1e-2) and sd < 1e-3
    assert list(quantiles) == sorted(quantiles) and len(quantiles) == 5
    weak, _, weak_q = _dependence_posterior(0.0, 100.0, 8, bounds)  # no information: the prior
    assert weak == pytest.approx(math.sqrt(lo * hi), rel=1e-2)
    assert weak_q[0] == pytest.approx(lo * (hi / lo) ** 0.1, rel=1e-2)
    assert _dependence_posterior(-1.0, 1e-6, 1e6, bounds)[0] == pytest.approx(lo, rel=1e-2)
    # nothing explains x at all: every quantile at the nearer end, exactly
    assert _dependence_posterior(-5.0, 1e-6, 1e6, bounds)[2] == (lo,) * 5
    # and above it: the top, exactly (only FFT round-off is left below the range, and
    # keeping it would put the quantiles wherever the round-off happens to be largest)
    for x, count in itertools.product((2.0, 5.0, 20.0), (1e6, 1e8)):
        assert _dependence_posterior(x, 1e-6, count, bounds)[2] == pytest.approx((hi,) * 5)
    # an exact zero without noise: only the Gamma's mass at u = 0 explains it, equally
    # for every D, so the posterior is the prior (log-uniform: quantiles lo (hi/lo)^f)
    flat = _dependence_posterior(0.0, 0.0, 1.0, bounds)[2]
    prior_q = [lo * (hi / lo) ** f for f in (0.1, 0.3, 0.5, 0.7, 0.9)]
    np.testing.assert_allclose(flat, prior_q, rtol=2 * math.log(hi / lo) / 4000)
    # a little beyond the range, with a small but real likelihood: its top, not a point
    edge = _dependence_posterior(0.35, 1e-4, 1e6, bounds)[2]
    assert 0.29 < edge[0] < edge[-1] <= hi
    # precise data from few pairs: heavy-tailed pairs may have missed the dependence,
    # so the posterior reaches above the estimate (and never pins it)
    few = _dependence_posterior(0.01, 1e-12, 4, bounds)[2]
    assert few[0] < 0.01 < few[-1] and few[-1] > 2 * 0.01


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


# -- the pilot's estimate, replayed from its documented rules -------------------------


def test_pilot_margins_pool_their_views_by_inverse_variance_then_shrink_to_uniform() -> None:
    # attribute 0: a 1-way view (400 reports) and the pair (0, 1) (150 reports), pooled
    # with weights 1 / (per-cell variance x cells summed into a margin cell); attribute
    # 1: the pair only; attribute 2: one view of a single report (it still counts); a
    # view without reports comes first and tells nothing. Each pooled margin shrinks
    # towards uniform by k = v0 / (v0 + var) and keeps the expected distance.
    schema = Schema.from_sizes([2, 3, 2])
    o1, o2 = choose_oracle(2, 1.0), choose_oracle(6, 1.0)
    one = MarginalTable((0,), np.array([0.7, 0.3]), o1.variance(400), 400)
    pair = MarginalTable((0, 1), np.array([[0.4, 0.1, 0.15], [0.05, 0.2, 0.1]]),
                         o2.variance(150), 150)  # fmt: skip
    single = MarginalTable((2,), np.array([1.6, -0.6]), o1.variance(1), 1)
    empty = MarginalTable((0,), np.array([0.5, 0.5]), np.inf, 0)
    profile = estimate_profile(schema, [empty, one, pair, single], [o1, o1, o2, o1])

    def expected(margins: list[np.ndarray], weights: list[float]) -> np.ndarray:
        size = margins[0].size
        p_hat = sum(w * m for w, m in zip(weights, margins)) / sum(weights)
        v0 = (size - 1) / (size * size * (size + 1))
        k = v0 / (v0 + 1.0 / sum(weights))
        u = np.full(size, 1.0 / size)
        skew = k * k * float(((p_hat - u) ** 2).sum()) + (1 - k) * v0 * size
        out: np.ndarray = u + math.sqrt(skew) * (p_hat - u) / np.linalg.norm(p_hat - u)
        return out

    def weight(oracle, n: int, cells: int, size: int) -> float:  # type: ignore[no-untyped-def]
        per_cell = oracle.variance(n) + 1.0 / (n * cells)
        return 1.0 / (per_cell * cells / size)

    w_one, w_pair0 = weight(o1, 400, 2, 2), weight(o2, 150, 6, 2)
    np.testing.assert_allclose(profile.marginals[0], expected(
        [one.values, pair.values.sum(axis=1)], [w_one, w_pair0]), rtol=1e-12)  # fmt: skip
    np.testing.assert_allclose(profile.marginals[1], expected(
        [pair.values.sum(axis=0)], [weight(o2, 150, 6, 3)]), rtol=1e-12)  # fmt: skip
    # one report says little (k = 0.06): the direction is its margin's, the distance
    # mostly the prior's
    np.testing.assert_allclose(profile.marginals[2], expected(
        [single.values], [weight(o1, 1, 2, 2)]), rtol=1e-12)  # fmt: skip
    assert profile.reports == 400 + 150 + 1


def test_the_dependence_estimate_divides_the_pairs_statistics_by_their_weights() -> None:
    # three disjoint pairs of uniform binary attributes (every pair weight 1) with one
    # dependence, measured precisely: the estimate is that dependence, within 4 of its
    # own posterior standard deviations (sum of statistics over sum of weights)
    schema = Schema.from_sizes([2] * 6)
    truths = [np.array([[0.35, 0.15], [0.15, 0.35]])] * 3
    pilot, oracles = [], []
    for i, truth in enumerate(truths):
        tables, oracle = _pair_tables(truth, 400_000, 4.0, count=1, seed=20 + i)
        pilot.append(MarginalTable((2 * i, 2 * i + 1), tables[0].values, tables[0].variance,
                                   400_000))  # fmt: skip
        oracles.append(oracle)
    profile = estimate_profile(schema, pilot, oracles)
    target = float(np.mean([pair_dependence(t) for t in truths]))
    # three pairs alike: within the posterior's 10-90% range, which the pairs'
    # possible heterogeneity keeps wide (alpha 4 alone gives a Gamma(12) mean: sd 29%)
    quantiles = profile.dependence_quantiles
    assert quantiles[0] <= target <= quantiles[-1]
    assert abs(math.log(profile.dependence / target)) < math.log(1.5)


def _posterior_replay(plans, users: int, eps: float) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """Pilot pairs (attributes, margins, planted interaction c): the profile's posterior
    against the documented rule, replayed; returns (sigma2, noise part)."""
    schema = Schema.from_sizes([2] * 6)
    pilot, oracles = [], []
    for i, ((a, b), pa, pb, c) in enumerate(plans):
        truth = np.outer(pa, pb) + c * np.array([[1, -1], [-1, 1]])
        tables, oracle = _pair_tables(truth, users, eps, count=1, seed=30 + i)
        pilot.append(MarginalTable((a, b), tables[0].values, tables[0].variance, users))
        oracles.append(oracle)
    profile = estimate_profile(schema, pilot, oracles)
    pairs, values, variances = _pair_statistics(pilot, oracles, profile.marginals)
    w = np.array(_normalised_weights(marginal_pair_weights(profile.marginals), [2] * 6))
    pw = w[pairs[:, 0], pairs[:, 1]]
    x = values.sum() / pw.sum()
    noise = variances.sum() / pw.sum() ** 2
    count = pw.sum() ** 2 / (pw @ pw)
    median, sd, quantiles = _dependence_posterior(x, noise, count,
                                                  dependence_range(profile.marginals))  # fmt: skip
    # measured pairs: their weight times their own posterior ratio, then renormalised,
    # the dependence moving with the normalisation so that each measured pair keeps
    # its own estimate: dependence x weight = median x pw x ratio
    measured = _pair_posterior(values, variances, median * pw)
    w[pairs[:, 0], pairs[:, 1]] = w[pairs[:, 1], pairs[:, 0]] = pw * measured
    np.testing.assert_allclose(profile.weights, _normalised_weights(w, [2] * 6), rtol=1e-12)
    factor = w.sum() / 30  # 15 pairs, both orders
    assert profile.dependence == pytest.approx(median * factor, rel=1e-12)
    assert profile.dependence_sd == pytest.approx(sd * factor, rel=1e-12)
    np.testing.assert_allclose(profile.dependence_quantiles, np.array(quantiles) * factor,
                               rtol=1e-12)  # fmt: skip
    got = profile.dependence * profile.weights[pairs[:, 0], pairs[:, 1]]
    np.testing.assert_allclose(got, median * pw * measured, rtol=1e-9)
    return noise, count


def test_the_dependence_posterior_replays_its_documented_rule() -> None:
    # the ratio estimate sum x / sum w, its noise sum var / (sum w)^2 and the effective
    # pair count (sum w)^2 / sum w^2 go to the posterior, with the range of the
    # estimated marginals; precisely and noisily measured pairs alike
    flat, skewed = np.array([0.5, 0.5]), np.array([0.8, 0.2])
    three = [((0, 1), flat, flat, 0.1), ((2, 3), skewed, skewed, 0.04),
             ((4, 5), flat, skewed, 0.0)]  # fmt: skip
    precise, count = _posterior_replay(three, 400_000, 4.0)
    assert 1 < count < 3  # unequal weights count as fewer pairs
    noisy, _ = _posterior_replay(three, 300, 0.5)
    assert noisy > 1000 * precise
    _posterior_replay(three[:2], 400_000, 4.0)  # two pairs
    # one skewed pair: its weight is below 1 (the mean over all pairs), and the ratio
    # estimate divides by it
    _posterior_replay(three[1:2], 400_000, 4.0)


def _posterior_mean(value: float, variance: float, expected: float, alpha: float) -> float:
    """E[r | x] for a Gamma(alpha, 1/alpha) prior on r and x ~ N(expected r, variance),
    by adaptive quadrature (the likelihood's peak given as a break point)."""
    from scipy import integrate, stats

    prior = stats.gamma(alpha, scale=1 / alpha)

    def density(r: float, power: int) -> float:
        like = math.exp(-((value - expected * r) ** 2) / (2 * variance))
        return float(r**power * prior.pdf(r) * like)

    points = [1, 10, max(value / expected, 1e-3)]
    moments = [integrate.quad(density, 1e-3, 1e3, args=(power,), points=points, limit=400)[0]
               for power in (0, 1)]  # fmt: skip
    return moments[1] / moments[0]


def test_a_pair_posterior_follows_its_gamma_prior_fitted_to_the_pairs_spread() -> None:
    # _pair_posterior against direct integration: Gamma(alpha, 1/alpha) prior on r with
    # 1/alpha = var(x / expected) - mean(variance / expected^2) (within [1/16, 4]) and
    # a normal likelihood. The grid has 400 log-spaced points over [1e-3, 1e3] (3.5% apart),
    # so narrow posteriors are off by up to 0.9%: 1.5% allowed
    expected = np.array([0.01, 0.02, 0.01, 0.03, 0.02, 0.01])
    cases = [
        np.array([0.002, 0.05, 0.03, 0.01, 0.06, 0.012]),  # spread: alpha from the moments
        np.array([0.3, 0.001, 0.0, 0.4, 0.0, 0.2]),  # heavy spread: alpha at its floor 1/16
        np.array([0.01, 0.02, 0.01, 0.03, 0.02, 0.01]),  # none: alpha at its cap 4
    ]
    variances = np.array([1e-4, 1e-6, 4e-5, 1e-6, 1e-4, 2e-5])
    for values in cases:
        z = values / expected
        excess = np.var(z, ddof=1) - np.mean(variances / expected**2)
        alpha = 1.0 / min(16.0, max(0.25, excess))
        got = _pair_posterior(values, variances, expected)
        for i in range(values.size):
            want = _posterior_mean(values[i], variances[i], expected[i], alpha)
            assert got[i] == pytest.approx(want, rel=1.5e-2)


def test_prior_moments_are_those_of_the_log_uniform_and_zero_cells_are_allowed() -> None:
    from scipy import integrate

    prior = DataProfile.prior(Schema.from_sizes([2, 2]))
    lo, hi = dependence_range(prior.marginals)
    norm = math.log(hi / lo)
    mean = integrate.quad(lambda x: 1 / norm, lo, hi)[0]  # x * density 1 / (x log(hi/lo))
    second = integrate.quad(lambda x: x / norm, lo, hi)[0]
    assert prior.dependence_sd == pytest.approx(math.sqrt(second - mean**2), rel=1e-9)
    # a marginal with an empty category is a distribution
    profile = DataProfile.from_marginals([np.array([1.0, 0.0]), np.array([0.5, 0.5])], 0.0)
    assert profile.skew[0] == pytest.approx(0.5)


def test_pairs_with_a_one_category_attribute_do_not_make_the_weights_uneven() -> None:
    margs = [np.array([0.5, 0.5]), np.array([1.0]), np.array([0.5, 0.5]), np.array([0.5, 0.5])]
    profile = DataProfile.from_marginals(margs, 0.02, pair_weights=np.ones((4, 4)))
    assert profile.weights[0, 1] == 0.0 and not profile.uneven
    assert DataProfile.from_marginals(margs, 0.02, pair_weights=np.array(
        [[0, 0, 1, 2], [0, 0, 0, 0], [1, 0, 0, 1], [2, 0, 1, 0]], dtype=float)).uneven  # fmt: skip


def test_pair_statistics_replay_their_documented_simulation_and_skip_one_category_pairs() -> None:
    # the noise's mean and unbiased variance over _BOOTSTRAP simulated views of the
    # independent table (the seed _BOOTSTRAP, drawn as the oracle draws), in units of
    # dim / L; a pair with a one-category attribute has no interaction and is skipped
    from calmkit_aggregator.profile import _BOOTSTRAP, _dependence_stat, _draw_estimates

    truth = np.array([[0.4, 0.05, 0.05], [0.05, 0.2, 0.25]])
    tables, oracle = _pair_tables(truth, 900, 1.0, count=1, seed=4)
    margs = [truth.sum(axis=1), truth.sum(axis=0), np.ones(1)]
    flat = MarginalTable((1, 2), np.full((3, 1), 1 / 3), oracle.variance(900), 900)
    pairs, values, variances = _pair_statistics(
        [flat, tables[0]], [choose_oracle(3, 1.0), oracle], margs
    )
    assert pairs.tolist() == [[0, 1]]
    gen = np.random.default_rng(_BOOTSTRAP)
    noise = _dependence_stat(_draw_estimates(oracle, np.outer(*margs[:2]).reshape(-1), 900, gen),
                             2, 3)  # fmt: skip
    raw = float(_dependence_stat(tables[0].values.reshape(1, -1), 2, 3)[0])
    unit, mean = 2 / 6, float(noise.mean())
    assert raw > 2 * mean  # a clear signal: the cross term counts
    assert values[0] == pytest.approx((raw - mean) / unit, rel=1e-12)
    spread = float(((noise - mean) ** 2).sum() / (noise.size - 1))
    assert variances[0] == pytest.approx(
        (spread + 4 * max(0.0, raw - mean) * mean / 2) / unit**2, rel=1e-12)  # fmt: skip


def test_the_posterior_without_information_has_the_prior_spread() -> None:
    # a likelihood flat over the prior's range: the posterior's sd is the log-uniform's
    prior = DataProfile.prior(Schema.from_sizes([2, 2]))
    _, sd, _ = _dependence_posterior(0.0, 1e6, 8, dependence_range(prior.marginals))
    assert sd == pytest.approx(prior.dependence_sd, rel=1e-3)


def test_a_given_profile_is_exact_normalised_and_read_only() -> None:
    near = np.array([0.3, 0.7 - 5e-7])  # within the 1e-6 a distribution may be off
    profile = DataProfile.from_marginals([near, np.array([0.5, 0.5])], 0.02)
    assert profile.marginals[0].sum() == pytest.approx(1.0, abs=1e-15)
    assert profile.dependence_sd == 0.0 and profile.dependence_quantiles == (0.02,)
    summary = profile.to_dict()
    assert summary["dependence_sd"] == 0.0 and summary["dependence_quantiles"] == [0.02]
    weighted = DataProfile.from_marginals([near, np.array([0.5, 0.5]), np.array([0.2, 0.8])],
                                          0.02, pair_weights=np.ones((3, 3)))  # fmt: skip
    assert not weighted.weights.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        weighted.weights[0, 1] = 5.0
    with pytest.raises(
        CalmkitError, match=r"^marginals\[0\] \(shape \(0,\)\) must be a 1-D table$"
    ):
        DataProfile.from_marginals([np.array([])], 0.0)
    with pytest.raises(CalmkitError, match=r"^dependence_quantiles \(\(-0.5, 0.1\)\) must be"):
        DataProfile((np.array([0.5, 0.5]),), 0.1, dependence_quantiles=(-0.5, 0.1))
    with pytest.raises(CalmkitError, match=r"^dependence_sd \(-1.0\) must be finite and >= 0$"):
        DataProfile((np.array([0.5, 0.5]),), 0.1, dependence_sd=-1.0)


def test_a_pair_with_one_category_has_no_dependence() -> None:
    assert pair_dependence(np.array([[0.2, 0.3, 0.5]])) == 0.0
    assert pair_dependence(np.array([[0.5], [0.5]])) == 0.0


def test_pair_tables_above_1024_cells_do_not_estimate_the_dependence() -> None:
    # the bootstrap of a pair table costs O(cells) per draw: tables above _DENSE = 1024
    # cells are left out (their pair keeps its prior weight)
    out = []
    for shape in ((32, 32), (25, 41)):
        truth = np.full(shape, 1.0 / (shape[0] * shape[1]))
        oracle = choose_oracle(truth.size, 1.0)
        table = MarginalTable((0, 1), truth, oracle.variance(5000), 5000)
        margs = [truth.sum(axis=1), truth.sum(axis=0)]
        out.append(_pair_statistics([table], [oracle], margs)[0].shape[0])
    assert out == [1, 0]


def test_a_single_pair_posterior_uses_a_unit_prior_shape() -> None:
    # one measured pair gives no spread to fit alpha: alpha = 1 (excess 1)
    for value, variance in ((0.05, 4e-4), (0.0, 1e-4), (0.02, 1e-3)):
        got = _pair_posterior(np.array([value]), np.array([variance]), np.array([0.01]))
        assert got[0] == pytest.approx(_posterior_mean(value, variance, 0.01, 1.0), rel=1.5e-2)


@pytest.mark.parametrize(("cells", "eps"), [(4, 1.0), (16, 1.0), (6, 3.0)])
def test_the_pilot_bootstrap_draws_reports_as_the_oracle_does(cells: int, eps: float) -> None:
    # _draw_estimates: unbiased, with the oracle's exact per-cell variance for a
    # population drawn from the table, i.e. for a fixed population plus the multinomial
    # draw of the users, t (1 - t) / n (GRR for 4 and 6 cells here, OUE for 16); 40
    # calls x _BOOTSTRAP draws, bounds 4 standard errors (the variance's from its
    # chi-square law, var sqrt(2 / (N - 1)))
    from calmkit_aggregator.profile import _draw_estimates

    oracle = choose_oracle(cells, eps)
    truth = np.random.default_rng(cells).dirichlet(np.ones(cells))
    gen = np.random.default_rng(7)
    draws = np.concatenate([_draw_estimates(oracle, truth, 300, gen) for _ in range(40)])
    exact = np.asarray(oracle.variance(300, truth)) + truth * (1 - truth) / 300
    se_mean = np.sqrt(exact / draws.shape[0])
    assert np.all(np.abs(draws.mean(axis=0) - truth) <= MARGIN * se_mean)
    se_var = exact * math.sqrt(2 / (draws.shape[0] - 1))
    assert np.all(np.abs(draws.var(axis=0, ddof=1) - exact) <= MARGIN * se_var)
    assert oracle.name == ("OUE" if cells == 16 else "GRR")


def test_the_prior_is_log_uniform_on_its_documented_range() -> None:
    # phi^2 log-uniform on [1e-3, 0.5], times what the Dirichlet(1) representatives
    # allow: ||P||^2 = 1/L + (L-1)/(L (L+1)) gives h = L (1 - ||P||^2) / (L - 1) = 2/3
    # (binary) and 3/4 (three categories), so the one pair's range is [5e-4, 0.25]:
    # median sqrt(1.25e-4), quantiles 5e-4 x 500^f
    prior = DataProfile.prior(Schema.from_sizes([2, 3]))
    assert CONTINGENCY_PRIOR == (1e-3, 0.5) and HETEROGENEITY_PRIOR == (1 / 16, 4.0)
    assert dependence_range(prior.marginals) == pytest.approx((5e-4, 0.25), rel=1e-12)
    assert prior.dependence == pytest.approx(math.sqrt(1.25e-4), rel=1e-12)
    expected = [5e-4 * 500**f for f in (0.1, 0.3, 0.5, 0.7, 0.9)]
    np.testing.assert_allclose(prior.dependence_quantiles, expected, rtol=1e-12)
    assert prior.reports == 0 and prior.source == "prior"
    given = DataProfile.from_marginals([np.array([0.5, 0.5])] * 2, 0.01)
    assert given.reports == 0 and given.to_dict()["pair_weights"] == "even"


def test_pair_weights_checks_and_fallbacks() -> None:
    margs = [np.array([0.5, 0.5]), np.array([0.9, 0.1]), np.array([1.0]), np.array([0.2, 0.8])]
    with pytest.raises(CalmkitError, match=r"^pair_weights must be finite and >= 0$"):
        DataProfile.from_marginals(margs, 0.02, pair_weights=-np.ones((4, 4)))
    # all zero: every pair alike
    zero = DataProfile.from_marginals(margs, 0.02, pair_weights=np.zeros((4, 4)))
    assert not zero.uneven and zero.weights[0, 1] == zero.weights[1, 3] == 1.0
    # symmetric up to rounding is symmetric
    w = np.array([[0, 1, 0, 2], [1, 0, 0, 3], [0, 0, 0, 0], [2, 3, 0, 0]], dtype=float)
    w[0, 1] *= 1 + 1e-12
    tilted = DataProfile.from_marginals(margs, 0.02, pair_weights=w)
    assert tilted.uneven and tilted.to_dict()["pair_weights"] == "uneven"
    # a one-category attribute allows no interaction
    raw = marginal_pair_weights(margs)
    assert raw[2].tolist() == [0.0] * 4 and raw[:, 2].tolist() == [0.0] * 4


def test_the_representative_keeps_a_direction_with_an_exact_zero() -> None:
    from calmkit_aggregator.profile import _representative

    mean = np.array([1 / 3, 0.5, 1 / 6])  # its first coordinate equals uniform's
    out = _representative(mean, 0.02)
    assert np.all(np.isfinite(out)) and out.sum() == pytest.approx(1.0)
    assert ((out - 1 / 3) ** 2).sum() == pytest.approx(0.02, rel=1e-9)
    assert out[0] == pytest.approx(1 / 3)


def test_pilot_pairs_with_one_report_count_and_attributes_no_view_holds_keep_the_prior() -> None:
    truth = np.array([[0.4, 0.1], [0.1, 0.4]])
    oracle = choose_oracle(4, 1.0)
    one = MarginalTable((0, 1), truth, oracle.variance(1), 1)
    margs = [truth.sum(axis=1), truth.sum(axis=0)]
    assert _pair_statistics([one], [oracle], margs)[0].tolist() == [[0, 1]]
    schema = Schema.from_sizes([2, 2, 3])
    profile = estimate_profile(schema, [one], [oracle])
    np.testing.assert_array_equal(profile.marginals[2], DataProfile.prior(schema).marginals[2])


def test_evenness_sees_every_pair_and_a_lone_attribute_has_no_pairs() -> None:
    margs = [np.array([0.5, 0.5])] * 4
    w = np.ones((4, 4))
    w[0, 1] = w[1, 0] = 2.0  # only a pair next to the diagonal differs
    assert DataProfile.from_marginals(margs, 0.01, pair_weights=w).uneven
    lone = DataProfile.from_marginals([np.array([0.5, 0.5])], 0.01, pair_weights=np.ones((1, 1)))
    assert lone.weights.tolist() == [[0.0]] and not lone.uneven


def test_pilot_views_hold_one_or_two_attributes_and_degenerate_margins_are_handled() -> None:
    schema = Schema.from_sizes([2, 2, 2])
    oracle = choose_oracle(8, 1.0)
    triple = MarginalTable((0, 1, 2), np.full((2, 2, 2), 1 / 8), oracle.variance(100), 100)
    with pytest.raises(CalmkitError, match=r"^pilot view \[0, 1, 2\] must hold one or two"):
        estimate_profile(schema, [triple], [oracle])
    # attribute 0 is always in category 0: its pilot margin, shrunk towards uniform,
    # stays short of the point (1, 0), so the pair keeps a tiny positive weight and the
    # estimate stays finite
    truth = np.array([[0.5, 0.5], [0.0, 0.0]])
    tables, pair_oracle = _pair_tables(truth, 2_000_000, 4.0, count=1, seed=11)
    profile = estimate_profile(Schema.from_sizes([2, 2]), tables, [pair_oracle])
    assert math.isfinite(profile.dependence) and math.isfinite(profile.dependence_sd)


def test_more_posterior_and_weight_edges() -> None:
    # precise data in the middle of the prior's range: the posterior is the likelihood,
    # sd = sigma (the log-uniform prior's slope moves it by under 5% over +-2 sigma)
    # (very many pairs: no heterogeneity left in their mean)
    _, sd, _ = _dependence_posterior(0.05, 0.002**2, 1e6, (1e-3, 0.3))
    assert sd == pytest.approx(0.002, rel=0.05)
    # far above the prior's range: every quantile is its upper end
    hi = 0.3
    assert _dependence_posterior(5.0, 1e-6, 1e6, (1e-3, hi))[2] == (pytest.approx(hi),) * 5
    # a pair measured far beyond the ratio grid (r up to 1e3) still has a finite
    # posterior at the grid's top
    r = _pair_posterior(np.array([50.0]), np.array([1e-6]), np.array([0.01]))
    assert np.isfinite(r[0]) and r[0] == pytest.approx(1e3, rel=0.01)
    # negative cells are not a distribution, even summing to 1
    with pytest.raises(CalmkitError, match=r"^marginals\[0\] must be a distribution"):
        DataProfile.from_marginals([np.array([1.2, -0.2])], 0.0)
    # one pair only, or weights equal up to rounding: even
    two = DataProfile.from_marginals([np.array([0.5, 0.5])] * 2, 0.0,
                                     pair_weights=np.full((2, 2), 0.3))  # fmt: skip
    assert not two.uneven
    third = DataProfile.from_marginals([np.array([0.5, 0.5])] * 4, 0.0,
                                       pair_weights=np.full((4, 4), 0.1))  # fmt: skip
    assert not third.uneven
    rounded = np.ones((4, 4))
    rounded[0, 2] = rounded[2, 0] = 1 + 1e-12
    assert not DataProfile.from_marginals([np.array([0.5, 0.5])] * 4, 0.0,
                                          pair_weights=rounded).uneven  # fmt: skip


def test_marginal_pair_weights_for_more_categories() -> None:
    # h_a = (1 - ||P_a||^2) / (L_a - 1) x L_a; pair weight h_a h_b
    margs = [np.array([0.5, 0.3, 0.2]), np.array([0.7, 0.2, 0.05, 0.05]), np.array([0.9, 0.1])]
    h = [(1 - float(p @ p)) / (p.size - 1) * p.size for p in margs]
    raw = marginal_pair_weights(margs)
    for a, b in itertools.combinations(range(3), 2):
        assert raw[a, b] == pytest.approx(h[a] * h[b], rel=1e-12)


def test_the_representative_stops_at_the_simplex_edge_on_its_ray() -> None:
    from calmkit_aggregator.profile import _representative

    mean = np.array([0.5, 0.3, 0.2])
    u = np.full(3, 1 / 3)
    out = _representative(mean, 1.0)  # far more skew than the simplex allows
    direction = (mean - u) / np.linalg.norm(mean - u)
    t = float((out - u) @ direction)
    np.testing.assert_allclose(out, u + t * direction, atol=1e-12)  # on the ray
    assert out.min() == pytest.approx(0.0, abs=1e-12) and out.sum() == pytest.approx(1.0)


def test_last_profile_edges() -> None:
    import dataclasses

    profile = DataProfile.from_marginals([np.array([0.5, 0.5])] * 2, 0.01,
                                         pair_weights=np.full((2, 2), 0.3))  # fmt: skip
    with pytest.raises(dataclasses.FrozenInstanceError):
        profile.dependence = 0.5  # type: ignore[misc]
    assert profile.weights[0, 1] == 1.0  # one pair: normalised to mean 1 all the same
    with pytest.raises(CalmkitError, match=r"^pair_weights must be symmetric$"):
        DataProfile.from_marginals([np.array([0.5, 0.5])] * 2, 0.0,
                                   pair_weights=np.array([[0.0, 2.0], [1.0, 0.0]]))  # fmt: skip
    # an attribute no pilot view holds, before held ones, keeps the prior's marginal
    truth = np.array([[0.4, 0.1], [0.1, 0.4]])
    tables, oracle = _pair_tables(truth, 5000, 1.0, count=1, seed=12)
    pair = MarginalTable((2, 3), tables[0].values, tables[0].variance, 5000)
    schema = Schema.from_sizes([2, 3, 2, 2])
    est = estimate_profile(schema, [pair], [oracle])
    prior = DataProfile.prior(schema)
    np.testing.assert_array_equal(est.marginals[0], prior.marginals[0])
    np.testing.assert_array_equal(est.marginals[1], prior.marginals[1])
    assert abs(est.marginals[2][0] - 0.5) < 0.1 and est.marginals[3].size == 2
    # a 1-way view before a pair: the pair still counts
    single = MarginalTable((0,), np.array([0.5, 0.5]), choose_oracle(2, 1.0).variance(100), 100)
    got = _pair_statistics(
        [single, pair],
        [choose_oracle(2, 1.0), oracle],
        [np.full(2, 0.5), np.full(3, 1 / 3), np.full(2, 0.5), np.full(2, 0.5)],
    )
    assert got[0].tolist() == [[2, 3]]
    # a pair view without reports tells nothing
    empty = MarginalTable((2, 3), np.full((2, 2), 0.25), np.inf, 0)
    assert _pair_statistics([empty], [oracle], [np.full(2, 0.5)] * 4)[0].shape == (0, 2)


def test_a_pair_posterior_fits_alpha_from_two_pairs() -> None:
    values, variances = np.array([0.05, 0.001]), np.array([1e-5, 1e-5])
    expected = np.array([0.01, 0.01])
    z = values / expected
    excess = np.var(z, ddof=1) - np.mean(variances / expected**2)
    alpha = 1.0 / min(16.0, max(0.25, excess))
    got = _pair_posterior(values, variances, expected)
    for i in range(2):
        want = _posterior_mean(values[i], variances[i], expected[i], alpha)
        assert got[i] == pytest.approx(want, rel=1.5e-2)
    assert alpha != 1.0  # the moments decide, not the one-pair default


@pytest.mark.parametrize(
    ("x", "noise", "count", "bounds"),
    [
        (0.003, 1e-5, 8.0, (1e-4, 0.05)),  # noisy, few pairs
        (0.1, 0.002, 8.0, (6e-4, 0.3)),  # a clear signal
        (0.0, 1e-4, 3.0, (1e-4, 0.1)),  # nothing seen
        (0.05, 1e-6, 1.0, (1e-4, 0.1)),  # one precise pair: its Gamma decides
        (0.0, 1e-8, 1.0, (1e-4, 0.1)),  # one precise pair without dependence
        (0.0015, 1e-6, 1.0, (1e-4, 0.1)),  # one pair, x at 1.5 sd: u's mass at 0 counts
    ],
)
def test_the_dependence_posterior_matches_direct_integration(
    x: float, noise: float, count: float, bounds: tuple[float, float]
) -> None:
    # the likelihood of D, sum over alpha of the integral of N(x; D u, noise) against
    # u's Gamma(alpha count, 1/(alpha count)) law, by the trapezoid rule in log u on
    # 40,000 points over [1e-9, 1e3] plus the law's mass below them (at u = 0), on 200
    # points of D; the posterior's quantiles agree within the coarser grid's step (3.2%)
    from scipy import integrate, special, stats

    lo, hi = bounds
    ds = np.geomspace(lo, hi, 200)
    sd = math.sqrt(noise)
    logu = np.linspace(math.log(1e-9), math.log(1e3), 40_000)
    u = np.exp(logu)
    noise_at = np.exp(-0.5 * ((x - ds[:, None] * u[None, :]) / sd) ** 2)  # (200, U)
    like = np.zeros(ds.size)
    for alpha in np.geomspace(*HETEROGENEITY_PRIOR, 9):
        shape = alpha * count
        log_u_density = stats.gamma.logpdf(u, shape, scale=1 / shape) + logu  # per log u
        like += integrate.trapezoid(noise_at * np.exp(log_u_density), logu, axis=1)
        like += special.gammainc(shape, shape * 1e-9) * math.exp(-0.5 * (x / sd) ** 2)
    cdf = np.cumsum(like) / like.sum()
    want = [ds[min(ds.size - 1, int(np.searchsorted(cdf, f)))] for f in (0.1, 0.3, 0.5, 0.7, 0.9)]
    got = _dependence_posterior(x, noise, count, bounds)[2]
    step = (hi / lo) ** (1 / 199)
    for g, w in zip(got, want):
        assert w / step <= g <= w * step


def test_the_dependence_posterior_is_calibrated_on_data_drawn_from_its_model() -> None:
    # D and alpha drawn from their priors, `count` pairs' r from Gamma(alpha, 1/alpha),
    # x = D mean(r) + noise: each posterior quantile f then lies above the true D with
    # probability f (Bayesian calibration), within 4 binomial standard errors over 300
    # draws. Dropping the pairs' heterogeneity (alpha -> inf) fails at the upper
    # quantiles: a few heavy-tailed pairs leave D far above their mean too often.
    gen = np.random.default_rng(7)
    bounds = lo, hi = (1e-4, 0.1)
    draws = 300
    below = np.zeros(5)
    for _ in range(draws):
        dep = lo * (hi / lo) ** gen.random()
        alpha = math.exp(gen.uniform(*np.log(HETEROGENEITY_PRIOR)))
        count = int(gen.integers(1, 40))
        sd = dep * 10 ** gen.uniform(-2, 1)  # from precise to noise-dominated
        r = gen.gamma(alpha, 1 / alpha, size=count)
        x = dep * r.mean() + sd * gen.standard_normal()
        quantiles = _dependence_posterior(x, sd**2, float(count), bounds)[2]
        below += dep <= np.array(quantiles)
    frac = below / draws
    expected = np.array([0.1, 0.3, 0.5, 0.7, 0.9])
    se = np.sqrt(expected * (1 - expected) / draws)
    assert np.all(np.abs(frac - expected) <= MARGIN * se), frac


@pytest.mark.parametrize("x", [0.0123, 0.05, 0.2])
def test_an_exact_estimate_from_many_pairs_lands_within_half_a_lattice_step(x: float) -> None:
    # no noise, 10^8 pairs (their mean's law is a point at 1): the posterior median is
    # the lattice point next to x, so it is within half a step (plus the widening of
    # the noise to one step); a bin of the Gamma's mass shifted by one would move it
    # by a whole step
    from calmkit_aggregator.profile import _GRID

    lo, hi = 1e-3, 0.3
    step = math.log(hi / lo) / (_GRID - 1)
    median = _dependence_posterior(x, 1e-14, 1e8, (lo, hi))[0]
    assert abs(math.log(median / x)) <= 0.5 * step + 1e-12


def test_margins_that_allow_no_dependence_still_give_a_positive_range() -> None:
    # every attribute constant (a point mass): the margins allow no dependence, and the
    # range is the contingency prior times a floor of 1e-12, not zero (log-spaced)
    lo, hi = dependence_range([np.array([1.0, 0.0]), np.array([0.0, 1.0])])
    assert (lo, hi) == pytest.approx((1e-3 * 1e-12, 0.5 * 1e-12), rel=1e-9, abs=0)
    assert dependence_range([np.full(2, 0.5)] * 2) == pytest.approx(CONTINGENCY_PRIOR)
    assert dependence_range([np.ones(1), np.full(2, 0.5)]) == pytest.approx(CONTINGENCY_PRIOR)
