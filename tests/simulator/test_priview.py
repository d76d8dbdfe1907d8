"""PriView (central reference): Laplace(m/eps) noise of the stated variance, and far
below CALM's error at the same setting."""

from __future__ import annotations

import numpy as np

from calmkit_simulator import synthetic_population
from calmkit_simulator.experiment import run_mechanism
from calmkit_simulator.mechanisms import Calm, PriView
from calmkit_simulator.mechanisms.priview import laplace_views
from tests.stats import assert_variance, assert_z

POP = synthetic_population(n=20_000, sizes=(2, 3, 2, 2, 2), strength=1.5, rng=2)
VIEWS = [(0, 1), (1, 2), (2, 3, 4)]


def test_laplace_views_are_unbiased_with_the_stated_variance() -> None:
    rng = np.random.default_rng(4)
    reps = 400
    runs = [laplace_views(POP, VIEWS, 0.5, rng) for _ in range(reps)]
    for j, view in enumerate(VIEWS):
        samples = np.stack([r[j].values.reshape(-1) for r in runs])
        stated = runs[0][j].variance
        assert stated == 2 * (len(VIEWS) / 0.5) ** 2 / POP.n**2
        assert_variance(samples, np.full(samples.shape[1], stated))
        assert_z(samples.mean(axis=0), POP.marginal(view).reshape(-1), stated / reps)


def test_central_error_is_far_below_local() -> None:
    # Per cell, LDP GRR on a view of L cells with n/m users has variance about
    # m (e^eps + L - 2) / ((e^eps - 1)^2 n); Laplace(m/eps) has 2 m^2 / (eps^2 n^2).
    # Their ratio is about n / (2 m) (here 1000). With every pair a view, 2-way queries
    # are answered by projection (no max-ent bias), so the central error must be at
    # least 10x smaller.
    local = run_mechanism(POP, Calm(m=10, l=2), 1.0, 2, queries=10, reps=2, rng=1)
    central = run_mechanism(POP, PriView(m=10, l=2), 1.0, 2, queries=10, reps=2, rng=1)
    assert np.mean([r.sse for r in central]) < np.mean([r.sse for r in local]) / 10
