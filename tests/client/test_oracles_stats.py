"""Unbiasedness and variance of the GRR and OUE estimators (eqs. 1, 2), with fixed
seeds and bounds derived from the exact variance."""

from __future__ import annotations

import numpy as np
import pytest

from calmkit_client import GRR, MAX_VIEW_CELLS, OUE, FrequencyOracle
from tests.stats import assert_variance, assert_z

CASES = [GRR(1.0, 8), GRR(0.5, 64), OUE(1.0, 8), OUE(1.0, 64), OUE(0.3, 256), GRR(2.0, 3)]


def _population(L: int, n: int, seed: int) -> np.ndarray:
    """n true cells from a skewed distribution over L cells (some cells empty)."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, L + 1) ** 1.2
    weights[L // 2 :: 3] = 0.0
    return rng.choice(L, size=n, p=weights / weights.sum())


@pytest.mark.parametrize("oracle", CASES, ids=lambda o: f"{o.name}-L{o.L}-eps{o.epsilon}")
def test_estimates_are_unbiased_within_exact_variance(oracle: FrequencyOracle) -> None:
    n = 100_000
    cells = _population(oracle.L, n, seed=11)
    truth = np.bincount(cells, minlength=oracle.L) / n
    payloads = oracle.perturb(cells, rng=np.random.default_rng(12))
    estimate = oracle.estimate(oracle.support(payloads), n)
    assert_z(estimate, truth, oracle.variance(n, truth))


@pytest.mark.parametrize(
    "oracle", [GRR(1.0, 6), OUE(1.0, 12), GRR(0.4, 20)], ids=lambda o: f"{o.name}-L{o.L}"
)
def test_empirical_variance_matches_formula(oracle: FrequencyOracle) -> None:
    n, reps = 4000, 300
    cells = _population(oracle.L, n, seed=21)
    truth = np.bincount(cells, minlength=oracle.L) / n
    rng = np.random.default_rng(22)
    samples = np.stack(
        [oracle.estimate(oracle.support(oracle.perturb(cells, rng)), n) for _ in range(reps)]
    )
    assert_variance(samples, oracle.variance(n, truth))
    # and the mean over all repetitions is unbiased at the reduced variance
    assert_z(samples.mean(axis=0), truth, oracle.variance(n, truth) / reps)


def test_f_independent_variance_is_the_exact_one_at_f_zero() -> None:
    for oracle in CASES:
        assert oracle.variance(1000, np.zeros(oracle.L))[0] == pytest.approx(
            oracle.variance(1000), rel=1e-12
        )


def test_single_grr_report_is_the_batch_code_on_one_cell() -> None:
    oracle = GRR(1.0, 9)
    for cell in range(oracle.L):
        single = oracle.perturb_one(cell, np.random.default_rng(cell))
        batch = oracle.perturb(np.array([cell]), np.random.default_rng(cell))[0]
        assert single == int(batch)


@pytest.mark.parametrize("L", [5, 8, 21])
def test_single_oue_report_maps_whole_words_to_bits(L: int) -> None:
    # one report draws exactly L + 1 whole words: bit u is word_u < T, the true bit
    # word_L < 2^63; consecutive reports from one generator take consecutive words
    oracle = OUE(1.5, L)
    rng = np.random.default_rng(100 + L)
    all_words = np.random.default_rng(100 + L).bit_generator.random_raw(L * (L + 1))
    for cell in range(L):
        single = oracle.perturb_one(cell, rng)
        words = all_words[cell * (L + 1) : (cell + 1) * (L + 1)]
        bits = [int(w) < oracle._t_flip for w in words[:L]]
        bits[cell] = int(words[L]) < 2**63
        assert single == np.packbits(np.array(bits, dtype=np.uint8)).tobytes()


def test_grr_batch_equals_consecutive_single_reports() -> None:
    oracle = GRR(1.0, 9)  # one word per report, consumed in order
    batch = oracle.perturb(np.arange(9).repeat(50), rng=np.random.default_rng(5))
    rng = np.random.default_rng(5)
    assert batch.tolist() == [oracle.perturb_one(c, rng) for c in np.arange(9).repeat(50)]


def test_oue_perturbs_the_largest_views() -> None:
    # MAX_VIEW_CELLS (2^20) cells: more bits than one chunk holds, so one report a chunk
    oracle = OUE(1.0, MAX_VIEW_CELLS)
    payloads = oracle.perturb(np.array([0, MAX_VIEW_CELLS - 1]), rng=np.random.default_rng(4))
    assert payloads.shape == (2, MAX_VIEW_CELLS // 8) and payloads.dtype == np.uint8
    assert oracle.support(payloads).shape == (MAX_VIEW_CELLS,)


def test_oue_support_counts_match_unpacked_bits() -> None:
    oracle = OUE(1.0, 37)
    payloads = oracle.perturb(np.arange(1000) % 37, rng=np.random.default_rng(3))
    bits = np.unpackbits(payloads, axis=1, count=37)
    np.testing.assert_array_equal(oracle.support(payloads), bits.sum(axis=0))
    assert not np.unpackbits(payloads, axis=1)[:, 37:].any()  # padding stays zero


@pytest.mark.parametrize(
    "oracle, shape",
    [(GRR(1.0, 6), (2, 3)), (OUE(1.0, 12), (3, 4)), (GRR(0.4, 20), (4, 5))],
    ids=lambda o: getattr(o, "name", str(o)),
)
def test_contrast_variance_is_the_noise_power_per_dimension(oracle, shape) -> None:
    # Two constant-diagonal contrast spaces of an (a, b) table: every zero-sum contrast
    # (dimension L - 1) and the interaction (dimension (a-1)(b-1)).
    a, b = shape
    center = [np.eye(s) - np.full((s, s), 1.0 / s) for s in shape]
    spaces = {
        "zero-sum": (np.eye(oracle.L) - np.full((oracle.L,) * 2, 1.0 / oracle.L), oracle.L - 1),
        "interaction": (np.kron(center[0], center[1]), (a - 1) * (b - 1)),
    }
    n, reps = 4000, 400
    cells = _population(oracle.L, n, seed=31)
    truth = np.bincount(cells, minlength=oracle.L) / n
    rng = np.random.default_rng(32)
    noise = np.stack(
        [
            oracle.estimate(oracle.support(oracle.perturb(cells, rng)), n) - truth
            for _ in range(reps)
        ]
    )
    for proj, dim in spaces.values():
        power = ((noise @ proj) ** 2).sum(axis=1)  # ||P e||^2 per repetition
        assert_z(
            np.array([power.mean()]),
            np.array([dim * oracle.contrast_variance(n)]),
            power.var(ddof=1) / reps,
        )


def _exact_covariance(oracle: FrequencyOracle, counts: np.ndarray) -> np.ndarray:
    """Covariance (L, L) of ``estimate`` for a fixed population (``counts[v]`` users in
    cell v), by enumeration from the definition: a report of a user in cell v supports
    cell u with probability ``P_v[u]`` (p at u = v, q elsewhere); GRR reports one cell
    (per-user covariance ``diag(P_v) - P_v P_v^T``), OUE independent bits
    (``diag(P_v (1 - P_v))``). Users are independent; the estimate is
    ``(C/n - q) / (p - q)``."""
    L, p, q = oracle.L, oracle.p, oracle.q
    n = int(counts.sum())
    total = np.zeros((L, L))
    for v in range(L):
        probs = np.full(L, q)
        probs[v] = p
        if oracle.name == "GRR":
            one = np.diag(probs) - np.outer(probs, probs)
        else:
            one = np.diag(probs * (1 - probs))
        total += counts[v] * one
    return total / (n * (p - q)) ** 2


EXACT = [GRR(1.0, 2), GRR(0.7, 5), GRR(2.0, 6), OUE(1.0, 2), OUE(0.7, 5), OUE(2.0, 12)]


@pytest.mark.parametrize("oracle", EXACT, ids=lambda o: f"{o.name}-L{o.L}-eps{o.epsilon}")
def test_variance_helpers_equal_the_exact_covariance(oracle: FrequencyOracle) -> None:
    # Each helper against the covariance enumerated from the oracle's p and q for a
    # small population with empty cells: equal up to float rounding (rel 1e-12).
    L = oracle.L
    counts = np.zeros(L, dtype=np.int64)
    counts[: (L + 1) // 2] = 3 + np.arange((L + 1) // 2) * 5  # skewed, the rest empty
    n = int(counts.sum())
    f = counts / n
    cov = _exact_covariance(oracle, counts)
    assert oracle.variance(n, f) == pytest.approx(np.diag(cov), rel=1e-12)
    # a group of cells (a cell of a projection): 1_G^T cov 1_G, groups of every size
    # holding occupied cells, empty ones or both
    for size in range(1, L + 1):
        for start in (0, L - size):
            group = np.zeros(L)
            group[start : start + size] = 1.0
            exact = group @ cov @ group
            got = oracle.sum_variance(n, f[start : start + size].sum(), size)
            assert float(got) == pytest.approx(exact, rel=1e-12), (size, start)
    # several totals at once (array-like) give the same values
    totals = np.array([f[:1].sum(), f[:2].sum()])
    assert oracle.sum_variance(n, totals, 1) == pytest.approx(
        [oracle.sum_variance(n, t, 1) for t in totals], rel=1e-15
    )
    # zero-sum contrasts: the centring projector (dimension L - 1) and, for L = 6 and
    # 12, the interaction of a (2, L/2) table: tr(P cov) = dim * contrast_variance
    spaces = [(np.eye(L) - 1.0 / L, L - 1)]
    if L % 2 == 0 and L > 2:
        a, b = 2, L // 2
        proj = np.kron(np.eye(a) - 1.0 / a, np.eye(b) - 1.0 / b)
        spaces.append((proj, (a - 1) * (b - 1)))
    for proj, dim in spaces:
        exact = float(np.trace(proj @ cov))
        assert dim * oracle.contrast_variance(n) == pytest.approx(exact, rel=1e-12)
