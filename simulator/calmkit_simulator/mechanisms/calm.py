"""CALM as a harness mechanism (papers/calm-ccs18.txt §4): Algorithm 1's plan, the
fast population path, consistency, shrinkage (unless off) and maximum entropy."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from calmkit_aggregator import MarginalEstimator, plan_collection, reconstruct
from calmkit_client.randomness import RngLike

from ..collect import collect_support
from ..population import Population
from .base import Mechanism, Release

__all__ = ["Calm"]


class _CalmRelease(Release):
    def __init__(self, estimator: MarginalEstimator) -> None:
        self.estimator = estimator

    def answer(self, attrs: Sequence[int]) -> np.ndarray:
        return self.estimator.answer(tuple(sorted(attrs))).values

    def describe(self) -> dict[str, object]:
        plan = self.estimator.plan
        return {"m": plan.m, "l": max(len(v) for v in plan.views)}


class Calm(Mechanism):
    """CALM with Algorithm 1 (or fixed ``m``/``l``), theta and the collection path."""

    name = "CALM"

    def __init__(
        self,
        theta: float = 0.001,
        m: int | None = None,
        l: int | None = None,  # noqa: E741 (the paper's name)
        path: str = "fast",
        shrink: bool = True,
    ) -> None:
        self.theta, self.m, self.l, self.path, self.shrink = theta, m, l, path, shrink

    def run(self, population: Population, epsilon: float, k: int, rng: RngLike = None) -> Release:
        gen = np.random.default_rng(rng)  # type: ignore[arg-type]
        seed = int(gen.integers(2**31))
        plan = plan_collection(population.schema, epsilon, population.n, k, theta=self.theta,
                               l=self.l, m=self.m, rng=seed, seed=seed)  # fmt: skip
        support = collect_support(population, plan, gen, path=self.path)
        return _CalmRelease(reconstruct(support, shrink=self.shrink))
