"""The pilot's evidence on pair dependence: the statistic's law under independence,
the Gamma likelihood, and the pooled posterior (direct integration, calibration on
data drawn from its model, noise that tells nothing)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from scipy import integrate, special, stats

from calmkit_aggregator.planning import dependence as dependence_module
from calmkit_aggregator.planning.dependence import (
    _ALPHAS,
    _BOOTSTRAP,
    _GRID,
    HETEROGENEITY_PRIOR,
    QUANTILES,
    PairEvidence,
    dependence_posterior,
    dependence_statistic,
    pair_evidence,
)
from calmkit_aggregator.planning.profile import pair_dependence
from calmkit_aggregator.reconstruction.estimate import draw_estimates
from calmkit_aggregator.reconstruction.marginal import MarginalTable
from calmkit_client import choose_oracle

from .pilot_tables import pair_tables

MARGIN = 4.0  # standard errors


def _evidence(raw, null_mean, null_var, unit, dim=4.0, seed=0) -> PairEvidence:  # type: ignore[no-untyped-def]
    """Evidence of pairs whose null draws (_BOOTSTRAP each) come from the Gamma law
    with the given mean and variance (seeded)."""
    given = (raw, null_mean, null_var, unit, dim)
    arrays = [np.atleast_1d(np.asarray(x, dtype=np.float64)) for x in given]
    count = max(a.size for a in arrays)
    raw_, mean0, var0, unit_, dim_ = (np.broadcast_to(a, (count,)).copy() for a in arrays)
    gen = np.random.default_rng(seed)
    null = gen.gamma((mean0**2 / var0)[:, None], (var0 / mean0)[:, None], size=(count, _BOOTSTRAP))
    return PairEvidence(np.zeros((count, 2), dtype=np.int64), raw_, null, unit_, dim_)


def _kernel_logpdf(raw: float, null: np.ndarray, signal: np.ndarray, dim: int) -> np.ndarray:
    """The documented likelihood by numerical integration: the density g of the noise's
    norm v, the null draws' square roots' normal kernel density (reflected at 0; at
    least the exponential tail past their 90% quantile u: share above u times
    exp(-(v^2 - u) / beta) / beta times 2 v, beta the largest of 2 mean / dim, their
    variance over mean and their mean excess over u; normalised) on 40,001 points v;
    the statistic is S + v^2 + 2 sqrt(S) v t with t the cosine of a random direction in
    dim dimensions ((t + 1) / 2 ~ Beta((dim - 1) / 2, (dim - 1) / 2)). For dim >= 2 the
    density is the derivative of the distribution function integral of g(v) F_t(t(v))
    dv, t(v) = (x - S - v^2) / (2 sqrt(S) v), by a central difference of 1e-4 raw; for
    dim 1 (t = +-1) the sum over the v that give raw of g(v) / (4 sqrt(raw)); at S = 0,
    g(sqrt(raw)) / (2 sqrt(raw))."""
    from calmkit_aggregator.planning.dependence import _bandwidth

    roots = np.sqrt(null)
    h = float(_bandwidth(roots[None, :])[0])
    v = np.linspace(0.0, max(roots.max(), math.sqrt(raw)) + 12 * h, 40_001)
    g = (
        stats.norm.pdf(v[:, None], roots[None, :], h)
        + stats.norm.pdf(v[:, None], -roots[None, :], h)
    ).mean(axis=1)
    u = np.quantile(null, 0.9)
    above = null[null > u]
    beta = max(2 * null.mean() / dim, null.var() / null.mean(), (above - u).mean())
    tail = above.size / null.size * np.exp(-(v * v - u) / beta) / beta * 2 * v
    g = np.maximum(g, np.where(v * v > u, tail, 0.0))
    g /= integrate.trapezoid(g, v)
    root_raw = math.sqrt(raw)
    a = (dim - 1) / 2

    def cdf(x: float, root_s: float) -> float:
        t = (x - root_s**2 - v[1:] ** 2) / (2 * root_s * v[1:])
        return float(
            integrate.trapezoid(g[1:] * special.betainc(a, a, (np.clip(t, -1, 1) + 1) / 2), v[1:])
        )

    out = []
    for s in signal:
        root_s = math.sqrt(s)
        if s == 0:
            value = float(np.interp(root_raw, v, g)) / (2 * root_raw)
        elif dim == 1:  # raw = (v + sqrt S)^2 or (v - sqrt S)^2, each with probability 1/2
            nodes = [x for x in (root_raw - root_s, root_s - root_raw, root_s + root_raw) if x > 0]
            value = sum(float(np.interp(x, v, g)) for x in nodes) / (4 * root_raw)
        else:
            d = 1e-4 * raw
            value = (cdf(raw + d, root_s) - cdf(raw - d, root_s)) / (2 * d)
        out.append(math.log(max(value, 1e-300)))
    return np.array(out)


# -- the statistic and its law ------------------------------------------------------------
@pytest.mark.parametrize(
    ("truth", "n", "eps"),
    [
        (np.array([[0.6, 0.1], [0.1, 0.2]]), 70, 2.0),  # dependent, few users (GRR)
        (np.array([[0.6, 0.1], [0.1, 0.2]]), 300, 1.0),
        (np.full((2, 2), 0.25), 300, 1.0),  # independent
        (np.array([[0.3, 0.05, 0.05], [0.05, 0.3, 0.25]]), 2000, 0.5),  # OUE (6 cells)
    ],
)
def test_the_estimate_is_unbiased(truth: np.ndarray, n: int, eps: float) -> None:
    tables, oracle = pair_tables(truth, n, eps, count=1500, seed=3)
    evidence = pair_evidence(tables, [oracle] * len(tables), [truth.sum(axis=1), truth.sum(axis=0)])
    values = evidence.estimate
    se = values.std(ddof=1) / math.sqrt(values.size)
    assert abs(values.mean() - pair_dependence(truth)) <= MARGIN * se


@pytest.mark.parametrize(
    ("shape", "n", "eps"), [((2, 2), 300, 1.0), ((6, 41), 1100, 1.0), ((16, 7), 1100, 0.5)]
)
def test_under_independence_the_likelihood_is_the_statistics_law(
    shape: tuple[int, int], n: int, eps: float
) -> None:
    # independent attributes with skewed margins (one category of 41 at 90%, as a
    # country of birth): 600 fresh pilots' statistics against the law the likelihood
    # gives at S = 0 (its CDF: the mean over the null draws of the kernel's normal
    # CDF). Their mean within 4 standard errors of the null's (both samples' noise),
    # and the law's 10% and 90% quantiles leave 10% of them each below and above
    # (4 standard errors: the 600 statistics' binomial noise and the 200 null draws'
    # own, sqrt(0.09 / 600 + 0.09 / 200))
    gen = np.random.default_rng(sum(shape))
    pa = gen.dirichlet(np.full(shape[0], 0.5))
    pb = np.full(shape[1], 0.1 / (shape[1] - 1))
    pb[0] = 0.9
    truth = np.outer(pa, pb)
    tables, oracle = pair_tables(truth, n, eps, count=600, seed=5)
    evidence = pair_evidence(tables[:1], [oracle], [pa, pb])
    raw = np.array([dependence_statistic(t.values.reshape(1, -1), *shape)[0] for t in tables])
    null = evidence.null[0]
    se = math.sqrt(raw.var() / raw.size + null.var() / null.size)
    assert abs(raw.mean() - null.mean()) <= MARGIN * se
    from calmkit_aggregator.planning.dependence import _bandwidth

    # the kernel of the square roots reflected at 0: its CDF at x is
    # Phi((sqrt(x) - a) / h) + Phi((sqrt(x) + a) / h) - 1 averaged over the roots a
    roots = np.sqrt(null)
    h = float(_bandwidth(roots[None, :])[0])
    x = np.sqrt(raw)[:, None]
    cdf = (
        stats.norm.cdf((x - roots[None, :]) / h) + stats.norm.cdf((x + roots[None, :]) / h) - 1
    ).mean(axis=1)
    for tail in ((cdf < 0.1).mean(), (cdf > 0.9).mean()):
        assert abs(tail - 0.1) <= MARGIN * math.sqrt(0.09 / raw.size + 0.09 / null.size)


def test_a_skewed_large_domain_reads_as_independent() -> None:
    # the symptom this module exists for: a 6 x 41 pilot table from 1,100 reports at
    # epsilon 1, its attributes independent and one of them 90% in one category. With
    # the margins' skew, the statistic's noise part is twice that of uniform margins
    # (0.8 of dependence per unit read from noise alone); with the pilot's own margins
    # the estimate is unbiased: over 300 pilots its mean is 0 within 4 standard errors
    from calmkit_aggregator.planning.profile import estimated_marginal

    gen = np.random.default_rng(41)
    pa = gen.dirichlet(np.full(6, 2.0))
    pb = np.full(41, 0.1 / 40)
    pb[0] = 0.9
    tables, oracle = pair_tables(np.outer(pa, pb), 1100, 1.0, count=300, seed=6)
    values = []
    for table in tables:
        var = (oracle.variance(1100) + 1 / (1100 * 246)) * 246
        margs = [
            estimated_marginal(table.values.sum(axis=1), var / 6, unbiased=True),
            estimated_marginal(table.values.sum(axis=0), var / 41, unbiased=True),
        ]
        values.append(pair_evidence([table], [oracle], margs).estimate[0])
    arr = np.array(values)
    assert abs(arr.mean()) <= MARGIN * arr.std(ddof=1) / math.sqrt(arr.size)
    # uniform margins in the null would read the skew's extra noise as dependence
    uniform = [np.full(6, 1 / 6), np.full(41, 1 / 41)]
    naive = np.array([pair_evidence([t], [oracle], uniform).estimate[0] for t in tables[:50]])
    assert naive.mean() > 0.3


def test_pair_evidence_replays_its_simulation_and_skips_what_tells_nothing() -> None:
    # the null's mean and variance over _BOOTSTRAP draws of the independent table (the
    # seed _BOOTSTRAP, drawn as the oracle draws); a one-category pair, a view without
    # reports and a table above 1024 cells are skipped
    truth = np.array([[0.4, 0.05, 0.05], [0.05, 0.2, 0.25]])
    tables, oracle = pair_tables(truth, 900, 1.0, count=1, seed=4)
    margs = [truth.sum(axis=1), truth.sum(axis=0), np.ones(1)]
    flat = MarginalTable((1, 2), np.full((3, 1), 1 / 3), oracle.variance(900), 900)
    empty = MarginalTable((0, 1), truth, np.inf, 0)
    big_oracle = choose_oracle(25 * 41, 1.0)
    big = MarginalTable((0, 1), np.full((25, 41), 1 / 1025), big_oracle.variance(5000), 5000)
    evidence = pair_evidence(
        [flat, empty, tables[0], big],
        [choose_oracle(3, 1.0), oracle, oracle, big_oracle],
        [*margs, np.full(25, 0.04), np.full(41, 1 / 41)],
    )
    assert evidence.pairs.tolist() == [[0, 1]]
    gen = np.random.default_rng(_BOOTSTRAP)
    noise = dependence_statistic(
        draw_estimates(oracle, np.outer(*margs[:2]).reshape(-1), 900, gen, _BOOTSTRAP), 2, 3
    )
    raw = float(dependence_statistic(tables[0].values.reshape(1, -1), 2, 3)[0])
    assert evidence.raw[0] == raw and evidence.unit[0] == pytest.approx(2 / 6)
    np.testing.assert_array_equal(evidence.null[0], noise)
    assert evidence.dim[0] == 2 and evidence.null_mean[0] == pytest.approx(noise.mean())
    assert evidence.estimate[0] == pytest.approx((raw - noise.mean()) / (2 / 6), rel=1e-12)


@pytest.mark.parametrize(("cells", "eps"), [(4, 1.0), (16, 1.0), (6, 3.0)])
def test_the_bootstrap_draws_reports_as_the_oracle_does(cells: int, eps: float) -> None:
    # unbiased, with the oracle's exact per-cell variance for a population drawn from
    # the table, t (1 - t) / n on top (GRR for 4 and 6 cells, OUE for 16); 40 calls x
    # _BOOTSTRAP draws, bounds 4 standard errors
    oracle = choose_oracle(cells, eps)
    truth = np.random.default_rng(cells).dirichlet(np.ones(cells))
    gen = np.random.default_rng(7)
    draws = np.concatenate([draw_estimates(oracle, truth, 300, gen, _BOOTSTRAP) for _ in range(40)])
    exact = np.asarray(oracle.variance(300, truth)) + truth * (1 - truth) / 300
    assert np.all(np.abs(draws.mean(axis=0) - truth) <= MARGIN * np.sqrt(exact / len(draws)))
    se_var = exact * math.sqrt(2 / (draws.shape[0] - 1))
    assert np.all(np.abs(draws.var(axis=0, ddof=1) - exact) <= MARGIN * se_var)
    assert oracle.name == ("OUE" if cells == 16 else "GRR")


def test_the_likelihood_adds_the_signal_along_the_noise_at_a_random_angle() -> None:
    # against numerical integration on a 250x finer grid: the likelihood's 160 nodes
    # (each cell's spread counted) are within 3% of it wherever the likelihood is
    # within e^-8 of its peak (log difference 0.03)
    # (the last pair's statistic lies past every null draw: its density there is the
    # exponential tail's; it is binary, one dimension: the statistic (sqrt(S) +- v)^2)
    evidence = _evidence(
        [0.3, 2.0, 0.01, 0.12],
        [0.2, 1.5, 0.02, 0.01],
        [0.01, 0.4, 1e-4, 2e-4],
        [0.25, 0.8, 0.5, 0.25],
        [8.0, 11.0, 8.0, 1.0],
    )
    assert evidence.raw[3] > evidence.null[3].max()
    deps = np.array(
        [
            [0.0, 0.1, 0.3, 1.0],
            [0.0, 0.3, 0.5, 1.0],
            [0.0, 0.005, 0.01, 0.05],
            [0.0, 0.05, 0.1, 0.3],
        ]
    )
    got = evidence.log_likelihood(deps)
    for i in range(4):
        want = _kernel_logpdf(
            float(evidence.raw[i]),
            evidence.null[i],
            deps[i] * evidence.unit[i],
            int(evidence.dim[i]),
        )
        near = want > want.max() - 8
        np.testing.assert_allclose(got[i][near], want[near], atol=0.03)
        assert np.all(got[i][~near] < want.max() - 6)


@pytest.mark.parametrize(
    ("pa", "pb", "n", "eps", "tails"),
    [
        ([0.55, 0.45], [0.98, 0.02], 262, 1.0, (1e-3, 1e-4)),  # GRR, one rare category
        ([0.5, 0.5], [0.5, 0.5], 771, 1.0, (1e-3, 1e-4)),
        ([0.35, 0.3, 0.1, 0.1, 0.1, 0.05], [0.5] + [0.5 / 9] * 9, 1100, 1.0, (1e-3,)),  # OUE
    ],
)
def test_the_statistics_tail_keeps_its_density(
    pa: list[float], pb: list[float], n: int, eps: float, tails: tuple[float, ...]
) -> None:
    # at the statistic's 1-in-1,000 and 1-in-10,000 values under independence (mostly
    # past all 200 null draws) the likelihood at S = 0 against the exact density (a 3%
    # window on 400,000 draws of the oracle): within 2 nats. The exponential tail's
    # scale from 200 draws errs by about 10% (their mean's), 0.7 nats at 7 scales past
    # u, and a chi-square's y^-1/2 factor, which it lacks, adds at most 0.9. A kernel
    # alone ends a bandwidth past the largest draw: 10-80 nats too low here
    truth = np.outer(pa, pb)
    tables, oracle = pair_tables(truth, n, eps, count=1, seed=2)
    evidence = pair_evidence(tables, [oracle], [np.array(pa), np.array(pb)])
    gen = np.random.default_rng(9)
    shape = truth.shape
    exact = np.sort(
        dependence_statistic(draw_estimates(oracle, truth.ravel(), n, gen, 400_000), *shape)
    )
    for tail in tails:
        x = float(exact[int((1 - tail) * exact.size)])
        assert x > np.quantile(evidence.null[0], 0.9)  # where the tail holds
        density = np.mean(np.abs(exact - x) < 0.03 * x) / (0.06 * x)
        at = dataclasses.replace(evidence, raw=np.array([x]))
        got = float(at.log_likelihood(np.zeros((1, 1)))[0, 0])
        assert abs(got - math.log(density)) <= 2.0, (tail, got, math.log(density))


@pytest.mark.parametrize("seed", [4, 5, 6, 7])
def test_one_pair_at_its_noise_tail_does_not_read_as_dependence(seed: int) -> None:
    # ten independent pairs (262 reports at eps 1, one category at 2%), the first at the
    # value its noise reaches once in 1,000 pilots: nine pairs show nothing, and such a
    # draw happens in one pilot of a hundred, so the posterior's 10% quantile stays
    # below the median of the same pilot without that draw (it moves by less than 40
    # of the posterior's percentiles). With the null draws' kernel alone its density
    # there was e^-3.5 of the exact, and the 10% quantile rose to 14-19x the prior's
    # floor, above that median (0.006-0.015 here)
    pa, pb = np.array([0.55, 0.45]), np.array([0.98, 0.02])
    truth = np.outer(pa, pb)
    tables, oracle = pair_tables(truth, 262, 1.0, count=10, seed=seed)
    evidence = pair_evidence(tables, [oracle] * 10, [pa, pb])
    gen = np.random.default_rng(9)
    exact = np.sort(
        dependence_statistic(draw_estimates(oracle, truth.ravel(), 262, gen, 100_000), 2, 2)
    )
    raw = evidence.raw.copy()
    raw[0] = exact[int(0.999 * exact.size)]
    bounds = (1e-3, 0.5)
    post = dependence_posterior(dataclasses.replace(evidence, raw=raw), np.ones(10), bounds)
    without = dependence_posterior(evidence, np.ones(10), bounds)
    assert post.quantiles[0] <= without.quantiles[2], (post.quantiles, without.quantiles)


# -- the posterior ------------------------------------------------------------------------
def _direct_quantiles(evidence: PairEvidence, weights: np.ndarray, bounds) -> list[float]:  # type: ignore[no-untyped-def]
    """Posterior quantiles of D by direct integration: for each of 200 D, each alpha
    and pair, the likelihood integrated against r's Gamma(alpha, 1/alpha) law by the
    trapezoid rule in log r on 2,000 points over [1e-9, 1e3], plus the law's mass
    below them at r = 0; the product over pairs, summed over alpha."""
    lo, hi = bounds
    ds = np.geomspace(lo, hi, 200)
    logr = np.linspace(math.log(1e-9), math.log(1e3), 2_000)
    r = np.exp(logr)
    pair_like = []
    for i in range(evidence.count):
        one = PairEvidence(
            evidence.pairs[i : i + 1],
            evidence.raw[i : i + 1],
            evidence.null[i : i + 1],
            evidence.unit[i : i + 1],
            evidence.dim[i : i + 1],
        )
        deps = (ds[:, None] * weights[i] * r[None, :]).reshape(-1)
        like = np.concatenate(
            [
                np.exp(one.log_likelihood(deps[j : j + 20_000][None, :]))[0]
                for j in range(0, deps.size, 20_000)
            ]
        )
        zero = float(np.exp(one.log_likelihood(np.zeros((1, 1))))[0, 0])
        pair_like.append((like.reshape(ds.size, r.size), zero))
    total = np.zeros(ds.size)
    for alpha in np.geomspace(*HETEROGENEITY_PRIOR, _ALPHAS):
        density = np.exp(stats.gamma.logpdf(r, alpha, scale=1 / alpha) + logr)  # per log r
        log_like = np.zeros(ds.size)
        for like, zero in pair_like:
            pair = integrate.trapezoid(like * density, logr, axis=1)
            pair += special.gammainc(alpha, alpha * 1e-9) * zero
            log_like += np.log(np.maximum(pair, 1e-300))
        total += np.exp(log_like)
    cdf = np.cumsum(total) / total.sum()
    return [float(ds[min(ds.size - 1, int(np.searchsorted(cdf, f)))]) for f in QUANTILES]


@pytest.mark.parametrize(
    ("raw", "mean0", "var0", "unit", "weights"),
    [
        ([0.05], [0.01], [1e-4], [0.25], [1.0]),  # one clear pair
        ([0.011], [0.01], [1e-4], [0.25], [1.0]),  # one pair, nothing seen
        (
            [0.05, 0.3, 0.02],
            [0.01, 0.2, 0.02],
            [1e-4, 0.01, 4e-4],
            [0.25, 0.8, 0.5],
            [1.0, 2.0, 0.5],
        ),  # three pairs, unequal weights and noise
        ([4.0, 0.02], [3.1, 0.01], [1.5, 1e-4], [0.8, 0.25], [1.3, 0.7]),  # a swamped pair
    ],
)
def test_the_posterior_matches_direct_integration(raw, mean0, var0, unit, weights) -> None:  # type: ignore[no-untyped-def]
    bounds = (1e-3, 0.5)
    evidence = _evidence(raw, mean0, var0, unit)
    w = np.array(weights, dtype=np.float64)
    got = dependence_posterior(evidence, w, bounds).quantiles
    want = _direct_quantiles(evidence, w, bounds)
    # within the coarser of the two lattices' steps (3.2%)
    step = max((0.5 / 1e-3) ** (1 / 199), (0.5 / 1e-3) ** (1 / (_GRID - 1)))
    for g, x in zip(got, want):
        assert x / step**1.01 <= g <= x * step**1.01, (got, want)


def _cosines(dims: np.ndarray, gen: np.random.Generator) -> np.ndarray:
    """The cosine between a fixed direction and a random one in each of ``dims``
    dimensions: +-1 in one, else ``2 Beta((dim - 1) / 2, (dim - 1) / 2) - 1``."""
    half = np.maximum(dims - 1, 1) / 2.0
    return np.where(dims > 1, 2 * gen.beta(half, half) - 1, gen.choice([-1.0, 1.0], dims.size))


def test_the_posterior_is_calibrated_on_data_drawn_from_its_model() -> None:
    # D and alpha from their priors, 1-20 pairs with random weights, units and noise,
    # each pair's r from Gamma(alpha, 1/alpha) and its statistic drawn as the
    # likelihood says (a null draw of a Gamma noise law of 1-300 dimensions, the signal
    # added at a random angle), the evidence holding 200 other draws of that noise law:
    # each posterior quantile f lies above the true D with probability f (Bayesian
    # calibration), within 4 binomial standard errors over 300 draws
    gen = np.random.default_rng(11)
    bounds = lo, hi = (1e-3, 0.5)
    draws = 300
    below = np.zeros(len(QUANTILES))
    for _ in range(draws):
        dep = lo * (hi / lo) ** gen.random()
        alpha = math.exp(gen.uniform(*np.log(HETEROGENEITY_PRIOR)))
        count = int(gen.integers(1, 21))
        weights = gen.gamma(2.0, 0.5, size=count)
        unit = gen.uniform(0.2, 0.95, size=count)
        mean0 = dep * unit * 10 ** gen.uniform(-2, 2, size=count)  # precise to swamped
        dim = np.rint(10 ** gen.uniform(0, math.log10(300), size=count))
        var0 = 2 * mean0**2 / dim
        signal = dep * weights * gen.gamma(alpha, 1 / alpha, size=count) * unit
        noise = gen.gamma(dim / 2, var0 / mean0)
        raw = signal + noise + 2 * np.sqrt(signal * noise) * _cosines(dim, gen)
        evidence = _evidence(raw, mean0, var0, unit, dim, seed=int(gen.integers(2**31)))
        post = dependence_posterior(evidence, weights, bounds)
        below += dep <= np.array(post.quantiles)
    frac = below / draws
    expected = np.array(QUANTILES)
    se = np.sqrt(expected * (1 - expected) / draws)
    assert np.all(np.abs(frac - expected) <= MARGIN * se), frac


def test_the_posterior_is_calibrated_on_pilot_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    # the whole path on tables an oracle measured: D and alpha from their priors, 30
    # binary pairs with uniform margins, each pair's dependence D r (16 c^2 for the
    # table [[1/4 + c, 1/4 - c], [1/4 - c, 1/4 + c]]), 500 reports each at eps 1 (GRR),
    # the evidence from pair_evidence: each posterior quantile f lies above the true D
    # with probability f, within 4 binomial standard errors over 120 draws. A binary
    # pair holds at most 1, so D's prior reaches 0.05 and alpha's 1/4 (heavier tails
    # would put D's mass in pairs beyond 1). The statistic modelled as the noise's law
    # shifted by S and widened by a normal read these pairs' small statistics as no
    # dependence: the truth lay below the posterior median in 15% of the draws (44% now)
    monkeypatch.setattr(dependence_module, "HETEROGENEITY_PRIOR", (0.25, 4.0))
    gen = np.random.default_rng(5)
    bounds = lo, hi = (1e-3, 0.05)
    oracle = choose_oracle(4, 1.0)
    half = [np.array([0.5, 0.5])] * 60
    draws, below = 120, np.zeros(len(QUANTILES))
    for _ in range(draws):
        dep = lo * (hi / lo) ** gen.random()
        alpha = math.exp(gen.uniform(math.log(0.25), math.log(4.0)))
        c = np.sqrt(np.minimum(dep * gen.gamma(alpha, 1 / alpha, 30), 1.0) / 16)
        c *= gen.choice([-1.0, 1.0], 30)
        tables = [
            MarginalTable(
                (2 * i, 2 * i + 1),
                draw_estimates(oracle, np.array([1, -1, -1, 1]) * x + 0.25, 500, gen, 1)[0].reshape(
                    2, 2
                ),
                float(oracle.variance(500)),
                500,
                oracle,
            )
            for i, x in enumerate(c)
        ]
        post = dependence_posterior(pair_evidence(tables, [oracle] * 30, half), np.ones(30), bounds)
        below += dep <= np.array(post.quantiles)
    frac = below / draws
    expected = np.array(QUANTILES)
    assert np.all(np.abs(frac - expected) <= MARGIN * np.sqrt(expected * (1 - expected) / draws)), (
        frac
    )


def test_pairs_swamped_by_noise_leave_the_prior() -> None:
    # noise a thousand times a 6 x 41 pilot table's against dependences of at most
    # 0.5: the likelihood is flat over the prior's range, the posterior its prior
    bounds = lo, hi = (1e-3, 0.5)
    evidence = _evidence(
        [3.9e3, 1.2e3, 0.35e3],
        [3.1e3, 1.4e3, 0.3e3],
        [1.5e5, 0.3e5, 0.01e5],
        0.8,
        [200.0, 100.0, 20.0],
    )
    post = dependence_posterior(evidence, np.ones(3), bounds)
    step = math.log(hi / lo) / (_GRID - 1)
    prior = [lo * (hi / lo) ** f for f in QUANTILES]
    for g, p in zip(post.quantiles, prior):
        assert abs(math.log(g / p)) <= step + 1e-9


def test_precise_pairs_take_their_values_and_pull_d() -> None:
    # many precisely measured pairs of one dependence (weights 1): D is theirs and
    # every pair's posterior mean its own value
    # (null mean 0.01 over 2e5 dimensions: the noise along the signal is tiny too)
    count, dep = 60, 0.04
    evidence = _evidence(np.full(count, 0.01 + dep * 0.5), 0.01, 1e-9, 0.5, 2e5)
    post = dependence_posterior(evidence, np.ones(count), (1e-3, 0.5))
    assert post.quantiles[0] <= dep <= post.quantiles[-1]
    assert abs(math.log(post.median / dep)) < 0.2
    np.testing.assert_allclose(post.pair_means, dep, rtol=0.03)
    # a pair with no dependence among them keeps its 0 (posterior mean well below D)
    raw = np.append(evidence.raw, 0.01)
    mixed = dependence_posterior(
        _evidence(raw, 0.01, 1e-9, 0.5, 2e5), np.ones(count + 1), (1e-3, 0.5)
    )
    assert mixed.pair_means[-1] < 0.05 * dep


def test_a_pair_of_zero_weight_carries_no_dependence() -> None:
    evidence = _evidence([0.05, 0.05], 0.01, 1e-5, 0.25)
    post = dependence_posterior(evidence, np.array([1.0, 0.0]), (1e-3, 0.5))
    assert post.pair_means[1] == 0.0 and post.pair_means[0] > 0
