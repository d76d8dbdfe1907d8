"""The FT and EM baselines (the CALM paper, Zhang et al., CCS 2018, §3.5, §3.6): FT's
coefficients are unbiased with the binary randomized-response variance, exact
coefficients reconstruct the marginals exactly and formula (6) predicts the SSE; EM
recovers the marginal from (nearly) noiseless reports, matches the unbiased estimator's
variance where that is the maximum-likelihood estimate, and never lowers the
likelihood."""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pytest

from calmkit_client import GRR, CalmkitError, Schema
from calmkit_simulator import Population, synthetic_population
from calmkit_simulator.mechanisms import NotScalable
from calmkit_simulator.mechanisms.em import EMRelease, ExpectationMaximization
from calmkit_simulator.mechanisms.ft import (
    Fourier,
    FourierBasis,
    FourierRelease,
    ft_variance,
    hadamard_inverse,
)
from tests.stats import assert_variance, assert_z

# -- FT --------------------------------------------------------------------------------
# d = 8, k = 3: N = 8 + 28 + 56 = 92 coefficients, n = 92 * 100 so every coefficient
# gets exactly 100 users and ft_variance's n / N is exact.
D, K, N_USERS = 8, 3, 9200
POP_BIN = synthetic_population(n=N_USERS, sizes=(2,) * D, strength=1.5, rng=5)
# Small epsilon: formula (6) models only the randomized response; the random split of
# users adds (1 - f^2)(N - 1)/(n - 1) per coefficient, at most (e^eps - 1)^2 / (4 e^eps) of
# the randomized-response term: 1.6% at eps = 0.25 (27% at eps = 1).
EPS_FT = 0.25
# Repetitions for the SSE check: a repetition's mean SSE over the 56 queries is
# 2^-3 / 56 * sum_S w_S e_S^2 with w_S = 21, 6, 1 queries containing a coefficient of
# order 1, 2, 3 and e_S independent, near-Gaussian with one variance, so its relative
# standard deviation is sqrt(2 sum w^2) / sum w = sqrt(2 * 4592) / 392 = 0.245. Over
# 400 repetitions that is 1.2%: the 10% tolerance is 8 standard errors (6.9 after
# the at most 1.6% the split adds), while the paper's literal count (93 Var0 instead
# of 80.5 Var0, 15.5% high) would fail.
REPS_FT = 400
QUERIES = list(combinations(range(D), K))


@pytest.fixture(scope="module")
def ft_runs() -> list[FourierRelease]:
    gen = np.random.default_rng(11)
    mech = Fourier(nonnegative=False)
    runs = [mech.run(POP_BIN, EPS_FT, K, gen) for _ in range(REPS_FT)]
    return runs


def _assert_unbiased(runs: list[FourierRelease], pop: Population, epsilon: float) -> None:
    exact = runs[0].basis.exact(pop)
    est = np.stack([r.coefficients for r in runs])
    m = runs[0].group_sizes.astype(float)
    assert np.all(m == m[0]), "n is a multiple of N: equal groups"
    # Var of 2 P_hat - 1: binary RR on the m users of the coefficient (4x GRR's
    # variance, exact for L = 2: p(1-p) = q(1-q)), plus drawing those m users from n
    # without replacement (the +-1 parity has variance 1 - f^2).
    rr = 4 * GRR(epsilon, 2).variance(int(m[0]))
    split = (1 - exact**2) * (pop.n - m) / (m * (pop.n - 1))
    assert_z(est.mean(axis=0), exact, (rr + split) / len(runs))
    assert_variance(est, rr + split)


def test_ft_coefficients_are_unbiased_with_the_rr_variance(ft_runs: list[FourierRelease]) -> None:
    assert ft_runs[0].basis.size == 92
    _assert_unbiased(ft_runs, POP_BIN, EPS_FT)


def test_ft_coefficients_are_unbiased_with_many_users_per_coefficient() -> None:
    # d = 4, k = 2: 10 coefficients, 2000 users each, eps = 2: the standard error of
    # the mean over 200 runs is ~0.002, so even a 5% error of scale shows on the
    # coefficients with |f| ~ 0.5 (the eps = 0.25 runs are too noisy for that).
    pop = synthetic_population(n=20_000, sizes=(2,) * 4, strength=1.5, rng=12)
    gen = np.random.default_rng(13)
    runs = [Fourier().run(pop, 2.0, 2, gen) for _ in range(200)]
    assert runs[0].basis.size == 10
    _assert_unbiased(runs, pop, 2.0)


def test_ft_sse_matches_formula_6(ft_runs: list[FourierRelease]) -> None:
    truth = {q: POP_BIN.marginal(q) for q in QUERIES}
    sse = np.array([[((r.answer(q) - truth[q]) ** 2).sum() for q in QUERIES] for r in ft_runs])
    predicted = ft_variance(D, K, N_USERS, EPS_FT)
    # the runs are independent: the mean's standard error from their spread; 4 of them
    per_run = sse.mean(axis=1)
    margin = 4 * per_run.std(ddof=1) / np.sqrt(per_run.size)
    assert abs(per_run.mean() - predicted) < margin, (per_run.mean() / predicted, margin)
    # the paper's printed count (s = 0..k, every cell noisy) is 93 / 80.5 of this
    literal = ft_variance(D, K, N_USERS, EPS_FT, literal=True)
    assert literal / predicted == pytest.approx(93 / (7 / 8 * 92), rel=1e-12)


def test_ft_sse_with_the_user_split_at_eps_1() -> None:
    # At eps = 1 the random split of users adds up to 27% to formula (6); with the
    # population's coefficients it is exact: E[SSE of A] = 2^-3 sum_{S in A} Var(f_S),
    # Var(f_S) = N Var0 + (1 - f_S^2)(n - m) / (m (n - 1)). 200 runs: ~1.7% standard
    # error; the test allows 4 standard errors of the runs' mean.
    gen = np.random.default_rng(21)
    runs = [Fourier(nonnegative=False).run(POP_BIN, 1.0, K, gen) for _ in range(200)]
    basis, m = runs[0].basis, 100
    exact = basis.exact(POP_BIN)
    var = 4 * GRR(1.0, 2).variance(m) + (1 - exact**2) * (N_USERS - m) / (m * (N_USERS - 1))
    truth = {q: POP_BIN.marginal(q) for q in QUERIES}
    expected = np.mean(
        [var[basis.subset_index(basis.query_bits(q))[1:]].sum() / 8 for q in QUERIES]
    )
    per_run = np.array(
        [np.mean([((r.answer(q) - truth[q]) ** 2).sum() for q in QUERIES]) for r in runs]
    )
    sse = float(per_run.mean())
    margin = 4 * per_run.std(ddof=1) / np.sqrt(per_run.size)  # 4 standard errors
    assert abs(sse - expected) < margin, f"empirical / exact = {sse / expected:.3f}"
    # formula (6) alone misses the split here; its f_S = 0 bound covers it
    assert sse / ft_variance(D, K, N_USERS, 1.0) > 1.10
    assert expected <= ft_variance(D, K, N_USERS, 1.0, split=True)


@pytest.mark.parametrize(("sizes", "k"), [((2,) * 6, 3), ((3, 2, 5, 4, 1), 2)])
def test_ft_exact_coefficients_reconstruct_every_marginal(sizes: tuple[int, ...], k: int) -> None:
    pop = synthetic_population(n=3000, sizes=sizes, strength=2.0, rng=2)
    basis = FourierBasis(pop.schema, k)
    exact = basis.exact(pop)
    for t in range(1, k + 1):
        for q in combinations(range(pop.d), t):
            for nonnegative in (False, True):
                got = basis.marginal(q, exact, nonnegative)
                assert got.shape == pop.schema.shape(q)
                np.testing.assert_allclose(got, pop.marginal(q), rtol=0, atol=1e-12)


def test_hadamard_inverse_is_the_kronecker_product() -> None:
    rng = np.random.default_rng(0)
    f = rng.standard_normal(16)
    h = np.array([[1.0, 1.0], [1.0, -1.0]])
    full = h
    for _ in range(3):
        full = np.kron(full, h)
    np.testing.assert_allclose(hadamard_inverse(f), full @ f / 16, rtol=0, atol=1e-13)


def test_ft_not_scalable_before_any_work() -> None:
    # d = 32, k = 3: 32 + 496 + 4960 = 5488 coefficients for 1000 users
    pop = Population(Schema.from_sizes((2,) * 32), np.zeros((1000, 32), dtype=np.uint8))
    gen = np.random.default_rng(3)
    state = gen.bit_generator.state
    with pytest.raises(NotScalable, match=r"5488 .*n \(1000\)"):
        Fourier().run(pop, 1.0, 3, gen)
    assert gen.bit_generator.state == state
    # the paper's d = 32, k = 8: 15033172 coefficients for n = 2^16 (§5.2)
    with pytest.raises(NotScalable, match=r"15033172 .*n \(65536\)"):
        Fourier().check(Schema.from_sizes((2,) * 32), 1 << 16, 1.0, 8)
    with pytest.raises(CalmkitError, match="epsilon"):
        Fourier().run(POP_BIN, 0.0, 3, gen)
    assert gen.bit_generator.state == state


def test_ft_binary_encoding_answers_in_categories() -> None:
    # bits 2, 1, 3, 2, 0 (D = 8); k = 2 -> k_bits = 3 + 2 = 5, 218 coefficients
    pop = synthetic_population(n=6000, sizes=(3, 2, 5, 4, 1), strength=1.5, rng=4)
    release = Fourier().run(pop, 2.0, 2, 7)
    assert release.describe()["coefficients"] == 218
    for q in combinations(range(pop.d), 2):
        got = release.answer(q)
        assert got.shape == pop.schema.shape(q)
        assert got.min() >= 0 and got.sum() == pytest.approx(1.0, abs=1e-12)
    assert release.answer((1, 3, 4)).shape == (2, 4, 1)  # 3 bits: within k_bits
    with pytest.raises(CalmkitError, match="k_bits = 5"):
        release.answer((0, 2, 3))  # 7 bits


# -- EM --------------------------------------------------------------------------------
def _unbiased_variance(release: EMRelease, pop: Population, q: tuple[int, ...]) -> np.ndarray:
    """Exact per-cell variance of the unbiased estimator given the population:
    (sum_x N_x prod_i s_i(x_i, v_i) - N_v) / n^2, with
    s_i(a, b) = E[Z_i(b)^2 | x_i = a] = (P(b supported | a)(1 - 2q) + q^2) / (p - q)^2
    (Z = (B - q)/(p - q) is unbiased for 1{x = v}, independent across attributes)."""
    s: np.ndarray = np.ones((1, 1))
    for a in q:
        oracle, L = release.oracles[a], pop.schema.sizes[a]
        assert oracle is not None
        p, qq = oracle.p, oracle.q
        supported = np.where(np.eye(L) > 0, p, qq)
        s = np.kron(s, (supported * (1 - 2 * qq) + qq**2) / (p - qq) ** 2)
    counts = pop.counts(q).reshape(-1).astype(float)
    return np.asarray((s @ counts - counts) / pop.n**2)


def test_em_recovers_the_marginal_from_nearly_noiseless_reports() -> None:
    pop = synthetic_population(n=5000, sizes=(2, 3, 4, 5), strength=1.5, rng=6)
    release = ExpectationMaximization().run(pop, 4 * 16.0, 2, 1)  # 16 per attribute
    assert isinstance(release, EMRelease)
    for q in combinations(range(pop.d), 2):
        # No report flipped (seeded); then T_hat = (A_1 (x) A_2) x with
        # A_i = (I - q_i J) / (p_i - q_i), ||A_i - I|| <= 2 L_i q_i: the deviation is at
        # most prod(1 + 2 L_i q_i) - 1 (~2e-6), while one flipped report moves a cell
        # by 1/n = 2e-4.
        flips = [o.q for o in (release.oracles[a] for a in q) if o is not None]
        bound = float(np.prod([1 + 2 * L * f for L, f in zip(pop.schema.shape(q), flips)])) - 1
        got = release.answer(q)
        assert got.shape == pop.schema.shape(q)
        np.testing.assert_allclose(got, pop.marginal(q), rtol=0, atol=bound)


def test_em_is_the_unbiased_mle_with_its_variance_for_grr() -> None:
    # independent attributes, 2 per attribute (all GRR): every cell >= 1/12, the
    # unbiased estimate is a distribution, hence EM's maximum (it starts there and stays)
    pop = synthetic_population(n=20000, sizes=(2, 3, 4), strength=0.0, max_parents=0, rng=7)
    release = ExpectationMaximization().run(pop, 3 * 2.0, 2, 2)
    assert isinstance(release, EMRelease)
    assert {o.name for o in release.oracles} == {"GRR"}  # type: ignore[union-attr]
    for q in combinations(range(pop.d), 2):
        fit = release.fit(q)
        unbiased = release.unbiased(q).reshape(-1)
        assert unbiased.min() > 1.0 / pop.n and fit.converged
        np.testing.assert_allclose(fit.table, unbiased, rtol=0, atol=1e-12)
        assert_z(fit.table, pop.marginal(q).reshape(-1), _unbiased_variance(release, pop, q))


def test_em_with_oue_is_close_to_the_truth_and_beats_it_in_likelihood() -> None:
    # eps 1 per attribute: 12 categories -> OUE (12 >= 3e + 2). The MLE is
    # asymptotically efficient, so the unbiased estimator's exact variance bounds its
    # variance: a conservative z-test. Correlated, skewed attributes (a symmetric
    # population would hide a wrong likelihood); a cell near 0 makes EM's approach to
    # the maximum slow (~12000 steps to tol).
    pop = synthetic_population(n=100_000, sizes=(2, 12), strength=1.0, max_parents=1, rng=8)
    release = ExpectationMaximization(max_iter=20_000).run(pop, 2 * 1.0, 2, 3)
    assert isinstance(release, EMRelease)
    assert [o.name for o in release.oracles] == ["GRR", "OUE"]  # type: ignore[union-attr]
    fit = release.fit((0, 1))
    truth = pop.marginal((0, 1))
    assert fit.converged
    assert fit.table.sum() == pytest.approx(1.0, abs=1e-12)
    assert_z(fit.table, truth.reshape(-1), _unbiased_variance(release, pop, (0, 1)))
    # the log-likelihood is concave in T and EM converged: nothing beats the fit
    at_truth = release.log_likelihood((0, 1), truth)
    at_unbiased = release.log_likelihood((0, 1), np.maximum(release.unbiased((0, 1)), 1e-12))
    assert fit.loglik[-1] >= max(at_truth, at_unbiased)


@pytest.mark.parametrize("init", ["uniform", "unbiased"])
def test_em_log_likelihood_never_decreases(init: str) -> None:
    pop = synthetic_population(n=4000, sizes=(2, 3, 12), strength=2.0, rng=9)
    release = ExpectationMaximization(init=init, max_iter=300).run(pop, 3 * 1.0, 3, 4)
    assert isinstance(release, EMRelease)
    for q in [(0, 1), (0, 2), (0, 1, 2)]:
        ll = release.fit(q).loglik
        # round-off only: a few ulps of the sum
        assert np.diff(ll).min() >= -1e-12 * np.abs(ll).max(), q
        # from uniform EM climbs for many steps; from the unbiased start it may already
        # be at the maximum (GRR only) and stop after one step
        assert init == "unbiased" or (ll.size > 10 and ll[-1] > ll[0])


def test_em_answers_are_distributions_of_the_right_shape() -> None:
    pop = synthetic_population(n=3000, sizes=(3, 2, 5, 4, 1), strength=1.5, rng=10)
    release = ExpectationMaximization().run(pop, 1.0, 3, 5)
    for q in [*combinations(range(pop.d), 2), (0, 2, 3), (1, 3, 4)]:
        got = release.answer(q)
        assert got.shape == pop.schema.shape(q)
        assert got.min() >= 0 and got.sum() == pytest.approx(1.0, abs=1e-12)


def test_em_not_scalable_and_eager_epsilon() -> None:
    schema = Schema.from_sizes((2,) * 32)
    with pytest.raises(NotScalable, match="bytes"):
        ExpectationMaximization().check(schema, 1 << 30, 1.0, 3)  # 32 GiB of reports
    wide = Schema.from_sizes((40,) * 4)  # 40^4 cells x min(n, patterns) x 8 bytes
    with pytest.raises(NotScalable, match="likelihood matrix"):
        ExpectationMaximization().check(wide, 100_000, 1.0, 4)
    gen = np.random.default_rng(1)
    state = gen.bit_generator.state
    with pytest.raises(CalmkitError, match="epsilon"):
        ExpectationMaximization().run(POP_BIN, float("nan"), 3, gen)
    assert gen.bit_generator.state == state


def test_em_batched_answers_equal_one_at_a_time() -> None:
    # mixed cell counts (2-way and 3-way over sizes 2 and 3, GRR and OUE attributes)
    # batch separately; each table must equal its own sequential fit, including
    # problems that converge at different steps.
    pop = synthetic_population(n=3000, sizes=(2, 3, 2, 5, 2), strength=1.5, rng=8)
    release = ExpectationMaximization(tol=1e-7, max_iter=500).run(pop, 4.0, 3, rng=2)
    queries = [(0, 1), (1, 3, 4), (0, 2, 4), (2, 3), (0, 1, 2)]
    batched = release.answer_many(queries)
    for q, table in zip(queries, batched):
        assert table.shape == pop.schema.shape(q)
        np.testing.assert_allclose(table, release.answer(q), rtol=0, atol=1e-12)


def test_em_batches_stay_within_the_memory_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: every query's likelihood matrix was built at once (adult, d = 8, k = 3,
    n = 2^16 grew past 11 GB and was killed). Now each batch's stacked matrices stay
    within MAX_BYTES; with a bound that fits two problems, the batches split and the
    tables are unchanged."""
    from calmkit_simulator.mechanisms import em

    pop = synthetic_population(n=3000, sizes=(2, 3, 2, 5, 2), strength=1.5, rng=8)
    release = ExpectationMaximization(tol=1e-7, max_iter=500).run(pop, 4.0, 3, rng=2)
    queries = [(0, 1, 2), (0, 2, 4), (1, 2, 4), (0, 1, 4), (2, 3)]
    whole = release.answer_many(queries)
    sizes: list[int] = []
    real = em.expectation_maximization_batch

    def spy(lik: np.ndarray, *args: object, **kwargs: object) -> object:
        sizes.append(lik.nbytes)
        return real(lik, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(em, "expectation_maximization_batch", spy)
    one = max(release._grouped(tuple(q))[1].shape[0] for q in queries[:4]) * 12 * 8
    monkeypatch.setattr(em, "MAX_BYTES", 2 * one)
    split = release.answer_many(queries)
    assert len(sizes) >= 3 and max(sizes) <= 2 * one  # the 12-cell queries in pairs
    for a, b in zip(whole, split):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)
