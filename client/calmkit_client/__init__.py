"""calmkit_client: the embeddable LDP client.

One call turns a user's record into one perturbed report under a collection plan::

    from calmkit_client import Plan, Schema, make_report
    report = make_report(plan, {"age": "30-39", "smoker": "no"}, user_id="u-17")

Randomness comes from the OS entropy source unless an explicit ``rng`` is passed
(simulation and tests only).
"""

from .assignment import UserId, encode_user_id, hash_user_id, hash_user_ids, xxh64_u64
from .errors import CalmkitError, OracleError, PlanError, SchemaError
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
    "Attribute",
    "CalmkitError",
    "FrequencyOracle",
    "OracleError",
    "OsEntropy",
    "Plan",
    "PlanError",
    "Report",
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
