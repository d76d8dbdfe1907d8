"""AM, the all-marginals method (CALM (Zhang et al., "CALM: Consistent Adaptive Local
Marginal for Marginal Release under Local Differential Privacy", CCS 2018), §3.4).

The users are split equally (the plan's public hash, equal shares) into C(d, k)
groups, one per k-way marginal; each group reports its marginal's cell through the
adaptive oracle (GRR iff ``L < 3 e^eps + 2``, else OUE), and a k-way query is answered
by its own marginal. Variance (5): ``2^k C(d, k) Var0`` for binary attributes.

Post-processing: as for FC (see :mod:`.fc`), the paper applies none; its formula (5)
is the variance of the unbiased marginal. ``nonnegative=False`` is the paper's AM;
``nonnegative=True`` (default) applies Norm-Sub to each collected marginal.

Queries of t < k attributes (the paper's AM answers only k-way marginals, §3.4:
"no way to answer any t-way marginal queries for t > k"): the average of the
projections of all C(d - t, k - t) marginals containing the query, with §4.4's
inverse-variance weights ``w_i ∝ 1 / (C_i var_i)`` (``C_i`` cells of marginal i per
query cell, ``var_i`` its oracle's f-independent variance with its group's n_i).
The weights depend only on group sizes, never on the reports, so with
``nonnegative=False`` the average stays unbiased. Queries of more than k attributes
raise :class:`CalmkitError`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import combinations

import numpy as np

from calmkit_aggregator import MarginalTable
from calmkit_client import MAX_VIEW_CELLS, CalmkitError, Plan, Schema, validate_epsilon
from calmkit_client.randomness import RngLike
from calmkit_client.validation import is_int

from ..population import Population
from .base import Mechanism, NotScalable, Release
from .direct import check_path, collect_views
from .fc import attribute_sizes, check_query, fo_variance, kset_cells, table_sse

__all__ = ["MAX_VIEWS", "AllMarginals", "am_variance"]

# More k-way marginals than this is not a setting AM can run (one Plan view each).
MAX_VIEWS = 100_000


def am_variance(
    sizes: int | Sequence[int], k: int, n: float, epsilon: float, *, exact: bool = False
) -> float:
    """Expected SSE of a k-way marginal answered by AM, averaged over the k-sets.

    ``sizes``: the d attribute sizes (an int d: d binary attributes). Eq. (5) (binary:
    ``2^k C(d,k) Var0``): marginal A has ``|V_A|`` cells, each estimated from
    ``n / C(d,k)`` users, so the SSE is ``|V_A| Var0(|V_A|, n / C(d,k))``; the oracle
    (and so Var0) is chosen per marginal by its own ``|V_A|``.
    ``exact=True``: :func:`.fc.table_sse` per marginal (adds the true cell's
    ``p(1-p) - q(1-q)``, which the f-independent Var0 drops: +15% for GRR at L=8,
    eps=1). Both assume groups of exactly ``n / C(d,k)`` users and measure the error
    against the group's own users; against the whole population's marginal ``f``
    (what the harness measures) the random split adds about
    ``(C(d,k) - 1) / n * (1 - sum f^2)``, which depends on the data.
    """
    sz = attribute_sizes(sizes)
    by_cells = kset_cells(sz, k)
    groups = sum(by_cells.values())  # C(d, k)
    per_group = n / groups

    def one(cells: int) -> float:
        if exact:
            return table_sse(cells, per_group, epsilon)
        return cells * fo_variance(cells, per_group, epsilon)

    return sum(count * one(cells) for cells, count in by_cells.items()) / groups


class _AllMarginalsRelease(Release):
    def __init__(self, schema: Schema, k: int, tables: list[MarginalTable], oracles: list[str]):
        self.schema, self.k = schema, k
        self.tables = {t.attrs: t for t in tables}
        self.oracles = oracles

    def answer(self, attrs: Sequence[int]) -> np.ndarray:
        """The query's own marginal (t = k) or the weighted average of the containing
        marginals' projections (t < k): float64, shape ``schema.shape(attrs)``."""
        query = check_query(self.schema, attrs)
        if len(query) > self.k:
            raise CalmkitError(
                f"query ({list(query)}) has {len(query)} attributes; AM collected only "
                f"{self.k}-way marginals and must be asked at most {self.k}"
            )
        if len(query) == self.k:
            return self.tables[query].values
        rest = [a for a in range(self.schema.d) if a not in query]
        members = [
            self.tables[tuple(sorted(query + extra))]
            for extra in combinations(rest, self.k - len(query))
        ]
        projected = [t.project(query) for t in members]
        var = np.array([p.variance for p in projected])  # C_i var_i
        if np.all(np.isinf(var)):  # no containing group has users
            w = np.ones(len(projected))
        else:
            w = np.where(np.isinf(var), 0.0, 1.0 / var)
        w /= w.sum()
        return np.tensordot(w, np.stack([p.values for p in projected]), axes=1)

    def describe(self) -> dict[str, object]:
        n = [t.n for t in self.tables.values()]
        return {
            "views": len(self.tables),
            "k": self.k,
            "users_per_view": float(np.mean(n)),
            "oracles": sorted(set(self.oracles)),
        }


class AllMarginals(Mechanism):
    """AM (§3.4): one group of users per k-way marginal. ``nonnegative``: Norm-Sub each
    marginal (not in the paper, see the module docstring); ``path``: the population
    path of :func:`~calmkit_simulator.collect.collect_support`."""

    name = "AM"

    def __init__(self, nonnegative: bool = True, path: str = "fast") -> None:
        self.nonnegative, self.path = bool(nonnegative), check_path(path)

    def check(self, schema: Schema, n: int, epsilon: float, k: int) -> None:
        validate_epsilon(epsilon)
        d = schema.d
        if not is_int(k) or not 1 <= k <= d:
            raise CalmkitError(f"k ({k!r}) must be an int in [1, d={d}]")
        groups = math.comb(d, int(k))
        if groups > MAX_VIEWS:
            raise NotScalable(
                f"AM needs C(d={d}, k={k}) = {groups} marginals, one group of users each; "
                f"at most {MAX_VIEWS} are supported"
            )
        if n < groups:
            raise NotScalable(
                f"AM needs C(d={d}, k={k}) = {groups} groups of users but has only n = {n} "
                f"users (fewer than one per marginal)"
            )
        widest = math.prod(sorted(schema.sizes, reverse=True)[: int(k)])
        if widest > MAX_VIEW_CELLS:
            raise NotScalable(
                f"AM's largest {k}-way marginal has {widest} cells; at most "
                f"MAX_VIEW_CELLS = {MAX_VIEW_CELLS} are supported"
            )
        if widest < 2:
            raise NotScalable(f"AM's {k}-way marginals ({widest} cell) must have >= 2 cells")

    def run(self, population: Population, epsilon: float, k: int, rng: RngLike = None) -> Release:
        self.check(population.schema, population.n, epsilon, k)
        gen = np.random.default_rng(rng)
        seed = int(gen.integers(2**63))  # a fresh split of the users per run
        schema = population.schema
        views = tuple(combinations(range(schema.d), int(k)))
        plan = Plan(schema, validate_epsilon(epsilon), views, seed=seed)
        tables = collect_views(population, plan, gen, self.path, self.nonnegative)
        return _AllMarginalsRelease(schema, int(k), tables, [o.name for o in plan.view_oracles])
