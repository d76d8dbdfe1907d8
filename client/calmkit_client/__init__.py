"""calmkit_client: the embeddable LDP client.

One call turns a user's record into one perturbed report under a collection plan::

    from calmkit_client import Plan, Schema, make_report
    report = make_report(plan, {"age": "30-39", "smoker": "no"}, user_id="u-17")

or, against an aggregator service, one memoised report per user and collection::

    from calmkit_client import Collector
    with Collector("agg.example:50051", "survey-1", submit_token) as c:
        c.submit({"age": "30-39", "smoker": "no"})

The device keeps its secret, its reports and its privacy ledger in a per-user file
(:func:`default_state_path`; pass ``state=DeviceState(path)`` to choose it), and
refuses reports beyond its :class:`PrivacyBudget`. Reports draw every random bit from
the OS entropy source; the device API takes no seed or generator. Simulations use
:func:`make_reports` / ``FrequencyOracle.perturb`` with a numpy Generator.

The names below load on first use (PEP 562): an app, or the ``calmkit`` command
line, imports only the modules it uses.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .assignment import UserId
    from .budget import DEFAULT_BUDGET, PrivacyBudget
    from .collector import Collector, RetryPolicy
    from .device import DeviceState, default_state_path
    from .errors import (
        AccessDenied,
        BudgetExceeded,
        CalmkitError,
        CollectionClosed,
        CollectionError,
        CollectionExists,
        CollectionNotFound,
        OracleError,
        PlanError,
        PlanMismatch,
        ReportConflict,
        SchemaError,
    )
    from .oracles import GRR, OUE, FrequencyOracle, choose_oracle, make_oracle, validate_epsilon
    from .plan import MAX_VIEW_CELLS, Plan
    from .report import Report, ViewReports, make_report, make_reports
    from .schema import Attribute, Schema

_WHERE = {
    "UserId": "assignment",
    "DEFAULT_BUDGET": "budget", "PrivacyBudget": "budget",
    "Collector": "collector", "RetryPolicy": "collector",
    "DeviceState": "device", "default_state_path": "device",
    "AccessDenied": "errors", "BudgetExceeded": "errors", "CalmkitError": "errors",
    "CollectionClosed": "errors", "CollectionError": "errors", "CollectionExists": "errors",
    "CollectionNotFound": "errors", "OracleError": "errors", "PlanError": "errors",
    "PlanMismatch": "errors", "ReportConflict": "errors", "SchemaError": "errors",
    "GRR": "oracles", "OUE": "oracles", "FrequencyOracle": "oracles",
    "choose_oracle": "oracles", "make_oracle": "oracles", "validate_epsilon": "oracles",
    "MAX_VIEW_CELLS": "plan", "Plan": "plan",
    "Report": "report", "ViewReports": "report",
    "make_report": "report", "make_reports": "report",
    "Attribute": "schema", "Schema": "schema",
}  # fmt: skip

__all__ = [
    "DEFAULT_BUDGET",
    "GRR",
    "MAX_VIEW_CELLS",
    "OUE",
    "AccessDenied",
    "Attribute",
    "BudgetExceeded",
    "CalmkitError",
    "CollectionClosed",
    "CollectionError",
    "CollectionExists",
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
    "UserId",
    "ViewReports",
    "choose_oracle",
    "default_state_path",
    "make_oracle",
    "make_report",
    "make_reports",
    "validate_epsilon",
]

__version__ = "0.1.0"
assert sorted(__all__) == sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'calmkit_client' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})
