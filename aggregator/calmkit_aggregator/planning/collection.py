"""Planning a collection, the aggregator's first step: the views, the adaptive oracle
per view, equal shares.

Two planners:

- ``"pipeline"`` (the default): :func:`~.search.choose_plan`, which predicts the
  whole pipeline's error for the workload under a data profile. With a pilot
  (:mod:`.pilot`) the profile comes from the first users' reports.
- ``"paper"``: CALM's Algorithm 1 (Zhang et al., "CALM: Consistent Adaptive Local Marginal
  for Marginal Release under Local Differential Privacy", CCS 2018, §4.3;
  :func:`~.algorithm1.choose_views`),
  as the paper's evaluation and the figure reproduction use it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from calmkit_client import Plan, PlanError, Schema

from .algorithm1 import DEFAULT_THETA, choose_views
from .error_model import Workload
from .profile import DataProfile
from .search import choose_plan

__all__ = ["PLANNERS", "plan_collection", "workload_of"]

PLANNERS = ("pipeline", "paper")


def workload_of(
    schema: Schema, k: int | None, queries: Sequence[Sequence[int | str]] | None
) -> Workload:
    """The workload of ``k``-way marginals or of explicit queries (names or positions)."""
    if queries is not None:
        return Workload(queries=tuple(tuple(schema.resolve(q)) for q in queries))
    if k is None:
        raise PlanError("k (None) must be given when no queries are")
    return Workload(k=k)


def plan_collection(
    schema: Schema,
    epsilon: float,
    n: int,
    k: int | None,
    theta: float = DEFAULT_THETA,
    l: int | None = None,  # noqa: E741 (the paper's name)
    m: int | None = None,
    rng: int = 0,
    seed: int = 0,
    covering_dir: Path | str | None = None,
    planner: str = "pipeline",
    profile: DataProfile | None = None,
    queries: Sequence[Sequence[int | str]] | None = None,
    reconstruction: str = "local",
) -> Plan:
    """The plan for ``n`` users answering k-way queries (or ``queries``).

    ``planner="pipeline"``: views chosen by the pipeline's predicted error under
    ``profile`` (default: the prior, :meth:`DataProfile.prior`); ``"paper"``:
    Algorithm 1 with threshold ``theta``. ``l`` and ``m`` may be fixed in both. Each
    view's oracle is the one with the smaller variance (§2.2.3), users are split
    equally, and ``seed`` is the assignment hash seed. ``reconstruction`` ("local" or
    "global"): how the answers will be reconstructed, which the pipeline planner's
    error model predicts (Algorithm 1 ignores it).
    """
    if planner == "paper":
        if k is None:
            raise PlanError("k (None) must be given to the paper's planner (Algorithm 1)")
        choice = choose_views(
            schema.sizes, epsilon, n, k, theta=theta, rng=rng, covering_dir=covering_dir, l=l, m=m
        )
        return Plan(schema, epsilon, choice.views, seed=seed)
    if planner != "pipeline":
        raise PlanError(f"planner ({planner!r}) must be one of {list(PLANNERS)}")
    chosen = choose_plan(
        schema.sizes,
        epsilon,
        n,
        workload_of(schema, k, queries),
        profile,
        l=l,
        m=m,
        rng=rng,
        covering_dir=covering_dir,
        reconstruction=reconstruction,
    )
    return Plan(schema, epsilon, chosen.views, seed=seed)
