"""calmkit_aggregator: ingestion, estimation, consistency, reconstruction, service."""

from .calm import MarginalEstimator, reconstruct
from .consistency import ConsistentViews, intersection_closure, make_consistent, norm_sub
from .estimate import estimate_views
from .marginal import MarginalTable
from .maxent import Answer, answer_query, maximum_entropy
from .support import SupportCounts

__all__ = [
    "Answer",
    "ConsistentViews",
    "MarginalEstimator",
    "MarginalTable",
    "SupportCounts",
    "answer_query",
    "estimate_views",
    "intersection_closure",
    "make_consistent",
    "maximum_entropy",
    "norm_sub",
    "reconstruct",
]
