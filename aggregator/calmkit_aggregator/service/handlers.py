"""The aggregator gRPC service: the handlers of
``calmkit.v1.Aggregator`` (served by :func:`calmkit_aggregator.service.server.create_server`
with gRPC health checking and reflection). A batch of reports
is validated whole, committed to storage in one transaction, counted, and only then
acknowledged. Errors map to status codes (bad input INVALID_ARGUMENT naming the field,
unknown collection NOT_FOUND, closed collection or other plan FAILED_PRECONDITION,
conflicting report ALREADY_EXISTS, token UNAUTHENTICATED) and name calmkit's error
class in the ``calmkit-error`` trailing metadata.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import logging
import secrets
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import grpc
import numpy as np

from calmkit_client import CalmkitError, Plan
from calmkit_client.collector import ERROR_KEY
from calmkit_client.echo import bounded
from calmkit_client.errors import (
    AccessDenied,
    AdmissionRefused,
    BatchTooLarge,
    CollectionClosed,
    CollectionExists,
    CollectionFull,
    CollectionNotFound,
    PlanMismatch,
    RateLimited,
    ReportConflict,
    ServiceUnavailable,
    StorageFull,
)
from calmkit_client.ids import check_collection_id
from calmkit_client.wire import CollectionInfo, MarginalAnswer

from ..phases import (
    PILOT_SET_ASIDE,
    PhasedDesign,
    answer_support,
    combine_phases,
    pilot_left_out,
    pilot_set_aside,
)
from ..planning.collection import plan_collection
from ..planning.pilot import plan_next_phase, plan_pilot_round, start_pilot
from ..reconstruction.methods import check_reconstruction
from ..reconstruction.pipeline import Estimator, reconstruct_by
from ..reconstruction.support import SupportCounts
from ..reconstruction.uncertainty import MAX_REPLICATES, Bootstrap, bootstrap
from . import wire
from .admission import admit
from .faults import as_fault, fault_detail
from .manipulation import (
    FlagLog,
    answer_shift,
    batch_flag,
    check_parts,
    default_cap,
    pilot_result,
)
from .metrics import NO_METRICS, NullMetrics
from .rate_limit import RateLimit, submitter_of
from .store import ReportStore, batch_columns

__all__ = ["AggregatorService", "log_json"]

log = logging.getLogger("calmkit.aggregator")

DEFAULT_REPLICATES = 32  # bootstrap replicates behind a served variance

_CODES: list[tuple[type[Exception], grpc.StatusCode]] = [
    (CollectionNotFound, grpc.StatusCode.NOT_FOUND),
    (CollectionExists, grpc.StatusCode.ALREADY_EXISTS),
    (ReportConflict, grpc.StatusCode.ALREADY_EXISTS),
    (CollectionClosed, grpc.StatusCode.FAILED_PRECONDITION),
    (PlanMismatch, grpc.StatusCode.FAILED_PRECONDITION),
    (AdmissionRefused, grpc.StatusCode.PERMISSION_DENIED),  # before its base class
    (AccessDenied, grpc.StatusCode.UNAUTHENTICATED),
    (ServiceUnavailable, grpc.StatusCode.UNAVAILABLE),
    (RateLimited, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (BatchTooLarge, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (StorageFull, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (CollectionFull, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (CalmkitError, grpc.StatusCode.INVALID_ARGUMENT),
]


def log_json(event: str, **fields: Any) -> None:
    """One structured log line: ``{"event": .., "t": .., **fields}``; a str field is
    cut to :data:`~calmkit_client.echo.MAX_DETAIL_CHARS`."""
    fields = {k: bounded(v) if isinstance(v, str) else v for k, v in fields.items()}
    log.info(json.dumps({"event": event, "t": round(time.time(), 3), **fields}, default=str))


def _rpc(method: Callable[..., Any]) -> Callable[..., Any]:
    """Check the request's collection id, then map calmkit errors to gRPC statuses;
    anything else is INTERNAL (logged with its traceback). Messages and log lines are
    bounded (docs/security.md "Client strings in errors and logs")."""

    @functools.wraps(method)
    def wrapper(self: AggregatorService, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            self._check_id(request)
            return method(self, request, context)
        except CalmkitError as exc:
            code = next(c for cls, c in _CODES if isinstance(exc, cls))
            detail = bounded(str(exc))
            self.metrics.refused(
                method.__name__, code.name, type(exc).__name__, wire.batch_size(request)
            )
            log_json("refused", rpc=method.__name__, code=code.name, error=detail)
            context.set_trailing_metadata(((ERROR_KEY, type(exc).__name__),))
            context.abort(code, detail)
        except Exception as exc:  # keep serving; the message says what failed
            fault = as_fault(exc)
            if fault is not None:  # full disk, lost database: a code the client retries
                code = next(c for cls, c in _CODES if isinstance(fault, cls))
                self.metrics.refused(
                    method.__name__, code.name, type(fault).__name__, wire.batch_size(request)
                )
                log_json(
                    "storage_fault", rpc=method.__name__, code=code.name, error=fault_detail(exc)
                )
                context.set_trailing_metadata(((ERROR_KEY, type(fault).__name__),))
                context.abort(code, str(fault))
            trace = "".join(traceback.format_tb(exc.__traceback__))
            detail = bounded(f"{type(exc).__name__}: {exc}")
            log.error("internal error in %s: %s\n%s", method.__name__, detail, trace)
            context.abort(grpc.StatusCode.INTERNAL, detail)

    return wrapper


def _support_seed(support: SupportCounts) -> int:
    """The bootstrap's seed: a digest of the counts, so the same reports always get the
    same standard errors (the bootstrap only post-processes private counts)."""
    digest = hashlib.sha256(support.plan.digest.encode())
    digest.update(np.ascontiguousarray(support.n).tobytes())
    for counts in support.counts:
        digest.update(np.ascontiguousarray(counts).tobytes())
    return int.from_bytes(digest.digest()[:8], "little")


def _hash_token(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


def _bearer(context: grpc.ServicerContext) -> str | None:
    for key, value in context.invocation_metadata():
        if key == "authorization" and isinstance(value, str) and value.startswith("Bearer "):
            return value[len("Bearer ") :]
    return None


class AggregatorService(wire.AggregatorServicer):
    """The ``calmkit.v1.Aggregator`` implementation over a :class:`Storage`."""

    def __init__(
        self,
        storage: ReportStore,
        admin_token: str | None = None,
        rate_limit: float | None = None,
        rate_burst: int | None = None,
        metrics: NullMetrics = NO_METRICS,
    ) -> None:
        self.storage = storage
        self.metrics = metrics  # counters of a metrics endpoint (none: counts nothing)
        self._rate = RateLimit(rate_limit, burst=rate_burst) if rate_limit is not None else None
        self._admin_hash = _hash_token(admin_token) if admin_token else None
        # keyed by (collection id, reconstruction)
        self._estimates: dict[tuple[str, str], tuple[int, SupportCounts, Estimator]] = {}
        self._bootstraps: dict[tuple[str, str], tuple[int, int, Bootstrap]] = {}
        self._estimate_lock = threading.Lock()
        # one bootstrap computation at a time per (collection id, reconstruction)
        self._bootstrap_locks: dict[tuple[str, str], threading.Lock] = {}
        self._advance_lock = threading.Lock()
        self._flag_log = FlagLog()

    # -- access ------------------------------------------------------------------------
    def _check_id(self, request: Any) -> None:
        """A collection id the storage does not hold must follow the rules
        (:func:`~calmkit_client.ids.check_collection_id`) before anything looks it up;
        ids stored before the rules existed stay addressable. CreateCollection's
        empty id means "pick one"."""
        collection_id = getattr(request, "collection_id", None)
        if collection_id is None or collection_id in self.storage:
            return
        if collection_id or not wire.picks_collection_id(request):
            check_collection_id(collection_id)

    def _is_admin(self, context: grpc.ServicerContext) -> bool:
        if self._admin_hash is None:
            return True  # loopback-only server without a token file
        token = _bearer(context)
        return token is not None and hmac.compare_digest(_hash_token(token), self._admin_hash)

    def _require_admin(self, context: grpc.ServicerContext) -> None:
        if not self._is_admin(context):
            raise AccessDenied("authorization (admin bearer token) is missing or wrong")

    def _require_submit(self, context: grpc.ServicerContext, expected: bytes) -> None:
        token = _bearer(context)
        if token is None or not hmac.compare_digest(_hash_token(token), expected):
            raise AccessDenied("authorization (the collection's submit token) is missing or wrong")

    def _collection(self, collection_id: str, submit_token: str | None = None) -> Any:
        record = self.storage.get_collection(collection_id)
        counts = self.storage.phase_support(collection_id, record.phase).n
        flags = self._flags(collection_id, record)
        return wire.collection_to_proto(record, counts.tolist(), submit_token, flags)

    def _flags(self, collection_id: str, record: Any) -> list[str]:
        """The collection's manipulation flags: its counts checked now (every phase;
        logged once per newly flagged state) and the flagged batches stored."""
        parts = [self.storage.phase_support(collection_id, i) for i in range(len(record.plans))]
        result = check_parts(parts)
        if self._flag_log.is_new(collection_id, result):
            if not result.passed:
                self.metrics.flag("collection")
            log_json(
                "manipulation",
                collection=collection_id,
                scope="collection",
                views=[f.view for f in result.flagged],
                tests=result.tests,
                alpha=result.alpha,
                reason=result.reason,
            )
        now = [f"collection counts: {result.reason}"] if not result.passed else []
        return now + list(record.flags)

    # -- admin -------------------------------------------------------------------------
    @_rpc
    def CreateCollection(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._require_admin(context)
        params = wire.create_from_proto(request)
        design = None
        if params.views:
            plan = Plan(params.schema, params.epsilon, params.views, seed=params.seed)
        elif (
            params.planner == "pipeline"
            and params.pilot > 0
            and params.expected_n >= 2
            and (params.l is None or params.m is None)
        ):
            pilot = start_pilot(
                params.schema, params.epsilon, params.expected_n, params.pilot, seed=params.seed
            )
            plan = pilot.plan
            design = PhasedDesign(
                params.expected_n,
                pilot.reports,
                params.k,
                params.seed,
                params.l,
                params.m,
                reconstruction=params.reconstruction,
                first_round=pilot.first_round,
            )
        else:
            plan = plan_collection(
                params.schema,
                params.epsilon,
                params.expected_n,
                params.k,
                theta=params.theta if params.theta is not None else 0.001,
                l=params.l,
                m=params.m,
                rng=params.seed,
                seed=params.seed,
                planner=params.planner,
                reconstruction=params.reconstruction,
            )
        collection_id = params.collection_id or f"c-{secrets.token_hex(6)}"
        token = secrets.token_urlsafe(24)
        cap = default_cap(params.expected_n, params.max_reports)
        self.storage.create_collection(
            collection_id,
            plan,
            params.k,
            _hash_token(token),
            design,
            max_reports=cap,
            admission=params.admission,
            expected_n=params.expected_n,
        )
        log_json(
            "created",
            collection=collection_id,
            m=plan.m,
            digest=plan.digest,
            pilot_target=None if design is None else design.pilot_reports,
            max_reports=cap,
            admission=None if params.admission is None else params.admission.fingerprint,
        )
        return self._collection(collection_id, submit_token=token)

    @_rpc
    def GetCollection(self, request: Any, context: grpc.ServicerContext) -> Any:
        """Public (a plan is public by design), but the manipulation flags and the pilot
        check only for the admin token: their texts name cell counts of the reports
        (adding fakes to one cell until it is flagged, then subtracting them, reads
        that cell's count) and the addresses batches came from. Anyone else gets the
        pilot check's verdict alone, and no flags (nor the cost of checking them)."""
        if self._is_admin(context):
            return self._collection(request.collection_id)
        record = self.storage.get_collection(request.collection_id)
        counts = self.storage.phase_support(request.collection_id, record.phase).n
        verdict = record.pilot_check.split(":", 1)[0].split(";", 1)[0]
        public = replace(record, flags=(), pilot_check=verdict)
        return wire.collection_to_proto(public, counts.tolist())

    @_rpc
    def ListCollections(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._require_admin(context)
        items = [self._collection(r.collection_id) for r in self.storage.list_collections()]
        return wire.collection_list_to_proto(items)

    @_rpc
    def CloseCollection(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._require_admin(context)
        self.storage.close_collection(request.collection_id)
        log_json("closed", collection=request.collection_id)
        return self._collection(request.collection_id)

    @_rpc
    def GetPlan(self, request: Any, context: grpc.ServicerContext) -> Any:
        return wire.plan_message(self.storage.get_collection(request.collection_id).plan)

    # -- reports -----------------------------------------------------------------------
    @_rpc
    def SubmitReports(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._submit(request, context, len(request.reports), wire.reports_from_proto)

    @_rpc
    def SubmitColumnar(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._submit(request, context, request.count, wire.columns_from_proto)

    def _submit(
        self,
        request: Any,
        context: grpc.ServicerContext,
        count: int,
        decode: Callable[[Any, Plan], Any],
    ) -> Any:
        """Authenticate, charge the submitter's rate limit (this collection, the
        client's address), decode against the plan the batch names, store, then
        acknowledge (after the commit)."""
        t0 = time.perf_counter()
        record = self.storage.submit_record(request.collection_id, request.plan_digest)
        self._require_submit(context, record.submit_token_hash)
        if self._rate is not None:
            self._rate.charge((request.collection_id, submitter_of(context.peer())), count)
        # any phase's plan, but storage refuses new reports under a failed pilot's
        phase = record.phase_of(request.plan_digest)
        reports = decode(request, record.plans[phase])
        if record.admission is not None:  # per-user tickets and assigned views
            reports = batch_columns(record.plans[phase], reports)
            tickets = wire.tickets_from_proto(request)
            admit(record.admission, request.collection_id, record.plans[phase], reports, tickets)
        t_commit = time.perf_counter()
        outcome = self.storage.add_reports(request.collection_id, request.plan_digest, reports)
        commit = time.perf_counter() - t_commit
        log_json(
            "submitted",
            collection=request.collection_id,
            accepted=outcome.accepted,
            duplicates=outcome.duplicates,
            phase=phase,
            ms=round(1e3 * (time.perf_counter() - t0), 2),
        )
        if outcome.accepted:
            self._check_batch(request.collection_id, record.plans[phase], reports, context)
        if record.design is not None and record.phase < record.design.pilot_phases:
            # a pilot phase that may be done; one batch may end both pilot rounds
            while self._maybe_advance(request.collection_id):
                pass
        seconds = time.perf_counter() - t0
        self.metrics.batch(outcome.accepted, outcome.duplicates, seconds, commit)
        return wire.ack_to_proto(outcome.accepted, outcome.duplicates)

    def _check_batch(
        self, collection_id: str, plan: Plan, reports: Any, context: grpc.ServicerContext
    ) -> None:
        """Flag a stored batch whose own counts no honest population explains: logged
        with the peer's address and stored (the batch stays accepted)."""
        flag = batch_flag(batch_columns(plan, reports), str(context.peer()))
        if flag is None:
            return
        log_json("manipulation", collection=collection_id, scope="batch", reason=flag)
        self.metrics.flag("batch")
        self.storage.add_flag(collection_id, flag)

    def _maybe_advance(self, collection_id: str) -> bool:
        """Start the next phase once a pilot phase has its reports: plan it from the
        pilot's counts so far (committed before the next GetPlan can serve it): the
        pilot's second round, or the main phase. Threads that race here plan once: the
        storage keeps the first plan stored for a phase. Whether a phase started."""
        record = self.storage.get_collection(collection_id)
        design = record.design
        if design is None or record.state != "open" or record.pilot_check.startswith("failed"):
            return False  # after a failed pilot check the main phase runs: nothing to plan
        target = design.phase_target(record.phase)
        if target is None or record.reports < target:
            return False
        with self._advance_lock:
            current = record.phase
            record = self.storage.get_collection(collection_id)
            if record.phase != current:
                return False
            t0 = time.perf_counter()
            parts = [self.storage.phase_support(collection_id, i) for i in range(current + 1)]
            pilot = combine_phases(parts)
            passed, check = pilot_result(parts, current + 1)
            self.storage.set_pilot_check(collection_id, check)
            if not passed:  # fakes may have written the pilot: plan without it
                log_json("manipulation", collection=collection_id, scope="pilot", reason=check)
                self.metrics.flag("pilot")
                plan = _safe_plan(design, pilot)
                self._start_phase(collection_id, current + 1, plan, t0, planner="paper")
            elif current + 1 < design.pilot_phases:
                plan = plan_pilot_round(design, pilot)
                self._start_phase(collection_id, current + 1, plan, t0, planner="pilot round")
            else:
                main = plan_next_phase(design, pilot)
                self._start_phase(
                    collection_id,
                    current + 1,
                    main.plan,
                    t0,
                    l=main.choice.l,
                    predicted_sse=round(main.choice.predicted.sse, 6),
                    predicted_range=[round(x, 6) for x in main.choice.sse_range],
                    dependence=round(main.choice.profile.dependence, 5),
                    pilot_kept=main.keeps_pilot,
                    notes=main.notes(main.plan.schema.names),
                )
                if not main.keeps_pilot:  # stored once the main phase is: see _estimator
                    self.storage.set_pilot_check(collection_id, f"{check}; {PILOT_SET_ASIDE}")
        return True

    def _start_phase(
        self, collection_id: str, phase: int, plan: Plan, t0: float, **fields: object
    ) -> None:
        """Store ``phase`` with ``plan`` and log it (planned since ``t0``)."""
        record = self.storage.add_phase(collection_id, phase, plan)
        reports = sum(record.phase_reports[:phase])
        ms = round(1e3 * (time.perf_counter() - t0), 1)
        log_json(
            "phase",
            collection=collection_id,
            phase=phase,
            m=plan.m,
            digest=plan.digest,
            pilot_reports=reports,
            ms=ms,
            **fields,
        )

    # -- queries -----------------------------------------------------------------------
    def _estimator(
        self, collection_id: str, reconstruction: str = "local"
    ) -> tuple[SupportCounts, Estimator, int]:
        """The support counted now, its reconstruction (cached per collection and
        reconstruction until more reports arrive) and how many reports it rests on.
        A pilot that failed its feasibility check is left out (its reports may be
        fakes, and every later phase was planned without them), and so is one the
        planner set aside (:attr:`~..planning.pilot.MainPlan.keeps_pilot`): that one's
        reports still count in the attributes' margins
        (:attr:`~..reconstruction.support.SupportCounts.margins_from`)."""
        support = self._answer_support(collection_id)
        side = support.margins_from
        total = int(support.n.sum()) + (int(side.n.sum()) if side is not None else 0)
        if total == 0:
            raise CollectionClosed(f"collection_id ({collection_id!r}) has no reports yet")
        with self._estimate_lock:
            cached = self._estimates.get((collection_id, reconstruction))
            if cached is None or cached[0] != total:
                cached = (total, support, reconstruct_by(support, reconstruction))
                self._estimates[(collection_id, reconstruction)] = cached
        return cached[1], cached[2], total

    def _answer_support(self, collection_id: str) -> SupportCounts:
        """The counts the collection's answers rest on (see :meth:`_estimator`)."""
        record = self.storage.get_collection(collection_id)
        if not (pilot_left_out(record.pilot_check) and record.phase >= 1):
            return self.storage.support(collection_id)
        # the phase planned without the pilot is the last: every earlier one is left out
        support = self.storage.phase_support(collection_id, record.phase)
        if not pilot_set_aside(record.pilot_check):
            return support
        pilot = [self.storage.phase_support(collection_id, i) for i in range(record.phase)]
        return answer_support(combine_phases(pilot), support, keeps_pilot=False)

    def _bootstrap(
        self,
        collection_id: str,
        support: SupportCounts,
        estimator: Estimator,
        total: int,
        replicates: int,
        reconstruction: str = "local",
    ) -> Bootstrap:
        """Bootstrap replicates of the reconstruction, cached like it. Computed once per
        collection and reconstruction at a time: a query that arrives while they are
        being computed (a client's retry after its deadline, say) waits for them
        rather than starting the same work again, which on a slow reconstruction
        would never let any of them finish."""
        key = (collection_id, reconstruction)
        with self._estimate_lock:
            flight = self._bootstrap_locks.setdefault(key, threading.Lock())
        with flight:
            with self._estimate_lock:
                cached = self._bootstraps.get(key)
            if cached is not None and cached[:2] == (total, replicates):
                return cached[2]
            boot = bootstrap(
                support,
                estimator,
                replicates,
                rng=_support_seed(support),
                reconstruction=reconstruction,
            )
            with self._estimate_lock:
                self._bootstraps[key] = (total, replicates, boot)
        return boot

    @_rpc
    def Query(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._require_admin(context)
        return self._query(*wire.query_from_proto(request))

    def answer(
        self, collection_id: str, names: list[str], replicates: int = 0, reconstruction: str = ""
    ) -> MarginalAnswer:
        """What ``Query`` answers, as ``calmkit query`` reads it (the web console's
        marginals: the same numbers, from the same caches)."""
        reconstruction = check_reconstruction(reconstruction or "local")
        if not names:
            raise CalmkitError("attributes (empty) must name at least one attribute")
        return wire.marginal_answer(self._query(collection_id, names, replicates, reconstruction))

    def status(self, collection_id: str) -> CollectionInfo:
        """What ``GetCollection`` answers, as ``calmkit collection status`` reads it."""
        return wire.collection_info(self._collection(collection_id))

    def _query(
        self, collection_id: str, names: list[str], replicates: int, reconstruction: str
    ) -> Any:
        if replicates > MAX_REPLICATES or replicates == 1:
            raise CalmkitError(
                f"replicates ({replicates}) must be 0 (default {DEFAULT_REPLICATES}) or in "
                f"[2, {MAX_REPLICATES}]"
            )
        replicates = replicates or DEFAULT_REPLICATES
        record = self.storage.get_collection(collection_id)
        support, estimator, total = self._estimator(collection_id, reconstruction)
        schema = record.plan.schema
        attrs = tuple(sorted(schema.resolve(names)))
        answer = estimator.answer(attrs)
        boot = self._bootstrap(collection_id, support, estimator, total, replicates, reconstruction)
        ordered = [schema.attributes[a].name for a in attrs]
        log_json(
            "query",
            collection=collection_id,
            attrs=ordered,
            method=answer.method,
            reconstruction=reconstruction,
        )
        return wire.marginal_to_proto(
            answer,
            ordered,
            boot.mean_squared_error(attrs, estimator),
            total,
            record.state,
            total_error_method(answer.method, replicates, boot.unseen_sizing(attrs, estimator)),
            replicates,
            self._flags(collection_id, record),
            answer_shift(support.plan, attrs),
        )


def _safe_plan(design: PhasedDesign, pilot: SupportCounts) -> Plan:
    """The plan of the phase after a pilot that failed its check: CALM's Algorithm 1
    for the users left, from the design alone (nothing of the pilot's counts)."""
    remaining = max(1, design.expected_n - int(pilot.n.sum()))
    schema = pilot.plan.schema
    return plan_collection(
        schema,
        pilot.plan.epsilon,
        remaining,
        design.k,
        l=design.l,
        m=design.m,
        rng=design.seed + 1,
        seed=design.seed + 1,
        planner="paper",
    )


def total_error_method(answer_method: str, replicates: int, sizing: str = "") -> str:
    """What the served per-cell ``variance`` is (the answer's ``variance_method``);
    ``sizing``: how the interactions a max-ent answer misses were sized
    (:meth:`~..reconstruction.uncertainty.Bootstrap.unseen_sizing`)."""
    unseen = (
        ""
        if answer_method == "projection"
        else (
            " + the interactions no view holds (max-ent), sized from those the views show"
            + (f" ({sizing})" if sizing else "")
        )
    )
    return (
        "mean squared total error (noise + estimated bias), not noise alone: parametric "
        f"bootstrap of the unshrunk reconstruction, {replicates} replicates (its noise "
        "and bias) + the shrinkage's displacement" + unseen
    )
