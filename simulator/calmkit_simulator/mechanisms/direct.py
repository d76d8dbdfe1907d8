"""Direct estimation shared by FC and AM (CALM (Zhang et al., "CALM: Consistent Adaptive
Local Marginal for Marginal Release under Local Differential Privacy", CCS 2018), §3.3,
§3.4): users report under a plan, each view is estimated on its own (eqs. 1, 2),
optionally Norm-Sub'd; no consistency or max-ent step."""

from __future__ import annotations

import numpy as np

from calmkit_aggregator import MarginalTable, estimate_views
from calmkit_aggregator.reconstruction import norm_sub
from calmkit_client import CalmkitError, Plan

from ..collect import PATHS, collect_support
from ..population import Population

__all__ = ["check_path", "collect_views"]


def check_path(path: str) -> str:
    """A population path of :func:`~calmkit_simulator.collect.collect_support`."""
    if path not in PATHS:
        raise CalmkitError(f"path ({path!r}) must be one of {list(PATHS)}")
    return path


def collect_views(
    population: Population,
    plan: Plan,
    rng: np.random.Generator,
    path: str,
    nonnegative: bool,
) -> list[MarginalTable]:
    """Every user reports under ``plan``; one unbiased table per view, Norm-Sub'd
    (projected onto the simplex) when ``nonnegative``."""
    support = collect_support(population, plan, rng, path=path)  # type: ignore[arg-type]
    tables = estimate_views(support)
    if nonnegative:
        tables = [MarginalTable(t.attrs, norm_sub(t.values), t.variance, t.n) for t in tables]
    return tables
