"""Consistency and non-negativity of the views (the pipeline's consistency step: CALM
(Zhang et al., "CALM: Consistent Adaptive Local Marginal for Marginal Release under
Local Differential Privacy", CCS 2018), §4.4, after PriView's, §4.1).

Consistency: for every attribute set A in the intersection closure of the views
(the empty set included: every view's total is set to the known 1), smallest first,
the views containing A are projected onto A and averaged with inverse-variance weights
``w_i ∝ 1 / (C_i var_i)`` (``C_i`` = cells of V_i per cell of A; equal variances give
the paper's ``1 / C_i``); each view then gets ``(T_A(v) - T_{A_i}(v)) / C_i`` added to
every cell projecting to v. Processing subsets first keeps them consistent.

Non-negativity: Norm-Sub per view, i.e. the Euclidean projection onto
``{T >= 0, sum T = 1}``. The two steps alternate until the views are consistent and
non-negative within ``tol`` or ``max_iter`` rounds; the residuals reached are kept.

Convergence: both steps map onto polyhedral sets (an affine subspace, a product of
simplices), where alternating projections converge linearly (Bauschke & Borwein 1993).
Measured on CALM's views (binary attributes, eps 1, n = 2^22) the inconsistency falls
by a factor of about 0.88 a round: 1e-9 takes 100-150 rounds, so ``max_iter`` (1000)
is a guard, not the usual way out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations

import numpy as np

from .marginal import MarginalTable, inverse_variance_weights

__all__ = [
    "ConsistentViews",
    "intersection_closure",
    "make_consistent",
    "norm_sub",
    "norm_sub_rows",
]


def intersection_closure(views: Sequence[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """Attribute sets that are intersections of two or more views, closed under
    intersection, with the empty set; sorted by size (then lexicographically)."""
    sets = {frozenset(v) for v in views}
    closure: set[frozenset[int]] = {frozenset()}
    closure |= {a & b for a, b in combinations(sets, 2)}
    # a view listed twice, or contained in another view, is its own intersection
    listed: dict[frozenset[int], int] = {}
    for v in views:
        listed[frozenset(v)] = listed.get(frozenset(v), 0) + 1
    closure |= {a for a in sets if listed[a] > 1 or any(a < b for b in sets)}
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
        w = inverse_variance_weights(var)
        steps.append(_Step(attrs, tuple(members), tuple(drop), tuple(cells), tuple(bshape), w))
    return steps


@dataclass
class _Pattern:
    """Members of one level's steps that sit in one stack with the same axes summed
    out: their ``rows`` in the stack, each one's step (numbered within the level's
    steps of its projected shape), weight and C_i."""

    group: int
    axes: tuple[int, ...]
    bshape: tuple[int, ...]
    rows: list[int]
    steps: list[int]
    weights: list[float]
    cells: list[float]


class _Stacks:
    """The views' values stacked by shape (one (count, *shape) array per shape), and
    the closure's steps batched by level (attribute-set size).

    Within one pass, once every smaller set is consistent, the updates of two sets of
    the same size commute. The update of A spreads ``T_A - P_A`` over a member's
    cells, and its projection onto another set B of that size depends only on its
    margin on the smaller set A & B, which is zero: every member of A already agrees
    on A & B, so ``T_A`` does too. So a level's steps run together (all projections,
    then all updates). That is a few whole-array operations per level and pattern,
    whatever the number of views, with the same result as one step at a time (to
    rounding; tested)."""

    def __init__(self, tables: Sequence[MarginalTable], steps: list[_Step]) -> None:
        shapes = sorted({t.values.shape for t in tables})
        self.where: list[tuple[int, int]] = []
        members_of: list[list[int]] = [[] for _ in shapes]
        for i, t in enumerate(tables):
            g = shapes.index(t.values.shape)
            self.where.append((g, len(members_of[g])))
            members_of[g].append(i)
        self.arrays = [
            np.stack([tables[i].values for i in members]).astype(np.float64)
            for members in members_of
        ]
        sizes = sorted({len(step.attrs) for step in steps})
        self.levels = [self._level([s for s in steps if len(s.attrs) == k]) for k in sizes]

    def _level(
        self, steps: list[_Step]
    ) -> tuple[bool, list[list[tuple[_Pattern, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]]]:
        """(is the empty set, per projected shape: its patterns as (pattern, rows,
        steps, weights, C_i arrays))."""
        by_shape: dict[tuple[int, ...], dict[tuple[int, tuple[int, ...]], _Pattern]] = {}
        numbering: dict[tuple[int, ...], int] = {}
        for step in steps:
            first = step.members[0]
            shape_a = tuple(
                n
                for ax, n in enumerate(self.arrays[self.where[first][0]].shape[1:])
                if ax not in step.drop[0]
            )
            patterns = by_shape.setdefault(shape_a, {})
            number = numbering.setdefault(shape_a, 0)
            numbering[shape_a] = number + 1
            for k, (i, drop) in enumerate(zip(step.members, step.drop)):
                g, row = self.where[i]
                key = (g, tuple(ax + 1 for ax in drop))
                pattern = patterns.setdefault(
                    key, _Pattern(g, key[1], step.bshape[k], [], [], [], [])
                )
                pattern.rows.append(row)
                pattern.steps.append(number)
                pattern.weights.append(float(step.weights[k]))
                pattern.cells.append(float(step.cells[k]))
        empty = bool(steps) and not steps[0].attrs
        groups = []
        for patterns in by_shape.values():
            groups.append(
                [
                    (
                        p,
                        np.array(p.rows, dtype=np.int64),
                        np.array(p.steps, dtype=np.int64),
                        np.array(p.weights),
                        np.array(p.cells),
                    )
                    for p in patterns.values()
                ]
            )
        return empty, groups

    def consistency_pass(self) -> None:
        """Levels in order of size: every member's projection onto its set, the sets'
        weighted means (targets), then each member's difference spread evenly over its
        C_i cells."""
        for empty, groups in self.levels:
            updates = []
            for group in groups:
                projected = [self.arrays[p.group][rows].sum(axis=p.axes) for p, rows, *_ in group]
                if empty:  # the totals are known: every view must sum to 1
                    targets = [np.ones_like(proj) for proj in projected]
                else:
                    count = max(int(steps.max()) for _, _, steps, _, _ in group) + 1
                    means = np.zeros((count, *projected[0].shape[1:]))
                    for (_, _, steps, weights, _), proj in zip(group, projected):
                        np.add.at(means, steps, _along(weights, proj) * proj)
                    targets = [means[steps] for _, _, steps, _, _ in group]
                for (p, rows, _, _, cells), proj, target in zip(group, projected, targets):
                    change = (target - proj) / _along(cells, proj)
                    updates.append((p, rows, change.reshape((len(rows), *p.bshape))))
            for p, rows, change in updates:
                self.arrays[p.group][rows] += change

    def inconsistency(self) -> float:
        """Largest difference between two members' projections onto a shared set."""
        worst = 0.0
        for empty, groups in self.levels:
            if empty:
                continue
            for group in groups:
                count = max(int(steps.max()) for _, _, steps, _, _ in group) + 1
                shape = None
                high = low = np.zeros(0)
                for p, rows, steps, _, _ in group:
                    proj = self.arrays[p.group][rows].sum(axis=p.axes)
                    if shape is None:
                        shape = proj.shape[1:]
                        high = np.full((count, *shape), -np.inf)
                        low = np.full((count, *shape), np.inf)
                    np.maximum.at(high, steps, proj)
                    np.minimum.at(low, steps, proj)
                worst = max(worst, float((high - low).max()))
        return worst

    def minimum(self) -> float:
        return min(float(a.min()) for a in self.arrays)

    def norm_sub(self) -> None:
        """Norm-Sub of every view (row by row of each stack)."""
        self.arrays = [
            norm_sub_rows(a.reshape(a.shape[0], -1)).reshape(a.shape) for a in self.arrays
        ]

    def values(self) -> list[np.ndarray]:
        """Each view's values, in the tables' order."""
        return [self.arrays[g][row].copy() for g, row in self.where]


def _along(per_row: np.ndarray, like: np.ndarray) -> np.ndarray:
    """``per_row`` (k,) shaped to broadcast over ``like`` (k, ...)."""
    return per_row.reshape((-1,) + (1,) * (like.ndim - 1))


def norm_sub_rows(x: np.ndarray) -> np.ndarray:
    """:func:`norm_sub` of every row of ``x`` (rows, cells) at total 1."""
    width = x.shape[1]
    desc = -np.sort(-x, axis=1)
    cum = np.cumsum(desc, axis=1) - 1.0
    rank = np.arange(1, width + 1)
    ok = desc - cum / rank > 0
    rho = width - 1 - np.argmax(ok[:, ::-1], axis=1)
    delta = cum[np.arange(x.shape[0]), rho] / (rho + 1)
    rows: np.ndarray = np.maximum(x - delta[:, None], 0.0)
    return rows


@dataclass(frozen=True)
class ConsistentViews:
    """Views after consistency + Norm-Sub, with the residuals reached.

    ``inconsistency``: largest difference between two views' projections onto a
    shared attribute set; ``negativity``: minus the most negative cell (0 if none);
    ``iterations``: rounds run; ``closure``: the views' intersection closure (for
    shrinkage, which needs it too).
    """

    tables: tuple[MarginalTable, ...]
    inconsistency: float
    negativity: float
    iterations: int
    closure: tuple[tuple[int, ...], ...] = ()


def make_consistent(
    tables: Sequence[MarginalTable],
    tol: float = 1e-9,
    max_iter: int = 1000,
    nonnegative: bool = True,
    side: Sequence[MarginalTable] = (),
) -> ConsistentViews:
    """Alternate the consistency step and Norm-Sub (see module docstring).

    ``nonnegative=False`` runs the (linear, unbiased) consistency step once, alone.
    ``side``: tables the views are made consistent with and that are then dropped (a
    set-aside phase's margins, :func:`~.estimate.side_margins`): one table per view
    comes out.
    """
    joined = [*tables, *side]
    closure = intersection_closure([t.attrs for t in joined])
    stacks = _Stacks(joined, _steps(joined, closure))
    it = 0
    while it < max_iter:
        it += 1
        stacks.consistency_pass()
        if not nonnegative or stacks.minimum() >= -tol:
            break
        stacks.norm_sub()
        if stacks.inconsistency() <= tol:
            break
    negativity = max(0.0, -stacks.minimum())
    values = stacks.values()
    # zip stops at the views: the side tables are dropped
    out = tuple(MarginalTable(t.attrs, v, t.variance, t.n) for t, v in zip(tables, values))
    return ConsistentViews(out, stacks.inconsistency(), negativity, it, tuple(closure))
