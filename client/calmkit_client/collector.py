"""Client transport: fetch a collection's plan from the aggregator service and submit
reports to it over gRPC.

:class:`Collector` is what an app embeds: ``submit(record)`` makes (or recalls, see
:class:`~calmkit_client.device.DeviceState`) the user's one report for the collection
and sends it; ``submit_many`` does the same for many users in batches. Calls are
retried with jittered exponential backoff for up to a minute (:class:`RetryPolicy`), on
UNAVAILABLE (server or database restarting), DEADLINE_EXCEEDED, the server's rate limit
and full storage only: report ids make a resent batch idempotent on the server.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import numpy as np
import numpy.typing as npt

from . import wire
from .assignment import UserId
from .budget import DEFAULT_BUDGET, PrivacyBudget
from .device import DeviceState
from .errors import (
    AccessDenied,
    AdmissionRefused,
    BatchTooLarge,
    CalmkitError,
    CollectionClosed,
    CollectionError,
    CollectionExists,
    CollectionFull,
    CollectionNotFound,
    NotSupported,
    PlanMismatch,
    RateLimited,
    ReportConflict,
    ServiceUnavailable,
    StorageFull,
)
from .ids import check_collection_id
from .plan import Plan
from .schema import Label

__all__ = ["ERROR_KEY", "RETRYABLE", "Collector", "RetryPolicy", "call_with_retry", "open_channel"]

T = TypeVar("T")

RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
# RESOURCE_EXHAUSTED is retried only when the server names it a rate limit or full
# storage (a message over the size limit would fail again).
_RETRYABLE_EXHAUSTED = frozenset({RateLimited.__name__, StorageFull.__name__})
MAX_MESSAGE_BYTES = 16 * 1024 * 1024


class RetryPolicy:
    """How a call is retried: jittered exponential backoff for up to ``total`` seconds.

    A retryable failure (UNAVAILABLE, DEADLINE_EXCEEDED, and RESOURCE_EXHAUSTED when the
    server names it a rate limit or full storage) is tried again after a wait of
    ``initial * multiplier^i`` seconds capped at ``maximum``, shortened at random by up
    to the fraction ``jitter`` (drawn from the operating system's entropy source, so
    clients that failed together do not retry together). Retries stop once the next
    wait would end more than ``total`` seconds after the first try (the default, 60 s,
    rides out a database restart), or after ``attempts`` tries when that is given
    (None: no count limit). Each call has a ``timeout`` deadline (seconds).
    """

    def __init__(
        self,
        attempts: int | None = None,
        initial: float = 0.1,
        multiplier: float = 2.0,
        maximum: float = 5.0,
        timeout: float = 30.0,
        total: float = 60.0,
        jitter: float = 0.5,
    ) -> None:
        if attempts is not None and attempts < 1:
            raise CalmkitError(f"attempts ({attempts}) must be >= 1 or None")
        for name, value in (
            ("initial", initial),
            ("maximum", maximum),
            ("timeout", timeout),
            ("total", total),
        ):
            if not (np.isfinite(value) and value > 0):
                raise CalmkitError(f"{name} ({value!r}) must be finite and > 0")
        if not multiplier >= 1:
            raise CalmkitError(f"multiplier ({multiplier!r}) must be >= 1")
        if not 0 <= jitter <= 1:
            raise CalmkitError(f"jitter ({jitter!r}) must be in [0, 1]")
        self.attempts, self.initial, self.multiplier = attempts, initial, multiplier
        self.maximum, self.timeout = maximum, timeout
        self.total, self.jitter = total, jitter

    def waits(self) -> Iterator[float]:
        """The waits between tries, jittered, without end (the caller stops)."""
        wait = self.initial
        while True:
            yield wait * (1.0 - self.jitter * _uniform())
            wait = min(wait * self.multiplier, self.maximum)


def _uniform() -> float:
    """A uniform draw in [0, 1) from the OS entropy source (no RNG state to share or
    seed): 53 random bits."""
    return (int.from_bytes(os.urandom(8), "little") >> 11) / float(1 << 53)


_ERRORS: dict[str, type[CalmkitError]] = {
    cls.__name__: cls
    for cls in (
        CalmkitError,
        CollectionNotFound,
        CollectionExists,
        CollectionClosed,
        PlanMismatch,
        ReportConflict,
        AccessDenied,
        AdmissionRefused,
        ServiceUnavailable,
        NotSupported,
        RateLimited,
        BatchTooLarge,
        StorageFull,
        CollectionFull,  # RESOURCE_EXHAUSTED too, but not retried (_RETRYABLE_EXHAUSTED)
    )
}
ERROR_KEY = "calmkit-error"  # trailing metadata: the server's error class name


def _translate(err: grpc.RpcError) -> Exception:
    """Map a failed call to calmkit's error type (named by the server in trailing
    metadata, else by status code), keeping the server's message."""
    detail = err.details() or ""
    trailers: Any = err.trailing_metadata() or ()
    named = [str(item[1]) for item in trailers if item[0] == ERROR_KEY]
    cls = _ERRORS.get(named[0]) if named else None
    if cls is not None:
        return cls(detail)
    by_code: dict[grpc.StatusCode, type[CalmkitError]] = {
        grpc.StatusCode.NOT_FOUND: CollectionNotFound,
        grpc.StatusCode.ALREADY_EXISTS: ReportConflict,
        grpc.StatusCode.FAILED_PRECONDITION: CollectionClosed,
        grpc.StatusCode.UNAUTHENTICATED: AccessDenied,
        grpc.StatusCode.PERMISSION_DENIED: AccessDenied,
        grpc.StatusCode.INVALID_ARGUMENT: CalmkitError,
        grpc.StatusCode.UNAVAILABLE: ServiceUnavailable,
        grpc.StatusCode.UNIMPLEMENTED: NotSupported,
    }
    return by_code.get(err.code(), CollectionError)(f"{err.code().name}: {detail}")


def _retryable(err: grpc.RpcError) -> bool:
    if err.code() in RETRYABLE:
        return True
    trailers: Any = err.trailing_metadata() or ()
    named = {str(item[1]) for item in trailers if item[0] == ERROR_KEY}
    return err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and bool(named & _RETRYABLE_EXHAUSTED)


def call_with_retry(
    fn: Callable[..., T],
    request: Any,
    policy: RetryPolicy,
    metadata: Sequence[tuple[str, str]] = (),
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """``fn(request, timeout=..., metadata=...)``, retried as ``policy`` says on
    UNAVAILABLE, DEADLINE_EXCEEDED, the server's rate limit and full storage; other
    statuses raise the matching calmkit error at once. Resending is safe: a batch is
    stored whole or not at all, and report ids make a resent one idempotent."""
    start = clock()
    waits = policy.waits()
    attempt = 0
    while True:
        attempt += 1
        try:
            return fn(request, timeout=policy.timeout, metadata=tuple(metadata))
        except grpc.RpcError as err:
            if not _retryable(err):
                raise _translate(err) from None
            wait = next(waits)
            out_of_tries = policy.attempts is not None and attempt >= policy.attempts
            if out_of_tries or clock() + wait - start > policy.total:
                raise type(_translate(err))(  # the code's error class, so apps can act on it
                    f"server ({err.code().name}: {err.details()}) still failing after "
                    f"{attempt} attempts in {clock() - start:.1f} s (is the address right, "
                    "the server up, and TLS alike on both sides: root certificates for a "
                    "TLS server?)"
                ) from None
            sleep(wait)


def open_channel(address: str, root_certificates: bytes | None = None) -> grpc.Channel:
    """A channel to ``address``: TLS verified against ``root_certificates`` (PEM
    bytes of the CA, or of a self-signed server certificate) when given, else
    plaintext (for a loopback server, or one behind a TLS-terminating proxy)."""
    options = [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ]
    if root_certificates is None:
        return grpc.insecure_channel(address, options=options)
    pem = b"-----BEGIN CERTIFICATE-----"
    if not isinstance(root_certificates, bytes) or pem not in root_certificates:
        raise CalmkitError(
            "root_certificates must be PEM bytes containing -----BEGIN CERTIFICATE-----"
        )
    credentials = grpc.ssl_channel_credentials(root_certificates=root_certificates)
    return grpc.secure_channel(address, credentials, options=options)


@dataclass(frozen=True)
class _Refused:
    """A batch the server refused with :class:`PlanMismatch`: its plan digest, its
    number of reports and the server's message."""

    digest: str
    reports: int
    detail: str


def _raise_refused(refused: Sequence[_Refused], sent: wire.Acknowledgement) -> None:
    """:class:`PlanMismatch` naming the ``refused`` batches' reports (none: nothing),
    after the others were acknowledged (``sent``). The reports are given up: they are
    not made again under the current plan."""
    if not refused:
        return
    by_digest: dict[str, list[_Refused]] = {}
    for r in refused:
        by_digest.setdefault(r.digest, []).append(r)
    parts = [
        f"{sum(r.reports for r in rs)} reports made under plan_digest ({d[:12]}) were "
        f"refused ({rs[0].detail})"
        for d, rs in by_digest.items()
    ]
    raise PlanMismatch(
        "; ".join(parts) + ". They are given up, not made again under the current plan: "
        "each is its user's one report in the collection, and another would spend privacy "
        f"again ({sent.accepted} other reports accepted, {sent.duplicates} acknowledged as "
        "duplicates)"
    )


class Collector:
    """Submit one collection's reports to an aggregator at ``address``.

    ``state`` keeps the device secret (pseudonyms), the reports already made and the
    privacy ledger, so a retry or a restart re-sends the same report instead of
    spending privacy again. Without one, the per-user default file is used
    (``DeviceState()``, see :func:`~calmkit_client.device.default_state_path`);
    pass ``DeviceState.in_memory()`` to opt out of persistence.

    ``budget`` caps the epsilon a user spends per collection and in total on this
    device (default :data:`~calmkit_client.budget.DEFAULT_BUDGET`: 4 and 10): a plan
    whose epsilon does not fit is refused with
    :class:`~calmkit_client.errors.BudgetExceeded` before any report is made.

    ``root_certificates`` (PEM bytes) makes the channel TLS, verified against them;
    without them the channel is plaintext (for a loopback server only, or behind a
    TLS-terminating proxy).
    """

    def __init__(
        self,
        address: str,
        collection_id: str,
        submit_token: str | None = None,
        state: DeviceState | None = None,
        retry: RetryPolicy | None = None,
        batch_size: int = 1000,
        channel: grpc.Channel | None = None,
        budget: PrivacyBudget = DEFAULT_BUDGET,
        root_certificates: bytes | None = None,
    ) -> None:
        check_collection_id(collection_id)
        if not 1 <= batch_size <= 10_000:
            raise CalmkitError(f"batch_size ({batch_size}) must be in [1, 10000]")
        self.collection_id = collection_id
        self.batch_size = batch_size
        self._channel = channel or open_channel(address, root_certificates)
        self._owns_channel = channel is None
        self._stub = wire.aggregator_stub(self._channel)
        self._metadata = [("authorization", f"Bearer {submit_token}")] if submit_token else []
        if not isinstance(budget, PrivacyBudget):
            raise CalmkitError(f"budget ({type(budget).__name__}) must be a PrivacyBudget")
        self.budget = budget
        self._owns_state = state is None
        self._state = state if state is not None else DeviceState()
        self._retry = retry or RetryPolicy()
        self._plan: Plan | None = None
        self._columnar = True  # until a server answers that it has no SubmitColumnar

    def plan(self, refresh: bool = False) -> Plan:
        """The collection's current plan (its digest verified), fetched on first use
        and again with ``refresh=True``: a collection with a pilot phase changes its
        plan once the pilot has its reports."""
        if self._plan is None or refresh:
            msg = call_with_retry(
                self._stub.GetPlan, wire.collection_ref(self.collection_id), self._retry
            )
            self._plan = wire.plan_from_proto(msg)
        return self._plan

    def _send(
        self, items: Sequence[tuple[bytes, Any]], tickets: Sequence[bytes] | None = None
    ) -> wire.Acknowledgement:
        """Send reports (with their admission ``tickets``, one per item, when given);
        :class:`PlanMismatch` once the others are sent if the server refused a plan
        (see :meth:`_send_all`)."""
        total, refused = self._send_all(items, tickets)
        _raise_refused(refused, total)
        return total

    def _send_all(
        self, items: Sequence[tuple[bytes, Any]], tickets: Sequence[bytes] | None = None
    ) -> tuple[wire.Acknowledgement, list[_Refused]]:
        """Send reports in batches, one plan digest per batch (a report made in an
        earlier phase keeps that phase's plan); the acknowledgement and the batches
        the server refused with :class:`PlanMismatch` (a plan it no longer takes, such
        as a pilot's that failed its check). A refused batch does not stop the others,
        and its reports are not made again under another plan: each is the user's one
        report in the collection (:class:`~calmkit_client.device.DeviceState`), and a
        second would spend privacy again."""
        if tickets is not None and (isinstance(tickets, bytes) or len(tickets) != len(items)):
            given = "one bytes value" if isinstance(tickets, bytes) else str(len(tickets))
            raise CalmkitError(f"tickets ({given}) must be one ticket per report ({len(items)})")
        by_digest: dict[str, list[int]] = {}
        for i, item in enumerate(items):
            by_digest.setdefault(item[1].plan_digest, []).append(i)
        total = wire.Acknowledgement()
        refused: list[_Refused] = []
        for digest, group in by_digest.items():
            for start in range(0, len(group), self.batch_size):
                rows = group[start : start + self.batch_size]
                chunk = [items[i] for i in rows]
                chunk_tickets = None if tickets is None else [tickets[i] for i in rows]
                try:
                    total = total + self._submit(digest, chunk, chunk_tickets)
                except PlanMismatch as exc:
                    refused.append(_Refused(digest, len(chunk), str(exc)))
        return total, refused

    def _submit(
        self,
        digest: str,
        items: Sequence[tuple[bytes, Any]],
        tickets: Sequence[bytes] | None = None,
    ) -> wire.Acknowledgement:
        """One batch; a batch larger than the server's rate limit admits at once
        (:class:`BatchTooLarge`) is sent again in halves (tickets with their reports),
        and later batches stay at that size."""
        try:
            return self._submit_batch(digest, items, tickets)
        except BatchTooLarge:
            if len(items) == 1:
                raise
            half = (len(items) + 1) // 2
            self.batch_size = min(self.batch_size, half)
            first = self._submit(digest, items[:half], None if tickets is None else tickets[:half])
            rest = self._submit(digest, items[half:], None if tickets is None else tickets[half:])
            return first + rest

    def _submit_batch(
        self,
        digest: str,
        items: Sequence[tuple[bytes, Any]],
        tickets: Sequence[bytes] | None = None,
    ) -> wire.Acknowledgement:
        """One batch: in columns (``SubmitColumnar``), or as one message per report
        (``SubmitReports``) to a server too old for columns. A retry resends the same
        message, tickets included."""
        if self._columnar:
            batch = wire.columnar_batch_to_proto(self.collection_id, digest, items, tickets)
            try:
                ack = call_with_retry(self._stub.SubmitColumnar, batch, self._retry, self._metadata)
                return wire.ack_from_proto(ack)
            except NotSupported:
                self._columnar = False
        batch = wire.batch_to_proto(self.collection_id, digest, items, tickets)
        ack = call_with_retry(self._stub.SubmitReports, batch, self._retry, self._metadata)
        return wire.ack_from_proto(ack)

    def pseudonym(self, user_id: UserId | None = None) -> bytes:
        """The 16-byte pseudonym of ``user_id`` (None: the device's own user) in this
        collection: what the app's backend issues an admission ticket for
        (:class:`~calmkit_client.tickets.TicketIssuer`)."""
        return self._state.pseudonym(self.collection_id, user_id)

    def submit(
        self,
        record: Sequence[Label] | dict[str, Label],
        user_id: UserId | None = None,
        *,
        ticket: bytes | None = None,
    ) -> wire.Acknowledgement:
        """Make (or recall) this user's report and send it; returns the server's ack.
        The plan is fetched again first, so a new report uses the current phase; a new
        report must fit the budget (:class:`~calmkit_client.errors.BudgetExceeded`).

        ``ticket``: the user's admission ticket for :meth:`pseudonym`, required by a
        collection created with admission (else
        :class:`~calmkit_client.errors.AdmissionRefused`). The device state does not
        keep tickets: a call that resends a memoised report needs the ticket again
        (the app's backend can reissue it at will: the same pseudonym gets a ticket
        that admits the same one report).

        A report made under an earlier phase's plan is sent under it; if the server no
        longer takes that plan (a pilot's that failed its check), it raises
        :class:`~calmkit_client.errors.PlanMismatch` and the report is given up: it is
        not made again under the current plan, which would spend privacy again."""
        plan = self.plan(refresh=True)
        pseudonym, report = self._state.report_for(
            self.collection_id, plan, record, user_id, self.budget
        )
        return self._send([(pseudonym, report)], None if ticket is None else [ticket])

    def submit_many(
        self,
        codes: npt.ArrayLike,
        user_ids: Sequence[UserId] | np.ndarray,
        progress: Callable[[int], None] | None = None,
        *,
        tickets: Sequence[bytes] | None = None,
    ) -> wire.Acknowledgement:
        """Bulk upload for many users: ``codes`` (n, d) encoded records, one id each.
        Reports are made (or recalled) together, then sent in batches; ``progress``
        is called with the number of reports each acknowledged batch carried. The plan
        is fetched again first (one call per ``submit_many``). ``tickets``: one
        admission ticket per user, for ``pseudonym(user_id)`` (see :meth:`submit`).
        Reports under a plan the server no longer takes do not stop the others: they
        are all sent, then :class:`~calmkit_client.errors.PlanMismatch` names the
        refused ones, which are given up (see :meth:`submit`)."""
        if progress is not None and not callable(progress):
            raise CalmkitError(f"progress ({type(progress).__name__}) must be callable or None")
        if tickets is not None and (isinstance(tickets, bytes) or len(tickets) != len(user_ids)):
            given = "one bytes value" if isinstance(tickets, bytes) else str(len(tickets))
            raise CalmkitError(f"tickets ({given}) must be one ticket per user ({len(user_ids)})")
        plan = self.plan(refresh=True)
        items = self._state.reports_for(self.collection_id, plan, codes, user_ids, self.budget)
        total = wire.Acknowledgement()
        refused: list[_Refused] = []
        for start in range(0, len(items), self.batch_size):
            chunk = items[start : start + self.batch_size]
            chunk_tickets = None if tickets is None else tickets[start : start + self.batch_size]
            ack, lost = self._send_all(chunk, chunk_tickets)
            total, refused = total + ack, refused + lost
            if progress is not None:
                progress(len(chunk) - sum(r.reports for r in lost))
        _raise_refused(refused, total)
        return total

    def close(self) -> None:
        """Close the channel and the device state, if this collector opened them."""
        if self._owns_channel:
            self._channel.close()
        if self._owns_state:
            self._state.close()

    def __enter__(self) -> Collector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
