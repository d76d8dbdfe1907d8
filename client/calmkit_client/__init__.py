"""calmkit_client: the embeddable LDP client.

One call turns a user's record into one perturbed report under a collection plan::

    from calmkit_client import Plan, Schema, make_report
    report = make_report(plan, {"age": "30-39", "smoker": "no"}, user_id="u-17")

or, against an aggregator service, one memoised report per user and collection::

    from calmkit_client import Collector, DeviceState
    with Collector("agg.example:50051", "survey-1", submit_token, DeviceState("state.db")) as c:
        c.submit({"age": "30-39", "smoker": "no"})

Randomness comes from the OS entropy source unless an explicit ``rng`` is passed
(simulation and tests only).
"""

from .assignment import UserId, encode_user_id, hash_user_id, hash_user_ids, xxh64_u64
from .collector import Collector, RetryPolicy
from .device import DeviceState
from .errors import (
    AccessDenied,
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
from .randomness import OsEntropy, as_random_source
from .report import REPORT_ID_BYTES, Report, ViewReports, make_report, make_reports
from .schema import Attribute, Schema

__all__ = [
    "GRR",
    "MAX_VIEW_CELLS",
    "OUE",
    "REPORT_ID_BYTES",
    "AccessDenied",
    "Attribute",
    "CalmkitError",
    "CollectionClosed",
    "CollectionError",
    "CollectionExists",
    "CollectionNotFound",
    "Collector",
    "DeviceState",
    "FrequencyOracle",
    "OracleError",
    "OsEntropy",
    "Plan",
    "PlanError",
    "PlanMismatch",
    "Report",
    "ReportConflict",
    "RetryPolicy",
    "Schema",
    "SchemaError",
    "UserId",
    "ViewReports",
    "as_random_source",
    "choose_oracle",
    "encode_user_id",
    "hash_user_id",
    "hash_user_ids",
    "make_oracle",
    "make_report",
    "make_reports",
    "validate_epsilon",
    "xxh64_u64",
]

__version__ = "0.1.0"
