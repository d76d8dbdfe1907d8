"""Datacube (Cormode, Procopiuc, Srivastava & Yaroslavtsev, ICDE 2013): the closed-form
budgets of §3.1 / App. A against the paper's worked example and a numerical optimiser,
the Fourier all-k-way variances of App. C against repeated noise draws, GLS (§3.2)
against the literal eq. 7 on the full domain, consistency, and the errors."""

from __future__ import annotations

import math
from itertools import combinations

import numpy as np
import pytest
from scipy import integrate, optimize, stats

from calmkit_client import CalmkitError
from calmkit_simulator import synthetic_population
from calmkit_simulator.experiment import run_mechanism
from calmkit_simulator.mechanisms import NotScalable
from calmkit_simulator.mechanisms.datacube import (
    Datacube,
    allocation_variance,
    cell_variance,
    component_parities,
    compose,
    down_closure,
    exact_components,
    fourier_parities,
    fourier_weights,
    gaussian_allocation,
    gaussian_sigma,
    gls_component_variances,
    gls_components,
    kway_fourier_variance,
    laplace_allocation,
    marginal_weights,
    workload_counts,
    workload_variance,
)
from tests.stats import ALPHA, assert_variance, assert_z

EXAMPLE = [(0,), (0, 1)]  # §1, Fig. 1(b): marginals A and AB of 3 binary attributes


def _kway(d: int, k: int) -> list[tuple[int, ...]]:
    return list(combinations(range(d), k))


def _tables(pop, workload):  # type: ignore[no-untyped-def]
    tables = workload_counts(pop, workload)
    for a in workload:
        assert np.array_equal(tables[a], pop.counts(a))
    return tables


# -- 1. the worked example ---------------------------------------------------------------
@pytest.mark.parametrize("eps", [1.0, 0.4])
def test_worked_example_uniform_48_and_cube_root_46_17(eps: float) -> None:
    w = marginal_weights(EXAMPLE, (2, 2, 2))
    assert w.tolist() == [2.0, 4.0]  # cells of A and AB (S = Q, R = I)
    uniform = laplace_allocation(w, eps, optimal=False)
    assert np.allclose(uniform.budgets, [eps / 2, eps / 2], rtol=1e-12)
    assert uniform.total_variance * eps**2 == pytest.approx(48.0, rel=1e-12)
    opt = laplace_allocation(w, eps)
    # cube-root rule: eta ~ w^(1/3) = (2, 4)^(1/3); the notes' 0.4425 / 0.5575 and 46.168
    share = np.cbrt([2.0, 4.0]) / np.cbrt([2.0, 4.0]).sum()
    assert np.allclose(opt.budgets, eps * share, rtol=1e-12)
    assert np.allclose(opt.budgets / eps, [0.4425, 0.5575], atol=1e-4)
    assert opt.budgets.sum() == pytest.approx(eps, rel=1e-12)  # sum_r C_r eta_r = eps
    exact = (np.cbrt(4.0) + np.cbrt(8.0)) ** 3  # (sum s_r^(1/3))^3 with s_r = 2 w_r
    assert opt.total_variance * eps**2 == pytest.approx(exact, rel=1e-12)
    assert abs(opt.total_variance * eps**2 - 46.17) < 5e-3
    # the paper's own budgets 4/9 and 5/9: 46.17 as printed, and no better than optimal
    paper = allocation_variance(w, [4 * eps / 9, 5 * eps / 9], 2.0) * eps**2
    assert abs(paper - 46.17) < 5e-3
    assert opt.total_variance * eps**2 < paper < 48.0


def _full_domain_gls(sizes, workload, variances, z):  # type: ignore[no-untyped-def]
    """Literal eq. 7 over the full domain: y = Q (Q^T S^-1 Q)^+ Q^T S^-1 z, Cov = R S R^T."""
    grid = np.indices(sizes).reshape(len(sizes), -1)
    rows, noise = [], []
    for attrs, var in zip(workload, variances):
        cell = np.ravel_multi_index(tuple(grid[list(attrs)]), tuple(sizes[a] for a in attrs))
        q = np.zeros((math.prod(sizes[a] for a in attrs), grid.shape[1]))
        q[cell, np.arange(grid.shape[1])] = 1.0
        rows.append(q)
        noise += [var] * q.shape[0]
    Q = np.vstack(rows)
    inv = np.diag(1.0 / np.array(noise))
    R = Q @ np.linalg.pinv(Q.T @ inv @ Q) @ Q.T @ inv
    y = R @ np.concatenate([z[a].reshape(-1) for a in workload]) if z is not None else None
    return y, R @ np.diag(noise) @ R.T


def test_worked_example_gls_totals_match_the_notes_and_eq7() -> None:
    # notes §1: uniform budgets + GLS give 32.0, the 4/9, 5/9 budgets + GLS 30.0
    sizes = (2, 2, 2)
    for budgets, quoted in (([0.5, 0.5], 32.0), ([4 / 9, 5 / 9], 30.0)):
        variances = [2 / b**2 for b in budgets]
        total = workload_variance(
            EXAMPLE, sizes, gls_component_variances(EXAMPLE, sizes, variances)
        )
        _, cov = _full_domain_gls(sizes, EXAMPLE, variances, None)
        assert total == pytest.approx(np.trace(cov), rel=1e-10)
        assert abs(total - quoted) < 0.05


# -- closed forms against a numerical optimiser ------------------------------------------
def _slsqp(weights: np.ndarray, c: np.ndarray, eps: float, power: int) -> float:
    """min sum w / eta^2 s.t. sum C^p eta^p = eps^p (p = 1 Laplace, 2 Gaussian)."""
    x0 = np.full(weights.size, eps / (c**power).sum() ** (1 / power))
    res = optimize.minimize(
        lambda eta: float((weights / eta**2).sum()),
        x0,
        jac=lambda eta: -2 * weights / eta**3,
        constraints=[
            {"type": "eq", "fun": lambda eta: float((c**power * eta**power).sum()) - eps**power}
        ],
        bounds=[(1e-9, None)] * weights.size,
        method="SLSQP",
        options={"ftol": 1e-15, "maxiter": 1000},
    )
    return float(res.fun)


def test_cube_root_and_square_root_rules_are_the_numerical_optimum() -> None:
    gen = np.random.default_rng(7)
    w = gen.uniform(0.5, 20.0, size=7)
    c = gen.uniform(0.3, 2.0, size=7)
    eps = 0.8
    lap = laplace_allocation(w, eps, sensitivities=c)
    assert (c * lap.budgets).sum() == pytest.approx(eps, rel=1e-12)
    assert lap.total_variance == pytest.approx(2 * _slsqp(w, c, eps, 1), rel=1e-6)
    assert lap.total_variance == pytest.approx(allocation_variance(w, lap.budgets, 2.0))
    gauss = gaussian_allocation(w, eps, 1e-6, sensitivities=c)
    assert (c**2 * gauss.budgets**2).sum() == pytest.approx(eps**2, rel=1e-12)
    opt = gauss.factor * _slsqp(w, c, eps, 2)
    assert gauss.total_variance == pytest.approx(opt, rel=1e-6)
    # uniform is feasible, so never better
    assert (
        lap.total_variance
        < laplace_allocation(w, eps, optimal=False, sensitivities=c).total_variance
    )
    assert (
        gauss.total_variance
        < gaussian_allocation(w, eps, 1e-6, optimal=False, sensitivities=c).total_variance
    )


def test_gaussian_square_root_rule_is_appendix_a_with_the_papers_factor() -> None:
    w = np.array([3.0, 1.0, 8.0, 0.5])
    c = np.array([1.0, 0.5, 2.0, 1.0])
    eps, delta = 0.6, 1e-5
    f = 2 * math.log(2 / delta)  # Theorem 2.2 as printed
    alloc = gaussian_allocation(w, eps, delta, sensitivities=c, factor=f)
    root = (c * np.sqrt(w)).sum()
    assert np.allclose(alloc.budgets**2, eps**2 * np.sqrt(w) / (c * root), rtol=1e-12)
    assert alloc.total_variance == pytest.approx(f * root**2 / eps**2, rel=1e-12)
    assert np.allclose(alloc.variances, f / alloc.budgets**2)


@pytest.mark.parametrize("eps, delta", [(0.5, 1e-5), (1.0, 1e-6), (4.0, 1e-3)])
def test_analytic_gaussian_sigma_has_hockey_stick_delta(eps: float, delta: float) -> None:
    sigma = gaussian_sigma(eps, delta)
    # delta(sigma) of N(1, s^2) vs N(0, s^2) by integrating the densities
    y0 = eps * sigma**2 + 0.5  # where p = e^eps q
    spent, _ = integrate.quad(
        lambda y: stats.norm.pdf(y, 1, sigma) - math.exp(eps) * stats.norm.pdf(y, 0, sigma),
        y0,
        np.inf,
        epsabs=1e-14,
        epsrel=1e-10,
    )
    assert spent == pytest.approx(delta, rel=1e-6)
    if eps < 1:  # the classical and the paper's calibrations are valid but larger
        assert sigma < math.sqrt(2 * math.log(1.25 / delta)) / eps
        assert sigma < math.sqrt(2 * math.log(2 / delta)) / eps


# -- 2. Fourier all k-way: closed forms of App. C ----------------------------------------
@pytest.mark.parametrize("d, k", [(6, 2), (7, 3), (16, 1), (16, 2), (16, 3)])
def test_fourier_kway_allocation_matches_appendix_c(d: int, k: int) -> None:
    workload = _kway(d, k)
    coefs = down_closure(workload)
    assert len(coefs) == sum(math.comb(d, i) for i in range(k + 1))
    w = fourier_weights(workload, coefs)
    # paper: b = 2^(d-k+1) C(d-|b|, k-|b|) for orthonormal rows; parity units: / 2^(d+1)
    expect = [2.0**-k * math.comb(d - len(b), k - len(b)) for b in coefs]
    assert np.allclose(w, expect, rtol=1e-12)
    eps = 0.7
    for optimal in (True, False):
        alloc = laplace_allocation(w, eps, optimal=optimal)
        closed = kway_fourier_variance(d, k, eps, optimal=optimal)
        assert alloc.total_variance == pytest.approx(closed, rel=1e-10)
        gauss = gaussian_allocation(w, eps, 1e-6, optimal=optimal)
        closed = kway_fourier_variance(d, k, eps, optimal=optimal, noise="gaussian", delta=1e-6)
        assert gauss.total_variance == pytest.approx(closed, rel=1e-10)
    opt = laplace_allocation(w, eps)
    # lower orders (shared by more marginals) get more budget; equal within an order
    by_order = [opt.budgets[[len(b) == i for b in coefs]] for i in range(k + 1)]
    assert all(np.ptp(x) < 1e-15 for x in by_order)
    assert all(by_order[i][0] > by_order[i + 1][0] for i in range(k))
    # Lemma 4.2's bound
    bound = 3 * (k + 1) ** 2 * math.comb(d + k, k) * math.comb(d, k) ** 2 / (2 ** (k - 1) * eps**2)
    assert opt.total_variance <= bound


def test_fourier_kway_ratios_of_the_notes() -> None:
    # notes §2(G): at d = 16 optimal / uniform = 0.69 (k=1), 0.49 (k=2), 0.37 (k=3)
    for k, quoted in ((1, 0.69), (2, 0.49), (3, 0.37)):
        ratio = kway_fourier_variance(16, k, 1.0) / kway_fourier_variance(16, k, 1.0, optimal=False)
        assert abs(ratio - quoted) < 5e-3


def test_fourier_parities_match_records_and_components() -> None:
    pop = synthetic_population(n=700, sizes=(2,) * 6, strength=1.5, rng=5)
    workload = _kway(6, 3)
    tables = _tables(pop, workload)
    coefs, parity = fourier_parities(tables, (2,) * 6)
    assert coefs == down_closure(workload)
    bits = pop.codes.astype(np.int64)
    direct = np.array([(1 - 2 * (bits[:, list(b)].sum(axis=1) % 2)).sum() for b in coefs])
    assert np.array_equal(parity, direct)
    assert np.allclose(component_parities(exact_components(tables, (2,) * 6), coefs), direct)


@pytest.mark.parametrize("d, k", [(6, 2), (7, 3)])
def test_optimal_fourier_beats_uniform_by_the_predicted_ratio(d: int, k: int) -> None:
    # SSE over all k-way raw answers (counts) is sum_b w_b nu_b^2 (Parseval), nu_b
    # independent Laplace of variance V_b: mean sum w V, variance sum w^2 * 5 V^2
    # (Laplace: E nu^4 = 6 V^2). The means of `reps` draws are z-tested against the
    # closed forms, and so is their ratio (delta method).
    pop = synthetic_population(n=3000, sizes=(2,) * d, strength=1.5, rng=11)
    workload = _kway(d, k)
    tables = _tables(pop, workload)
    eps, reps = 1.0, 300
    gen = np.random.default_rng(12)
    w = fourier_weights(workload)
    means, predicted, variances = [], [], []
    for budgets in ("optimal", "uniform"):
        mech = Datacube("fourier", budgets)
        sse = np.empty(reps)
        for r in range(reps):
            release = mech.release((2,) * d, tables, pop.n, eps, gen)
            sse[r] = sum(((release.raw(a) * pop.n - tables[a]) ** 2).sum() for a in workload)
        alloc = laplace_allocation(w, eps, optimal=budgets == "optimal")
        assert alloc.total_variance == pytest.approx(
            kway_fourier_variance(d, k, eps, optimal=budgets == "optimal")
        )
        assert release.predicted_total_variance() == pytest.approx(alloc.total_variance)
        means.append(sse.mean())
        predicted.append(alloc.total_variance)
        variances.append(float((w**2 * 5 * alloc.variances**2).sum()) / reps)
    ratio = means[0] / means[1]
    expected = predicted[0] / predicted[1]
    assert expected < 0.75
    ratio_var = expected**2 * (variances[0] / predicted[0] ** 2 + variances[1] / predicted[1] ** 2)
    assert_z(
        np.array([*means, ratio]),
        np.array([*predicted, expected]),
        np.array([*variances, ratio_var]),
    )


def test_gaussian_fourier_noise_has_the_square_root_variances() -> None:
    # Gaussian noise: per-coefficient sample variances are exactly chi-square
    d, k, eps, delta, reps = 6, 2, 0.5, 1e-6, 300
    pop = synthetic_population(n=2000, sizes=(2,) * d, strength=1.5, rng=21)
    workload = _kway(d, k)
    tables = _tables(pop, workload)
    coefs, exact = fourier_parities(tables, (2,) * d)
    mech = Datacube("fourier", "optimal", "gaussian", delta=delta)
    gen = np.random.default_rng(22)
    samples = np.stack(
        [
            component_parities(mech.release((2,) * d, tables, pop.n, eps, gen).components, coefs)
            for _ in range(reps)
        ]
    )
    alloc = gaussian_allocation(fourier_weights(workload, coefs), eps, delta)
    assert_variance(samples, alloc.variances)
    assert_z(samples.mean(axis=0), exact, alloc.variances / reps)
    # independent coefficients: the pooled statistic is chi-square(m (reps - 1)), which
    # resolves the variance to about 2% (a 10% error in the Gaussian calibration fails)
    pooled = float(((reps - 1) * samples.var(axis=0, ddof=1) / alloc.variances).sum())
    df = samples.shape[1] * (reps - 1)
    assert stats.chi2.ppf(ALPHA / 2, df) <= pooled <= stats.chi2.isf(ALPHA / 2, df)


# -- 4. consistency and GLS ----------------------------------------------------------------
def _x_from_components(components, sizes):  # type: ignore[no-untyped-def]
    """A full-domain table reproducing every answer: sum_B theta_B / m_{[d],B}."""
    x = np.zeros(sizes)
    for b, theta in components.items():
        x += theta.reshape([sizes[a] if a in b else 1 for a in range(len(sizes))]) * (
            theta.size / x.size
        )
    return x


@pytest.mark.parametrize(
    "strategy, sizes", [("marginals", (2, 3, 4, 2, 3)), ("fourier", (2, 2, 2, 2, 2))]
)
def test_released_answers_are_consistent(strategy: str, sizes: tuple[int, ...]) -> None:
    pop = synthetic_population(n=1500, sizes=sizes, strength=1.5, rng=31)
    release = Datacube(strategy).run(pop, 0.5, 2, rng=32)
    x = _x_from_components(release.components, sizes)
    for attrs in down_closure(_kway(len(sizes), 2)):
        drop = tuple(i for i in range(len(sizes)) if i not in attrs)
        assert np.allclose(x.sum(axis=drop) / pop.n, release.raw(attrs), atol=1e-12)
    shared = release.raw((0, 1)).sum(axis=0)
    assert np.abs(shared - release.raw((1, 2)).sum(axis=1)).max() < 1e-9
    assert np.abs(shared - release.raw((1,))).max() < 1e-9
    # the noise is real: the raw answers differ from the truth
    assert not np.allclose(release.raw((0, 1)), pop.marginal((0, 1)), atol=1e-6)


def test_gls_without_noise_recovers_the_truth() -> None:
    sizes = (2, 3, 4, 2, 3)
    pop = synthetic_population(n=900, sizes=sizes, strength=1.5, rng=41)
    workload = [(0, 1, 2), (1, 3), (2, 3, 4), (0, 4)]
    tables = _tables(pop, workload)
    variances = dict(zip(workload, [1.0, 7.0, 0.2, 3.0]))
    components = gls_components(tables, variances, sizes)
    assert set(components) == set(down_closure(workload))
    for attrs in down_closure(workload):
        assert np.allclose(compose(components, attrs, sizes), pop.counts(attrs), atol=1e-9)


def test_gls_is_eq7_on_the_full_domain() -> None:
    sizes = (2, 3, 2, 2)
    workload = [(0, 1), (1, 2), (2, 3), (0, 3), (1,), (0, 1, 3)]
    variances = [1.0, 4.0, 0.5, 2.0, 0.3, 6.0]
    gen = np.random.default_rng(51)
    z = {a: gen.normal(5.0, 3.0, size=tuple(sizes[i] for i in a)) for a in workload}
    y, cov = _full_domain_gls(sizes, workload, variances, z)
    components = gls_components(z, dict(zip(workload, variances)), sizes)
    ours = np.concatenate([compose(components, a, sizes).reshape(-1) for a in workload])
    assert np.allclose(ours, y, atol=1e-9)
    s = gls_component_variances(workload, sizes, variances)
    diag = np.concatenate(
        [np.full(math.prod(sizes[i] for i in a), cell_variance(a, sizes, s)) for a in workload]
    )
    assert np.allclose(diag, np.diag(cov), rtol=1e-9)


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_gls_release_is_unbiased_with_the_predicted_variance(noise: str) -> None:
    sizes = (2, 3, 4, 2, 3)
    pop = synthetic_population(n=2000, sizes=sizes, strength=1.5, rng=61)
    workload = _kway(5, 2)
    tables = _tables(pop, workload)
    delta = 1e-5 if noise == "gaussian" else None
    mech = Datacube("marginals", "optimal", noise, delta=delta)
    gen = np.random.default_rng(62)
    reps = 400
    runs = [mech.release(sizes, tables, pop.n, 1.0, gen) for _ in range(reps)]
    chosen = runs[0].describe()
    assert chosen["budget_min"] < chosen["budget_max"]  # cells differ: non-uniform
    queries = [*workload, (2,), ()]
    samples = np.stack([np.concatenate([r.raw(q).reshape(-1) for q in queries]) for r in runs])
    truth = np.concatenate([pop.marginal(q).reshape(-1) for q in queries])
    var = np.concatenate(
        [np.full(max(1, math.prod(sizes[i] for i in q)), runs[0].cell_variance(q)) for q in queries]
    )
    assert_z(samples.mean(axis=0), truth, var / reps)
    if noise == "gaussian":  # linear in Gaussian noise: exact chi-square
        assert_variance(samples, var)


# -- the mechanism ---------------------------------------------------------------------------
def test_mechanism_answers_are_distributions_and_described() -> None:
    pop = synthetic_population(n=3000, sizes=(2,) * 7, strength=1.5, rng=71)
    for mech, label in ((Datacube(), "DC-F+"), (Datacube("marginals", "uniform"), "DC-Q")):
        assert mech.name == label and "epsilon-DP" in mech.privacy_unit
        reps = run_mechanism(pop, mech, 0.3, 3, queries=5, reps=2, rng=72)
        assert all(np.isfinite(r.sse) and r.sse < r.uniform_sse for r in reps)
        release = mech.run(pop, 0.3, 3, rng=73)
        for q in [(0, 2, 5), (1, 4), (3,)]:
            ans = release.answer(q)
            assert ans.shape == pop.schema.shape(q) and ans.dtype == np.float64
            assert ans.min() >= 0 and ans.sum() == pytest.approx(1.0, abs=1e-12)
        chosen = release.describe()
        assert chosen["strategy"] == mech.strategy and chosen["budgets"] == mech.budgets
        assert chosen["groups"] == (64 if mech.strategy == "fourier" else 35)
        assert chosen["predicted_sse"] == pytest.approx(
            chosen["predicted_total_variance"] / (35 * pop.n**2)  # type: ignore[operator]
        )
    gauss = Datacube(noise="gaussian", delta=1e-6)
    assert gauss.name == "DC-F+/G" and "delta=1e-06" in gauss.privacy_unit


# -- 5. errors ------------------------------------------------------------------------------
def test_bad_options_are_rejected_eagerly() -> None:
    with pytest.raises(CalmkitError, match=r"strategy \('wavelet'\)"):
        Datacube("wavelet")
    with pytest.raises(CalmkitError, match=r"budgets \('greedy'\)"):
        Datacube(budgets="greedy")
    with pytest.raises(CalmkitError, match=r"noise \('exp'\)"):
        Datacube(noise="exp")
    with pytest.raises(CalmkitError, match=r"delta \(None\)"):
        Datacube(noise="gaussian")
    with pytest.raises(CalmkitError, match=r"delta \(1.5\)"):
        Datacube(noise="gaussian", delta=1.5)
    with pytest.raises(CalmkitError, match=r"delta \(0.01\) applies only"):
        Datacube(delta=0.01)
    with pytest.raises(CalmkitError, match=r"max_cells \(0\)"):
        Datacube(max_cells=0)
    with pytest.raises(CalmkitError, match=r"weights"):
        laplace_allocation([1.0, 0.0], 1.0)
    with pytest.raises(CalmkitError, match=r"epsilon \(-1.0\)"):
        laplace_allocation([1.0], -1.0)
    with pytest.raises(CalmkitError, match=r"workload marginal \(\(1, 0\)\)"):
        marginal_weights([(1, 0)], (2, 2))


def test_not_scalable_before_any_work() -> None:
    pop = synthetic_population(n=200, sizes=(2, 3, 2), strength=1.5, rng=81)
    with pytest.raises(NotScalable, match=r"attribute 1 .* 3 categories.*strategy='marginals'"):
        Datacube("fourier").check(pop.schema, pop.n, 1.0, 2)
    with pytest.raises(NotScalable, match="binary"):
        Datacube("fourier").run(pop, 1.0, 2, rng=0)
    Datacube("marginals").check(pop.schema, pop.n, 1.0, 2)
    # 3-way marginals of 6 attributes of size 10: 20 * 1000 cells
    wide = synthetic_population(n=50, sizes=(10,) * 6, strength=1.0, rng=82)
    with pytest.raises(NotScalable, match=r"20 3-way marginals with 20000 cells.*k <= 2 fits"):
        Datacube("marginals", max_cells=10_000).run(wide, 1.0, 3, rng=0)
    with pytest.raises(CalmkitError, match=r"k \(4\)"):
        Datacube("marginals").check(pop.schema, pop.n, 1.0, 4)
    with pytest.raises(CalmkitError, match=r"epsilon \(0.0\)"):
        Datacube("marginals").check(pop.schema, pop.n, 0.0, 2)
    release = Datacube("marginals").run(pop, 1.0, 2, rng=83)
    with pytest.raises(CalmkitError, match=r"query \(\(0, 1, 2\)\)"):
        release.answer((0, 1, 2))
