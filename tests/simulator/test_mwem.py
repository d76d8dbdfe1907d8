"""MWEM (Hardt, Ligett & McSherry, NIPS 2012, Figure 1 with §2.3.2 and §3.3): the
exponential mechanism's distribution, the Laplace scale 2T/epsilon, the
multiplicative-weights update, the error falling with the rounds, and beating
per-marginal Laplace at small epsilon."""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import combinations
from typing import Any

import numpy as np
import pytest

from calmkit_client import CalmkitError, Schema
from calmkit_simulator import Population, synthetic_population
from calmkit_simulator.mechanisms.base import NotScalable, Release
from calmkit_simulator.mechanisms.mwem import (
    Mwem,
    _Weights,
    all_marginals,
    default_rounds,
    exponential_mechanism,
    laplace_measure,
    selection_probabilities,
)
from tests.stats import assert_chisquare, assert_variance, assert_z

POP8 = synthetic_population(n=1 << 16, sizes=(2,) * 8, strength=1.5, rng=3)
QUERIES8 = list(combinations(range(8), 3))
MIXED = synthetic_population(n=5_000, sizes=(2, 3, 2, 4, 3), strength=1.5, rng=8)


def _mean_sse(pop: Population, release: Release, queries: Sequence[tuple[int, ...]]) -> float:
    """Mean SSE (fractions) of the release's answers over ``queries``."""
    return float(np.mean([((release.answer(q) - pop.marginal(q)) ** 2).sum() for q in queries]))


# -- building blocks ------------------------------------------------------------------
def test_all_marginals_are_the_sums_over_the_other_axes() -> None:
    # catches a dropped or double-summed axis, or keys out of combinations() order
    table = np.random.default_rng(0).random((2, 3, 2, 4, 3))
    for k in range(6):
        out = all_marginals(table, k)
        assert list(out) == list(combinations(range(5), k))
        for attrs, marginal in out.items():
            others = tuple(a for a in range(5) if a not in attrs)
            np.testing.assert_allclose(marginal, table.sum(axis=others), rtol=1e-12)


def test_selection_probabilities_are_the_exponential_mechanism() -> None:
    # Pr[j] = exp(eps s_j / (2 sensitivity)) / sum (McSherry-Talwar), by hand; then the
    # Gumbel-max sampler's counts over 20,000 draws against them (chi-square). Catches
    # a missing factor 2 or a sensitivity ignored (either changes these probabilities).
    scores = np.array([0.0, 1.0, 2.0, 3.0, 5.0, 5.0, -1.0])
    for eps, sens in ((1.0, 1.0), (0.6, 2.0)):
        weights = np.exp(eps * scores / (2 * sens))
        expected = weights / weights.sum()
        np.testing.assert_allclose(selection_probabilities(scores, eps, sens), expected)
        gen = np.random.default_rng(5)
        draws = 20_000
        picks = [exponential_mechanism(scores, eps, sens, gen) for _ in range(draws)]
        observed = np.bincount(picks, minlength=scores.size)
        assert_chisquare(observed, draws * expected)


def test_exponential_mechanism_picks_the_worst_at_huge_epsilon() -> None:
    # at eps = 1e6 the runner-up (score gap 0.01) has probability exp(-2500)
    scores = np.array([3.0, 7.0, 7.01, 1.0, 6.5])
    gen = np.random.default_rng(6)
    assert {exponential_mechanism(scores, 1e6, 1.0, gen) for _ in range(500)} == {2}


def test_laplace_measurement_has_the_stated_scale() -> None:
    # Laplace(1/eps) per cell: mean the counts, variance 2 / eps^2 (catches scale eps
    # or 2/eps, i.e. a sensitivity or budget split applied twice)
    eps, reps = 0.4, 2_000
    counts = np.arange(12.0).reshape(3, 4)
    gen = np.random.default_rng(7)
    samples = np.stack([laplace_measure(counts, eps, gen).reshape(-1) for _ in range(reps)])
    var = np.full(12, 2 / eps**2)
    assert_variance(samples, var)
    assert_z(samples.mean(axis=0), counts.reshape(-1), var / reps)


def test_mechanism_measures_with_laplace_two_t_over_epsilon() -> None:
    # k = d: one candidate (the full table), T = 1 round, no replay: the release is
    # p(c) = u exp(eta (m_c - 1/C)) / Z with m = (counts + Lap(2T/eps)) / n, so
    # (log p - mean log p) / eta = m - mean m. Its noise e - mean(e) has per-cell
    # variance sigma^2 (1 - 1/C), sigma^2 = 2 (2T / eps)^2 / n^2 (Figure 1 step 2).
    pop = synthetic_population(n=1_000, sizes=(3, 2), strength=1.0, rng=9)
    eps, eta, reps, cells = 1.0, 0.5, 600, 6
    mech = Mwem(rounds=1, replays=0, step=eta)
    gen = np.random.default_rng(10)
    samples = []
    for _ in range(reps):
        logp = np.log(mech.run(pop, eps, 2, gen).answer((0, 1)).reshape(-1))
        samples.append((logp - logp.mean()) / eta)
    truth = pop.marginal((0, 1)).reshape(-1)
    sigma2 = 2 * (2 * 1 / eps) ** 2 / pop.n**2
    var = np.full(cells, sigma2 * (1 - 1 / cells))
    stacked = np.stack(samples)
    assert_variance(stacked, var)
    assert_z(stacked.mean(axis=0), truth - truth.mean(), var / reps)
    chosen = mech.run(pop, eps, 2, 0).describe()
    assert chosen["laplace_scale"] == 2 * 1 / eps
    assert chosen["epsilon_select_per_round"] == chosen["epsilon_measure_per_round"] == eps / 2


def test_mw_update_is_figure_1_step_3() -> None:
    # p(x) <- p(x) exp(eta (m_S(x_S) - p_S(x_S))) / Z, against a direct numpy transcription
    # on a mixed domain of 2x3x2x4x3x5x4 cells (exercises the merged-shape fast paths)
    sizes = (2, 3, 2, 4, 3, 5, 4)
    gen = np.random.default_rng(11)
    weights = _Weights(sizes)
    direct = np.full(sizes, 1.0 / math.prod(sizes))
    for attrs in [(0,), (6,), (1, 4), (0, 6), (2, 3, 5), (0, 1, 2, 3, 4, 5, 6), (0, 2, 6)]:
        others = tuple(a for a in range(len(sizes)) if a not in attrs)
        target = gen.dirichlet(np.ones(math.prod(sizes[a] for a in attrs)))
        target = target.reshape([sizes[a] for a in attrs])
        factor = np.exp(0.5 * (target - direct.sum(axis=others)))
        direct = direct * np.expand_dims(factor, others)
        direct /= direct.sum()
        weights.update(attrs, target, 0.5)
        np.testing.assert_allclose(weights.p, direct, rtol=1e-10)
        np.testing.assert_allclose(np.exp(weights.logp), direct, rtol=1e-10)


# -- the mechanism ----------------------------------------------------------------------
@pytest.mark.parametrize("penalize", [True, False])
def test_first_round_selects_the_worst_marginal_at_huge_epsilon(penalize: bool) -> None:
    # The first estimate is uniform, so at eps = 1e9 round 1 must pick the candidate
    # with the largest n ||truth - uniform||_1 (minus its cell count, §3.3, if penalised)
    for pop, k in ((MIXED, 2), (_PENALTY_POP, 1)):
        candidates = list(combinations(range(pop.d), k))
        scores = [
            pop.n * np.abs(pop.marginal(c) - 1 / pop.schema.cells(c)).sum()
            - (pop.schema.cells(c) if penalize else 0)
            for c in candidates
        ]
        chosen = Mwem(rounds=1, penalize_cells=penalize).run(pop, 1e9, k, 0).describe()
        assert chosen["selected"] == [candidates[int(np.argmax(scores))]]
    # on _PENALTY_POP the penalty decides: attribute 0 (2 cells, score 60) against
    # attribute 2 (6 cells, score 60.67)
    expected = (0,) if penalize else (2,)
    assert Mwem(rounds=1, penalize_cells=penalize).run(_PENALTY_POP, 1e9, 1, 0).describe()[
        "selected"
    ] == [expected]


def _penalty_population() -> Population:
    """100 records over sizes (2, 2, 6): counts [80, 20], [50, 50] and [47, 11, 11, 11,
    10, 10], so L1 scores 60, 0 and 60.67 (uniform start, counts)."""
    a0 = np.repeat([0, 1], [80, 20])
    a1 = np.tile([0, 1], 50)
    a2 = np.repeat(np.arange(6), [47, 11, 11, 11, 10, 10])
    return Population(Schema.from_sizes([2, 2, 6]), np.stack([a0, a1, a2], axis=1))


_PENALTY_POP = _penalty_population()


def test_first_selection_follows_the_l1_scores_at_epsilon_over_2t() -> None:
    # Round 1 of T = 2 selects at eps / (2T): Pr[S] = exp((eps / 4) s(S) / 2) / sum with
    # s(S) = n ||truth_S - uniform_S||_1 - cells(S). Counts of selected[0] over 3,000
    # runs against that (chi-square). Catches another score (squared error, no
    # penalty), another budget split (eps / T) or sensitivity.
    pop, k, rounds, runs = synthetic_population(n=400, sizes=(2, 3, 2, 2), rng=17), 2, 2, 3_000
    candidates = list(combinations(range(pop.d), k))
    scores = np.array(
        [
            pop.n * np.abs(pop.marginal(c) - 1 / pop.schema.cells(c)).sum() - pop.schema.cells(c)
            for c in candidates
        ]
    )
    eps = 8.0 / np.ptp(scores)  # spreads the probabilities: logits span 1 unit
    weights = np.exp(eps / (2 * rounds) * scores / 2)
    mech, gen = Mwem(rounds=rounds, replays=0), np.random.default_rng(18)
    picks = []
    for _ in range(runs):
        selected = mech.run(pop, eps, k, gen).describe()["selected"]
        picks.append(candidates.index(selected[0]))  # type: ignore[index]
    assert_chisquare(np.bincount(picks, minlength=len(candidates)), runs * weights / weights.sum())


def test_without_noise_the_answers_approach_the_truth() -> None:
    # eps = 1e9: selection is exact and the measurements noiseless, so MW with replay
    # fits every 3-way marginal (C(6,3) = 20 candidates, 60 rounds). Bound: 1% of the
    # uniform table's SSE (a bug in the update or the scores leaves the error near it).
    pop = synthetic_population(n=20_000, sizes=(2,) * 6, strength=1.5, rng=12)
    queries = list(combinations(range(6), 3))
    release = Mwem(rounds=60, replays=20).run(pop, 1e9, 3, 0)
    uniform = np.mean([((pop.marginal(q) - 1 / 8) ** 2).sum() for q in queries])
    assert _mean_sse(pop, release, queries) < 0.01 * uniform
    # the noise-free fit improves with replay (the MW fixed point is the same)
    assert _mean_sse(pop, release, queries) < _mean_sse(
        pop, Mwem(rounds=60, replays=0).run(pop, 1e9, 3, 0), queries
    )


def test_error_falls_as_the_rounds_grow() -> None:
    # d = 8 binary, n = 2^16, eps = 1, k = 3, all 56 3-way marginals, 3 reps each.
    # Each extra measured cuboid is fitted exactly by replayed MW, so going from 1 to 5
    # to 10 rounds must at least halve the mean SSE each time (decisive, not marginal).
    gen = np.random.default_rng(13)
    errors = {}
    for rounds in (1, 5, 10):
        mech = Mwem(rounds=rounds)
        errors[rounds] = np.mean(
            [_mean_sse(POP8, mech.run(POP8, 1.0, 3, gen), QUERIES8) for _ in range(3)]
        )
    assert errors[5] < errors[1] / 2, errors
    assert errors[10] < errors[5] / 2, errors


def _laplace_all_marginals(
    pop: Population, eps: float, k: int, rng: np.random.Generator
) -> dict[tuple[int, ...], np.ndarray]:
    """Baseline: every k-way marginal's counts plus Laplace(C(d,k)/eps) per cell (one
    record touches one cell of each of the C(d,k) marginals), clipped at 0 and
    normalised (uniform if nothing is left)."""
    queries = list(combinations(range(pop.d), k))
    out = {}
    for q in queries:
        noisy = pop.counts(q) + rng.laplace(0.0, len(queries) / eps, size=pop.schema.shape(q))
        noisy = np.clip(noisy, 0.0, None)
        total = noisy.sum()
        out[q] = noisy / total if total > 0 else np.full(noisy.shape, 1 / noisy.size)
    return out


@pytest.mark.parametrize("eps", [0.1, 0.2])
def test_beats_laplace_on_every_marginal_at_small_epsilon(eps: float) -> None:
    # Small budget split over all 56 marginals (Laplace 560 or 280 per count) versus
    # MWEM with its default T spending it on a few adaptively chosen ones (3 reps each).
    gen = np.random.default_rng(14)
    mwem = np.mean([_mean_sse(POP8, Mwem().run(POP8, eps, 3, gen), QUERIES8) for _ in range(3)])
    base = []
    for _ in range(3):
        answers = _laplace_all_marginals(POP8, eps, 3, gen)
        base.append(np.mean([((answers[q] - POP8.marginal(q)) ** 2).sum() for q in QUERIES8]))
    assert mwem < np.mean(base), (mwem, np.mean(base))


def test_release_is_a_distribution_with_the_right_shapes() -> None:
    # mixed sizes, unsorted queries of every order: shape schema.shape(sorted), all
    # positive, sums to 1, and answers agree (marginals of one distribution)
    for iterate in ("last", "average"):
        release = Mwem(rounds=4, iterate=iterate).run(MIXED, 1.0, 2, 15)
        for t in range(1, MIXED.d + 1):
            for q in combinations(range(MIXED.d), t):
                ans = release.answer(q[::-1])
                assert ans.shape == MIXED.schema.shape(q) and ans.dtype == np.float64
                assert np.all(ans > 0)
                assert ans.sum() == pytest.approx(1.0, abs=1e-12)
        np.testing.assert_allclose(release.answer((1,)), release.answer((1, 3)).sum(axis=1))
        chosen = release.describe()
        assert chosen["rounds"] == 4 and chosen["iterate"] == iterate
        assert chosen["epsilon_select_per_round"] == 1.0 / 8
        assert len(chosen["selected"]) == 4  # type: ignore[arg-type]
    # "average" is the mean of the iterates A_1..A_T: without noise (eps = 1e9, so the
    # first round of T = 2 is the whole run of T = 1 up to ~1e-9) it is the mean of the
    # last iterates of T = 1 and T = 2
    full = tuple(range(MIXED.d))
    one = Mwem(rounds=1).run(MIXED, 1e9, 2, 16).answer(full)
    two = Mwem(rounds=2).run(MIXED, 1e9, 2, 16).answer(full)
    avg = Mwem(rounds=2, iterate="average").run(MIXED, 1e9, 2, 16).answer(full)
    assert np.abs(two - one).max() > 1e-3  # the two iterates differ
    np.testing.assert_allclose(avg, (one + two) / 2, rtol=1e-6)


def test_default_rounds_rule() -> None:
    # (eps n)^(1/3) sqrt(ln|D| / cells), clipped to [1, candidates]; used when rounds=None
    assert default_rounds(21_574, 1.0, 1 << 16, 8, 560) == round(
        21_574 ** (1 / 3) * math.sqrt(math.log(1 << 16) / 8)
    )
    assert default_rounds(10**9, 10.0, 1 << 8, 8, 56) == 56
    assert default_rounds(10, 0.01, 1 << 8, 8, 56) == 1
    rounds = default_rounds(POP8.n, 0.5, 256, 8, 56)
    assert Mwem().run(POP8, 0.5, 3, 0).describe()["rounds"] == rounds


# -- refusals ---------------------------------------------------------------------------
def test_too_large_a_domain_is_not_scalable() -> None:
    schema = Schema.from_sizes([2] * 25)
    with pytest.raises(NotScalable, match=r"33554432 cells.*max_cells = 16777216"):
        Mwem().check(schema, 1000, 1.0, 3)
    with pytest.raises(NotScalable, match=r"2x3x2x4x3 = 144 cells.*max_cells = 100"):
        Mwem(max_cells=100).run(MIXED, 1.0, 2, 0)
    Mwem().check(Schema.from_sizes([2] * 24), 1000, 1.0, 3)  # 2^24 fits


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"rounds": 0}, r"rounds \(0\) must be None or an int >= 1"),
        ({"rounds": 2.5}, r"rounds \(2.5\)"),
        ({"rounds": True}, r"rounds \(True\)"),
        ({"replays": -1}, r"replays \(-1\) must be an int >= 0"),
        ({"iterate": "mean"}, r"iterate \('mean'\) must be one of"),
        ({"step": 0.0}, r"step \(0.0\) must be finite and > 0"),
        ({"step": float("nan")}, r"step \(nan\)"),
        ({"penalize_cells": "yes"}, r"penalize_cells \('yes'\) must be a bool"),
        ({"max_cells": 1}, r"max_cells \(1\) must be an int >= 2"),
    ],
)
def test_bad_options_are_refused(options: dict[str, Any], message: str) -> None:
    with pytest.raises(CalmkitError, match=message):
        Mwem(**options)


def test_bad_settings_are_refused() -> None:
    mech = Mwem(rounds=2)
    with pytest.raises(CalmkitError, match=r"epsilon \(-1.0\) must be finite and > 0"):
        mech.run(MIXED, -1.0, 2, 0)
    with pytest.raises(CalmkitError, match=r"k \(0\) must be an int in \[1, d=5\]"):
        mech.check(MIXED.schema, MIXED.n, 1.0, 0)
    with pytest.raises(CalmkitError, match=r"k \(6\)"):
        mech.run(MIXED, 1.0, 6, 0)
    with pytest.raises(CalmkitError, match=r"n \(0\) must be an int >= 1"):
        mech.check(MIXED.schema, 0, 1.0, 2)
    with pytest.raises(CalmkitError, match=r"query \(\[0, 9\]\)"):
        mech.run(MIXED, 1.0, 2, 0).answer([0, 9])
    with pytest.raises(CalmkitError, match=r"scores"):
        exponential_mechanism(np.array([1.0, np.inf]), 1.0)
