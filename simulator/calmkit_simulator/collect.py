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

from .population import Population, cells_of

__all__ = ["PATHS", "collect_support", "true_view_counts"]

PATHS = ("fast", "faithful")


def _user_ids(population: Population, user_ids: npt.ArrayLike | None) -> np.ndarray:
    if user_ids is None:
        return np.arange(population.n, dtype=np.uint64)
    ids = np.asarray(user_ids)
    if ids.shape != (population.n,):
        raise CalmkitError(f"user_ids (shape {ids.shape}) must have shape ({population.n},)")
    return ids


def true_view_counts(
    population: Population, plan: Plan, user_ids: npt.ArrayLike | None = None
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Users per view (m,) and the true cell counts (L_j,) of each view's users."""
    if population.schema != plan.schema:
        raise CalmkitError("population schema must equal the plan's schema")
    views = plan.assign_many(_user_ids(population, user_ids))
    n = np.bincount(views, minlength=plan.m).astype(np.int64)
    # group users by view once (a stable sort: O(n log n), not a mask per view)
    order = np.argsort(views, kind="stable")
    bounds = np.searchsorted(views[order], np.arange(plan.m + 1))
    counts = []
    for j, view in enumerate(plan.views):
        rows = order[bounds[j] : bounds[j + 1]]
        cells = cells_of(plan.schema, population.codes[rows], tuple(view))
        counts.append(np.bincount(cells, minlength=plan.view_oracles[j].L).astype(np.int64))
    return n, counts


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
