"""The epsilon claims of GRR and OUE, pinned exactly (the CALM paper, Zhang et al., CCS
2018, §2.2).

The privacy loss is computed from the sampler's exact output probabilities
(integer thresholds over 2**64), not from the textbook p and q, and the sampler is
checked to realise those probabilities.
"""

from __future__ import annotations

import itertools
import math
import re
from fractions import Fraction

import numpy as np
import pytest

from calmkit_client import GRR, OUE, OracleError, choose_oracle, make_oracle
from tests.stats import assert_chisquare, z_bound

SETTINGS = [(0.1, 2), (0.5, 3), (1.0, 8), (2.0, 64), (4.0, 256), (0.2, 256)]


def _worst_log_ratio(matrix: np.ndarray) -> float:
    """max over outputs y and inputs v1, v2 of log P(y|v1) / P(y|v2); matrix[y, v]."""
    return float(np.max(np.log(matrix.max(axis=1)) - np.log(matrix.min(axis=1))))


@pytest.mark.parametrize(("epsilon", "L"), SETTINGS)
def test_grr_worst_case_ratio_is_exactly_e_to_epsilon(epsilon: float, L: int) -> None:
    oracle = GRR(epsilon, L)
    matrix = np.array([[float(oracle.likelihood(y, v)) for v in range(L)] for y in range(L)])
    for v in (0, L - 1):  # each input's output distribution sums to exactly 1
        assert sum(oracle.likelihood(y, v) for y in range(L)) == 1
    loss = _worst_log_ratio(matrix)
    assert abs(loss - epsilon) <= 1e-12
    # tight: the mechanism is not (epsilon - 1e-9)-LDP
    assert loss > epsilon - 1e-9
    assert abs(oracle.realised_epsilon - loss) <= 1e-12


@pytest.mark.parametrize(("epsilon", "L"), [(0.5, 2), (1.0, 5), (2.0, 8)])
def test_oue_worst_case_ratio_over_all_outputs(epsilon: float, L: int) -> None:
    oracle = OUE(epsilon, L)
    outputs = [
        np.packbits(np.array(bits, dtype=np.uint8)).tobytes()
        for bits in itertools.product([0, 1], repeat=L)
    ]
    matrix = np.array([[float(oracle.likelihood(y, v)) for v in range(L)] for y in outputs])
    np.testing.assert_allclose(matrix.sum(axis=0), 1.0, rtol=1e-12)
    loss = _worst_log_ratio(matrix)
    assert abs(loss - epsilon) <= 1e-12
    assert loss > epsilon - 1e-9


@pytest.mark.parametrize(("epsilon", "L"), SETTINGS)
def test_oue_ratio_at_large_L_from_the_two_differing_bits(epsilon: float, L: int) -> None:
    # For inputs v1 != v2 only bits v1 and v2 have different distributions, so the
    # ratio of any output depends on those two bits alone: enumerate their 4 values.
    oracle = OUE(epsilon, L)
    rng = np.random.default_rng(0)
    worst = -math.inf
    pairs = list(itertools.permutations(range(L), 2))
    picked = rng.choice(len(pairs), size=min(len(pairs), 6), replace=False)
    for v1, v2 in [(0, L - 1), *(pairs[i] for i in picked)]:
        for b1, b2 in itertools.product([0, 1], repeat=2):
            bits = (rng.random(L) < 0.3).astype(np.uint8)
            bits[v1], bits[v2] = b1, b2
            y = np.packbits(bits).tobytes()
            ratio = oracle.likelihood(y, v1) / oracle.likelihood(y, v2)
            worst = max(worst, math.log(ratio.numerator) - math.log(ratio.denominator))
    assert abs(worst - epsilon) <= 1e-12
    assert abs(oracle.realised_epsilon - epsilon) <= 1e-12


@pytest.mark.parametrize(("epsilon", "L"), [(0.5, 4), (2.0, 16)])
def test_grr_sampler_realises_its_likelihoods(epsilon: float, L: int) -> None:
    oracle = GRR(epsilon, L)
    n, cell = 200_000, L // 3
    out = oracle.perturb(np.full(n, cell), rng=np.random.default_rng(1))
    expected = n * np.array([float(oracle.likelihood(y, cell)) for y in range(L)])
    assert_chisquare(np.bincount(out, minlength=L), expected)


@pytest.mark.parametrize(("epsilon", "L"), [(0.5, 4), (2.0, 13)])
def test_oue_sampler_realises_its_bit_probabilities(epsilon: float, L: int) -> None:
    oracle = OUE(epsilon, L)
    n, cell = 100_000, L - 1
    counts = oracle.support(oracle.perturb(np.full(n, cell), rng=np.random.default_rng(2)))
    probs = np.full(L, oracle.q)
    probs[cell] = 0.5
    # each bit count is Binomial(n, prob): z-test per bit
    z = (counts - n * probs) / np.sqrt(n * probs * (1 - probs))
    assert np.all(np.abs(z) <= z_bound(L))


def test_choose_oracle_switches_at_3e_eps_plus_2() -> None:
    eps = 1.0
    cut = 3 * math.e + 2  # 10.15
    assert choose_oracle(10, eps).name == "GRR" and 10 < cut
    assert choose_oracle(11, eps).name == "OUE"
    # at L = 3 e^eps + 2 exactly (L = 8, eps = ln 2) the variances are equal: OUE
    assert 3 * math.exp(math.log(2)) + 2 == 8 and choose_oracle(8, math.log(2)).name == "OUE"
    # the rule picks the smaller f-independent variance
    for L in range(2, 40):
        chosen = choose_oracle(L, eps).variance(1000)
        assert chosen <= min(GRR(eps, L).variance(1000), OUE(eps, L).variance(1000)) * (1 + 1e-12)


def test_paper_variance_formulas() -> None:
    e, n = math.exp(1.3), 5000
    assert GRR(1.3, 20).variance(n) == pytest.approx((20 - 2 + e) / ((e - 1) ** 2 * n), rel=1e-12)
    assert OUE(1.3, 20).variance(n) == pytest.approx(4 * e / ((e - 1) ** 2 * n), rel=1e-12)


@pytest.mark.parametrize("bad", [-1.0, 0.0, math.nan, math.inf, -math.inf])
def test_epsilon_must_be_finite_and_positive(bad: float) -> None:
    with pytest.raises(OracleError, match=rf"epsilon \({bad!r}\) must be finite and > 0"):
        GRR(bad, 4)
    with pytest.raises(OracleError, match="epsilon"):
        choose_oracle(4, bad)


@pytest.mark.parametrize("bad", ["1", None, True, [1.0]])
def test_epsilon_must_be_a_number(bad: object) -> None:
    with pytest.raises(OracleError, match="epsilon"):
        OUE(bad, 4)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [1, 0, -3, 2.5, True, "8"])
def test_L_must_be_an_int_at_least_2(bad: object) -> None:
    with pytest.raises(OracleError, match=r"L \(.*\) must be an int >= 2"):
        GRR(1.0, bad)  # type: ignore[arg-type]


def test_epsilon_too_large_for_exact_thresholds_is_refused() -> None:
    with pytest.raises(OracleError, match="64-bit"):
        OUE(40.0, 8)
    for cls in (GRR, OUE):  # past MAX_EPSILON = 44 the bound itself is named
        with pytest.raises(OracleError, match=r"^epsilon \(44.5\) must be <= 44 \(a 64-bit"):
            cls(44.5, 2)
    assert abs(OUE(15.0, 8).realised_epsilon - 15.0) <= 1e-11


def test_unknown_oracle_name() -> None:
    with pytest.raises(OracleError, match=r"oracle \('RAPPOR'\) must be one of"):
        make_oracle("RAPPOR", 8, 1.0)


def test_cells_out_of_range_are_rejected() -> None:
    with pytest.raises(OracleError, match=r"cell \(8\) must be in \[0, 8\)"):
        GRR(1.0, 8).perturb(np.array([1, 8]))
    with pytest.raises(OracleError, match=r"^cell \(8\) must be in \[0, 8\)$"):
        OUE(1.0, 8).perturb(np.array([0, 8]))  # the bad one, not the smallest
    with pytest.raises(OracleError, match=r"cell \(-1\)"):
        OUE(1.0, 8).perturb_one(-1)
    for oracle in (GRR(1.0, 8), OUE(1.0, 8)):
        for bad in (1.5, True, "3"):
            with pytest.raises(OracleError, match=rf"^cell \({re.escape(repr(bad))}\) must be an"):
                oracle.perturb_one(bad)  # type: ignore[arg-type]
        with pytest.raises(OracleError, match=r"^cell \(-1\) must be in \[0, 8\)$"):
            oracle.perturb(np.array([-1, 3]))  # the bad one, not the largest
        with pytest.raises(OracleError, match=r"^cell \(8\) must be in \[0, 8\)$"):
            oracle.perturb_one(8)


def test_epsilon_tolerance_is_relative_to_epsilon() -> None:
    # From epsilon 16 on, 64-bit thresholds realise the loss only to ~1e-13..1e-12
    # absolute: within the relative tolerance 1e-12 * epsilon, so the oracles are built.
    for eps in (16.0, 18.0, 19.0):
        for oracle in (GRR(eps, 2), OUE(eps, 8)):
            assert 0 < abs(oracle.realised_epsilon - eps) <= 1e-12 * eps
    # below epsilon 1 it is 1e-12 absolute: at 0.001 the logs' rounding alone is ~5e-15
    for oracle in (GRR(0.001, 2), OUE(0.001, 8)):
        assert 1e-12 * 0.001 < abs(oracle.realised_epsilon - 0.001) <= 1e-12
    # and not more: GRR at eps 0.2 over 16384 cells would realise 0.2 - 1.24e-12
    with pytest.raises(OracleError, match=r"with 64-bit thresholds at L=16384 \(realised 0.19"):
        GRR(0.2, 16384)


def test_refusal_names_the_loss_the_thresholds_would_realise() -> None:
    # eps = 44 at L = 2: q 2^64 = 1.44 rounds to Q = 1 word per other cell, so the true
    # cell keeps K = 2^64 - 1 words and the loss would be log(K / Q) = 44.36
    realised = math.log(2**64 - 1) - math.log(1)
    with pytest.raises(OracleError, match=re.escape(f"at L=2 (realised {realised!r})")):
        GRR(44.0, 2)


def test_thresholds_are_the_nearest_64_bit_fractions() -> None:
    # q 2^64 is an integer for q >= 2^-12 (53-bit mantissas); these smaller q have a
    # fractional part of 0.6-0.65 (rounds up) or 0.5 (a tie), and eps = 1 none
    for eps, L in [(10.0, 8), (14.0, 3), (15.0, 3), (15.0, 8), (9.0, 3), (1.0, 8)]:
        oracle = GRR(eps, L)
        other, keep = oracle.likelihood(1, 0), oracle.likelihood(0, 0)
        assert abs(other - Fraction(oracle.q)) * 2**64 <= Fraction(1, 2)
        assert keep + (L - 1) * other == 1


@pytest.mark.parametrize("bad", [np.array([[0, 1]]), np.array([0.0, 1.0])])
def test_cells_must_be_a_1d_int_array(bad: np.ndarray) -> None:
    msg = rf"^cells \(shape {re.escape(str(bad.shape))}, dtype {bad.dtype}\) must be 1-D ints$"
    for oracle in (GRR(1.0, 4), OUE(1.0, 4)):
        with pytest.raises(OracleError, match=msg):
            oracle.perturb(bad, rng=np.random.default_rng(0))


@pytest.mark.parametrize("bad", [0, -2, 2.5, True, np.float64(3.0)])
def test_report_count_must_be_a_positive_int(bad: object) -> None:
    msg = rf"^n \({re.escape(repr(bad))}\) must be an int > 0$"
    for oracle in (GRR(1.0, 4), OUE(1.0, 4)):
        with pytest.raises(OracleError, match=msg):
            oracle.estimate(np.ones(4), bad)  # type: ignore[arg-type]
        with pytest.raises(OracleError, match=msg):
            oracle.variance(bad)  # type: ignore[arg-type]
        with pytest.raises(OracleError, match=msg):
            oracle.sum_variance(bad, 0.5, 2)  # type: ignore[arg-type]
        with pytest.raises(OracleError, match=msg):
            oracle.contrast_variance(bad)  # type: ignore[arg-type]


def test_one_report_is_enough() -> None:
    for oracle in (GRR(1.0, 4), OUE(1.0, 4)):
        assert np.all(np.isfinite(oracle.estimate(np.array([1, 0, 0, 0]), 1)))
        assert oracle.variance(1) > 0 and oracle.contrast_variance(1) > 0
        assert oracle.sum_variance(1, 1.0, 2) > 0


def test_group_size_must_be_an_int_in_1_to_L() -> None:
    oracle = GRR(1.0, 4)
    for bad in (True, 1.5, np.float64(2.0)):
        msg = rf"^cells \({re.escape(repr(bad))}\) must be an int in \[1, 4\]$"
        with pytest.raises(OracleError, match=msg):
            oracle.sum_variance(10, 0.5, bad)  # type: ignore[arg-type]
    for bad in (0, -1, 5):
        with pytest.raises(OracleError, match=rf"^cells \({bad}\) must be in \[1, 4\]$"):
            oracle.sum_variance(10, 0.5, bad)
    for cells in (1, 4, np.int64(3)):  # the bounds are allowed
        assert oracle.sum_variance(10, 0.5, cells) > 0


def test_choose_oracle_names_L_as_given() -> None:
    # the value as the caller gave it (a numpy int keeps its repr)
    for bad in (1, np.int64(1), 0, 2.5, True, "8"):
        msg = rf"^L \({re.escape(repr(bad))}\) must be an int >= 2$"
        with pytest.raises(OracleError, match=msg):
            choose_oracle(bad, 1.0)


def test_payload_checks() -> None:
    oue = OUE(1.0, 10)  # 2 bytes, 6 padding bits
    with pytest.raises(OracleError, match="padding"):
        oue.support(np.array([[0, 1]], dtype=np.uint8))
    with pytest.raises(OracleError, match=r"shape \(1, 3\)"):
        oue.support(np.zeros((1, 3), dtype=np.uint8))
    with pytest.raises(OracleError, match=r"GRR payload \(10\)"):
        GRR(1.0, 10).support(np.array([0, 10]))
    for bad in (np.array([0.0, 1.0]), np.array([[0, 1]])):
        msg = rf"^GRR payloads \(shape {re.escape(str(bad.shape))}, dtype {bad.dtype}\) must be"
        with pytest.raises(OracleError, match=msg):
            GRR(1.0, 10).support(bad)
    grr_msg = r"^GRR payload \(-1\) must be a cell in \[0, 10\)$"
    for bad in ([0, -1], [-1, 3]):  # the bad one is named, not the largest
        with pytest.raises(OracleError, match=grr_msg):
            GRR(1.0, 10).support(np.array(bad))
    # L = 20: 3 bytes, 4 padding bits; row 0 has bits set in its middle byte only, rows
    # 1 and 2 a padding bit: the first bad row is named
    payloads = np.array([[0, 255, 16], [0, 0, 1], [0, 0, 2]], dtype=np.uint8)
    with pytest.raises(OracleError, match=r"^OUE payload \(row 1\) must have its 4 padding"):
        OUE(1.0, 20).support(payloads)
