"""Consistency and non-negativity of the views (papers/calm-ccs18.txt §4.4, PriView;
DESIGN.md steps 6-7).

Consistency: for every attribute set A in the intersection closure of the views
(the empty set included: every view's total is set to the known 1), smallest first,
the views containing A are projected onto A and averaged with inverse-variance weights
``w_i ∝ 1 / (C_i var_i)`` (``C_i`` = cells of V_i per cell of A; equal variances give
the paper's ``1 / C_i``); each view then gets ``(T_A(v) - T_{A_i}(v)) / C_i`` added to
every cell projecting to v. Processing subsets first keeps them consistent.

Non-negativity: Norm-Sub per view, i.e. the Euclidean projection onto
``{T >= 0, sum T = 1}``. The two steps alternate until the views are consistent and
non-negative within ``tol`` or ``max_iter`` rounds; the residuals reached are kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations, pairwise

import numpy as np

from .marginal import MarginalTable

__all__ = ["ConsistentViews", "intersection_closure", "make_consistent", "norm_sub"]


def intersection_closure(views: Sequence[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """Attribute sets that are intersections of two or more views, closed under
    intersection, with the empty set; sorted by size (then lexicographically)."""
    sets = {frozenset(v) for v in views}
    closure: set[frozenset[int]] = {frozenset()}
    closure |= {a & b for a, b in combinations(sets, 2)}
    # a view listed twice, or contained in another view, is its own intersection
    closure |= {a for a in sets if sum(1 for v in views if a <= frozenset(v)) > 1}
    frontier = set(closure)
    while frontier:
        new = {a & b for a in frontier for b in closure} - closure
        closure |= new
        frontier = new
    return sorted((tuple(sorted(s)) for s in closure), key=lambda s: (len(s), s))


def norm_sub(values: np.ndarray, total: float = 1.0) -> np.ndarray:
    """Norm-Sub: ``max(T - delta, 0)`` with delta such that the result sums to
    ``total`` (the Euclidean projection onto the scaled simplex), any shape."""
    flat = values.reshape(-1)
    desc = np.sort(flat)[::-1]
    cum = np.cumsum(desc) - total
    rank = np.arange(1, flat.size + 1)
    rho = np.nonzero(desc - cum / rank > 0)[0][-1]
    delta = cum[rho] / (rho + 1)
    return np.maximum(values - delta, 0.0)


def _weights(
    tables: Sequence[MarginalTable], members: list[int], attrs: tuple[int, ...]
) -> tuple[np.ndarray, list[MarginalTable]]:
    projected = [tables[i].project(attrs) for i in members]
    var = np.array([p.variance for p in projected])
    if np.all(var == 0) or np.all(np.isinf(var)):
        w = np.ones(len(members))
    else:
        with np.errstate(divide="ignore"):
            w = np.where(var == 0, np.inf, 1.0 / var)
        if np.isinf(w).any():  # exact tables dominate
            w = np.isinf(w).astype(float)
    return w / w.sum(), projected


def _consistency_pass(tables: list[MarginalTable], closure: list[tuple[int, ...]]) -> None:
    for attrs in closure:
        members = [i for i, t in enumerate(tables) if set(attrs) <= set(t.attrs)]
        if len(members) < 2 and attrs:
            continue
        w, projected = _weights(tables, members, attrs)
        # the totals are known: every view must sum to 1
        target = np.ones(()) if not attrs else sum(wi * p.values for wi, p in zip(w, projected))
        for i, p in zip(members, projected):
            t = tables[i]
            c = t.cells // max(1, p.cells)
            delta = (target - p.values) / c
            # broadcast the update over the axes not in attrs
            shape = [
                t.values.shape[ax] if t.attrs[ax] in attrs else 1 for ax in range(len(t.attrs))
            ]
            tables[i] = MarginalTable(t.attrs, t.values + delta.reshape(shape), t.variance, t.n)


def _inconsistency(tables: Sequence[MarginalTable], closure: list[tuple[int, ...]]) -> float:
    worst = 0.0
    for attrs in closure:
        proj = [t.project(attrs).values for t in tables if set(attrs) <= set(t.attrs)]
        for a, b in pairwise(proj):
            worst = max(worst, float(np.abs(a - b).max()))
    return worst


@dataclass(frozen=True)
class ConsistentViews:
    """Views after consistency + Norm-Sub, with the residuals reached.

    ``inconsistency``: largest difference between two views' projections onto a
    shared attribute set; ``negativity``: minus the most negative cell (0 if none);
    ``iterations``: rounds run.
    """

    tables: tuple[MarginalTable, ...]
    inconsistency: float
    negativity: float
    iterations: int


def make_consistent(
    tables: Sequence[MarginalTable],
    tol: float = 1e-9,
    max_iter: int = 100,
    nonnegative: bool = True,
) -> ConsistentViews:
    """Alternate the consistency step and Norm-Sub (see module docstring).

    ``nonnegative=False`` runs the (linear, unbiased) consistency step once, alone.
    """
    current = list(tables)
    closure = intersection_closure([t.attrs for t in current])
    if not nonnegative:
        _consistency_pass(current, closure)
        negativity = max(0.0, -min(float(t.values.min()) for t in current))
        return ConsistentViews(tuple(current), _inconsistency(current, closure), negativity, 1)
    it = 0
    while it < max_iter:
        it += 1
        _consistency_pass(current, closure)
        if min(float(t.values.min()) for t in current) >= -tol:
            break
        current = [MarginalTable(t.attrs, norm_sub(t.values), t.variance, t.n) for t in current]
        if _inconsistency(current, closure) <= tol:
            break
    negativity = max(0.0, -min(float(t.values.min()) for t in current))
    return ConsistentViews(tuple(current), _inconsistency(current, closure), negativity, it)
