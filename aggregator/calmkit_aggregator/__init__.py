"""calmkit_aggregator: the aggregator side of calmkit.

- :mod:`.planning`: which views users report on (the default planner, its pilot, and
  Algorithm 1 of the CALM paper);
- :mod:`.reconstruction`: from support counts to consistent views and any marginal;
- :mod:`.service`: the gRPC collection service and its storage.

The names below are what most users need; each package lists the rest.
"""

from .planning import (
    DataProfile,
    PhasedDesign,
    PlannedViews,
    Workload,
    choose_plan,
    choose_views,
    combine_phases,
    pilot_plan,
    plan_after_pilot,
    plan_collection,
    predict_error,
)
from .reconstruction import (
    RECONSTRUCTIONS,
    Answer,
    Estimator,
    GlobalEstimator,
    MarginalEstimator,
    MarginalTable,
    SupportCounts,
    bootstrap,
    estimate_views,
    make_consistent,
    reconstruct,
    reconstruct_by,
)

__all__ = [
    "RECONSTRUCTIONS",
    "Answer",
    "DataProfile",
    "Estimator",
    "GlobalEstimator",
    "MarginalEstimator",
    "MarginalTable",
    "PhasedDesign",
    "PlannedViews",
    "SupportCounts",
    "Workload",
    "bootstrap",
    "choose_plan",
    "choose_views",
    "combine_phases",
    "estimate_views",
    "make_consistent",
    "pilot_plan",
    "plan_after_pilot",
    "plan_collection",
    "predict_error",
    "reconstruct",
    "reconstruct_by",
]
