"""FC, the full contingency table method (CALM (Zhang et al., "CALM: Consistent Adaptive
Local Marginal for Marginal Release under Local Differential Privacy", CCS 2018), §3.3),
and the variance formulas shared with AM (eqs. 3, 4).

Every user reports the cell of her whole record (one view = all d attributes) through
the adaptive frequency oracle (§2.2.3: GRR iff ``L < 3 e^eps + 2``, else OUE); the
aggregator estimates the full table F (unbiased, eqs. 1, 2) and answers any marginal
by summing F's cells. The table has ``prod(sizes)`` cells, so FC refuses domains over
:data:`calmkit_client.MAX_VIEW_CELLS` (d = 32 binary has 2^32) in :meth:`check`.

Post-processing. The paper applies none to FC (or AM): §5.1 says they "can be directly
applied", and its comparison uses formulas (4) and (5), which are the variances of the
unbiased estimates ("256 Var0 for FC, 448 Var0 for AM ... the experimental results
match the analytical comparison"); Norm-Sub/consistency appears only as a step of
CALM (§4.2, §4.4). ``nonnegative=False`` is therefore the paper's FC: the raw
projection of the unbiased F (cells may be negative; with OUE the total is 1 only in
expectation). ``nonnegative=True`` (default, so that answers obey
:class:`~.base.Release`'s "fractions summing to 1") applies Norm-Sub to the collected
table F once, before projecting, as CALM applies it to its collected views: every
answer is then a marginal of one non-negative table summing to 1, so answers agree
with one another.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from calmkit_aggregator import MarginalTable
from calmkit_client import (
    MAX_VIEW_CELLS,
    CalmkitError,
    Plan,
    Schema,
    choose_oracle,
    validate_epsilon,
)
from calmkit_client.randomness import RngLike
from calmkit_client.validation import is_int

from ..population import Population
from .base import Mechanism, NotScalable, Release
from .direct import check_path, collect_views

__all__ = ["FullContingency", "fc_variance", "fo_variance"]


# -- the paper's variance formulas ------------------------------------------------------
def fo_variance(cells: int, n: float, epsilon: float) -> float:
    """Var0 of eq. (3): the adaptive oracle's f-independent per-cell variance with
    ``n`` reports over ``cells`` cells, ``min(4 e^eps, cells - 2 + e^eps) /
    ((e^eps - 1)^2 n)``."""
    e = math.exp(validate_epsilon(epsilon))
    return min(4 * e, cells - 2 + e) / ((e - 1) ** 2 * n)


def attribute_sizes(sizes: int | Sequence[int]) -> tuple[int, ...]:
    """The attributes' category counts: ``sizes`` itself, or for an int d, d binary
    attributes."""
    if is_int(sizes):
        out: tuple[int, ...] = (2,) * int(sizes)
    else:
        out = tuple(int(s) for s in sizes)
    if not out or any(s < 2 for s in out):
        raise CalmkitError(f"sizes ({sizes!r}) must be d >= 1 or attribute sizes >= 2")
    return out


def kset_cells(sizes: int | Sequence[int], k: int) -> dict[int, int]:
    """How many k-subsets of the attributes have each marginal cell count:
    ``{cells: count}`` (a DP over attributes; no enumeration of the C(d, k) sets)."""
    sz = attribute_sizes(sizes)
    if not is_int(k) or not 0 <= k <= len(sz):
        raise CalmkitError(f"k ({k!r}) must be an int in [0, d={len(sz)}]")
    # layer[j] = {cells: number of j-subsets of the attributes seen so far}
    layer: list[dict[int, int]] = [{1: 1}] + [{} for _ in range(k)]
    for s in sz:
        for j in range(k, 0, -1):
            for cells, count in layer[j - 1].items():
                layer[j][cells * s] = layer[j].get(cells * s, 0) + count
    return layer[k]


def table_sse(cells: int, n: float, epsilon: float, out_cells: int | None = None) -> float:
    """Exact expected SSE of the unbiased estimate of a table of ``cells`` cells from
    ``n`` reports through the adaptive oracle, summed into ``out_cells`` equal groups
    of cells (a marginal of it; default: the table itself). Independent of the data.

    Each group S of ``C = cells / out_cells`` cells is counted by a Bernoulli per
    report, so, with ``sum f = 1``: OUE (independent bits) ``(p(1-p) + (cells-1)
    q(1-q)) / (n (p-q)^2)``; GRR (one cell per report: S is hit with ``a = p + (C-1) q``
    by its own users, ``b = C q`` by others) ``(a(1-a) + (out_cells-1) b(1-b)) /
    (n (p-q)^2)``. The paper's ``cells * Var0`` keeps only the ``q(1-q)`` terms.
    """
    oracle = choose_oracle(int(cells), epsilon)
    p, q = oracle.p, oracle.q
    if oracle.name == "OUE":
        power = p * (1 - p) + (cells - 1) * q * (1 - q)
    else:
        m = cells if out_cells is None else int(out_cells)
        a, b = p + (cells // m - 1) * q, (cells // m) * q
        power = a * (1 - a) + (m - 1) * b * (1 - b)
    return power / (n * (p - q) ** 2)


def fc_variance(
    sizes: int | Sequence[int], k: int, n: float, epsilon: float, *, exact: bool = False
) -> float:
    """Expected SSE of a k-way marginal answered by FC, averaged over the k-sets.

    ``sizes``: the d attribute sizes (an int d: d binary attributes). Eq. (4) (the
    paper writes ``2^d Var0`` for binary): every cell of the full table (``L =
    prod(sizes)`` cells) lands in exactly one cell of any marginal, so the SSE is
    ``L * Var0(L)``, whatever k (``fo_variance(L, n, epsilon)``).
    ``exact=True``: :func:`table_sse` with the true cell's ``p(1-p)`` term (equal to
    (4) up to ``(p(1-p) - q(1-q)) / (L q(1-q))``, under 0.1% for OUE at L >= 256).
    """
    sz = attribute_sizes(sizes)
    full = math.prod(sz)
    if not exact:
        return full * fo_variance(full, n, epsilon)
    by_cells = kset_cells(sz, k)
    total = sum(by_cells.values())
    return sum(c * table_sse(full, n, epsilon, m) for m, c in by_cells.items()) / total


# -- the mechanism ------------------------------------------------------------------------
def check_query(schema: Schema, attrs: Sequence[int]) -> tuple[int, ...]:
    """Sorted positions of a query, or :class:`CalmkitError` naming it."""
    try:
        return tuple(sorted(schema.resolve(attrs)))
    except CalmkitError as exc:
        raise CalmkitError(f"query ({list(attrs)!r}): {exc}") from None


class _FullRelease(Release):
    def __init__(self, schema: Schema, table: MarginalTable, oracle: str) -> None:
        self.schema, self.table, self.oracle = schema, table, oracle

    def answer(self, attrs: Sequence[int]) -> np.ndarray:
        """The projection of the (Norm-Subbed, unless ``nonnegative=False``) full
        table onto ``attrs``: float64, shape ``schema.shape(attrs)``."""
        query = check_query(self.schema, attrs)
        return self.table.project(query).values

    def describe(self) -> dict[str, object]:
        return {"cells": self.table.cells, "oracle": self.oracle}


class FullContingency(Mechanism):
    """FC (§3.3): every user reports her full record's cell; marginals are projections
    of the estimated full table. ``nonnegative``: Norm-Sub the full table first (not in
    the paper, see the module docstring); ``path``: the population path of
    :func:`~calmkit_simulator.collect.collect_support`."""

    name = "FC"

    def __init__(self, nonnegative: bool = True, path: str = "fast") -> None:
        self.nonnegative, self.path = bool(nonnegative), check_path(path)

    def check(self, schema: Schema, n: int, epsilon: float, k: int) -> None:
        validate_epsilon(epsilon)
        cells = math.prod(schema.sizes)  # exact: int64 products overflow past d = 62
        if cells > MAX_VIEW_CELLS:
            sizes = "x".join(str(s) for s in schema.sizes)
            raise NotScalable(
                f"FC's full table ({sizes} = {cells} cells, d={schema.d}) must have at most "
                f"MAX_VIEW_CELLS = {MAX_VIEW_CELLS} cells"
            )
        if cells < 2:
            raise NotScalable(f"FC's full table ({cells} cell) must have at least 2 cells")

    def run(self, population: Population, epsilon: float, k: int, rng: RngLike = None) -> Release:
        self.check(population.schema, population.n, epsilon, k)
        gen = np.random.default_rng(rng)
        schema = population.schema
        plan = Plan(schema, validate_epsilon(epsilon), (tuple(range(schema.d)),))
        (table,) = collect_views(population, plan, gen, self.path, self.nonnegative)
        return _FullRelease(schema, table, plan.view_oracles[0].name)
