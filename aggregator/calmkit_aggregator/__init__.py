"""calmkit_aggregator: the aggregator side of calmkit.

- :mod:`.planning`: which views users report on (the default planner, its pilot, and
  Algorithm 1 of the CALM paper);
- :mod:`.reconstruction`: from support counts to consistent views and any marginal;
- :mod:`.phases`: a collection in phases (the design storage keeps, and the phases'
  counts combined);
- :mod:`.service`: the gRPC collection service and its storage.

The names below are what most users need; each package lists the rest. They are
imported on first use (:mod:`calmkit_client.lazy`), so importing a light module such as the storage
loads neither the planner nor scipy.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .phases import PhasedDesign, combine_phases
    from .planning import (
        DataProfile,
        PlannedViews,
        Workload,
        choose_plan,
        choose_views,
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
else:
    from calmkit_client.lazy import lazy_exports

    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            ".phases": ("PhasedDesign", "combine_phases"),
            ".planning": (
                "DataProfile",
                "PlannedViews",
                "Workload",
                "choose_plan",
                "choose_views",
                "pilot_plan",
                "plan_after_pilot",
                "plan_collection",
                "predict_error",
            ),
            ".reconstruction": (
                "RECONSTRUCTIONS",
                "Answer",
                "Estimator",
                "GlobalEstimator",
                "MarginalEstimator",
                "MarginalTable",
                "SupportCounts",
                "bootstrap",
                "estimate_views",
                "make_consistent",
                "reconstruct",
                "reconstruct_by",
            ),
        },
    )
    del lazy_exports

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
