"""calmkit_aggregator: the aggregator side of calmkit.

- :mod:`.planning`: which views users report on (the default planner, its pilot, and
  Algorithm 1 of the CALM paper);
- :mod:`.reconstruction`: from support counts to consistent views and any marginal;
- :mod:`.service`: the gRPC collection service and its storage.

The names below are what most users need; each package lists the rest. They load on
first use (PEP 562), so importing the package (as the ``calmkit`` command line does to
list the service's commands) needs nothing of the aggregator extra.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

_WHERE = {
    "DataProfile": "planning",
    "PhasedDesign": "planning",
    "PlannedViews": "planning",
    "Workload": "planning",
    "choose_plan": "planning",
    "choose_views": "planning",
    "combine_phases": "planning",
    "pilot_plan": "planning",
    "plan_after_pilot": "planning",
    "plan_collection": "planning",
    "predict_error": "planning",
    "RECONSTRUCTIONS": "reconstruction",
    "Answer": "reconstruction",
    "Estimator": "reconstruction",
    "GlobalEstimator": "reconstruction",
    "MarginalEstimator": "reconstruction",
    "MarginalTable": "reconstruction",
    "SupportCounts": "reconstruction",
    "bootstrap": "reconstruction",
    "estimate_views": "reconstruction",
    "make_consistent": "reconstruction",
    "reconstruct": "reconstruction",
    "reconstruct_by": "reconstruction",
}
_SUBPACKAGES = ("planning", "reconstruction", "service")

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
assert sorted(__all__) == sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        return importlib.import_module(f".{name}", __name__)
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'calmkit_aggregator' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE, *_SUBPACKAGES})
