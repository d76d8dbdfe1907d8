"""CALM's aggregator pipeline (Zhang et al., "CALM: Consistent Adaptive Local Marginal
for Marginal Release under Local Differential Privacy", CCS 2018, §4.2, Fig. 2 steps
2-4): support counts -> estimated views -> consistent, non-negative views -> answers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from calmkit_client import Plan
from calmkit_client.schema import AttrRef

from .consistency import ConsistentViews, make_consistent
from .estimate import contrast_variances, estimate_views, side_margins
from .global_model import reconstruct_global
from .maxent import Answer, answer_query
from .methods import check_reconstruction
from .shrinkage import shrink_interactions, shrink_margins
from .support import SupportCounts

__all__ = ["Estimator", "MarginalEstimator", "reconstruct", "reconstruct_by"]


@dataclass(frozen=True)
class MarginalEstimator:
    """Answers any marginal query of a collection from its consistent views.

    ``shrinkage``: each view's interaction factor lambda (1 = kept as estimated; see
    :mod:`calmkit_aggregator.reconstruction.shrinkage`), or None when shrinkage was off;
    ``margins``: each attribute position's margin factor (1 = kept; see
    :func:`~.shrinkage.shrink_margins`), or None when shrinkage was off.
    """

    plan: Plan
    views: ConsistentViews
    tol: float = 1e-9
    max_iter: int = 1000
    shrinkage: np.ndarray | None = None
    margins: Mapping[int, float] | None = None

    def answer(self, attrs: Sequence[AttrRef]) -> Answer:
        """The marginal over ``attrs`` (names or positions; answered over their sorted
        positions): projection of a covering view, else maximum entropy."""
        idx = tuple(sorted(self.plan.schema.resolve(attrs)))
        shape = self.plan.schema.shape(idx)
        return answer_query(self.views.tables, idx, shape, self.tol, self.max_iter)


def reconstruct(
    support: SupportCounts, tol: float = 1e-9, max_iter: int = 1000, shrink: bool = True
) -> MarginalEstimator:
    """Estimate every view, make them consistent and non-negative, then answer by
    max-ent. Unless ``shrink=False`` (the paper's pipeline exactly), each attribute's
    nearly flat margin is first shrunk towards uniform and, after consistency, each
    view's unshared interactions towards max-ent, both by their estimated
    signal-to-noise ratio (:mod:`.shrinkage`). Views measured more than once under one
    oracle are pooled first (:meth:`~.support.SupportCounts.pooled`); the margins of a
    phase in ``support.margins_from`` join the consistency step
    (:func:`~.estimate.side_margins`)."""
    support = support.pooled()
    side = side_margins(support)
    if not shrink:
        views = make_consistent(estimate_views(support), tol=tol, max_iter=max_iter, side=side)
        return MarginalEstimator(support.plan, views)
    contrast = contrast_variances(support)
    margins = shrink_margins(estimate_views(support), contrast)
    views = make_consistent(margins.tables, tol=tol, max_iter=max_iter, side=side)
    shrunk = shrink_interactions(views.tables, contrast, closure=views.closure)
    views = replace(views, tables=shrunk.tables)
    return MarginalEstimator(support.plan, views, shrinkage=shrunk.factors, margins=margins.factors)


class Estimator(Protocol):
    """What answers a collection's marginal queries: local max-ent
    (:class:`MarginalEstimator`) or the global model
    (:class:`~.global_model.GlobalEstimator`), as Private-PGM's estimators share one
    interface. ``views``: the consistent views the answers meet; ``shrinkage``: each
    view's interaction factor (None when shrinkage was off)."""

    @property
    def plan(self) -> Plan:
        """The plan the reports were made under."""
        ...

    @property
    def views(self) -> ConsistentViews:
        """The views after consistency and Norm-Sub."""
        ...

    @property
    def shrinkage(self) -> np.ndarray | None:
        """Per view, the factor its unshared interactions were shrunk by (None: not
        shrunk)."""
        ...

    @property
    def margins(self) -> Mapping[int, float] | None:
        """Per attribute position, the factor its margin was shrunk towards uniform by
        (None: not shrunk)."""
        ...

    def answer(self, attrs: Sequence[AttrRef]) -> Answer:
        """The marginal over ``attrs`` (names or positions)."""
        ...


def reconstruct_by(
    support: SupportCounts, reconstruction: str = "local", shrink: bool = True
) -> Estimator:
    """:func:`reconstruct` (``"local"``) or :func:`~.global_model.reconstruct_global`
    (``"global"``) of ``support``; ``shrink`` turns the margins' shrinkage (both), the
    interactions' shrinkage (local) or prior (global) on or off."""
    if check_reconstruction(reconstruction) == "local":
        return reconstruct(support, shrink=shrink)
    return reconstruct_global(support, shrink=shrink)
