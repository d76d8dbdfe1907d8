"""Conversions between calmkit's dataclasses and the v1 wire messages
(protos/calmkit_proto/v1/calmkit.proto). The only client module that touches generated
protobuf classes; the aggregator's ``wire`` reuses these for plans and schemas."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np

from calmkit_proto.v1 import calmkit_pb2 as pb
from calmkit_proto.v1 import calmkit_pb2_grpc as pb_grpc

from .errors import PlanError
from .plan import Plan
from .report import Report
from .schema import Attribute, Schema

__all__ = [
    "STATES",
    "Acknowledgement",
    "CollectionInfo",
    "MarginalAnswer",
    "ack_from_proto",
    "aggregator_stub",
    "batch_to_proto",
    "collection_from_proto",
    "collection_ref",
    "create_request",
    "list_request",
    "marginal_from_proto",
    "plan_from_proto",
    "plan_to_proto",
    "query_request",
    "schema_from_proto",
    "schema_to_proto",
]

STATES = {pb.COLLECTION_STATE_OPEN: "open", pb.COLLECTION_STATE_CLOSED: "closed"}


def aggregator_stub(channel: grpc.Channel) -> Any:
    """The generated client stub of the ``calmkit.v1.Aggregator`` service."""
    return pb_grpc.AggregatorStub(channel)  # type: ignore[no-untyped-call]


def schema_to_proto(schema: Schema) -> Any:
    return pb.Schema(
        attributes=[
            pb.Attribute(name=a.name, categories=list(a.categories), ordered=a.ordered)
            for a in schema.attributes
        ]
    )


def schema_from_proto(msg: Any) -> Schema:
    return Schema(
        tuple(Attribute(a.name, tuple(a.categories), bool(a.ordered)) for a in msg.attributes)
    )


def plan_to_proto(plan: Plan) -> Any:
    return pb.Plan(
        schema=schema_to_proto(plan.schema),
        epsilon=plan.epsilon,
        views=[pb.View(attributes=list(v)) for v in plan.views],
        oracles=list(plan.oracles or ()),
        shares=list(plan.shares or ()),
        seed=plan.seed,
        digest=plan.digest,
    )


def plan_from_proto(msg: Any) -> Plan:
    """Rebuild the plan from its fields; its digest must equal the one sent."""
    plan = Plan(
        schema=schema_from_proto(msg.schema),
        epsilon=msg.epsilon,
        views=tuple(tuple(int(a) for a in v.attributes) for v in msg.views),
        oracles=tuple(msg.oracles) or None,
        shares=tuple(msg.shares) or None,
        seed=int(msg.seed),
    )
    if plan.digest != msg.digest:
        raise PlanError(f"plan digest ({msg.digest!r}) must match its content ({plan.digest!r})")
    return plan


def _report_to_proto(report: Report, pseudonym: bytes, ticket: bytes = b"") -> Any:
    msg = pb.Report(
        view=report.view, report_id=report.report_id, pseudonym=pseudonym, ticket=ticket
    )
    if isinstance(report.payload, bytes):
        msg.bits = report.payload
    else:
        msg.cell = report.payload
    return msg


def _tickets(tickets: Sequence[bytes] | None, n: int) -> list[bytes]:
    """The tickets of n reports (empty ones without), checked: bytes, n of them."""
    if tickets is None:
        return [b""] * n
    if isinstance(tickets, (bytes, str)) or len(tickets) != n:
        given = "one bytes value" if isinstance(tickets, (bytes, str)) else f"{len(tickets)}"
        raise PlanError(f"tickets ({given}) must be one bytes ticket per report ({n})")
    bad = next((i for i, t in enumerate(tickets) if not isinstance(t, bytes)), None)
    if bad is not None:
        raise PlanError(f"tickets[{bad}] ({type(tickets[bad]).__name__}) must be bytes")
    return list(tickets)


_U32 = np.dtype("<u4")


def batch_to_proto(
    collection_id: str,
    plan_digest: str,
    items: Sequence[tuple[bytes, Report]],
    tickets: Sequence[bytes] | None = None,
) -> Any:
    """A ``ReportBatch`` of ``(pseudonym, report)`` pairs made under ``plan_digest``,
    with their admission ``tickets`` (one per item) when given."""
    ticket_list = _tickets(tickets, len(items))
    for i, (_, report) in enumerate(items):
        if report.plan_digest != plan_digest:
            raise PlanError(
                f"reports[{i}].plan_digest ({report.plan_digest!r}) must be {plan_digest!r}"
            )
    return pb.ReportBatch(
        collection_id=collection_id,
        plan_digest=plan_digest,
        reports=[_report_to_proto(r, p, t) for (p, r), t in zip(items, ticket_list)],
    )


def columnar_batch_to_proto(
    collection_id: str,
    plan_digest: str,
    items: Sequence[tuple[bytes, Report]],
    tickets: Sequence[bytes] | None = None,
) -> Any:
    """A ``ColumnarBatch`` of ``(pseudonym, report)`` pairs made under ``plan_digest``:
    views and GRR cells as little-endian uint32, OUE payloads, report ids,
    pseudonyms and the admission ``tickets`` (one per item, when given) each
    concatenated into one bytes field."""
    ticket_list = _tickets(tickets, len(items))
    reports = [r for _, r in items]
    for i, report in enumerate(reports):
        if report.plan_digest != plan_digest:
            raise PlanError(
                f"reports[{i}].plan_digest ({report.plan_digest!r}) must be {plan_digest!r}"
            )
    n = len(reports)
    oue = [isinstance(r.payload, bytes) for r in reports]
    return pb.ColumnarBatch(
        collection_id=collection_id,
        plan_digest=plan_digest,
        count=n,
        views=np.fromiter((r.view for r in reports), _U32, count=n).tobytes(),
        cells=np.fromiter((r.payload for r, o in zip(reports, oue) if not o), _U32).tobytes(),
        bits=b"".join(r.payload for r, o in zip(reports, oue) if o),  # type: ignore[misc]
        report_ids=b"".join(r.report_id for r in reports),
        pseudonyms=b"".join(p for p, _ in items),
        tickets=b"".join(ticket_list),
    )


def columnar_batch_from_arrays(
    collection_id: str,
    plan: Plan,
    views: np.ndarray,
    payloads: Sequence[np.ndarray],
    report_ids: bytes,
    pseudonyms: bytes,
) -> Any:
    """A ``ColumnarBatch`` of reports given as arrays, in view order: ``views`` (n,)
    ints, ``payloads[j]`` the reports of view ``j`` (GRR: cells; OUE: packed bits,
    (n_j, ceil(L/8)) uint8), and ``report_ids``, ``pseudonyms`` (16 bytes a report,
    concatenated). For simulators and load tests, which make reports in bulk."""
    grr = [o.name == "GRR" for o in plan.view_oracles]
    cells = [np.asarray(p).astype(_U32) for j, p in enumerate(payloads) if grr[j] and len(p)]
    bits = [np.asarray(p, np.uint8) for j, p in enumerate(payloads) if not grr[j] and len(p)]
    return pb.ColumnarBatch(
        collection_id=collection_id,
        plan_digest=plan.digest,
        count=len(views),
        views=np.asarray(views).astype(_U32).tobytes(),
        cells=np.concatenate(cells).tobytes() if cells else b"",
        bits=np.concatenate(bits).tobytes() if bits else b"",
        report_ids=report_ids,
        pseudonyms=pseudonyms,
    )


@dataclass(frozen=True)
class Acknowledgement:
    """Reports the server committed: ``accepted`` new, ``duplicates`` already held."""

    accepted: int = 0
    duplicates: int = 0

    def __add__(self, other: Acknowledgement) -> Acknowledgement:
        return Acknowledgement(self.accepted + other.accepted, self.duplicates + other.duplicates)


def ack_from_proto(msg: Any) -> Acknowledgement:
    return Acknowledgement(int(msg.accepted), int(msg.duplicates))


@dataclass(frozen=True)
class CollectionInfo:
    """A collection as the server describes it (``submit_token`` only on creation).
    ``plan`` is the current phase's plan; ``phase_reports`` counts each phase's
    reports; ``pilot_target``: the pilot's reports (in one phase or two), after which
    the main phase starts (0: no pilot);
    ``max_reports``: the report cap (0: none); ``flags``: manipulation flags (counts
    no honest population explains); ``pilot_check``: the pilot's feasibility check
    (followed by a note where the planner left the pilot's reports out of the answers);
    ``admission``: the admission-ticket scheme and key fingerprint ("" when reports
    need no ticket); ``expected_n``: the users it was planned for (0: not given)."""

    collection_id: str
    state: str
    plan: Plan
    k: int
    reports: int
    view_reports: tuple[int, ...]
    created_at: float
    closed_at: float | None
    submit_token: str | None
    phase: int = 0
    phase_reports: tuple[int, ...] = ()
    pilot_target: int = 0
    max_reports: int = 0
    flags: tuple[str, ...] = ()
    pilot_check: str = ""
    admission: str = ""
    expected_n: int = 0

    @property
    def in_pilot(self) -> bool:
        """Whether the current phase is one of the pilot's: the phases before it hold
        fewer than ``pilot_target`` reports, and no pilot check failed (the phase after
        a failed check is the main phase)."""
        if not self.pilot_target or self.pilot_check.startswith("failed"):
            return False
        return sum(self.phase_reports[: self.phase]) < self.pilot_target

    @property
    def pilot_reports(self) -> int:
        """Reports in the pilot's phases (those in the current phase too while it is one
        of them)."""
        if not self.pilot_target:
            return 0
        return self.reports if self.in_pilot else sum(self.phase_reports[: self.phase])


def collection_from_proto(msg: Any) -> CollectionInfo:
    return CollectionInfo(
        collection_id=msg.collection_id,
        state=STATES.get(msg.state, "unknown"),
        plan=plan_from_proto(msg.plan),
        k=int(msg.k),
        reports=int(msg.reports),
        view_reports=tuple(int(x) for x in msg.view_reports),
        created_at=float(msg.created_at),
        closed_at=float(msg.closed_at) or None,
        submit_token=msg.submit_token or None,
        phase=int(msg.phase),
        phase_reports=tuple(int(x) for x in msg.phase_reports),
        pilot_target=int(msg.pilot_target),
        max_reports=int(msg.max_reports),
        flags=tuple(str(f) for f in msg.flags),
        pilot_check=str(msg.pilot_check),
        admission=str(msg.admission),
        expected_n=int(msg.expected_n),
    )


def create_request(
    schema: Schema,
    epsilon: float,
    expected_n: int,
    k: int,
    *,
    collection_id: str = "",
    theta: float | None = None,
    views: Sequence[Sequence[int]] | None = None,
    m: int | None = None,
    l: int | None = None,  # noqa: E741 (the paper's name)
    seed: int = 0,
    planner: str = "",
    pilot: float | None = None,
    reconstruction: str = "local",
    max_reports: int = 0,
    admission: tuple[str, bytes] | None = None,
) -> Any:
    """A CreateCollection request; ``reconstruction`` ("local" or "global") is the one
    the pipeline planner plans for (queries may still ask for either); ``max_reports``:
    the report cap (0: the server's default, 2 x ``expected_n``); ``admission``:
    ``(scheme, key)`` when every report must carry an admission ticket
    (:mod:`~calmkit_client.tickets`)."""
    req = pb.CreateCollectionRequest(
        collection_id=collection_id,
        schema=schema_to_proto(schema),
        epsilon=epsilon,
        expected_n=expected_n,
        k=k,
        views=[pb.View(attributes=list(v)) for v in views or ()],
        seed=seed,
        planner=planner,
        reconstruction=reconstruction,
        max_reports=max_reports,
    )
    if pilot is not None:
        req.pilot = pilot
    if theta is not None:
        req.theta = theta
    if m is not None:
        req.m = m
    if l is not None:
        req.l = l
    if admission is not None:
        req.admission.scheme, req.admission.key = admission
    return req


@dataclass(frozen=True)
class MarginalAnswer:
    """A reconstructed marginal from the server: ``values`` shaped over ``attributes``
    (schema order), per-cell ``variance``: the mean squared total error of those
    values, noise and estimated bias (``variance_method`` says how it was computed,
    ``replicates`` how many bootstrap replicates it rests on),
    the ``method``, and the collection ``state`` (answers from an open collection are
    provisional). ``flags``: the collection's manipulation flags;
    ``max_shift_per_share``: the largest shift of a cell of the views behind the answer
    per unit share of fake reports among their reports."""

    attributes: tuple[str, ...]
    values: np.ndarray
    variance: np.ndarray
    method: str
    residual: float
    reports: int
    state: str
    variance_method: str = ""
    replicates: int = 0
    flags: tuple[str, ...] = ()
    max_shift_per_share: float = 0.0


def marginal_from_proto(msg: Any) -> MarginalAnswer:
    shape = tuple(int(s) for s in msg.shape)
    return MarginalAnswer(
        attributes=tuple(msg.attributes),
        values=np.asarray(msg.values, dtype=np.float64).reshape(shape),
        variance=np.asarray(msg.variance, dtype=np.float64).reshape(shape),
        method=msg.method,
        residual=float(msg.residual),
        reports=int(msg.reports),
        state=STATES.get(msg.state, "unknown"),
        variance_method=msg.variance_method,
        replicates=int(msg.replicates),
        flags=tuple(str(f) for f in msg.flags),
        max_shift_per_share=float(msg.max_shift_per_share),
    )


def query_request(
    collection_id: str, attributes: Sequence[str], replicates: int = 0, reconstruction: str = ""
) -> Any:
    return pb.QueryRequest(
        collection_id=collection_id,
        attributes=list(attributes),
        replicates=replicates,
        reconstruction=reconstruction,
    )


def collection_ref(collection_id: str) -> Any:
    return pb.CollectionRef(collection_id=collection_id)


def list_request() -> Any:
    return pb.ListCollectionsRequest()
