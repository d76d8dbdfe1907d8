"""The data profile: the prior's exact moments, the pilot's margins and dependence read
through their documented rules, the bounds a pair's margins put on it, validation.
(The dependence posterior itself: test_dependence.py.)"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from calmkit_aggregator.planning.dependence import (
    HETEROGENEITY_PRIOR,
    dependence_posterior,
    pair_evidence,
)
from calmkit_aggregator.planning.profile import (
    CONTINGENCY_PRIOR,
    DataProfile,
    dependence_range,
    estimate_profile,
    estimated_marginal,
    marginal_pair_weights,
    pair_caps,
    pair_dependence,
)
from calmkit_aggregator.reconstruction.marginal import MarginalTable
from calmkit_client import CalmkitError, Schema, choose_oracle

from .pilot_tables import pair_tables as _pair_tables

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


def test_the_pilot_profile_weights_pairs_by_their_marginals() -> None:
    schema = Schema.from_sizes([2] * 6)
    flat, skewed = np.array([0.5, 0.5]), np.array([0.9, 0.1])
    pilot, oracles = [], []
    for seed, (a, b), (pa, pb) in [
        (8, (0, 1), (flat, flat)),
        (9, (2, 3), (skewed, skewed)),
        (10, (4, 5), (flat, skewed)),
    ]:
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


def test_pilot_margins_pool_their_views_by_inverse_variance_then_read_them() -> None:
    # attribute 0: a 1-way view (400 reports) and the pair (0, 1) (150 reports), pooled
    # with weights 1 / (per-cell variance x cells summed into a margin cell); attribute
    # 1: the pair only; attribute 2: one view of a single report (it still counts); a
    # view without reports comes first and tells nothing. Each pooled margin is then
    # read by estimated_marginal with the pooled per-cell variance
    schema = Schema.from_sizes([2, 3, 2])
    o1, o2 = choose_oracle(2, 1.0), choose_oracle(6, 1.0)
    one = MarginalTable((0,), np.array([0.7, 0.3]), o1.variance(400), 400)
    pair = MarginalTable(
        (0, 1), np.array([[0.4, 0.1, 0.15], [0.05, 0.2, 0.1]]), o2.variance(150), 150
    )
    single = MarginalTable((2,), np.array([1.6, -0.6]), o1.variance(1), 1)
    empty = MarginalTable((0,), np.array([0.5, 0.5]), np.inf, 0)
    profile = estimate_profile(schema, [empty, one, pair, single], [o1, o1, o2, o1])

    def expected(margins: list[np.ndarray], weights: list[float]) -> np.ndarray:
        p_hat = sum(w * m for w, m in zip(weights, margins)) / sum(weights)
        return estimated_marginal(p_hat, 1.0 / sum(weights))

    def weight(oracle, n: int, cells: int, size: int) -> float:  # type: ignore[no-untyped-def]
        per_cell = oracle.variance(n) + 1.0 / (n * cells)
        return 1.0 / (per_cell * cells / size)

    w_one, w_pair0 = weight(o1, 400, 2, 2), weight(o2, 150, 6, 2)
    np.testing.assert_allclose(
        profile.marginals[0],
        expected([one.values, pair.values.sum(axis=1)], [w_one, w_pair0]),
        rtol=1e-12,
    )
    np.testing.assert_allclose(
        profile.marginals[1],
        expected([pair.values.sum(axis=0)], [weight(o2, 150, 6, 3)]),
        rtol=1e-12,
    )
    np.testing.assert_allclose(
        profile.marginals[2], expected([single.values], [weight(o1, 1, 2, 2)]), rtol=1e-12
    )
    assert profile.reports == 400 + 150 + 1


def test_a_precise_margin_is_itself_and_a_swamped_one_the_priors_median_skew() -> None:
    # precise: the distance T - (L - 1) var and the Norm-Sub shape are the margin's own
    p = np.array([0.6, 0.25, 0.1, 0.05])
    np.testing.assert_allclose(estimated_marginal(p, 1e-12), p, atol=1e-4)
    # swamped by noise: the log-uniform prior's median share of a single category's
    # distance, sqrt(1e-5 x 0.95), whatever the noisy margin showed
    u = np.full(30, 1 / 30)
    noisy = u + np.random.default_rng(3).normal(0, 3.0, 30)
    got = estimated_marginal(noisy, 9.0)
    share = float(((got - u) ** 2).sum()) / (1 - 1 / 30)
    assert share == pytest.approx(math.sqrt(1e-5 * 0.95), rel=0.03)
    # the old rule's trap: 41 categories, one at 91%, as a pilot pair of 7 x 41 cells
    # measures it (per-cell variance 0.023): still clearly skewed (||P||^2 0.83; the
    # Dirichlet(1) prior read ~0.05)
    truth = np.full(41, 0.09 / 40)
    truth[0] = 0.91
    draws = [
        estimated_marginal(truth + g, 0.023)
        for g in np.random.default_rng(4).normal(0, math.sqrt(0.023), (40, 41))
    ]
    power = np.median([float(d @ d) for d in draws])
    assert 0.5 < power < 0.95


def test_a_pilot_profile_brackets_each_margin_by_its_skew_quantiles() -> None:
    # a rare item (2%) and a common one, one pair view: the marginal range holds each
    # attribute's representative at the 10% and 90% posterior quantiles of its distance
    # from uniform, read from the same pooled margin as the median. From 60 reports
    # at eps 2 the noise hides how rare the item is (the ends far apart, in order);
    # from 400,000 the ends are the likelihood's own 10-90% width apart
    schema = Schema.from_sizes([2, 2])
    truth = np.array([[0.68, 0.30], [0.01, 0.01]])
    for n, apart in ((60, True), (400_000, False)):
        tables, oracle = _pair_tables(truth, n, 2.0, count=1, seed=8)
        profile = estimate_profile(schema, tables, [oracle])
        assert profile.marginal_range is not None
        low, high = profile.marginal_range
        per_cell = oracle.variance(n) + 1.0 / (n * 4)
        var = per_cell * 4 / 2  # a margin cell sums two of the table's cells
        for a, axis in ((0, 1), (1, 0)):
            p_hat = tables[0].values.sum(axis=axis)
            for got, q in ((low[a], 0.1), (profile.marginals[a], 0.5), (high[a], 0.9)):
                expected = estimated_marginal(p_hat, var, quantile=q)
                np.testing.assert_allclose(got, expected, rtol=1e-9)
            skews = [float(((m - 0.5) ** 2).sum()) for m in (low[a], profile.marginals[a], high[a])]
            assert skews == sorted(skews)
            assert (skews[2] > 2 * skews[0]) is apart
            if not apart:  # precise: the likelihood's 10-90% width, 2 x 1.2816 sd of T
                width = 2 * 1.2816 * math.sqrt(2 * var**2 + 4 * skews[1] * var)
                assert skews[2] - skews[0] == pytest.approx(width, rel=0.1)
    # a given profile has none, unless given; checked like the marginals
    assert DataProfile.from_marginals([np.array([0.5, 0.5])], 0.0).marginal_range is None
    one = (np.array([0.5, 0.5]),)
    with pytest.raises(CalmkitError, match=r"marginal_range \(1 sets\) must hold two"):
        DataProfile(one, 0.0, marginal_range=(one,))  # type: ignore[arg-type]
    with pytest.raises(CalmkitError, match=r"marginal_range \(sizes \[3\]\) must match"):
        DataProfile(one, 0.0, marginal_range=(one, (np.ones(3) / 3,)))
    with pytest.raises(CalmkitError, match=r"marginals\[0\] must be a distribution"):
        DataProfile(one, 0.0, marginal_range=(one, (np.array([0.7, 0.7]),)))
    ranged = DataProfile(one, 0.1, marginal_range=(one, one))
    swapped = ranged.with_marginals((np.array([0.9, 0.1]),))
    assert swapped.marginal_range is None and swapped.dependence == 0.1
    np.testing.assert_allclose(swapped.marginals[0], [0.9, 0.1])


def test_a_sharpened_margin_reaches_its_skew_and_stops_short_of_one_category() -> None:
    from calmkit_aggregator.planning.profile import _MOST_SKEW, _sharpened

    shape = np.array([0.4, 0.3, 0.2, 0.1])
    u = 0.25
    for skew in (0.1, 0.3, 0.6):
        out = _sharpened(shape, skew)
        assert ((out - u) ** 2).sum() == pytest.approx(skew, rel=1e-6)
        assert np.all(np.diff(out) <= 0)  # the order of the shape is kept
    # an estimate far beyond what the noise allows stops within _MOST_SKEW of a single
    # category's distance (the prior's top): the other categories keep some mass
    far = estimated_marginal(np.array([1.6, -0.2, -0.2, -0.2]), 1e-6)
    assert 0.98 * _MOST_SKEW * 0.75 < ((far - u) ** 2).sum() <= _MOST_SKEW * 0.75
    assert far.min() > 0


def test_pair_caps_bound_every_table_and_are_tight_for_a_perfect_dependence() -> None:
    gen = np.random.default_rng(5)
    for _ in range(200):
        la, lb = (int(x) for x in gen.integers(2, 12, size=2))
        t = gen.dirichlet(np.full(la * lb, gen.choice([0.05, 0.5, 5.0]))).reshape(la, lb)
        caps = pair_caps([t.sum(axis=1), t.sum(axis=0)])
        assert pair_dependence(t) <= caps[0, 1] * (1 + 1e-12) and caps[0, 1] == caps[1, 0]
    # a perfect dependence of L x L with uniform margins holds (1/L - 1/L^2) of the
    # bound's (1/L + 1/L^2)
    size = 30
    perfect = np.eye(size) / size
    caps = pair_caps([np.full(size, 1 / size)] * 2)
    assert pair_dependence(perfect) / caps[0, 1] == pytest.approx((size - 1) / (size + 1))
    assert pair_caps([np.ones(1), np.full(2, 0.5)])[0, 1] == 0.0


def test_the_dependence_estimate_divides_the_pairs_statistics_by_their_weights() -> None:
    # three disjoint pairs of uniform binary attributes (every pair weight 1) with one
    # dependence, measured precisely: the estimate is that dependence, within 4 of its
    # own posterior standard deviations (sum of statistics over sum of weights)
    schema = Schema.from_sizes([2] * 6)
    truths = [np.array([[0.35, 0.15], [0.15, 0.35]])] * 3
    pilot, oracles = [], []
    for i, truth in enumerate(truths):
        tables, oracle = _pair_tables(truth, 400_000, 4.0, count=1, seed=20 + i)
        pilot.append(
            MarginalTable((2 * i, 2 * i + 1), tables[0].values, tables[0].variance, 400_000)
        )
        oracles.append(oracle)
    profile = estimate_profile(schema, pilot, oracles)
    target = float(np.mean([pair_dependence(t) for t in truths]))
    # three pairs alike: within the posterior's 10-90% range, which the pairs'
    # possible heterogeneity keeps wide (alpha 4 alone gives a Gamma(12) mean: sd 29%)
    quantiles = profile.dependence_quantiles
    assert quantiles[0] <= target <= quantiles[-1]
    assert abs(math.log(profile.dependence / target)) < math.log(1.5)


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
    assert DataProfile.from_marginals(
        margs,
        0.02,
        pair_weights=np.array(
            [[0, 0, 1, 2], [0, 0, 0, 0], [1, 0, 0, 1], [2, 0, 1, 0]], dtype=float
        ),
    ).uneven


def test_the_posterior_without_information_has_the_prior_spread() -> None:
    # pairs whose noise swamps every dependence: the posterior's sd is the log-uniform
    # prior's (to the lattice's resolution, 3%)
    prior = DataProfile.prior(Schema.from_sizes([2, 2]))
    truth = np.full((2, 2), 0.25)
    tables, oracle = _pair_tables(truth, 2, 0.05, count=1, seed=1)
    evidence = pair_evidence(tables, [oracle], [np.full(2, 0.5)] * 2)
    post = dependence_posterior(evidence, np.ones(1), dependence_range(prior.marginals))
    assert post.sd == pytest.approx(prior.dependence_sd, rel=0.05)


def test_a_given_profile_is_exact_normalised_and_read_only() -> None:
    near = np.array([0.3, 0.7 - 5e-7])  # within the 1e-6 a distribution may be off
    profile = DataProfile.from_marginals([near, np.array([0.5, 0.5])], 0.02)
    assert profile.marginals[0].sum() == pytest.approx(1.0, abs=1e-15)
    assert profile.dependence_sd == 0.0 and profile.dependence_quantiles == (0.02,)
    summary = profile.to_dict()
    assert summary["dependence_sd"] == 0.0 and summary["dependence_quantiles"] == [0.02]
    weighted = DataProfile.from_marginals(
        [near, np.array([0.5, 0.5]), np.array([0.2, 0.8])], 0.02, pair_weights=np.ones((3, 3))
    )
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


def test_the_prior_is_log_uniform_on_its_documented_range() -> None:
    # phi^2 log-uniform on [1e-3, 0.5], times what the Dirichlet(1) representatives
    # allow: ||P||^2 = 1/L + (L-1)/(L (L+1)) gives h = L (1 - ||P||^2) / (L - 1) = 2/3
    # (binary) and 3/4 (three categories), so the one pair's range is [5e-4, 0.25]:
    # median sqrt(1.25e-4), quantiles 5e-4 x 500^f
    prior = DataProfile.prior(Schema.from_sizes([2, 3]))
    assert CONTINGENCY_PRIOR == (1e-3, 0.5) and HETEROGENEITY_PRIOR == (1 / 64, 4.0)
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
    from calmkit_aggregator.planning.profile import _representative

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
    assert pair_evidence([one], [oracle], margs).pairs.tolist() == [[0, 1]]
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
    # attribute 0 is always in category 0: its pilot margin stops short of the point
    # (1, 0) (at most _MOST_SKEW of the way), so the pair keeps a small positive weight
    # and the estimate stays finite
    truth = np.array([[0.5, 0.5], [0.0, 0.0]])
    tables, pair_oracle = _pair_tables(truth, 2_000_000, 4.0, count=1, seed=11)
    profile = estimate_profile(Schema.from_sizes([2, 2]), tables, [pair_oracle])
    assert math.isfinite(profile.dependence) and math.isfinite(profile.dependence_sd)


def test_more_posterior_and_weight_edges() -> None:
    # precise pairs far above the prior's range: every quantile at the range's top
    # (its lattice point), and each pair's own mean finite at its measured value
    from calmkit_aggregator.planning.dependence import _GRID, PairEvidence

    gen = np.random.default_rng(2)
    null = gen.gamma(50.0, 1e-4, size=(40, 200))  # mean 0.005, 100 dimensions
    far = PairEvidence(
        np.zeros((40, 2), dtype=np.int64),
        np.full(40, 0.005 + 5.0 * 0.25),
        null,
        np.full(40, 0.25),
        np.full(40, 100.0),
    )
    post = dependence_posterior(far, np.ones(40), (1e-3, 0.3))
    step = (0.3 / 1e-3) ** (1 / (_GRID - 1))  # the lattice's
    assert all(0.3 / step**1.01 <= q <= 0.3 for q in post.quantiles)
    assert np.all(np.isfinite(post.pair_means))
    np.testing.assert_allclose(post.pair_means, 5.0, rtol=0.05)
    # negative cells are not a distribution, even summing to 1
    with pytest.raises(CalmkitError, match=r"^marginals\[0\] must be a distribution"):
        DataProfile.from_marginals([np.array([1.2, -0.2])], 0.0)
    # one pair only, or weights equal up to rounding: even
    two = DataProfile.from_marginals(
        [np.array([0.5, 0.5])] * 2, 0.0, pair_weights=np.full((2, 2), 0.3)
    )
    assert not two.uneven
    third = DataProfile.from_marginals(
        [np.array([0.5, 0.5])] * 4, 0.0, pair_weights=np.full((4, 4), 0.1)
    )
    assert not third.uneven
    rounded = np.ones((4, 4))
    rounded[0, 2] = rounded[2, 0] = 1 + 1e-12
    assert not DataProfile.from_marginals(
        [np.array([0.5, 0.5])] * 4, 0.0, pair_weights=rounded
    ).uneven


def test_marginal_pair_weights_for_more_categories() -> None:
    # h_a = (1 - ||P_a||^2) / (L_a - 1) x L_a; pair weight h_a h_b
    margs = [np.array([0.5, 0.3, 0.2]), np.array([0.7, 0.2, 0.05, 0.05]), np.array([0.9, 0.1])]
    h = [(1 - float(p @ p)) / (p.size - 1) * p.size for p in margs]
    raw = marginal_pair_weights(margs)
    for a, b in itertools.combinations(range(3), 2):
        assert raw[a, b] == pytest.approx(h[a] * h[b], rel=1e-12)


def test_the_representative_stops_at_the_simplex_edge_on_its_ray() -> None:
    from calmkit_aggregator.planning.profile import _representative

    mean = np.array([0.5, 0.3, 0.2])
    u = np.full(3, 1 / 3)
    out = _representative(mean, 1.0)  # far more skew than the simplex allows
    direction = (mean - u) / np.linalg.norm(mean - u)
    t = float((out - u) @ direction)
    np.testing.assert_allclose(out, u + t * direction, atol=1e-12)  # on the ray
    assert out.min() == pytest.approx(0.0, abs=1e-12) and out.sum() == pytest.approx(1.0)


def test_last_profile_edges() -> None:
    import dataclasses

    profile = DataProfile.from_marginals(
        [np.array([0.5, 0.5])] * 2, 0.01, pair_weights=np.full((2, 2), 0.3)
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        profile.dependence = 0.5  # type: ignore[misc]
    assert profile.weights[0, 1] == 1.0  # one pair: normalised to mean 1 all the same
    with pytest.raises(CalmkitError, match=r"^pair_weights must be symmetric$"):
        DataProfile.from_marginals(
            [np.array([0.5, 0.5])] * 2, 0.0, pair_weights=np.array([[0.0, 2.0], [1.0, 0.0]])
        )
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
    got = pair_evidence(
        [single, pair],
        [choose_oracle(2, 1.0), oracle],
        [np.full(2, 0.5), np.full(3, 1 / 3), np.full(2, 0.5), np.full(2, 0.5)],
    )
    assert got.pairs.tolist() == [[2, 3]]
    # a pair view without reports tells nothing
    empty = MarginalTable((2, 3), np.full((2, 2), 0.25), np.inf, 0)
    assert pair_evidence([empty], [oracle], [np.full(2, 0.5)] * 4).pairs.shape == (0, 2)


def test_margins_that_allow_no_dependence_still_give_a_positive_range() -> None:
    # every attribute constant (a point mass): the margins allow no dependence, and the
    # range is the contingency prior times a floor of 1e-12, not zero (log-spaced)
    lo, hi = dependence_range([np.array([1.0, 0.0]), np.array([0.0, 1.0])])
    assert (lo, hi) == pytest.approx((1e-3 * 1e-12, 0.5 * 1e-12), rel=1e-9, abs=0)
    assert dependence_range([np.full(2, 0.5)] * 2) == pytest.approx(CONTINGENCY_PRIOR)
    assert dependence_range([np.ones(1), np.full(2, 0.5)]) == pytest.approx(CONTINGENCY_PRIOR)
