"""CALM's aggregator pipeline (papers/calm-ccs18.txt §4; DESIGN.md steps 5-8):
support counts -> estimated views -> consistent, non-negative views -> answers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from calmkit_client import Plan
from calmkit_client.schema import AttrRef

from .consistency import ConsistentViews, make_consistent
from .estimate import estimate_views
from .maxent import Answer, answer_query
from .support import SupportCounts

__all__ = ["MarginalEstimator", "reconstruct"]


@dataclass(frozen=True)
class MarginalEstimator:
    """Answers any marginal query of a collection from its consistent views."""

    plan: Plan
    views: ConsistentViews
    tol: float = 1e-9
    max_iter: int = 1000

    def answer(self, attrs: Sequence[AttrRef]) -> Answer:
        """The marginal over ``attrs`` (names or positions; answered over their sorted
        positions): projection of a covering view, else maximum entropy."""
        idx = tuple(sorted(self.plan.schema.resolve(attrs)))
        shape = self.plan.schema.shape(idx)
        return answer_query(self.views.tables, idx, shape, self.tol, self.max_iter)


def reconstruct(
    support: SupportCounts, tol: float = 1e-9, max_iter: int = 100
) -> MarginalEstimator:
    """Estimate every view, make them consistent and non-negative."""
    views = make_consistent(estimate_views(support), tol=tol, max_iter=max_iter)
    return MarginalEstimator(support.plan, views)
