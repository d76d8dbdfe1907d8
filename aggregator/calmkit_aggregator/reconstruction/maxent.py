"""Answering a marginal query from the views, the pipeline's last step (PriView's, as
CALM (Zhang et al., "CALM: Consistent Adaptive Local Marginal for Marginal Release under
Local Differential Privacy", CCS 2018), §4.1-4.2 adopts it): projection when a view
covers the query, otherwise maximum entropy by iterative proportional fitting over
dom(query)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from calmkit_client import CalmkitError

from .marginal import MarginalTable, inverse_variance_weights

__all__ = ["Answer", "answer_query", "maximum_entropy"]


@dataclass(frozen=True)
class Answer:
    """A reconstructed marginal: ``values`` over sorted ``attrs``, sums to 1;
    ``method`` "projection" or "maxent"; for max-ent the largest constraint residual
    and the IPF rounds run."""

    attrs: tuple[int, ...]
    values: np.ndarray
    method: str
    residual: float = 0.0
    iterations: int = 0


def maximum_entropy(
    shape: Sequence[int],
    constraints: Sequence[tuple[tuple[int, ...], np.ndarray]],
    tol: float = 1e-10,
    max_iter: int = 1000,
) -> tuple[np.ndarray, float, int]:
    """The maximum-entropy distribution over a dense grid of ``shape`` matching each
    constraint ``(axes, target)`` (target: the marginal over those axes, in axis order).

    Iterative proportional fitting from uniform: ``P *= target / P_axes`` (0/0 = 0),
    one reshape-broadcast per constraint, until the largest residual is below ``tol``
    or a sweep changes no cell by more than ``tol`` (constraints that no distribution
    meets: IPF's limit cycle). Returns (P, residual, iterations).
    """
    dims = len(shape)
    p = np.full(tuple(shape), 1.0 / float(np.prod(shape, dtype=np.float64)))
    prepared = []
    for axes, target in constraints:
        other = tuple(ax for ax in range(dims) if ax not in axes)
        bshape = [shape[ax] if ax in axes else 1 for ax in range(dims)]
        t = np.clip(np.asarray(target, dtype=np.float64), 0.0, None)
        t = t / t.sum() if t.sum() > 0 else np.full(t.shape, 1.0 / t.size)
        prepared.append((other, bshape, t.reshape(bshape)))
    residual, it = np.inf, 0
    while it < max_iter:
        it += 1
        previous = p.copy()
        for other, _bshape, t in prepared:
            current = p.sum(axis=other, keepdims=True)
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = np.where(current > 0, t / current, 0.0)
            p *= ratio
        residual = max(
            (float(np.abs(p.sum(axis=other, keepdims=True) - t).max()) for other, _, t in prepared),
            default=0.0,
        )
        # inconsistent constraints have no solution: IPF then settles into a cycle
        # that repeats every sweep, so a sweep that no longer moves P also stops
        if residual <= tol or float(np.abs(p - previous).max()) <= tol:
            break
    total = p.sum()
    return (p / total if total > 0 else p), residual, it


def query_constraints(
    tables: Sequence[MarginalTable], query: tuple[int, ...]
) -> list[tuple[tuple[int, ...], np.ndarray]]:
    """The views' projections onto ``attrs ∩ V_i`` for a sorted ``query``, as IPF
    constraints ``(axes in query, target)``: a set inside another is dropped, and a set
    several views share takes their :func:`~.marginal.inverse_variance_weights` average."""
    groups: dict[tuple[int, ...], list[MarginalTable]] = {}
    for t in tables:
        common = tuple(a for a in query if a in t.attrs)
        if common:
            groups.setdefault(common, []).append(t.project(common))
    constraints = []
    for s in groups:
        if any(set(s) < set(o) for o in groups):
            continue
        projections = groups[s]
        w = inverse_variance_weights(p.variance for p in projections)
        target = sum(wi * p.values for wi, p in zip(w, projections))
        constraints.append((tuple(query.index(a) for a in s), np.asarray(target)))
    return constraints


def answer_query(
    tables: Sequence[MarginalTable],
    attrs: Sequence[int],
    shape: Sequence[int],
    tol: float = 1e-10,
    max_iter: int = 1000,
) -> Answer:
    """The marginal over ``attrs`` (sorted attribute positions, ``shape`` their sizes).

    A view containing every attribute of the query answers by projection (the most
    precise such view). Otherwise the constraints are the views' projections onto
    ``attrs ∩ V_i``, dropping any contained in another (a set shared by several
    views takes their :func:`~.marginal.inverse_variance_weights` average: after
    consistency they agree anyway), and IPF finds the max-ent table.
    Attributes in no view stay uniform.
    """
    query = tuple(sorted(int(a) for a in attrs))
    if len(set(query)) != len(query) or len(shape) != len(query):
        raise CalmkitError(f"query ({list(attrs)}) must be distinct attributes matching shape")
    covering = [t for t in tables if set(query) <= set(t.attrs)]
    if covering:
        best = min(covering, key=lambda t: t.project(query).variance)
        values = np.clip(best.project(query).values, 0.0, None)
        return Answer(query, values / values.sum(), "projection")
    values, residual, it = maximum_entropy(shape, query_constraints(tables, query), tol, max_iter)
    return Answer(query, values, "maxent", residual, it)
