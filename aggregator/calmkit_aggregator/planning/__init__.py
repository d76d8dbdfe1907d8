"""Planning a collection: which views (attribute sets) users report on.

The entry point is :func:`plan_collection`. Its default planner (``"pipeline"``)
predicts the whole pipeline's error for candidate designs (:mod:`.error_model`) from
a data profile (:mod:`.profile`) and picks the best (:mod:`.search`); a two-phase
collection first runs a pilot on pairs of attributes to learn that profile
(:mod:`.pilot`). ``"paper"`` is Algorithm 1 of "CALM: Consistent Adaptive Local
Marginal for Marginal Release under Local Differential Privacy" (Zhang et al., CCS
2018), §4.3 (:mod:`.algorithm1`), with covering designs (:mod:`.covering`).
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..phases import PhasedDesign, combine_phases
    from .algorithm1 import Choice, choose_views
    from .collection import PLANNERS, plan_collection, workload_of
    from .covering import (
        CoveringError,
        best_known_size,
        construct_cover,
        read_cover,
        verify_cover,
    )
    from .error_model import ErrorPrediction, Workload, predict_error
    from .pilot import (
        PILOT_FRACTION,
        MainPlan,
        pilot_plan,
        pilot_size,
        plan_after_pilot,
        plan_next_phase,
        profile_from_pilot,
    )
    from .profile import DataProfile, estimate_profile
    from .search import Candidate, PlannedViews, choose_plan
else:
    from calmkit_client.lazy import lazy_exports

    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "..phases": ("PhasedDesign", "combine_phases"),
            ".algorithm1": ("Choice", "choose_views"),
            ".collection": ("PLANNERS", "plan_collection", "workload_of"),
            ".covering": (
                "CoveringError",
                "best_known_size",
                "construct_cover",
                "read_cover",
                "verify_cover",
            ),
            ".error_model": ("ErrorPrediction", "Workload", "predict_error"),
            ".pilot": (
                "PILOT_FRACTION",
                "MainPlan",
                "pilot_plan",
                "pilot_size",
                "plan_after_pilot",
                "plan_next_phase",
                "profile_from_pilot",
            ),
            ".profile": ("DataProfile", "estimate_profile"),
            ".search": ("Candidate", "PlannedViews", "choose_plan"),
        },
    )
    del lazy_exports

__all__ = [
    "PILOT_FRACTION",
    "PLANNERS",
    "Candidate",
    "Choice",
    "CoveringError",
    "DataProfile",
    "ErrorPrediction",
    "MainPlan",
    "PhasedDesign",
    "PlannedViews",
    "Workload",
    "best_known_size",
    "choose_plan",
    "choose_views",
    "combine_phases",
    "construct_cover",
    "estimate_profile",
    "pilot_plan",
    "pilot_size",
    "plan_after_pilot",
    "plan_collection",
    "plan_next_phase",
    "predict_error",
    "profile_from_pilot",
    "read_cover",
    "verify_cover",
    "workload_of",
]
