"""Server-side conversions between v1 wire messages and calmkit's dataclasses; the
only aggregator module that touches generated protobuf classes. Every field of an
incoming message is validated here, with errors naming the field and value."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
from google.protobuf.message import DecodeError

from calmkit_client import CalmkitError, Plan
from calmkit_client.errors import AdmissionRefused
from calmkit_client.report import REPORT_ID_BYTES
from calmkit_client.tickets import TicketVerifier
from calmkit_client.wire import (
    CollectionInfo,
    MarginalAnswer,
    collection_from_proto,
    marginal_from_proto,
    plan_to_proto,
    schema_from_proto,
)
from calmkit_proto.v1 import calmkit_pb2 as pb
from calmkit_proto.v1 import calmkit_pb2_grpc as pb_grpc

from ..planning.collection import PLANNERS
from ..planning.pilot import PILOT_FRACTION
from ..reconstruction.maxent import Answer
from ..reconstruction.methods import check_reconstruction
from .columns import ReportColumns, decode_columns
from .store import CollectionRecord, StoredReport

__all__ = [
    "MAX_BATCH",
    "AggregatorServicer",
    "CreateParams",
    "ack_to_proto",
    "add_servicer",
    "collection_list_to_proto",
    "collection_to_proto",
    "columns_from_proto",
    "create_from_proto",
    "marginal_to_proto",
    "reports_from_proto",
    "tickets_from_proto",
]

MAX_BATCH = 10_000  # reports per SubmitReports call
PSEUDONYM_BYTES = 16
AggregatorServicer = pb_grpc.AggregatorServicer
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Aggregator"].full_name


def picks_collection_id(request: Any) -> bool:
    """Whether an empty collection_id asks the server to pick one (CreateCollection)."""
    return isinstance(request, pb.CreateCollectionRequest)


def add_servicer(servicer: Any, server: Any, guard: Any = None) -> None:
    """Register ``servicer``'s methods; requests arrive as bytes and are parsed here,
    so a message that does not decode is INVALID_ARGUMENT (not INTERNAL). With a
    ``guard`` (:class:`~.limits.Guard`), each method is served by its request-streaming
    wrapper, which checks the metadata and the body's size before parsing."""
    methods = pb.DESCRIPTOR.services_by_name["Aggregator"].methods
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
    for m in methods:
        handle = _parsing(getattr(servicer, m.name), getattr(pb, m.input_type.name))
        serialize = getattr(pb, m.output_type.name).SerializeToString
        if guard is None:
            handlers[m.name] = grpc.unary_unary_rpc_method_handler(
                handle, request_deserializer=None, response_serializer=serialize
            )
        else:
            handlers[m.name] = grpc.stream_unary_rpc_method_handler(
                guard.wrap(m.name, handle), request_deserializer=None, response_serializer=serialize
            )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))


def _parsing(handler: Any, message: Any) -> Any:
    def parse_then_handle(raw: bytes, context: grpc.ServicerContext) -> Any:
        try:
            request = message.FromString(raw)
        except DecodeError:
            context.set_trailing_metadata((("calmkit-error", "CalmkitError"),))
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"request ({len(raw)} bytes) is not a valid {message.DESCRIPTOR.full_name} message",
            )
        return handler(request, context)

    return parse_then_handle


@dataclass(frozen=True)
class CreateParams:
    """A validated CreateCollection request."""

    collection_id: str
    schema: Any
    epsilon: float
    expected_n: int
    k: int
    theta: float | None
    views: tuple[tuple[int, ...], ...]
    m: int | None
    l: int | None  # noqa: E741 (the paper's name)
    seed: int
    planner: str = "pipeline"
    pilot: float = PILOT_FRACTION
    reconstruction: str = "local"  # what the pipeline planner plans for
    max_reports: int = 0  # the report cap (0: the default, DEFAULT_CAP x expected_n)
    admission: TicketVerifier | None = None  # the tickets reports need (None: none)


def admission_from_proto(msg: Any) -> TicketVerifier | None:
    """The ``admission`` of a CreateCollection request, validated (scheme, key
    length, a valid Ed25519 public key); None when absent."""
    if not msg.HasField("admission"):
        return None
    try:
        return TicketVerifier(str(msg.admission.scheme), bytes(msg.admission.key))
    except CalmkitError as exc:
        raise CalmkitError(f"admission.{exc}") from None


def create_from_proto(msg: Any) -> CreateParams:
    if not msg.HasField("schema") or not msg.schema.attributes:
        raise CalmkitError("schema (empty) must list at least one attribute")
    schema = schema_from_proto(msg.schema)
    if not math.isfinite(msg.epsilon) or msg.epsilon <= 0:
        raise CalmkitError(f"epsilon ({msg.epsilon!r}) must be finite and > 0")
    views = tuple(tuple(int(a) for a in v.attributes) for v in msg.views)
    if not views and msg.expected_n < 1:
        raise CalmkitError(f"expected_n ({msg.expected_n}) must be >= 1 (or give views)")
    if not 1 <= msg.k <= schema.d:
        raise CalmkitError(f"k ({msg.k}) must be in [1, {schema.d}]")
    planner = msg.planner or "pipeline"
    if planner not in PLANNERS:
        raise CalmkitError(f"planner ({msg.planner[:40]!r}) must be one of {list(PLANNERS)}")
    pilot = msg.pilot if msg.HasField("pilot") else PILOT_FRACTION
    if not (math.isfinite(pilot) and 0 <= pilot < 1):
        raise CalmkitError(f"pilot ({pilot!r}) must be a fraction in [0, 1)")
    reconstruction = str(msg.reconstruction) or "local"
    check_reconstruction(reconstruction)
    return CreateParams(
        collection_id=msg.collection_id,
        schema=schema,
        epsilon=float(msg.epsilon),
        expected_n=int(msg.expected_n),
        k=int(msg.k),
        theta=msg.theta if msg.HasField("theta") else None,
        views=views,
        m=int(msg.m) if msg.HasField("m") else None,
        l=int(msg.l) if msg.HasField("l") else None,
        seed=int(msg.seed),
        planner=planner,
        pilot=float(pilot),
        reconstruction=reconstruction,
        max_reports=int(msg.max_reports),
        admission=admission_from_proto(msg),
    )


def tickets_from_proto(msg: Any) -> bytes:
    """The batch's admission tickets concatenated in batch order: a ``ColumnarBatch``'s
    ``tickets``, or the ``ReportBatch`` reports' ``ticket`` fields joined (each must
    have the length of the first, else the batch is refused naming the report)."""
    if isinstance(msg, pb.ColumnarBatch):
        return bytes(msg.tickets)
    tickets = [r.ticket for r in msg.reports]
    size = len(tickets[0]) if tickets else 0
    for i, t in enumerate(tickets):
        if len(t) != size:
            raise AdmissionRefused(
                f"reports[{i}].ticket ({len(t)} bytes) must be as long as reports[0].ticket "
                f"({size} bytes)"
            )
    return b"".join(tickets)


def reports_from_proto(msg: Any, plan: Plan) -> list[StoredReport]:
    """Validate a batch field by field against ``plan`` (view range, payload kind and
    size, GRR cell < L, OUE length and zero padding bits, id lengths); the first bad
    field raises, naming it, so the batch is refused whole."""
    n = len(msg.reports)
    if n > MAX_BATCH:
        raise CalmkitError(f"reports ({n} in one batch) must be at most {MAX_BATCH}")
    oracles = plan.view_oracles
    out = []
    for i, r in enumerate(msg.reports):
        if not r.view < plan.m:
            raise CalmkitError(f"reports[{i}].view ({r.view}) must be in [0, {plan.m})")
        oracle = oracles[r.view]
        kind = r.WhichOneof("payload")
        if oracle.name == "GRR":
            if kind != "cell":
                raise CalmkitError(f"reports[{i}].payload ({kind}) must be a cell (GRR view)")
            if not r.cell < oracle.L:
                raise CalmkitError(f"reports[{i}].cell ({r.cell}) must be < L = {oracle.L}")
            payload: int | bytes = int(r.cell)
        else:
            if kind != "bits":
                raise CalmkitError(f"reports[{i}].payload ({kind}) must be bits (OUE view)")
            nbytes = (oracle.L + 7) // 8
            if len(r.bits) != nbytes:
                raise CalmkitError(
                    f"reports[{i}].bits ({len(r.bits)} bytes) must be {nbytes} bytes (L = "
                    f"{oracle.L})"
                )
            pad = nbytes * 8 - oracle.L
            if pad and r.bits[-1] & ((1 << pad) - 1):
                raise CalmkitError(
                    f"reports[{i}].bits (last byte {r.bits[-1]:#04x}) must have its {pad} "
                    "padding bits zero"
                )
            payload = bytes(r.bits)
        for name, value, size in (
            ("report_id", r.report_id, REPORT_ID_BYTES),
            ("pseudonym", r.pseudonym, PSEUDONYM_BYTES),
        ):
            if len(value) != size:
                raise CalmkitError(f"reports[{i}].{name} ({len(value)} bytes) must be {size}")
        out.append(StoredReport(bytes(r.report_id), bytes(r.pseudonym), int(r.view), payload))
    return out


def columns_from_proto(msg: Any, plan: Plan) -> ReportColumns:
    """Validate a ``ColumnarBatch`` against ``plan`` with whole-array operations
    (:func:`~.columns.decode_columns`); the first bad field raises, naming it."""
    if msg.count > MAX_BATCH:
        raise CalmkitError(f"count ({msg.count} reports in one batch) must be at most {MAX_BATCH}")
    return decode_columns(
        plan,
        int(msg.count),
        report_ids=msg.report_ids,
        pseudonyms=msg.pseudonyms,
        views=msg.views,
        cells=msg.cells,
        bits=msg.bits,
    )


def ack_to_proto(accepted: int, duplicates: int) -> Any:
    return pb.Ack(accepted=accepted, duplicates=duplicates)


_STATES = {"open": pb.COLLECTION_STATE_OPEN, "closed": pb.COLLECTION_STATE_CLOSED}


def collection_to_proto(
    record: CollectionRecord,
    view_reports: Sequence[int],
    submit_token: str | None = None,
    flags: Sequence[str] = (),
) -> Any:
    return pb.Collection(
        collection_id=record.collection_id,
        state=_STATES[record.state],
        plan=plan_to_proto(record.plan),
        k=record.k,
        reports=record.reports,
        view_reports=[int(x) for x in view_reports],
        created_at=record.created_at,
        closed_at=record.closed_at or 0.0,
        submit_token=submit_token or "",
        phase=record.phase,
        phase_reports=list(record.phase_reports),
        pilot_target=0 if record.design is None else record.design.pilot_reports,
        max_reports=record.max_reports,
        flags=list(flags),
        pilot_check=record.pilot_check,
        admission="" if record.admission is None else record.admission.fingerprint,
        expected_n=record.expected_users,
    )


def collection_list_to_proto(items: Sequence[Any]) -> Any:
    return pb.CollectionList(collections=list(items))


def plan_message(plan: Plan) -> Any:
    return plan_to_proto(plan)


def marginal_to_proto(
    answer: Answer,
    names: Sequence[str],
    variance: np.ndarray,
    reports: int,
    state: str,
    variance_method: str = "",
    replicates: int = 0,
    flags: Sequence[str] = (),
    max_shift_per_share: float = 0.0,
) -> Any:
    return pb.MarginalTable(
        attributes=list(names),
        shape=list(answer.values.shape),
        values=answer.values.reshape(-1).tolist(),
        variance=np.broadcast_to(variance, answer.values.shape).reshape(-1).tolist(),
        method=answer.method,
        residual=answer.residual,
        reports=reports,
        state=_STATES[state],
        variance_method=variance_method,
        replicates=replicates,
        flags=list(flags),
        max_shift_per_share=max_shift_per_share,
    )


def query_from_proto(msg: Any) -> tuple[str, list[str], int, str]:
    """``(collection id, attribute names, bootstrap replicates or 0 for the default,
    reconstruction: "local" when not given)``."""
    if not msg.attributes:
        raise CalmkitError("attributes (empty) must name at least one attribute")
    reconstruction = str(msg.reconstruction) or "local"
    check_reconstruction(reconstruction)
    return msg.collection_id, list(msg.attributes), int(msg.replicates), reconstruction


def batch_size(msg: Any) -> int:
    """The reports a SubmitReports or SubmitColumnar request carries (a columnar
    batch: its report ids, however many it claims), 0 for any other request."""
    if isinstance(msg, pb.ReportBatch):
        return len(msg.reports)
    if isinstance(msg, pb.ColumnarBatch):
        return min(int(msg.count), len(msg.report_ids) // REPORT_ID_BYTES)
    return 0


def marginal_answer(msg: Any) -> MarginalAnswer:
    """A served marginal as ``calmkit query`` reads it off the wire."""
    return marginal_from_proto(msg)


def collection_info(msg: Any) -> CollectionInfo:
    """A served collection as ``calmkit collection status`` reads it off the wire."""
    return collection_from_proto(msg)
