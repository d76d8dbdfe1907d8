"""The feasibility test and the fake-shift bound (calmkit_aggregator.integrity): honest
reports of any population are flagged no more often than the stated false-alarm rate,
fakes that leave the honest band are flagged (one cell, all-ones OUE), fakes that stay
inside it are not, and the worst attack attains the bound."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import stats

from calmkit_aggregator.integrity import DEFAULT_ALPHA, check_feasible, max_shift_per_share
from calmkit_client import CalmkitError
from calmkit_client.oracles import GRR, OUE, FrequencyOracle

# Property test: R trials of one random honest population per example, at ALPHA. A
# correct test flags each trial with probability at most ALPHA, independently, so the
# number of flags is stochastically below Binomial(R, ALPHA); it exceeds MAX_FLAGS with
# probability at most 1e-6 (per example; 30 examples: 3e-5 overall). ALPHA is 0.05, not
# the service's 1e-6: at 1e-6 a correct and a 100x too loose test both give 0 flags in
# any affordable R, so nothing would be checked.
R, ALPHA, EXAMPLES = 100, 0.05, 30
MAX_FLAGS = int(stats.binom.isf(1e-6, R, ALPHA))  # P(Binomial(R, ALPHA) > MAX_FLAGS) <= 1e-6


def honest_counts(
    oracle: FrequencyOracle, f: np.ndarray, n: int, rng: np.random.Generator
) -> np.ndarray:
    """Support counts of n honest reports of a population with cell frequencies f
    (the oracle's own perturbation, seeded)."""
    cells = rng.choice(oracle.L, size=n, p=f)
    return oracle.support(oracle.perturb(cells, rng))


@st.composite
def populations(draw: st.DrawFn) -> tuple[list[FrequencyOracle], list[np.ndarray], list[int]]:
    """1-3 views: GRR or OUE, 2-40 cells, epsilon 0.3-4, n 1-3000 reports, and a
    distribution from uniform to one cell (Dirichlet, some cells set to zero)."""
    views = draw(st.integers(1, 3))
    oracles, dists, sizes = [], [], []
    for _ in range(views):
        kind = draw(st.sampled_from([GRR, OUE]))
        L = draw(st.integers(2, 40))
        eps = draw(st.floats(0.3, 4.0))
        conc = draw(st.sampled_from([0.02, 0.3, 1.0, 20.0]))
        seed = draw(st.integers(0, 2**32 - 1))
        rng = np.random.default_rng(seed)
        f = rng.dirichlet(np.full(L, conc))
        f[rng.random(L) < draw(st.sampled_from([0.0, 0.5]))] = 0.0
        if f.sum() == 0:
            f[0] = 1.0
        oracles.append(kind(eps, L))
        dists.append(f / f.sum())
        sizes.append(draw(st.integers(1, 3000)))
    return oracles, dists, sizes


@settings(
    max_examples=EXAMPLES,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(populations(), st.integers(0, 2**32 - 1))
def test_honest_reports_are_flagged_no_more_often_than_alpha(population, seed: int) -> None:
    oracles, dists, sizes = population
    rng = np.random.default_rng(seed)
    flags = 0
    for _ in range(R):
        counts = [honest_counts(o, f, n, rng) for o, f, n in zip(oracles, dists, sizes)]
        flags += not check_feasible(oracles, np.array(sizes), counts, alpha=ALPHA).passed
    assert flags <= MAX_FLAGS, (flags, MAX_FLAGS)


def test_honest_reports_pass_at_the_default_alpha() -> None:
    """A collection's worth of honest views: never flagged at 1e-6 (expected flags over
    the 50 checks: at most 5e-5)."""
    rng = np.random.default_rng(1)
    oracles = [GRR(1.0, 8), GRR(1.0, 4), OUE(1.0, 30), OUE(0.5, 64)]
    for _ in range(50):
        dists = [rng.dirichlet(np.full(o.L, 0.1)) for o in oracles]
        n = rng.integers(1000, 20000, size=len(oracles))
        counts = [honest_counts(o, f, int(k), rng) for o, f, k in zip(oracles, dists, n)]
        result = check_feasible(oracles, n, counts)
        assert result.passed and result.tests == 2 * (8 + 4 + 30 + 64) + 4, result.reason
        assert result.alpha == DEFAULT_ALPHA == 1e-6


def _attack(oracle: FrequencyOracle, n_honest: int, share: float, seed: int):
    """Honest reports of a population that never has cell 0 (its honest rate is q),
    and the same plus fakes (a ``share`` of all reports) all on cell 0 (GRR) or all
    with bit 0 set and nothing else (OUE)."""
    rng = np.random.default_rng(seed)
    f = np.r_[0.0, rng.dirichlet(np.ones(oracle.L - 1))]
    honest = honest_counts(oracle, f, n_honest, rng)
    fakes = round(n_honest * share / (1 - share))
    attacked = honest.copy()
    attacked[0] += fakes
    return honest, attacked, fakes


@pytest.mark.parametrize("oracle", [GRR(1.0, 8), OUE(1.0, 16), GRR(2.0, 4)], ids=str)
def test_the_worst_attack_attains_the_bound(oracle: FrequencyOracle) -> None:
    n_h, share = 20_000, 0.1
    honest, attacked, fakes = _attack(oracle, n_h, share, seed=3)
    p, q = oracle.p, oracle.q
    f_honest = oracle.estimate(honest, n_h)[0]
    f_attacked = oracle.estimate(attacked, n_h + fakes)[0]
    s = fakes / (n_h + fakes)
    bound = s * max_shift_per_share(oracle)
    assert max_shift_per_share(oracle) == (1 - q) / (p - q) <= 1 / (p - q)
    # shift = s (1 - c/n_h) / (p - q) with c/n_h ~ q: off the bound by s (c/n_h - q) /
    # (p - q), whose sd is s sqrt(q (1 - q) / n_h) / (p - q)
    sd = s * math.sqrt(q * (1 - q) / n_h) / (p - q)
    assert abs((f_attacked - f_honest) - bound) <= 4 * sd, (f_attacked - f_honest, bound, sd)


def test_the_bound_is_at_most_the_simple_one_and_covers_both_directions() -> None:
    for eps in (0.1, 0.5, 1.0, 2.0, 5.0):
        for L in (2, 3, 4, 8, 50):
            for o in (GRR(eps, L), OUE(eps, L)):
                p, q = o.p, o.q
                assert max_shift_per_share(o) <= 1 / (p - q) + 1e-12
                # downward: fakes avoid a cell the honest population fills (rate p)
                assert max_shift_per_share(o) >= p / (p - q)


def test_one_cell_fakes_beyond_the_band_are_flagged_and_within_it_not() -> None:
    o = GRR(1.0, 8)
    _, loud, _ = _attack(o, 2000, 0.3, seed=4)  # 0.7 q + 0.3 > p: out of the band
    n = np.array([loud.sum()])
    result = check_feasible([o], n, [loud], views=["a x b"])
    assert not result.passed and result.flagged[0].high == (0,)
    assert result.reason.startswith("view 0 (a x b) (GRR): cell 0 counts ")
    # a smart attacker: 5% fakes on the same cell stay inside [n q, n p]: undetectable,
    # and the shift is bounded (test_the_worst_attack_attains_the_bound)
    _, quiet, _ = _attack(o, 20_000, 0.05, seed=5)
    assert check_feasible([o], np.array([quiet.sum()]), [quiet]).passed


def test_all_ones_oue_fakes_fail_the_total_and_all_zeros_too() -> None:
    o = OUE(1.0, 40)
    rng = np.random.default_rng(6)
    n_h, fakes = 5000, 250  # 5% fakes: every bit's count stays near the band's middle
    honest = honest_counts(o, rng.dirichlet(np.ones(40)), n_h, rng)
    ones = check_feasible([o], np.array([n_h + fakes]), [honest + fakes])
    assert not ones.passed and ones.flagged[0].total == "high"
    assert ones.flagged[0].high == ()  # the per-bit tests alone would miss it
    zeros = check_feasible([o], np.array([n_h + 4 * fakes]), [honest])
    assert not zeros.passed and zeros.flagged[0].total == "low"


def test_views_without_reports_and_bad_arguments() -> None:
    o = GRR(1.0, 4)
    empty = check_feasible([o], np.array([0]), [np.zeros(4, np.int64)])
    assert empty.passed and empty.tests == 0
    with pytest.raises(CalmkitError, match=r"alpha \(0\) must be in \(0, 1\)"):
        check_feasible([o], np.array([1]), [np.array([1, 0, 0, 0])], alpha=0)
    with pytest.raises(CalmkitError, match=r"must cover 1 views"):
        check_feasible([o], np.array([1, 2]), [np.array([1, 0, 0, 0])])
