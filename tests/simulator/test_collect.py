"""Fast and faithful report production agree in distribution (and with the formulas)."""

from __future__ import annotations

import numpy as np
import pytest

from calmkit_client import CalmkitError, Plan
from calmkit_simulator import collect, collect_support, synthetic_population, true_view_counts
from tests.stats import assert_variance, assert_z

POP = synthetic_population(n=3000, sizes=(2, 3, 2, 4), strength=1.5, rng=8)
# eps = 1: L = 6 (GRR), 24 (OUE), 8 (GRR), 16 (OUE)
PLAN = Plan(POP.schema, 1.0, [[0, 1], [1, 3], [2, 3], [0, 2, 3]], seed=3)
REPS = 250


def _expected() -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Exact mean and variance of each view's support counts."""
    n, true_counts = true_view_counts(POP, PLAN)
    means, variances = [], []
    for j, oracle in enumerate(PLAN.view_oracles):
        nv, rest = true_counts[j], n[j] - true_counts[j]
        p, q = oracle.p, oracle.q
        means.append(nv * p + rest * q)
        variances.append(nv * p * (1 - p) + rest * q * (1 - q))
    return means, variances


def _samples(path: str) -> list[np.ndarray]:
    rng = np.random.default_rng(100 if path == "fast" else 200)
    runs = [collect_support(POP, PLAN, rng, path=path) for _ in range(REPS)]  # type: ignore[arg-type]
    return [np.stack([r.counts[j] for r in runs]) for j in range(PLAN.m)]


@pytest.fixture(scope="module")
def samples() -> dict[str, list[np.ndarray]]:
    return {path: _samples(path) for path in ("fast", "faithful")}


@pytest.mark.parametrize("path", ["fast", "faithful"])
def test_each_path_matches_exact_mean_and_variance(
    samples: dict[str, list[np.ndarray]], path: str
) -> None:
    means, variances = _expected()
    for j in range(PLAN.m):
        assert_z(samples[path][j].mean(axis=0), means[j], variances[j] / REPS)
        assert_variance(samples[path][j], variances[j])


def test_paths_agree_with_each_other(samples: dict[str, list[np.ndarray]]) -> None:
    _, variances = _expected()
    for j in range(PLAN.m):
        diff = samples["fast"][j].mean(axis=0) - samples["faithful"][j].mean(axis=0)
        assert_z(diff, np.zeros_like(diff), 2 * variances[j] / REPS)


def test_same_users_in_each_view_on_both_paths() -> None:
    fast = collect_support(POP, PLAN, 1, path="fast")
    faithful = collect_support(POP, PLAN, 1, path="faithful")
    np.testing.assert_array_equal(fast.n, faithful.n)
    assert fast.n.sum() == POP.n
    for j, oracle in enumerate(PLAN.view_oracles):
        if oracle.name == "GRR":  # every GRR report supports exactly one cell
            assert fast.counts[j].sum() == faithful.counts[j].sum() == fast.n[j]


def test_estimates_from_fast_counts_are_unbiased() -> None:
    n, true_counts = true_view_counts(POP, PLAN)
    support = collect_support(POP, PLAN, 9)
    for j, oracle in enumerate(PLAN.view_oracles):
        truth = true_counts[j] / n[j]
        est = oracle.estimate(support.counts[j], int(n[j]))
        assert_z(est, truth, oracle.variance(int(n[j]), truth))


@pytest.mark.parametrize("seed", range(4))
def test_gathered_counting_equals_one_mask_per_view(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gathered counts (blocks of users, one bincount over all views) equal, bit for
    bit, the plain algorithm: a boolean mask over all users per view and the schema's
    validated ``cell_index``; blocks of 1000 users here, so the last one is partial."""
    monkeypatch.setattr(collect, "BLOCK", 1000)
    rng = np.random.default_rng(seed)
    pop = synthetic_population(n=5000, sizes=(2, 3, 5, 2, 4), strength=1.0, rng=seed)
    views = [
        sorted(rng.choice(5, size=int(rng.integers(1, 4)), replace=False).tolist())
        for _ in range(7)
    ]
    plan = Plan(pop.schema, 1.0, views, seed=seed)
    ids = rng.permutation(1 << 20)[: pop.n].astype(np.uint64)  # not 0..n-1
    n, counts = true_view_counts(pop, plan, ids)
    assigned = plan.assign_many(ids)
    for j, view in enumerate(plan.views):
        mask = assigned == j
        cells = pop.schema.cell_index(pop.codes[mask], view)
        expected = np.bincount(cells, minlength=plan.view_oracles[j].L)
        assert n[j] == mask.sum()
        assert counts[j].dtype == np.int64 and np.array_equal(counts[j], expected)


def test_a_phase_counted_in_place_equals_the_copied_users(monkeypatch: pytest.MonkeyPatch) -> None:
    """``rows`` (positions or a mask) counts those users where they are, with their
    positions as ids: the same counts as copying them out (``take``) first."""
    monkeypatch.setattr(collect, "BLOCK", 700)
    rng = np.random.default_rng(9)
    chosen = np.sort(rng.choice(POP.n, size=1200, replace=False))
    mask = np.zeros(POP.n, dtype=bool)
    mask[chosen] = True
    n, counts = true_view_counts(POP.take(chosen), PLAN, user_ids=chosen)
    for rows in (chosen, mask):
        got_n, got = true_view_counts(POP, PLAN, rows=rows)
        assert np.array_equal(got_n, n) and all(np.array_equal(a, b) for a, b in zip(got, counts))
    with pytest.raises(CalmkitError, match=r"rows and user_ids must not both be given"):
        true_view_counts(POP, PLAN, user_ids=np.arange(POP.n), rows=chosen)
    with pytest.raises(CalmkitError, match=r"rows \(mask of shape \(5,\)\) must have shape"):
        true_view_counts(POP, PLAN, rows=np.ones(5, dtype=bool))
    with pytest.raises(CalmkitError, match=r"rows must be positions in \[0, 3000\)"):
        true_view_counts(POP, PLAN, rows=np.array([0, 3000]))
