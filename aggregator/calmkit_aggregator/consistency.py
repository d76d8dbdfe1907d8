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
from itertools import combinations

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
    projected: np.ndarray = np.maximum(values - delta, 0.0)
    return projected


@dataclass(frozen=True)
class _Step:
    """One closure set A: each member view's axes to sum out to project onto A, its
    C_i, the shape broadcasting A back over the view, and its weight (normalised)."""

    attrs: tuple[int, ...]
    members: tuple[int, ...]
    drop: tuple[tuple[int, ...], ...]
    cells: tuple[int, ...]
    bshape: tuple[tuple[int, ...], ...]
    weights: np.ndarray


def _steps(tables: Sequence[MarginalTable], closure: list[tuple[int, ...]]) -> list[_Step]:
    steps = []
    for attrs in closure:
        members = [i for i, t in enumerate(tables) if set(attrs) <= set(t.attrs)]
        if len(members) < 2 and attrs:
            continue
        drop, cells, bshape, var = [], [], [], []
        for i in members:
            t = tables[i]
            keep = [ax for ax, a in enumerate(t.attrs) if a in attrs]
            drop.append(tuple(ax for ax in range(len(t.attrs)) if ax not in keep))
            c = t.cells // max(1, int(np.prod([t.values.shape[ax] for ax in keep])))
            cells.append(c)
            bshape.append(
                tuple(t.values.shape[ax] if ax in keep else 1 for ax in range(len(t.attrs)))
            )
            var.append(c * t.variance)  # each projected cell sums C_i cells
        v = np.array(var)
        if np.all(v == 0) or np.all(np.isinf(v)):
            w = np.ones(len(members))
        else:
            with np.errstate(divide="ignore"):
                w = np.where(v == 0, np.inf, 1.0 / v)
            if np.isinf(w).any():  # exact tables dominate
                w = np.isinf(w).astype(float)
        steps.append(
            _Step(attrs, tuple(members), tuple(drop), tuple(cells), tuple(bshape), w / w.sum())
        )
    return steps


def _consistency_pass(values: list[np.ndarray], steps: list[_Step]) -> None:
    """Subsets first: average the members' projections onto A and spread each
    member's difference evenly over its C_i cells (in place)."""
    for step in steps:
        projected = [values[i].sum(axis=ax) for i, ax in zip(step.members, step.drop)]
        # the totals are known: every view must sum to 1
        target = (
            np.tensordot(step.weights, np.stack(projected), axes=1) if step.attrs else np.ones(())
        )
        for i, p, c, shape in zip(step.members, projected, step.cells, step.bshape):
            values[i] = values[i] + ((target - p) / c).reshape(shape)


def _inconsistency(values: list[np.ndarray], steps: list[_Step]) -> float:
    worst = 0.0
    for step in steps:
        if not step.attrs:
            continue
        projected = np.stack([values[i].sum(axis=ax) for i, ax in zip(step.members, step.drop)])
        worst = max(worst, float(np.ptp(projected, axis=0).max()))
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
    closure = intersection_closure([t.attrs for t in tables])
    steps = _steps(tables, closure)
    values = [t.values.copy() for t in tables]
    it = 0
    while it < max_iter:
        it += 1
        _consistency_pass(values, steps)
        if not nonnegative or min(float(v.min()) for v in values) >= -tol:
            break
        values = [norm_sub(v) for v in values]
        if _inconsistency(values, steps) <= tol:
            break
    negativity = max(0.0, -min(float(v.min()) for v in values))
    out = tuple(MarginalTable(t.attrs, v, t.variance, t.n) for t, v in zip(tables, values))
    return ConsistentViews(out, _inconsistency(values, steps), negativity, it)
