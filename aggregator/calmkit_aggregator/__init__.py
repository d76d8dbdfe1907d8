"""calmkit_aggregator: ingestion, estimation, consistency, reconstruction, service."""

from .calm import RECONSTRUCTIONS, Estimator, MarginalEstimator, reconstruct, reconstruct_by
from .choose import Choice, Option, balanced_views, choose_views, expected_cells
from .consistency import ConsistentViews, intersection_closure, make_consistent, norm_sub
from .covering import CoveringError, best_known_size, construct_cover, read_cover, verify_cover
from .estimate import estimate_views
from .global_model import GlobalEstimator, fit_global, reconstruct_global
from .marginal import MarginalTable
from .maxent import Answer, answer_query, maximum_entropy
from .planner import plan_collection
from .shrinkage import shrink_interactions
from .support import SupportCounts

__all__ = [
    "RECONSTRUCTIONS",
    "Answer",
    "Choice",
    "ConsistentViews",
    "CoveringError",
    "Estimator",
    "GlobalEstimator",
    "MarginalEstimator",
    "MarginalTable",
    "Option",
    "SupportCounts",
    "answer_query",
    "balanced_views",
    "best_known_size",
    "choose_views",
    "construct_cover",
    "estimate_views",
    "expected_cells",
    "fit_global",
    "intersection_closure",
    "make_consistent",
    "maximum_entropy",
    "norm_sub",
    "plan_collection",
    "read_cover",
    "reconstruct",
    "reconstruct_by",
    "reconstruct_global",
    "shrink_interactions",
    "verify_cover",
]
