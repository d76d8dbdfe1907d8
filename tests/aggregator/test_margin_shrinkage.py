"""Margin shrinkage: the factor (James-Stein's for one margin, the pooled signal law's
for many, where it beats Norm-Sub, 4+ categories), what it changes in the views (one
main effect, the same factor in every view), its error on a flat population against
the James-Stein risk formula, and its use by both reconstructions."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from calmkit_aggregator import MarginalTable, estimate_views, make_consistent, reconstruct_by
from calmkit_aggregator.reconstruction.estimate import contrast_variances
from calmkit_aggregator.reconstruction.shrinkage import margin_factor, shrink_margins
from calmkit_client import Plan, Schema
from calmkit_simulator import Population, collect_support
from tests.stats import z_bound


def _flat(sizes: tuple[int, ...], n: int, seed: int) -> Population:
    """Every attribute's margin exactly uniform (n a multiple of each size)."""
    gen = np.random.default_rng(seed)
    codes = np.stack([gen.permutation(np.arange(n) % s) for s in sizes], axis=1)
    return Population(Schema.from_sizes(sizes), codes.astype(np.uint8), name="flat")


def _centred(p: np.ndarray) -> np.ndarray:
    return p - p.mean()


def test_a_noisy_flat_margin_gets_its_james_stein_factor() -> None:
    gen = np.random.default_rng(1)
    noise = 1e-3
    z = _centred(gen.standard_normal(30) * math.sqrt(noise) * 1.2)
    lam = max(0.0, 1 - 29 * noise / float((z**2).sum()))
    assert 0 < lam < 1
    assert margin_factor(z, noise) == pytest.approx(lam, rel=1e-12)


def test_a_skewed_margin_is_left_to_norm_sub() -> None:
    # one cell of 0.9, 29 near zero: James-Stein would scale it by about 0.76, Norm-Sub
    # removes most of the noise of the empty cells instead
    p = np.full(30, 0.1 / 29)
    p[0] = 0.9
    gen = np.random.default_rng(2)
    noise = 0.009
    z = _centred(p + gen.standard_normal(30) * math.sqrt(noise))
    assert 1 - 29 * noise / float((z**2).sum()) < 0.85
    assert margin_factor(z, noise) == 1.0


@pytest.mark.parametrize("size", [2, 3])
def test_margins_of_fewer_than_4_categories_are_never_shrunk(size: int) -> None:
    z = _centred(np.linspace(0, 1e-3, size))  # flat and noisy: would shrink to 0
    assert margin_factor(z, 1.0) == 1.0
    assert margin_factor(_centred(np.linspace(0, 1e-3, 4)), 1.0) == 0.0


def test_exact_views_and_views_without_reports_are_left_as_they_are() -> None:
    values = np.full((5, 4), 1 / 20)
    tables = [MarginalTable((0, 1), values, 0.0, 100), MarginalTable((1, 2), values, np.inf, 0)]
    shrunk = shrink_margins(tables, [0.0, np.inf])
    assert shrunk.factors == {0: 1.0, 1: 1.0, 2: 1.0}
    for a, b in zip(tables, shrunk.tables):
        np.testing.assert_array_equal(a.values, b.values)
    with pytest.raises(Exception, match=r"contrast_variance \(length 1\)"):
        shrink_margins(tables, [0.0])


def test_only_the_shrunk_main_effect_changes_the_same_way_in_every_view() -> None:
    sizes = (12, 10, 3, 8)
    pop = _flat(sizes, 2400, seed=3)
    plan = Plan(pop.schema, 0.3, [(0, 1), (1, 2), (0, 3), (2, 3), (0,)], seed=1)
    support = collect_support(pop, plan, 4)
    raw, contrast = estimate_views(support), contrast_variances(support)
    shrunk = shrink_margins(raw, contrast)
    lam = shrunk.factors
    assert lam[2] == 1.0 and min(lam[0], lam[1], lam[3]) < 0.5  # few reports, flat
    for before, after in zip(raw, shrunk.tables):
        assert after.values.sum() == pytest.approx(before.values.sum(), abs=1e-12)
        for a in before.attrs:
            m_b, m_a = before.project((a,)).values, after.project((a,)).values
            np.testing.assert_allclose(_centred(m_a), lam[a] * _centred(m_b), atol=1e-12)
        if len(before.attrs) == 2:  # the interaction (double-centred table) is kept
            inter = [
                t.values - t.values.mean(0) - t.values.mean(1)[:, None] for t in (before, after)
            ]
            np.testing.assert_allclose(inter[1], inter[0], atol=1e-12)
    # consistency then pools the shrunk main effects: lambda times the pooled raw one
    pooled = make_consistent(raw, nonnegative=False).tables
    pooled_shrunk = make_consistent(shrunk.tables, nonnegative=False).tables
    for t, s in zip(pooled, pooled_shrunk):
        for a in t.attrs:
            np.testing.assert_allclose(
                _centred(s.project((a,)).values),
                lam[a] * _centred(t.project((a,)).values),
                atol=1e-12,
            )


def test_flat_margins_shrink_beyond_james_stein_and_norm_sub_alone_does_not() -> None:
    # 200 attributes of 20 categories, each exactly uniform, one view each: each pooled
    # margin z has ||z||^2 = nu' chi^2_19 (nu' the oracle's noise nu plus the users'
    # sampling into views). James-Stein's factor (1 - 19 nu / ||z||^2)_+, one margin
    # alone, has a known law here; the signal's law fitted over the 200 margins (all
    # flat) must shrink them harder: its mean factor below James-Stein's law's mean by
    # more than z sd / sqrt(200) (a shrinkage that ignores its peers fails), and each
    # margin's squared error after the pipeline (at most ||lambda z||^2: Norm-Sub
    # projects onto the simplex, which holds the truth) on average within James-Stein's
    # risk bound. The paper's pipeline (no shrinkage) must exceed that bound.
    d, size, per_view = 200, 20, 1000
    pop = _flat((size,) * d, d * per_view, seed=5)
    plan = Plan(pop.schema, 0.5, [(a,) for a in range(d)], seed=2)
    support = collect_support(pop, plan, 6)
    nu = float(np.mean(contrast_variances(support)))
    ratio = 1 + float(np.mean(1.0 / (size * support.n))) / nu  # nu' / nu
    law, dim = stats.chi2(size - 1), size - 1

    def moments(f) -> tuple[float, float]:
        mean = law.expect(f)
        return mean, math.sqrt(law.expect(lambda c: f(c) ** 2) - mean**2)

    js_mean, js_sd = moments(lambda c: max(1 - dim / (ratio * c), 0.0))
    factors = shrink_margins(estimate_views(support), contrast_variances(support)).factors
    got = float(np.mean(list(factors.values())))
    assert got < js_mean - z_bound(1) * js_sd / math.sqrt(d), (got, js_mean)
    risk_mean, risk_sd = moments(lambda c: max(ratio * c - dim, 0.0) ** 2 / (ratio * c) * nu)
    bound = risk_mean + z_bound(1) * risk_sd / math.sqrt(d)

    def error(shrink: bool) -> float:
        est = reconstruct_by(support, shrink=shrink)
        return float(np.mean([((t.values - 1 / size) ** 2).sum() for t in est.views.tables]))

    assert error(True) <= bound, (error(True), bound)
    assert error(False) > bound, (error(False), bound)


@pytest.mark.parametrize("reconstruction", ["local", "global"])
def test_both_reconstructions_meet_the_shrunk_margins(reconstruction: str) -> None:
    pop = _flat((16, 16, 16), 1200, seed=7)
    plan = Plan(pop.schema, 0.3, [(0, 1), (1, 2), (0, 2)], seed=3)
    support = collect_support(pop, plan, 8)
    shrunk = shrink_margins(estimate_views(support), contrast_variances(support))
    assert max(shrunk.factors.values()) < 1.0
    expected = make_consistent(shrunk.tables).tables
    est = reconstruct_by(support, reconstruction)
    assert est.margins == shrunk.factors  # each estimator says what it shrank
    assert reconstruct_by(support, reconstruction, shrink=False).margins is None
    for a in range(3):
        got = est.answer([a]).values
        np.testing.assert_allclose(got, expected[0 if a < 2 else 1].project((a,)).values, atol=1e-6)
