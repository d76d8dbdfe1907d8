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

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .assignment import UserId
    from .budget import DEFAULT_BUDGET, PrivacyBudget
    from .collector import Collector, RetryPolicy
    from .device import DeviceState, default_state_path
    from .errors import (
        AccessDenied,
        AdmissionRefused,
        BudgetExceeded,
        CalmkitError,
        CollectionClosed,
        CollectionError,
        CollectionExists,
        CollectionFull,
        CollectionNotFound,
        OracleError,
        PlanError,
        PlanMismatch,
        ReportConflict,
        SchemaError,
        ServiceUnavailable,
        StorageFull,
    )
    from .oracles import GRR, OUE, FrequencyOracle, choose_oracle, make_oracle, validate_epsilon
    from .plan import MAX_VIEW_CELLS, Plan
    from .report import Report, ViewReports, make_report, make_reports
    from .schema import Attribute, Schema
    from .tickets import TicketIssuer, TicketVerifier
else:
    from .lazy import lazy_exports

    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            ".assignment": ("UserId",),
            ".budget": ("DEFAULT_BUDGET", "PrivacyBudget"),
            ".collector": ("Collector", "RetryPolicy"),
            ".device": ("DeviceState", "default_state_path"),
            ".errors": (
                "AccessDenied",
                "AdmissionRefused",
                "BudgetExceeded",
                "CalmkitError",
                "CollectionClosed",
                "CollectionError",
                "CollectionExists",
                "CollectionFull",
                "CollectionNotFound",
                "OracleError",
                "PlanError",
                "PlanMismatch",
                "ReportConflict",
                "SchemaError",
                "ServiceUnavailable",
                "StorageFull",
            ),
            ".oracles": (
                "GRR",
                "OUE",
                "FrequencyOracle",
                "choose_oracle",
                "make_oracle",
                "validate_epsilon",
            ),
            ".plan": ("MAX_VIEW_CELLS", "Plan"),
            ".report": ("Report", "ViewReports", "make_report", "make_reports"),
            ".schema": ("Attribute", "Schema"),
            ".tickets": ("TicketIssuer", "TicketVerifier"),
        },
    )
    del lazy_exports

__all__ = [
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
]

__version__ = "0.1.0"
