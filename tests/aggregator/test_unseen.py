"""The size of what a max-ent answer cannot see (calmkit_aggregator.reconstruction.unseen)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import truncnorm

from calmkit_aggregator.reconstruction.estimate import draw_estimates
from calmkit_aggregator.reconstruction.marginal import MarginalTable
from calmkit_aggregator.reconstruction.unseen import (
    NO_EVIDENCE,
    InteractionScale,
    lower_order_base,
    missing_sets,
    most_per_dof,
    spread_weights,
    top_interaction,
    unresolved_floor,
    unseen_sizing,
    unseen_squared_bias,
)
from calmkit_client import choose_oracle

PAIR = np.array([[0.30, 0.10, 0.05], [0.05, 0.20, 0.30]])  # dependent 2 x 3


def _views() -> list[MarginalTable]:
    single = np.array([0.4, 0.6])
    return [MarginalTable((0, 1), PAIR, 0.0, 1000), MarginalTable((2,), single, 0.0, 1000)]


def test_missing_sets_are_the_interactions_no_constraint_holds() -> None:
    views = _views()
    assert missing_sets(views, (0, 1)) == []  # a view covers it
    assert missing_sets(views, (0, 2)) == [(0, 1)]
    assert missing_sets(views, (0, 1, 2)) == [(0, 2), (1, 2), (0, 1, 2)]


def test_exact_views_measure_the_pair_strength_and_lower_orders_fill_higher() -> None:
    scale = InteractionScale(_views(), [1e-12, 1e-12])
    base = lower_order_base(PAIR)
    gap = top_interaction(PAIR - base)
    expected = float((gap**2).sum()) / float(spread_weights(base, (0, 1)).sum())
    assert scale.per_dof(2) == pytest.approx(expected, rel=1e-6)
    assert scale.per_dof(3) == scale.per_dof(2)  # no view holds a triple
    assert InteractionScale(_views()[1:], [1e-12]).per_dof(2) == NO_EVIDENCE


def test_unseen_squared_bias_sums_to_strength_times_dof_in_chi_square() -> None:
    scale = InteractionScale(_views(), [1e-12, 1e-12])
    answer = np.outer([0.45, 0.55], [0.4, 0.6])  # independent 2 x 2
    gap = unseen_squared_bias(answer, [(0, 1)], scale)
    assert (gap / answer).sum() == pytest.approx(scale.per_dof(2) * 1)
    assert np.all(gap > 0)


def test_noise_alone_measures_no_interaction() -> None:
    """Views of independent attributes with their noise power: r is about 0."""
    c = 1e-4  # noise power per contrast dimension (iid cells: c on every subspace)
    truth = np.outer([0.3, 0.3, 0.4], [0.5, 0.5])
    estimates = []
    for seed in range(200):
        noise = np.random.default_rng(seed).normal(0, np.sqrt(c), truth.shape)
        tables = [MarginalTable((0, 1), truth + noise, 0.0, 100)]
        pooled = InteractionScale(tables, [c]).pooled(2)
        assert pooled is not None
        estimates.append(max(0.0, pooled.estimate))
    # the noise subtracted, the estimate is ~0 (clipped at 0: about half the runs);
    # the noise's own size, unsubtracted, would be c * dof / spread ~ 1e-4 / 0.33
    strong = InteractionScale(_views(), [1e-12, 1e-12]).per_dof(2)
    assert np.median(estimates) < 1e-5 < strong


@pytest.mark.parametrize("size", [2, 5, 24])
def test_without_evidence_the_bound_is_what_a_perfectly_dependent_pair_misses(size: int) -> None:
    # a = b, uniform: the independent answer misses the truth by exactly the most an
    # L x L table can hold, (L - 1) / L^2 in L2; the bound without evidence (views of
    # one attribute: NO_EVIDENCE, capped at 1 / (L - 1) per dof) sums to the same
    truth = np.eye(size) / size
    answer = np.full((size, size), 1.0 / size**2)
    views = [MarginalTable((a,), np.full(size, 1.0 / size), 0.0, 1000) for a in range(2)]
    bound = unseen_squared_bias(answer, [(0, 1)], InteractionScale(views, [1e-12, 1e-12]))
    assert float(bound.sum()) == pytest.approx(float(((truth - answer) ** 2).sum()), rel=1e-12)
    assert most_per_dof([size, size]) == pytest.approx(1 / (size - 1))


def test_the_cap_leaves_binary_sets_at_no_evidence_and_measured_strengths_below_it() -> None:
    assert most_per_dof([2, 2]) == NO_EVIDENCE
    assert most_per_dof([2, 2, 2]) == 3.0  # above NO_EVIDENCE: binary triples unchanged
    assert most_per_dof([3, 7]) == pytest.approx(2 / 12)
    scale = InteractionScale(_views(), [1e-12, 1e-12])  # the measured 2 x 3 pair
    assert scale.per_dof(2) < most_per_dof([2, 3])
    answer = np.outer([0.45, 0.55], [0.2, 0.3, 0.5])
    gap = unseen_squared_bias(answer, [(0, 1)], scale)
    assert (gap / spread_weights(answer, (0, 1))).max() == pytest.approx(scale.per_dof(2))


SKEWED = np.outer([0.8, 0.1, 0.06, 0.04], [0.7, 0.2, 0.05, 0.05])  # independent, skewed


def _closed_form(table: np.ndarray, power: float) -> float:
    """The strength read in closed form: the set's own noise ``power dof`` is all the
    noise subtracted (what the scale did before it simulated the noise)."""
    base = lower_order_base(table)
    dof = (table.shape[0] - 1) * (table.shape[1] - 1)
    gap = float((top_interaction(table - base) ** 2).sum())
    return (gap - power * dof) / float(spread_weights(base, (0, 1)).sum())


@pytest.mark.parametrize("oracle", [False, True])
def test_skewed_independent_margins_measure_no_strength(oracle: bool) -> None:
    """Independent attributes with skewed margins: a noisy margin times the other's
    skew lands in the top interaction, which the simulated noise accounts for. The
    mean estimate over R runs is 0 within 4 of its standard errors (the served
    variance), the served variance is not below the runs' own (a sample variance of
    R = 200 has relative sd 0.1), and the closed form reads a strength many standard
    errors above 0. Tables with an oracle are drawn as the oracle draws them (OUE at
    eps 1, 12,000 users); without, independent normal noise of the given power."""
    runs = 200
    gen = np.random.default_rng(5)
    if oracle:
        ue = choose_oracle(16, 1.0)
        users = 12_000
        tables = draw_estimates(ue, SKEWED.reshape(-1), users, gen, runs).reshape(runs, 4, 4)
        power = ue.contrast_variance(users)
        views = [MarginalTable((0, 1), t, ue.variance(users), users, ue) for t in tables]
    else:
        power = 1e-4
        tables = SKEWED + gen.normal(0.0, np.sqrt(power), (runs, 4, 4))
        views = [MarginalTable((0, 1), t, 0.0, 100) for t in tables]
    measured = [InteractionScale([v], [power]).strength((0, 1), 0, power) for v in views]
    values = np.array([m[0] for m in measured if m is not None])
    served = np.array([m[1] for m in measured if m is not None])
    assert values.size == runs
    se = math.sqrt(served.mean() / runs)
    assert abs(values.mean()) < 4 * se, (values.mean(), se)
    assert values.var() < 1.5 * served.mean(), (values.var(), served.mean())
    closed = np.mean([_closed_form(t, power) for t in tables])
    assert closed > 10 * se, (closed, se)


def test_an_uncertain_estimate_serves_its_posterior_mean() -> None:
    """A pair whose noise dwarfs any strength it could hold: the estimate, clipped
    at 0, would be 0, but the served strength is the mean of the strength
    flat on [0, most] given the estimate, well above 0; exact views serve the estimate
    itself (test above)."""
    power = 0.04  # the table as measured is exactly independent; its noise is large
    table = np.outer([0.3, 0.3, 0.4], [0.5, 0.2, 0.3])
    scale = InteractionScale([MarginalTable((0, 1), table, 0.0, 100)], [power])
    pooled = scale.pooled(2)
    assert pooled is not None and pooled.sets == 1 and pooled.within_noise
    estimate, se, most = pooled.estimate, pooled.se, pooled.most
    assert most == most_per_dof([3, 3]) and estimate < 0 < most / 4 < se
    lo, hi = -estimate / se, (most - estimate) / se
    assert scale.per_dof(2) == pytest.approx(truncnorm.mean(lo, hi, loc=estimate, scale=se))
    assert scale.per_dof(2) > 0.0 == max(0.0, estimate)  # clipped, it would serve none


def test_the_sizing_says_how_each_missing_order_was_found() -> None:
    """What an answer's variance_method tells a user about term 4: measured, within
    noise (the posterior mean over [0, most]), or no view holds one (the most, or the
    lower order's strength)."""
    exact = InteractionScale(_views(), [1e-12, 1e-12])  # the dependent 2 x 3 pair, exact
    assert exact.sizing(2) == "pairs: measured on the 1 the views hold"
    assert unseen_sizing([(0, 2)], exact) == "pairs: measured on the 1 the views hold"
    assert unseen_sizing([(0, 1, 2)], exact) == (
        "pairs: measured on the 1 the views hold; "
        "triples: no view holds one, taken as strong as the pairs"
    )
    assert unseen_sizing([], exact) == ""
    noisy = InteractionScale(
        [MarginalTable((0, 1), np.outer([0.3, 0.7], [0.5, 0.5]), 0, 9)], [0.04]
    )
    assert "show no strength above their noise" in noisy.sizing(2)
    singles = InteractionScale(_views()[1:], [1e-12])
    assert singles.sizing(2) == (
        "pairs: no view holds one, sized at the most their tables can hold"
    )


def test_a_category_at_zero_is_floored_at_its_noise_spread_like_the_others() -> None:
    """A category whose estimated margin is 0 gets, in each of its cells, its margin's
    noise times the other attributes' shares squared; cells of categories above 0 get
    nothing (a 0 there is the answer's, not the margin's); an attribute no view holds
    (noise inf) is never floored."""
    values = np.array([[0.5, 0.0, 0.2], [0.3, 0.0, 0.0]])  # column 1 at 0; (1, 2) too
    floor = unresolved_floor(values, [1e-4, 4e-4])
    np.testing.assert_allclose(floor[:, 1], 4e-4 * np.array([0.7, 0.3]) ** 2)
    assert np.all(floor[:, [0, 2]] == 0)
    assert np.all(unresolved_floor(values, [1e-4, np.inf]) == 0)
    both = unresolved_floor(np.array([[0.0, 0.0], [0.0, 1.0]]), [1e-4, 4e-4])
    np.testing.assert_allclose(both, [[1e-4 * 4e-4, 1e-4 * 1.0], [4e-4 * 1.0, 0.0]])


def test_margin_noise_pools_the_views_that_hold_the_attribute() -> None:
    # a 2 x 3 view sums 3 cells into each category of attribute 0; a view of 0 alone
    pair = MarginalTable((0, 1), PAIR, 2e-4, 1000)
    single = MarginalTable((0,), PAIR.sum(axis=1), 1e-3, 1000)
    empty = MarginalTable((0,), PAIR.sum(axis=1), np.inf, 0)
    scale = InteractionScale([pair, single, empty], [1e-4, 1e-3, np.inf])
    assert scale.margin_noise(0) == pytest.approx(1 / (1 / (3 * 2e-4) + 1 / 1e-3))
    assert scale.margin_noise(1) == pytest.approx(2 * 2e-4)
    assert scale.margin_noise(2) == np.inf
