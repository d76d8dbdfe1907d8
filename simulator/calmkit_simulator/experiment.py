"""The paper's evaluation protocol (CALM, ACM CCS 2018, §5): SSE between the true and
the reconstructed k-way marginals (fractions), averaged over random k-way queries,
repeated with fresh reports and queries; mean and standard deviation over repeats.

The seed (``rng``) fixes each repetition's queries and the method's randomness as
independent streams (:mod:`.seeds`): runs that differ only in the method, the plan or
(l, m) answer the same queries in every repetition."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from calmkit_aggregator import reconstruct
from calmkit_client import CalmkitError, Plan
from calmkit_client.randomness import RngLike

from .collect import collect_support
from .mechanisms import Mechanism
from .population import Population
from .seeds import METHOD, QUERIES, root, stream

__all__ = ["MechanismRep", "RepResult", "random_queries", "run_calm", "run_mechanism", "sse"]


def random_queries(d: int, k: int, count: int, rng: RngLike = None) -> list[tuple[int, ...]]:
    """``count`` uniformly random k-subsets of ``d`` attributes (sorted tuples);
    distinct while C(d, k) allows."""
    if not 1 <= k <= d:
        raise CalmkitError(f"k ({k}) must be in [1, d={d}]")
    gen = np.random.default_rng(rng)
    distinct = math.comb(d, k) >= count
    seen: set[tuple[int, ...]] = set()
    out: list[tuple[int, ...]] = []
    while len(out) < count:
        q = tuple(sorted(gen.choice(d, size=k, replace=False).tolist()))
        if distinct and q in seen:
            continue
        seen.add(q)
        out.append(q)
    return out


def sse(truth: np.ndarray, estimate: np.ndarray) -> float:
    """Sum of squared errors over the cells of two marginals of the same shape."""
    return float(((np.asarray(truth) - np.asarray(estimate)) ** 2).sum())


@dataclass(frozen=True)
class RepResult:
    """One repetition: mean SSE over its queries for CALM and for Uniform."""

    calm_sse: float
    uniform_sse: float


def run_calm(
    population: Population,
    plan: Plan,
    k: int,
    queries: int = 50,
    reps: int = 20,
    rng: RngLike = 0,
    path: str = "fast",
    progress: Callable[[int], None] | None = None,
    shrink: bool = True,
) -> list[RepResult]:
    """``reps`` repetitions of: every user reports under ``plan``; CALM reconstructs
    (``shrink=False``: without the margins' and interactions' shrinkage, the paper's
    pipeline exactly); ``queries`` random k-way marginals are compared with the truth
    (and with Uniform).

    ``rng`` is the root seed (:func:`.seeds.root`): repetition r's reports are drawn
    from ``stream(rng, METHOD, r)`` and its queries from ``stream(rng, QUERIES, r)``, so
    the same ``rng`` gives the same reports whatever ``shrink`` is, and the same queries
    whatever the plan is."""
    base = root(rng)
    results = []
    for rep in range(reps):
        reports = np.random.default_rng(stream(base, METHOD, rep))
        support = collect_support(population, plan, reports, path=path)  # type: ignore[arg-type]
        estimator = reconstruct(support, shrink=shrink)
        calm, uniform = [], []
        for q in random_queries(population.d, k, queries, stream(base, QUERIES, rep)):
            truth = population.marginal(q)
            calm.append(sse(truth, estimator.answer(q).values))
            uniform.append(sse(truth, np.full(truth.shape, 1.0 / truth.size)))
        results.append(RepResult(float(np.mean(calm)), float(np.mean(uniform))))
        if progress is not None:
            progress(1)
    return results


@dataclass(frozen=True)
class MechanismRep:
    """One repetition of a mechanism: mean SSE over its queries, Uniform's on the
    same queries, the wall time of collection + release + answers, what the
    mechanism chose (``describe()``) and the queries (sorted attribute positions)."""

    sse: float
    uniform_sse: float
    seconds: float
    chosen: dict[str, object]
    queries: tuple[tuple[int, ...], ...] = ()


def run_mechanism(
    population: Population,
    mechanism: Mechanism,
    epsilon: float,
    k: int,
    queries: int = 50,
    reps: int = 20,
    rng: RngLike = 0,
    progress: Callable[[int], None] | None = None,
) -> list[MechanismRep]:
    """The evaluation protocol (§5) for any :class:`Mechanism`: ``reps`` times, run it
    on the population and compare ``queries`` random k-way answers with the truth.
    :meth:`Mechanism.check` runs first, so an infeasible setting fails before work.

    ``rng`` is the root seed (:func:`.seeds.root`): repetition r's queries are drawn
    from ``stream(rng, QUERIES, r)`` and the mechanism runs on ``stream(rng, METHOD,
    r)``. Neither depends on the mechanism, so two calls that differ only in it answer
    the same queries in every repetition (``MechanismRep.queries``)."""
    mechanism.check(population.schema, population.n, epsilon, k)
    base = root(rng)
    results = []
    for rep in range(reps):
        qs = random_queries(population.d, k, queries, stream(base, QUERIES, rep))
        t0 = time.perf_counter()
        release = mechanism.run(
            population, epsilon, k, np.random.default_rng(stream(base, METHOD, rep))
        )
        errors, uniform = [], []
        for q, answer in zip(qs, release.answer_many(qs)):
            truth = population.marginal(q)
            errors.append(sse(truth, answer))
            uniform.append(sse(truth, np.full(truth.shape, 1.0 / truth.size)))
        seconds = time.perf_counter() - t0
        results.append(
            MechanismRep(
                float(np.mean(errors)),
                float(np.mean(uniform)),
                seconds,
                release.describe(),
                tuple(qs),
            )
        )
        if progress is not None:
            progress(1)
    return results
