"""End to end in process: synthetic population -> reports -> CALM -> k-way answers.

Bound: a query inside view j is answered from n_j reports; before consistency its
SSE has expectation ``L_j var_j`` (the oracle's per-cell variance times the view's
cells) plus the sampling error of the view's users, at most ``1 / n_j``. Consistency
(inverse-variance averaging) and Norm-Sub (projection onto the simplex, which holds
the truth) do not increase it. The mean over Q queries x R reps of SSEs (sums of
``cells`` squared near-normal errors, relative sd <= sqrt(2 / cells)) stays below
``B (1 + z sqrt(2 / (cells Q R)))``. This is the paper's pipeline (``shrink=False``):
interaction shrinkage trades variance for bias, so it has no such bound; its effect
is measured in docs/accuracy.md.
"""

from __future__ import annotations

import math

import numpy as np

from calmkit_client import Plan
from calmkit_simulator import synthetic_population
from calmkit_simulator.experiment import run_calm
from tests.stats import z_bound

# the Steiner system S(3, 4, 8): 14 4-sets covering every 3-set of 8 attributes (§4.3)
VIEWS = [
    (0, 1, 2, 3),
    (4, 5, 6, 7),
    (0, 1, 4, 5),
    (2, 3, 6, 7),
    (0, 2, 4, 6),
    (1, 3, 5, 7),
    (0, 3, 5, 6),
    (1, 2, 4, 7),
    (0, 1, 6, 7),
    (2, 3, 4, 5),
    (0, 2, 5, 7),
    (1, 3, 4, 6),
    (0, 3, 4, 7),
    (1, 2, 5, 6),
]
K, QUERIES, REPS = 3, 50, 3


def _run(n: int, epsilon: float) -> tuple[float, float, float]:
    pop = synthetic_population(n=n, sizes=(2,) * 8, strength=1.5, rng=0)
    plan = Plan(pop.schema, epsilon, VIEWS, seed=2)
    results = run_calm(pop, plan, K, QUERIES, REPS, rng=5, shrink=False)
    oracle = plan.view_oracles[0]
    n_j = n / plan.m
    bound = oracle.L * oracle.variance(math.floor(n_j)) + 1 / n_j
    calm = float(np.mean([r.calm_sse for r in results]))
    uniform = float(np.mean([r.uniform_sse for r in results]))
    return calm, uniform, bound


def test_calm_error_is_within_the_variance_bound_and_far_below_uniform() -> None:
    calm, uniform, bound = _run(1 << 16, 1.0)
    cells = 2**K
    assert calm <= bound * (1 + z_bound(1) * math.sqrt(2 / (cells * QUERIES * REPS)))
    assert calm < uniform / 10


def test_calm_error_falls_with_n() -> None:
    small, _, bound_small = _run(1 << 14, 1.0)
    large, _, bound_large = _run(1 << 16, 1.0)
    assert bound_large < bound_small / 3.9  # the variance formula scales as 1 / n
    # 4x the users: expected SSE / 4; each mean has relative sd < 0.15 here
    assert large < small / 2
