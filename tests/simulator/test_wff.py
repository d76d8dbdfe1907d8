"""WFF (weighted Fourier factorizations, central reference): closed-form variances,
weighted MSE G^2/mu^2, Lebeda's (sqrt(d)+1)/2, GDP accounting, exact FFT recovery on
non-binary domains, and the NotScalable / option errors.

Independent references: the covariance of the raw answers is built from the character
matrix (no FFT), G from the singular values of the weighted workload matrix, delta
from numerical integration of the hockey-stick divergence."""

from __future__ import annotations

import math
from itertools import combinations, product

import numpy as np
import pytest
from scipy import integrate, stats

from calmkit_aggregator.reconstruction import norm_sub
from calmkit_client import CalmkitError, Schema
from calmkit_simulator import synthetic_population
from calmkit_simulator.experiment import run_mechanism
from calmkit_simulator.mechanisms.base import NotScalable
from calmkit_simulator.mechanisms.wff import (
    FourierPlan,
    WeightedFourier,
    Workload,
    exact_coefficients,
    gdp_delta,
    gdp_mu,
    noisy_release,
    predicted_rmse,
)
from tests.stats import assert_variance, assert_z

SIZES = (2, 3, 4, 2)
POP = synthetic_population(n=2000, sizes=SIZES, strength=1.5, rng=0)
MIXED = Workload.from_mapping({(0, 1): 0.5, (1, 2, 3): 0.3, (2,): 0.2})
MU = 0.5
REPS = 1500


def _repeat(plan: FourierPlan, queries: list[tuple[int, ...]], reps: int, seed: int) -> np.ndarray:
    """Raw counts of ``queries`` (flattened, concatenated) over ``reps`` releases."""
    exact = exact_coefficients(POP, plan)
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(reps):
        rel = noisy_release(exact, plan, MU, rng)
        rows.append(np.concatenate([rel.raw_counts(q).reshape(-1) for q in queries]))
    return np.stack(rows)


def _truth(queries: list[tuple[int, ...]]) -> np.ndarray:
    return np.concatenate([POP.counts(q).reshape(-1).astype(float) for q in queries])


def _character_covariance(sizes: tuple[int, ...], workload: Workload, mu: float) -> np.ndarray:
    """Covariance of the raw answers over the workload's cells (sets in order, C order)
    from first principles: every frequency alpha of the full domain with
    c(supp alpha) > 0 gets CN(0, 2G/(mu^2 sqrt(c))) noise, and cell (S, y) is
    ``Re sum_{supp alpha in S} Z_alpha conj(chi_alpha(y)) / n_S``; so
    ``Cov = Re(M diag(sigma^2) M^H) / 2``. No FFT, no plan."""
    alphas = np.array(list(product(*(range(n) for n in sizes))))
    supp = alphas != 0
    c = np.zeros(len(alphas))
    for s, w in zip(workload.sets, workload.weights):
        inside = ~supp[:, [i for i in range(len(sizes)) if i not in s]].any(axis=1)
        c[inside] += w / math.prod(sizes[i] for i in s) ** 2
    used = c > 0
    G = np.sqrt(c[used]).sum()
    sigma2 = 2 * G / (mu**2 * np.sqrt(c[used]))
    rows = []
    for s in workload.sets:
        n_s = math.prod(sizes[i] for i in s)
        cells = np.array(list(product(*(range(sizes[i]) for i in s))))  # C order
        phase = np.zeros((len(cells), int(used.sum())))
        for j, i in enumerate(s):
            phase += np.outer(cells[:, j], alphas[used, i]) / sizes[i]
        inside = ~supp[used][:, [i for i in range(len(sizes)) if i not in s]].any(axis=1)
        rows.append(np.exp(-2j * np.pi * phase) * inside / n_s)
    M = np.concatenate(rows)
    cov: np.ndarray = np.real((M * sigma2) @ M.conj().T) / 2
    return cov


@pytest.fixture(scope="module")
def k_way_samples() -> tuple[FourierPlan, list[tuple[int, ...]], np.ndarray]:
    plan = FourierPlan.build(SIZES, Workload.k_way(4, 2))
    queries = [*combinations(range(4), 2), (0,), (2,)]  # workload sets and subsets
    return plan, queries, _repeat(plan, queries, REPS, seed=11)


# -- 1. per-cell variance ---------------------------------------------------------------
def test_raw_cells_are_unbiased_with_the_closed_form_variance(k_way_samples) -> None:  # type: ignore[no-untyped-def]
    plan, queries, samples = k_way_samples
    variance = np.concatenate(
        [np.full(math.prod(SIZES[i] for i in q), plan.variance(q, MU)) for q in queries]
    )
    assert_variance(samples, variance)
    assert_z(samples.mean(axis=0), _truth(queries), variance / REPS)


def test_closed_form_variance_is_the_character_covariance_diagonal() -> None:
    # Lemma 3.7's V_S against the first-principles covariance, on a mixed workload.
    cov = _character_covariance(SIZES, MIXED, MU)
    plan = FourierPlan.build(SIZES, MIXED)
    stated = np.concatenate(
        [np.full(math.prod(SIZES[i] for i in s), plan.variance(s, MU)) for s in MIXED.sets]
    )
    np.testing.assert_allclose(np.diag(cov), stated, rtol=1e-12)


# -- 2. weighted MSE = G^2 / mu^2 ---------------------------------------------------------
def _cell_weights(workload: Workload) -> np.ndarray:
    return np.concatenate(
        [
            np.full(math.prod(SIZES[i] for i in s), w / math.prod(SIZES[i] for i in s))
            for s, w in zip(workload.sets, workload.weights)
        ]
    )


def test_weighted_mse_is_G_squared_over_mu_squared_analytically() -> None:
    for workload in (MIXED, Workload.k_way(4, 2), Workload.up_to(4, 3)):
        plan = FourierPlan.build(SIZES, workload)
        target = plan.G**2 / MU**2
        assert plan.weighted_mse(MU) == pytest.approx(target, rel=1e-12)
        assert predicted_rmse(SIZES, workload, MU) == pytest.approx(plan.G / MU, rel=1e-15)
        cov = _character_covariance(SIZES, workload, MU)
        assert float(_cell_weights(workload) @ np.diag(cov)) == pytest.approx(target, rel=1e-12)


def test_weighted_mse_is_G_squared_over_mu_squared_empirically() -> None:
    # Mean over R releases of sum_cells a_c e_c^2 (a = w(S)/n_S): its variance is
    # 2 tr((A Cov)^2) / R (Gaussian quadratic form), Cov from characters.
    plan = FourierPlan.build(SIZES, MIXED)
    samples = _repeat(plan, list(MIXED.sets), REPS, seed=12)
    a = _cell_weights(MIXED)
    wmse = ((samples - _truth(list(MIXED.sets))) ** 2) @ a
    ac = a[:, None] * _character_covariance(SIZES, MIXED, MU)
    assert_z(wmse.mean(), np.asarray(plan.G**2 / MU**2), 2 * np.trace(ac @ ac) / REPS)


def test_G_is_the_singular_value_lower_bound() -> None:
    # Theorem 5.8: the weighted workload matrix (rows sqrt(w(S)/n_S) 1[x_S = y] over the
    # full domain X) has nuclear norm sqrt(|X|) G; the mechanism meets the bound.
    X = np.array(list(product(*(range(n) for n in SIZES))))
    for workload in (MIXED, Workload.k_way(4, 2), Workload.up_to(4, 3)):
        rows = []
        for s, w in zip(workload.sets, workload.weights):
            n_s = math.prod(SIZES[i] for i in s)
            cells = np.array(list(product(*(range(SIZES[i]) for i in s))))
            hit = (X[None, :, list(s)] == cells[:, None, :]).all(axis=2)
            rows.append(np.sqrt(w / n_s) * hit)
        nuclear = np.linalg.svd(np.concatenate(rows), compute_uv=False).sum()
        plan = FourierPlan.build(SIZES, workload)
        assert plan.G == pytest.approx(nuclear / math.sqrt(len(X)), rel=1e-10)


def test_release_costs_exactly_mu_squared() -> None:
    for workload in (MIXED, Workload.k_way(4, 2), Workload.up_to(4, 3)):
        plan = FourierPlan.build(SIZES, workload)
        assert plan.gdp_cost(0.3) == pytest.approx(0.3**2, rel=1e-12)
        # variance inversely proportional to sqrt(c_T)
        np.testing.assert_allclose(plan.sigma2(0.3) * np.sqrt(plan.c), 2 * plan.G / 0.09)


def test_coefficient_noise_is_circular_complex_gaussian() -> None:
    # Lemma 3.1 needs Re and Im iid N(0, sigma_T^2 / 2): any direction of the noise,
    # e.g. (Re + Im)/sqrt(2) and (Re - Im)/sqrt(2), has that variance (a degenerate or
    # correlated pair would leave some direction of f_alpha unprotected).
    plan = FourierPlan.build(SIZES, MIXED)
    exact = exact_coefficients(POP, plan)
    rng = np.random.default_rng(14)
    noise = np.stack(
        [noisy_release(exact, plan, MU, rng).coefficients - exact for _ in range(REPS)]
    )
    re, im = noise.real, noise.imag
    half = np.repeat(plan.sigma2(MU) / 2, plan.D)
    samples = np.concatenate([re, im, (re + im) / np.sqrt(2), (re - im) / np.sqrt(2)], axis=1)
    assert_variance(samples, np.tile(half, 4))
    assert_z(samples.mean(axis=0), np.zeros(samples.shape[1]), np.tile(half, 4) / REPS)


# -- 3. Lebeda's binary 1-way mechanism and Algorithm 1 -----------------------------------
@pytest.mark.parametrize("d", [1, 2, 5, 16])
def test_binary_one_way_std_is_lebeda(d: int) -> None:
    plan = FourierPlan.build((2,) * d, Workload.k_way(d, 1))
    lebeda = (math.sqrt(d) + 1) / 2
    assert plan.G == pytest.approx(lebeda, rel=1e-14)
    for i in range(d):
        assert math.sqrt(plan.variance((i,), MU)) == pytest.approx(lebeda / MU, rel=1e-14)


def test_binary_one_way_std_is_lebeda_empirically() -> None:
    d = 9
    pop = synthetic_population(n=1000, sizes=(2,) * d, strength=1.5, rng=3)
    plan = FourierPlan.build(pop.schema.sizes, Workload.k_way(d, 1))
    exact = exact_coefficients(pop, plan)
    rng = np.random.default_rng(13)
    queries = [(i,) for i in range(d)]
    samples = np.stack(
        [
            np.concatenate([noisy_release(exact, plan, MU, rng).raw_counts(q) for q in queries])
            for _ in range(REPS)
        ]
    )
    lebeda = (math.sqrt(d) + 1) / 2 / MU  # = 4 here
    assert_variance(samples, np.full(2 * d, lebeda**2))


def test_uniform_k_way_matches_algorithm_1_closed_form() -> None:
    n, d, k, mu = 3, 5, 2, 0.7
    plan = FourierPlan.build((n,) * d, Workload.k_way(d, k))
    head = sum(
        math.comb(d, i) * (n - 1) ** i * math.sqrt(math.comb(d - i, k - i)) for i in range(k + 1)
    )
    for j, t in enumerate(plan.supports):
        sigma2 = 2 / mu**2 * head / math.sqrt(math.comb(d - len(t), k - len(t)))
        assert plan.sigma2(mu)[j] == pytest.approx(sigma2, rel=1e-12)
    cell = (
        n**-k
        * sum((n - 1) ** j * math.sqrt(math.comb(d, j) * math.comb(k, j)) for j in range(k + 1))
    ) ** 2
    for s in combinations(range(d), k):
        assert plan.variance(s, mu) == pytest.approx(cell / mu**2, rel=1e-12)


@pytest.mark.parametrize(
    ("n", "k", "d", "ratio"),
    [(2, 1, 10, 0.66), (2, 2, 20, 0.38), (3, 2, 50, 0.51), (10, 2, 100, 0.83)],
)
def test_std_ratio_to_gaussian_matches_the_notes_table(
    n: int, k: int, d: int, ratio: float
) -> None:
    # the notes' table of WFF / plain Gaussian (variance C(d,k)/mu^2) std ratios, 2 decimals
    plan = FourierPlan.build((n,) * d, Workload.k_way(d, k))
    got = math.sqrt(plan.variance(tuple(range(k)), 1.0) / math.comb(d, k))
    assert abs(got - ratio) <= 0.005


# -- 4. GDP accounting -----------------------------------------------------------------
def _hockey_stick(mu: float, eps: float) -> float:
    """sup_S P[N(mu,1) in S] - e^eps P[N(0,1) in S], by numerical integration."""
    f = lambda x: max(0.0, stats.norm.pdf(x - mu) - math.exp(eps) * stats.norm.pdf(x))  # noqa: E731
    cross = eps / mu + mu / 2  # densities cross here; the integrand is 0 below
    return float(integrate.quad(f, cross, math.inf, epsabs=0, epsrel=1e-11, limit=200)[0])


def test_gdp_delta_known_values() -> None:
    expected = stats.norm.cdf(-0.5) - math.e * stats.norm.cdf(-1.5)
    assert gdp_delta(1.0, 1.0) == pytest.approx(expected, rel=1e-12)
    assert gdp_delta(1.0, 1.0) == pytest.approx(0.126936737, abs=1e-9)
    assert gdp_delta(2.0, 0.0) == pytest.approx(2 * stats.norm.cdf(1.0) - 1, rel=1e-12)
    for mu, eps in [(0.2, 0.5), (0.5, 1.0), (1.0, 3.0), (3.0, 2.0), (0.1, 0.05)]:
        assert gdp_delta(mu, eps) == pytest.approx(_hockey_stick(mu, eps), rel=1e-7)


def test_gdp_mu_round_trip_and_monotonicity() -> None:
    for mu, eps in [(0.05, 0.2), (0.3, 1.0), (1.0, 1.0), (1.0, 5.0), (3.0, 0.1), (8.0, 10.0)]:
        assert gdp_mu(eps, gdp_delta(mu, eps)) == pytest.approx(mu, rel=1e-10)
    mus = np.geomspace(0.05, 10, 40)  # delta from 1e-88 to 1 - 1e-6
    deltas = [gdp_delta(m, 1.0) for m in mus]
    assert np.all(np.diff(deltas) > 0)
    assert np.all(np.diff([gdp_delta(1.0, e) for e in np.linspace(0, 6, 30)]) < 0)
    assert np.all(np.diff([gdp_mu(e, 1e-6) for e in (0.1, 0.2, 0.5, 1, 2, 4, 8)]) > 0)
    assert np.all(np.diff([gdp_mu(1.0, dl) for dl in (1e-12, 1e-9, 1e-6, 1e-3, 0.1)]) > 0)
    assert gdp_delta(gdp_mu(0.2, 1e-6), 0.2) == pytest.approx(1e-6, rel=1e-9)


def test_gdp_bad_arguments() -> None:
    for bad in (0.0, -1.0, math.nan, math.inf, True, "1"):
        with pytest.raises(CalmkitError, match="mu"):
            gdp_delta(bad, 1.0)  # type: ignore[arg-type]
    with pytest.raises(CalmkitError, match=r"epsilon \(-1.0\)"):
        gdp_delta(1.0, -1.0)
    for bad in (0.0, 1.0, -0.1, 2.0, math.nan):
        with pytest.raises(CalmkitError, match="delta"):
            gdp_mu(1.0, bad)
    with pytest.raises(CalmkitError, match="epsilon"):
        gdp_mu(0.0, 1e-6)


# -- 5. noiseless recovery -------------------------------------------------------------
@pytest.mark.parametrize(
    "workload", [Workload.k_way(4, 2), Workload.up_to(4, 3), MIXED], ids=["k", "upto-k", "mixed"]
)
def test_noiseless_fft_reconstruction_is_exact(workload: Workload) -> None:
    plan = FourierPlan.build(SIZES, workload)
    rel = noisy_release(exact_coefficients(POP, plan), plan, 1e12, 0)
    assert rel.total == pytest.approx(POP.n, abs=1e-6)
    for s in plan.supports[1:]:  # every non-empty set of the downward closure
        np.testing.assert_allclose(rel.raw_counts(s), POP.counts(s), rtol=0, atol=1e-6)
        np.testing.assert_allclose(rel.answer(s), POP.marginal(s), rtol=0, atol=1e-9)


def test_exact_coefficients_are_the_characters_sums() -> None:
    # f_alpha = sum_x exp(2 pi i sum_i alpha_i x_i / n_i), straight from the records
    plan = FourierPlan.build(SIZES, MIXED)
    f = exact_coefficients(POP, plan)
    codes = POP.codes.astype(float)
    for t, j in plan.index.items():
        freqs = list(product(*(range(1, SIZES[i]) for i in t)))
        got = f[plan.offsets[j] : plan.offsets[j + 1]]
        for a, alpha in enumerate(freqs):
            theta = np.zeros(POP.n)
            for al, i in zip(alpha, t):
                theta += al * codes[:, i] / SIZES[i]
            assert got[a] == pytest.approx(np.exp(2j * np.pi * theta).sum(), abs=1e-8)


# -- projection, release, harness ------------------------------------------------------
def test_answer_is_norm_sub_of_raw_fractions_and_never_farther() -> None:
    plan = FourierPlan.build(SIZES, Workload.k_way(4, 2))
    exact = exact_coefficients(POP, plan)
    rng = np.random.default_rng(5)
    negatives = 0
    for _ in range(50):
        rel = noisy_release(exact, plan, 0.02, rng)  # heavy noise: negative cells
        for s in combinations(range(4), 2):
            raw = rel.raw_counts(s) / max(rel.total, 1.0)
            ans = rel.answer(s)
            negatives += int((raw < 0).any())
            assert ans.shape == POP.schema.shape(s) and ans.dtype == np.float64
            assert ans.min() >= 0 and ans.sum() == pytest.approx(1.0, abs=1e-12)
            np.testing.assert_allclose(ans, norm_sub(raw), atol=1e-15)
            truth = POP.marginal(s)  # projection onto a convex set holding the truth
            assert ((ans - truth) ** 2).sum() <= ((raw - truth) ** 2).sum() + 1e-15
    assert negatives > 0


def test_queries_outside_the_closure_are_refused() -> None:
    plan = FourierPlan.build(SIZES, MIXED)
    rel = noisy_release(exact_coefficients(POP, plan), plan, 1.0, 0)
    for bad in [(0, 2), (0, 1, 2), (), (1, 1)]:
        with pytest.raises(CalmkitError, match="query"):
            rel.answer(bad)


def test_mechanism_runs_in_the_harness_and_is_seeded() -> None:
    mech = WeightedFourier()
    reps = run_mechanism(POP, mech, 1.0, 2, queries=4, reps=2, rng=1)
    chosen = reps[0].chosen
    mu = gdp_mu(1.0, 1e-6)
    assert chosen["mu"] == pytest.approx(mu) and chosen["delta"] == 1e-6
    plan = FourierPlan.build(SIZES, Workload.k_way(4, 2))
    assert chosen["G"] == pytest.approx(plan.G)
    assert chosen["predicted_rmse"] == pytest.approx(plan.G / mu)
    assert "delta=1e-06" in mech.privacy_unit and "add/remove" in mech.privacy_unit
    a = mech.run(POP, 1.0, 2, 7).answer((1, 2))
    b = mech.run(POP, 1.0, 2, 7).answer((1, 2))
    c = mech.run(POP, 1.0, 2, 8).answer((1, 2))
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    upto = WeightedFourier(workload="upto-k", delta=1e-8).run(POP, 1.0, 2, 0)
    assert upto.describe()["workload"] == "upto-k" and upto.answer((3,)).shape == (2,)


# -- 6. NotScalable and bad options ----------------------------------------------------
def test_not_scalable_before_any_work() -> None:
    mech = WeightedFourier()
    with pytest.raises(NotScalable, match="supports"):
        mech.check(Schema.from_sizes((2,) * 100), 10_000, 1.0, 5)
    with pytest.raises(NotScalable, match="coefficients"):
        mech.check(Schema.from_sizes((1000,) * 4), 10_000, 1.0, 3)
    with pytest.raises(NotScalable, match="2,002"):  # 1999 + 1 + 1 + 1 (+ f_0)
        WeightedFourier(max_coefficients=2001).check(Schema.from_sizes((2000, 2, 2)), 10, 1.0, 1)
    WeightedFourier(max_coefficients=2002).check(Schema.from_sizes((2000, 2, 2)), 10, 1.0, 1)
    with pytest.raises(NotScalable, match="25"):  # SIZES at k=2: 25 coefficients
        WeightedFourier(max_coefficients=24).run(POP, 1.0, 2, 0)
    with pytest.raises(NotScalable, match="supports"):
        WeightedFourier(workload={tuple(range(4)): 1.0}, max_supports=15).run(POP, 1.0, 2, 0)
    mech.check(Schema.from_sizes((2,) * 16), 21_574, 1.0, 3)  # NLTCS at k = 3 runs


def test_bad_options_and_arguments() -> None:
    for bad in (0.0, 1.0, -1e-6, math.nan, "x", True):
        with pytest.raises(CalmkitError, match="delta"):
            WeightedFourier(delta=bad)  # type: ignore[arg-type]
    with pytest.raises(CalmkitError, match="workload"):
        WeightedFourier(workload="all")
    with pytest.raises(CalmkitError, match="workload"):
        WeightedFourier(workload=3)  # type: ignore[arg-type]
    for name in ("max_coefficients", "max_supports"):
        with pytest.raises(CalmkitError, match=name):
            WeightedFourier(**{name: 0})  # type: ignore[arg-type]
    with pytest.raises(CalmkitError, match=r"epsilon \(-1.0\)"):
        WeightedFourier().run(POP, -1.0, 2, 0)
    with pytest.raises(CalmkitError, match="k"):
        WeightedFourier().check(POP.schema, POP.n, 1.0, 5)
    with pytest.raises(CalmkitError, match="positions < d"):
        WeightedFourier(workload={(0, 7): 1.0}).check(POP.schema, POP.n, 1.0, 2)
    bad_workloads: list[tuple[tuple[tuple[int, ...], ...], tuple[float, ...]]] = [
        (((),), (1.0,)),  # empty set
        (((0, 0),), (1.0,)),  # repeated attribute
        (((0,),), (-1.0,)),  # negative weight
        (((0,),), (0.0,)),  # no positive weight
        (((0,), (0,)), (1.0, 1.0)),  # repeated set
        (((0,),), (1.0, 2.0)),  # length mismatch
    ]
    for sets, weights in bad_workloads:
        with pytest.raises(CalmkitError, match="workload"):
            Workload(sets, weights)
