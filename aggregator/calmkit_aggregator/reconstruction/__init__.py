"""Reconstruction: from the reports' support counts to any marginal.

:func:`reconstruct_by` runs the pipeline of "CALM: Consistent Adaptive Local Marginal
for Marginal Release under Local Differential Privacy" (Zhang et al., CCS 2018), §4.4
and §4.5: estimate each view (:mod:`.estimate`), make the views consistent and non-
negative (:mod:`.consistency`) after shrinking nearly flat margins towards uniform,
shrink each view's unshared interactions (:mod:`.shrinkage`), then answer a query by
maximum entropy (:mod:`.maxent`, "local") or from one model of all views
(:mod:`.global_model`, "global"). Both answer through the :class:`Estimator` protocol;
:mod:`.uncertainty` gives their error bars."""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .consistency import ConsistentViews, intersection_closure, make_consistent, norm_sub
    from .estimate import estimate_views
    from .global_model import GlobalEstimator, fit_global, reconstruct_global
    from .marginal import MarginalTable
    from .maxent import Answer, answer_query, maximum_entropy
    from .methods import RECONSTRUCTIONS
    from .pipeline import Estimator, MarginalEstimator, reconstruct, reconstruct_by
    from .shrinkage import shrink_interactions, shrink_margins
    from .support import SupportCounts
    from .uncertainty import Bootstrap, bootstrap
else:
    from calmkit_client.lazy import lazy_exports

    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            ".consistency": (
                "ConsistentViews",
                "intersection_closure",
                "make_consistent",
                "norm_sub",
            ),
            ".estimate": ("estimate_views",),
            ".global_model": ("GlobalEstimator", "fit_global", "reconstruct_global"),
            ".marginal": ("MarginalTable",),
            ".maxent": ("Answer", "answer_query", "maximum_entropy"),
            ".methods": ("RECONSTRUCTIONS",),
            ".pipeline": ("Estimator", "MarginalEstimator", "reconstruct", "reconstruct_by"),
            ".shrinkage": ("shrink_interactions", "shrink_margins"),
            ".support": ("SupportCounts",),
            ".uncertainty": ("Bootstrap", "bootstrap"),
        },
    )
    del lazy_exports

__all__ = [
    "RECONSTRUCTIONS",
    "Answer",
    "Bootstrap",
    "ConsistentViews",
    "Estimator",
    "GlobalEstimator",
    "MarginalEstimator",
    "MarginalTable",
    "SupportCounts",
    "answer_query",
    "bootstrap",
    "estimate_views",
    "fit_global",
    "intersection_closure",
    "make_consistent",
    "maximum_entropy",
    "norm_sub",
    "reconstruct",
    "reconstruct_by",
    "reconstruct_global",
    "shrink_interactions",
    "shrink_margins",
]
