"""Each package's public API is deliberate: its ``__all__`` pinned here (a change to
it is a change to this file, reviewed as such), every name resolves, nothing private
is exported, and docs/api.md (``python docs/api.py``) lists exactly it."""

from __future__ import annotations

import importlib
import runpy
from pathlib import Path

import pytest

PUBLIC = {
    "calmkit_client": [
        "DEFAULT_BUDGET",
        "GRR",
        "MAX_VIEW_CELLS",
        "OUE",
        "AccessDenied",
        "AdmissionRefused",
        "Attribute",
        "BudgetExceeded",
        "CalmkitError",
        "CollectionClosed",
        "CollectionError",
        "CollectionExists",
        "CollectionFull",
        "CollectionNotFound",
        "Collector",
        "DeviceState",
        "FrequencyOracle",
        "OracleError",
        "Plan",
        "PlanError",
        "PlanMismatch",
        "PrivacyBudget",
        "Report",
        "ReportConflict",
        "RetryPolicy",
        "Schema",
        "SchemaError",
        "ServiceUnavailable",
        "StorageFull",
        "TicketIssuer",
        "TicketVerifier",
        "UserId",
        "ViewReports",
        "choose_oracle",
        "default_state_path",
        "make_oracle",
        "make_report",
        "make_reports",
        "validate_epsilon",
    ],
    "calmkit_aggregator": [
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
    ],
    "calmkit_aggregator.planning": [
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
    ],
    "calmkit_aggregator.reconstruction": [
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
    ],
    "calmkit_simulator": [
        "DATASETS",
        "PATHS",
        "BayesianNetwork",
        "DatasetError",
        "Population",
        "collect_support",
        "default_data_dir",
        "load_acs",
        "load_adult",
        "load_csv",
        "load_dataset",
        "load_kosarak",
        "load_nltcs",
        "load_retail",
        "load_transactions",
        "synthetic_population",
        "true_view_counts",
    ],
}
DOCS = Path(__file__).resolve().parents[1] / "docs"


@pytest.mark.parametrize("package", list(PUBLIC))
def test_the_public_api_is_what_is_pinned(package: str) -> None:
    module = importlib.import_module(package)
    assert list(module.__all__) == PUBLIC[package]
    assert not [n for n in module.__all__ if n.startswith("_")]
    missing = [n for n in module.__all__ if not hasattr(module, n)]
    assert missing == []


def test_docs_api_md_lists_the_public_api() -> None:
    generator = runpy.run_path(str(DOCS / "api.py"))
    assert list(generator["PACKAGES"]) == list(PUBLIC)
    assert (DOCS / "api.md").read_text() == generator["render"](), (
        "docs/api.md is out of date: run python docs/api.py"
    )


def _undocumented(obj: object) -> list[str]:
    """Public methods and properties of a class (its own, not inherited from object)
    with no docstring, their own or an overridden method's."""
    import inspect

    out = []
    for name, member in vars(obj).items():
        if name.startswith("_"):
            continue
        target = member.fget if isinstance(member, property) else member
        if inspect.isfunction(target) and not inspect.getdoc(getattr(obj, name)):
            out.append(name)
    return out


@pytest.mark.parametrize("package", list(PUBLIC))
def test_every_public_name_has_a_docstring(package: str) -> None:
    import inspect

    module = importlib.import_module(package)
    missing = []
    for name in module.__all__:
        obj = getattr(module, name)
        if not (inspect.isclass(obj) or inspect.isroutine(obj)):
            continue  # a constant: its value is what the reference shows
        if len(inspect.getdoc(obj) or "") < 20:
            missing.append(name)
        if inspect.isclass(obj):
            missing += [f"{name}.{m}" for m in _undocumented(obj)]
    assert missing == []
