"""Producing all reports of a population under a plan, as support counts.

Two paths with the same distribution:

- **faithful**: every user goes through the real client code
  (:func:`calmkit_client.make_reports`, vectorised per view) and the aggregator counts
  the payloads.
- **fast**: the support counts are sampled directly, exactly in distribution, from
  each view's true cell counts n_v (n_j users in the view;
  :func:`calmkit_aggregator.reconstruction.uncertainty.sample_support`):

  * OUE: ``C_v = Binomial(n_v, 1/2) + Binomial(n_j - n_v, q)`` (bits are independent).
  * GRR: a GRR report equals "keep the true cell with probability p - q, otherwise a
    cell uniform over all L" (then P(v) = p - q + Lq/L = p and every other cell has q,
    as p + (L-1)q = 1), so ``C = K + Multinomial(n_j - sum K, 1/L)`` with
    ``K_v = Binomial(n_v, p - q)``: O(L) draws, the same law as one multinomial per
    true cell.

Both assign users to views with the plan's hash of their ids (default ``0..n-1``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

import numpy as np
import numpy.typing as npt

from calmkit_aggregator import SupportCounts
from calmkit_aggregator.reconstruction.uncertainty import sample_support
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


def _row_blocks(n: int, rows: np.ndarray | None) -> Iterator[np.ndarray | slice]:
    """Blocks of at most BLOCK reporting users: slices of all n, or of ``rows``
    (sorted positions, or a boolean mask over the n users)."""
    if rows is None:
        for lo in range(0, n, BLOCK):
            yield slice(lo, min(lo + BLOCK, n))
    elif rows.dtype == bool:
        for lo in range(0, n, BLOCK):
            yield np.flatnonzero(rows[lo : lo + BLOCK]) + lo
    else:
        for lo in range(0, rows.size, BLOCK):
            yield rows[lo : lo + BLOCK]


def _rows(population: Population, rows: npt.ArrayLike | None) -> np.ndarray | None:
    if rows is None:
        return None
    arr = np.asarray(rows)
    if arr.dtype == bool:
        if arr.shape != (population.n,):
            raise CalmkitError(
                f"rows (mask of shape {arr.shape}) must have shape ({population.n},)"
            )
        return arr
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise CalmkitError(
            f"rows ({arr.dtype}, shape {arr.shape}) must be a 1-d array of "
            "positions or a boolean mask"
        )
    if arr.size and (arr.min() < 0 or arr.max() >= population.n):
        raise CalmkitError(f"rows must be positions in [0, {population.n})")
    return arr


def true_view_counts(
    population: Population,
    plan: Plan,
    user_ids: npt.ArrayLike | None = None,
    rows: npt.ArrayLike | None = None,
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Users per view (m,) and the true cell counts (L_j,) of each view's users.

    ``rows``: only these users report (positions, or a boolean mask over the n users;
    their ids are their positions) - a phase of a collection without copying the
    codes. Otherwise all users, with ``user_ids`` (default ``0..n-1``).

    O(n) and no loop over views: per block of users, each user's cell in its own
    view's table is gathered (``codes[user, attr]`` times the view's strides, views
    padded to the longest with stride 0), offset by where that view's table starts in
    one flat array, and all views are counted by a single ``bincount``."""
    if population.schema != plan.schema:
        raise CalmkitError("population schema must equal the plan's schema")
    if rows is not None and user_ids is not None:
        raise CalmkitError(
            "rows and user_ids must not both be given (rows' ids are their positions)"
        )
    ids = None if user_ids is None else _user_ids(population, user_ids)
    chosen = _rows(population, rows)
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
    for block in _row_blocks(population.n, chosen):
        if isinstance(block, slice):
            block_ids = (
                np.arange(block.start, block.stop, dtype=np.uint64) if ids is None else ids[block]
            )
        else:
            block_ids = block.astype(np.uint64)
        views = plan.assign_many(block_ids)
        codes = population.codes[block]
        users = np.arange(len(views))
        cells = starts[views]
        for c in range(width):
            cells += codes[users, attrs[views, c]] * strides[views, c]
        n += np.bincount(views, minlength=plan.m)
        flat += np.bincount(cells, minlength=flat.size)
    return n, [flat[a : a + size].copy() for a, size in zip(starts.tolist(), sizes.tolist())]


def collect_support(
    population: Population,
    plan: Plan,
    rng: RngLike = None,
    path: Literal["fast", "faithful"] = "fast",
    user_ids: npt.ArrayLike | None = None,
    rows: npt.ArrayLike | None = None,
) -> SupportCounts:
    """Support counts of every user's report under ``plan`` (see module docstring);
    ``rows``: only those users report (see :func:`true_view_counts`)."""
    if path == "faithful":
        if population.schema != plan.schema:
            raise CalmkitError("population schema must equal the plan's schema")
        gen = np.random.default_rng(rng)
        chosen = _rows(population, rows)
        if chosen is not None:
            if user_ids is not None:
                raise CalmkitError(
                    "rows and user_ids must not both be given (rows' ids are their positions)"
                )
            positions = np.flatnonzero(chosen) if chosen.dtype == bool else chosen
            population, user_ids = population.take(positions), positions
        batches = make_reports(plan, population.codes, _user_ids(population, user_ids), gen)
        return SupportCounts.from_reports(plan, batches)
    if path != "fast":
        raise CalmkitError(f"path ({path!r}) must be one of {list(PATHS)}")
    gen = np.random.default_rng(rng)
    n, true_counts = true_view_counts(population, plan, user_ids, rows)
    return sample_support(plan, n, true_counts, gen)
