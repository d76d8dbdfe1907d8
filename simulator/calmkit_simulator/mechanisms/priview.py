"""PriView, the central reference of CALM (Zhang et al., "CALM: Consistent Adaptive
Local Marginal for Marginal Release under Local Differential Privacy", CCS 2018), §4.1
and Fig. 8: a trusted curator computes the same views as CALM over all n records, adds
Laplace noise of scale m/epsilon to every count (one record touches one cell in each of
the m views: L1 sensitivity m under add/remove-one), then runs the same consistency,
shrinkage and maximum-entropy steps."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from calmkit_aggregator import MarginalTable, make_consistent, plan_collection
from calmkit_aggregator.reconstruction import answer_query
from calmkit_aggregator.reconstruction.shrinkage import shrink_interactions
from calmkit_client import validate_epsilon
from calmkit_client.randomness import RngLike

from ..population import Population
from .base import Mechanism, Release

__all__ = ["PriView", "laplace_views"]


class _TablesRelease(Release):
    def __init__(
        self,
        tables: Sequence[MarginalTable],
        shape_of: Callable[[tuple[int, ...]], tuple[int, ...]],
        chosen: dict[str, object],
    ) -> None:
        self.tables, self.shape_of, self.chosen = tuple(tables), shape_of, chosen

    def answer(self, attrs: Sequence[int]) -> np.ndarray:
        query = tuple(sorted(attrs))
        return answer_query(self.tables, query, self.shape_of(query)).values

    def describe(self) -> dict[str, object]:
        return dict(self.chosen)


def laplace_views(
    population: Population,
    views: Sequence[tuple[int, ...]],
    epsilon: float,
    rng: RngLike = None,
) -> list[MarginalTable]:
    """Every view's marginal over all n records plus Laplace(m/eps) per count, as
    fractions with per-cell variance ``2 (m/eps)^2 / n^2`` (epsilon-DP in total)."""
    eps = validate_epsilon(epsilon, "epsilon")
    gen = np.random.default_rng(rng)
    n, scale = population.n, len(views) / eps
    variance = 2 * scale**2 / n**2  # Laplace(b) has variance 2 b^2; counts / n
    tables = []
    for view in views:
        counts = population.marginal(view) * n
        noisy = counts + gen.laplace(0.0, scale, size=counts.shape)
        tables.append(MarginalTable(view, noisy / n, variance, n))
    return tables


class PriView(Mechanism):
    """Laplace(m/eps) on CALM's views (Algorithm 1 for the same n, eps, k, or fixed
    ``m``/``l``), then consistency, Norm-Sub, shrinkage (unless off) and max-ent."""

    name = "PriView"
    privacy_unit = "central epsilon-DP (add/remove one record); trusted curator"

    def __init__(
        self,
        theta: float = 0.001,
        m: int | None = None,
        l: int | None = None,  # noqa: E741 (the paper's name)
        shrink: bool = True,
    ) -> None:
        self.theta, self.m, self.l, self.shrink = theta, m, l, shrink

    def run(self, population: Population, epsilon: float, k: int, rng: RngLike = None) -> Release:
        eps = validate_epsilon(epsilon, "epsilon")
        gen = np.random.default_rng(rng)
        seed = int(gen.integers(2**31))
        plan = plan_collection(
            population.schema,
            eps,
            population.n,
            k,
            theta=self.theta,
            l=self.l,
            m=self.m,
            rng=seed,
            seed=seed,
            planner="paper",
        )
        tables = laplace_views(population, plan.views, eps, gen)
        final = make_consistent(tables).tables
        if self.shrink:  # iid noise: the contrast variance is the per-cell variance
            final = shrink_interactions(final, [t.variance for t in tables]).tables
        chosen: dict[str, object] = {"m": plan.m, "l": max(len(v) for v in plan.views)}
        return _TablesRelease(final, population.schema.shape, chosen)
