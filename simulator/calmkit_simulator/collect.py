"""Producing all reports of a population under a plan, as support counts.

Two paths with the same distribution:

- **faithful**: every user goes through the real client code
  (:func:`calmkit_client.make_reports`, vectorised per view) and the aggregator counts
  the payloads.
- **fast**: the support counts are sampled directly, exactly in distribution, from
  each view's true cell counts n_v (n_j users in the view;
  :func:`calmkit_aggregator.uncertainty.sample_support`):

  * OUE: ``C_v = Binomial(n_v, 1/2) + Binomial(n_j - n_v, q)`` (bits are independent).
  * GRR: a GRR report equals "keep the true cell with probability p - q, otherwise a
    cell uniform over all L" (then P(v) = p - q + Lq/L = p and every other cell has q,
    as p + (L-1)q = 1), so ``C = K + Multinomial(n_j - sum K, 1/L)`` with
    ``K_v = Binomial(n_v, p - q)``: O(L) draws, the same law as one multinomial per
    true cell.

Both assign users to views with the plan's hash of their ids (default ``0..n-1``).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import numpy.typing as npt

from calmkit_aggregator import SupportCounts
from calmkit_aggregator.uncertainty import sample_support
from calmkit_client import CalmkitError, Plan, make_reports
from calmkit_client.randomness import RngLike

from .population import Population

__all__ = ["PATHS", "collect_support", "true_view_counts"]

PATHS = ("fast", "faithful")


def _user_ids(population: Population, user_ids: npt.ArrayLike | None) -> np.ndarray:
    if user_ids is None:
        return np.arange(population.n, dtype=np.uint64)
    ids = np.asarray(user_ids)
    if ids.shape != (population.n,):
        raise CalmkitError(f"user_ids (shape {ids.shape}) must have shape ({population.n},)")
    return ids


BLOCK = 1 << 16  # users per block when counting: the temporaries stay O(block)


def true_view_counts(
    population: Population, plan: Plan, user_ids: npt.ArrayLike | None = None
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Users per view (m,) and the true cell counts (L_j,) of each view's users.

    O(n) and no loop over views: per block of users, each user's cell in its own
    view's table is gathered (``codes[user, attr]`` times the view's strides, views
    padded to the longest with stride 0), offset by where that view's table starts in
    one flat array, and all views are counted by a single ``bincount``."""
    if population.schema != plan.schema:
        raise CalmkitError("population schema must equal the plan's schema")
    ids = None if user_ids is None else _user_ids(population, user_ids)
    width = max(len(v) for v in plan.views)
    attrs = np.zeros((plan.m, width), dtype=np.intp)
    strides = np.zeros((plan.m, width), dtype=np.int64)
    for j, view in enumerate(plan.views):
        attrs[j, : len(view)] = view
        strides[j, : len(view)] = plan.schema.strides(view)
    sizes = np.array([o.L for o in plan.view_oracles], dtype=np.int64)
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    flat = np.zeros(int(sizes.sum()), dtype=np.int64)
    n = np.zeros(plan.m, dtype=np.int64)
    for lo in range(0, population.n, BLOCK):
        hi = min(lo + BLOCK, population.n)
        block_ids = np.arange(lo, hi, dtype=np.uint64) if ids is None else ids[lo:hi]
        views = plan.assign_many(block_ids)
        codes = population.codes[lo:hi]
        rows = np.arange(len(views))
        cells = starts[views]
        for c in range(width):
            cells += codes[rows, attrs[views, c]] * strides[views, c]
        n += np.bincount(views, minlength=plan.m)
        flat += np.bincount(cells, minlength=flat.size)
    return n, [flat[a : a + size].copy() for a, size in zip(starts.tolist(), sizes.tolist())]


def collect_support(
    population: Population,
    plan: Plan,
    rng: RngLike = None,
    path: Literal["fast", "faithful"] = "fast",
    user_ids: npt.ArrayLike | None = None,
) -> SupportCounts:
    """Support counts of every user's report under ``plan`` (see module docstring)."""
    if path == "faithful":
        if population.schema != plan.schema:
            raise CalmkitError("population schema must equal the plan's schema")
        gen = np.random.default_rng(rng)
        batches = make_reports(plan, population.codes, _user_ids(population, user_ids), gen)
        return SupportCounts.from_reports(plan, batches)
    if path != "fast":
        raise CalmkitError(f"path ({path!r}) must be one of {list(PATHS)}")
    gen = np.random.default_rng(rng)
    n, true_counts = true_view_counts(population, plan, user_ids)
    return sample_support(plan, n, true_counts, gen)
