"""Per-view support counts: the aggregator's sufficient statistics (DESIGN.md step 4).

Support counts are sums over reports, so counts from separate batches, replicas or
files merge by addition.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from calmkit_client import Plan, PlanError, ViewReports

__all__ = ["SupportCounts"]


@dataclass(frozen=True)
class SupportCounts:
    """Report counts ``n`` (m,) int64 and support counts per view (list of (L_j,) int64)
    of one collection under ``plan``."""

    plan: Plan
    n: np.ndarray
    counts: tuple[np.ndarray, ...]

    def __post_init__(self) -> None:
        n = np.asarray(self.n, dtype=np.int64)
        if n.shape != (self.plan.m,) or (n < 0).any():
            raise PlanError(f"n (shape {n.shape}) must be {self.plan.m} counts >= 0")
        counts = tuple(np.asarray(c, dtype=np.int64) for c in self.counts)
        if len(counts) != self.plan.m:
            raise PlanError(f"counts ({len(counts)} views) must cover the plan's {self.plan.m}")
        for j, (c, oracle) in enumerate(zip(counts, self.plan.view_oracles)):
            if c.shape != (oracle.L,):
                raise PlanError(f"counts[{j}] (shape {c.shape}) must have shape ({oracle.L},)")
        object.__setattr__(self, "n", n)
        object.__setattr__(self, "counts", counts)

    @classmethod
    def zeros(cls, plan: Plan) -> SupportCounts:
        return cls(
            plan,
            np.zeros(plan.m, np.int64),
            tuple(np.zeros(o.L, np.int64) for o in plan.view_oracles),
        )

    @classmethod
    def from_reports(cls, plan: Plan, batches: Iterable[ViewReports]) -> SupportCounts:
        """Count the payloads of :func:`calmkit_client.make_reports` batches."""
        n = np.zeros(plan.m, np.int64)
        counts = [np.zeros(o.L, np.int64) for o in plan.view_oracles]
        for batch in batches:
            j = plan.check_view(batch.view)
            n[j] += batch.n
            counts[j] += plan.view_oracles[j].support(batch.payloads)
        return cls(plan, n, tuple(counts))

    def merge(self, other: SupportCounts) -> SupportCounts:
        """Counts of both collections (same plan)."""
        if other.plan.digest != self.plan.digest:
            raise PlanError(f"plan ({other.plan.digest[:12]}) must match ({self.plan.digest[:12]})")
        return SupportCounts(
            self.plan, self.n + other.n, tuple(a + b for a, b in zip(self.counts, other.counts))
        )
