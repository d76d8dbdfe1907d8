"""What the service's two storage backends share: the interface the service uses
(:class:`ReportStore`), the records they hand out, and the checks both run, so the
embedded SQLite store (:mod:`.storage`) and the PostgreSQL store shared by replicas
(:mod:`.pg_storage`) accept and refuse exactly the same inputs.

A batch is accepted whole or refused whole. Before a backend touches its tables,
:func:`batch_columns` validates the batch against the plan (:mod:`.columns`: every
field, naming the first bad report) and :func:`dedupe_batch` collapses identical
repeats within it; :func:`new_positions` then decides, against the collection's key
tables of stored reports (:mod:`.keyset`), which reports are new.

Security choices made here, for both backends:

- Only the SHA-256 of a collection's submit token is stored
  (:data:`TOKEN_HASH_BYTES`): a copy of the database does not give the right to
  submit.
- Deduplication looks at a stored report's (report id, pseudonym) pair and nothing
  else. A report whose pair is stored is a retry, acknowledged as a duplicate whatever
  content it carries; a report id stored under another pseudonym, or a pseudonym that
  already holds a report, is refused. No answer depends on a stored report's view,
  payload or phase, and no error names a stored value, so a submit-token holder who
  learns a victim's pseudonym cannot probe the victim's report (an earlier server that
  compared contents and named the stored report id in its error let such a client read
  a report back in a few dozen probes).
- Once a collection's pilot failed its feasibility check and the phase planned
  without it is stored, new reports under a pilot phase's plan are refused
  (:func:`check_pilot_phase`): they count in no answer, and would only take places
  under the report cap. Retries of stored pilot reports are still acknowledged.
- Errors quote client-sent values through :func:`calmkit_client.echo.show`, bounded
  in length, so a hostile value cannot flood the logs.

This module imports neither backend, nor the planner, nor scipy.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

import numpy as np

from calmkit_client import Plan
from calmkit_client.echo import show as _show
from calmkit_client.errors import (
    CalmkitError,
    CollectionClosed,
    CollectionFull,
    PlanMismatch,
    ReportConflict,
)
from calmkit_client.ids import check_collection_id
from calmkit_client.tickets import TicketVerifier
from calmkit_client.validation import is_int

from ..phases import PhasedDesign, combine_phases, pilot_failed
from ..reconstruction.support import SupportCounts
from .columns import ReportColumns, columns_from_reports, decode_columns

__all__ = [
    "CLOSED",
    "MAX_FLAGS",
    "OPEN",
    "TOKEN_HASH_BYTES",
    "BatchOutcome",
    "CollectionRecord",
    "KeyLookup",
    "KeyTables",
    "ReportStore",
    "StoredReport",
    "batch_columns",
    "check_admission",
    "check_cap",
    "check_collection_args",
    "check_flag",
    "check_next_phase",
    "check_phase",
    "check_pilot_phase",
    "check_plan",
    "dedupe_batch",
    "new_positions",
    "not_open",
    "recount_log",
    "stored_admission",
    "stored_plan",
]

OPEN, CLOSED = "open", "closed"
TOKEN_HASH_BYTES = 32  # sha256 of the submit token


# -- records ------------------------------------------------------------------------------
@dataclass(frozen=True)
class StoredReport:
    """One report as stored: ``report_id`` and ``pseudonym`` (16 bytes each), ``view``
    (int) and ``payload`` (GRR: int cell; OUE: packed bytes). Not checked when made:
    the wire layer validates these, and :func:`batch_columns` checks a batch of them
    against its plan, naming the bad report's position (``reports[i].field``)."""

    report_id: bytes
    pseudonym: bytes
    view: int
    payload: int | bytes


@dataclass(frozen=True)
class CollectionRecord:
    """A collection's metadata and its number of counted reports.

    ``plans``: the plan of each phase so far (the last is the current one); ``state``:
    :data:`OPEN` or :data:`CLOSED`; ``design``: how the next phase is planned (None:
    one phase); ``reports``, ``phase_reports``: reports counted, in all and per
    phase; ``max_reports``: the report cap (0: none); ``expected_n``: the number of
    users the collection was planned for (``--n``; 0: not given, or created before it was
    stored); ``flags``: manipulation flags
    stored at ingest (one line each, oldest first); ``pilot_check``: the pilot's
    feasibility check ("" before it ran)."""

    collection_id: str
    plans: tuple[Plan, ...]
    k: int
    state: str
    submit_token_hash: bytes
    created_at: float
    closed_at: float | None
    reports: int
    design: PhasedDesign | None = None
    phase_reports: tuple[int, ...] = ()
    max_reports: int = 0
    flags: tuple[str, ...] = ()
    pilot_check: str = ""
    admission: TicketVerifier | None = None
    expected_n: int = 0

    def __post_init__(self) -> None:
        plans = self.plans
        if not isinstance(plans, tuple) or not plans or not all(isinstance(p, Plan) for p in plans):
            raise CalmkitError(f"plans ({_show(plans)}) must be a non-empty tuple of Plans")
        if self.state not in (OPEN, CLOSED):
            raise CalmkitError(f"state ({_show(self.state)}) must be {OPEN!r} or {CLOSED!r}")

    @property
    def plan(self) -> Plan:
        """The current phase's plan: what new reports use."""
        return self.plans[-1]

    @property
    def phase(self) -> int:
        """The current phase (0-based)."""
        return len(self.plans) - 1

    @property
    def expected_users(self) -> int:
        """The users the collection was planned for: ``expected_n``, else its phased
        design's (a collection stored before ``expected_n`` was); 0 when not known."""
        return self.expected_n or (0 if self.design is None else self.design.expected_n)

    def phase_of(self, plan_digest: str) -> int:
        """The phase whose plan has ``plan_digest``; :class:`PlanMismatch` if none."""
        for i, plan in enumerate(self.plans):
            if plan.digest == plan_digest:
                return i
        known = ", ".join(repr(p.digest) for p in self.plans)
        raise PlanMismatch(
            f"plan_digest ({_show(plan_digest)}) must be one of the collection's plans ({known})"
        )


@dataclass(frozen=True)
class BatchOutcome:
    """``accepted``: new reports written; ``duplicates``: identical retries of reports
    already stored (acknowledged again, not counted again)."""

    accepted: int
    duplicates: int

    def __post_init__(self) -> None:
        for name in ("accepted", "duplicates"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise CalmkitError(f"{name} ({_show(value)}) must be an int >= 0")


# -- the interface ---------------------------------------------------------------------------
class ReportStore(Protocol):
    """The storage interface the service uses; :class:`~.storage.Storage` (SQLite,
    embedded) and :class:`~.pg_storage.PgStorage` (PostgreSQL, shared by replicas)
    implement it, and one conformance suite runs against both.

    ``path``: where the data lives, for messages (a PostgreSQL URL without its
    password); ``snapshot_bytes``: key snapshots written by this process."""

    path: str
    snapshot_bytes: int

    def create_collection(
        self,
        collection_id: str,
        plan: Plan,
        k: int,
        submit_token_hash: bytes,
        design: PhasedDesign | None = None,
        max_reports: int = 0,
        admission: TicketVerifier | None = None,
        expected_n: int = 0,
    ) -> CollectionRecord: ...
    def add_flag(self, collection_id: str, flag: str) -> None: ...
    def set_pilot_check(self, collection_id: str, result: str) -> None: ...
    def get_collection(self, collection_id: str) -> CollectionRecord: ...
    def submit_record(self, collection_id: str, plan_digest: str) -> CollectionRecord: ...
    def list_collections(self) -> list[CollectionRecord]: ...
    def close_collection(self, collection_id: str) -> CollectionRecord: ...
    def add_phase(self, collection_id: str, phase: int, plan: Plan) -> CollectionRecord: ...
    def add_reports(
        self,
        collection_id: str,
        plan_digest: str,
        reports: Sequence[StoredReport] | ReportColumns,
    ) -> BatchOutcome: ...
    def support(self, collection_id: str) -> SupportCounts: ...
    def phase_support(self, collection_id: str, phase: int) -> SupportCounts: ...
    def recount(self, collection_id: str) -> SupportCounts: ...
    def wait_ready(self, timeout: float | None = None) -> bool: ...
    def close(self) -> None: ...
    def __contains__(self, collection_id: object) -> bool: ...
    def __enter__(self) -> ReportStore: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


class KeyLookup(Protocol):
    """A key table as deduplication reads it (:class:`.keyset.KeyTable`)."""

    def lookup(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...


class KeyTables(Protocol):
    """Key tables of a collection's stored reports: ``by_id`` (report id ->
    pseudonym) and ``by_pseudonym`` (the pseudonyms)."""

    @property
    def by_id(self) -> KeyLookup: ...
    @property
    def by_pseudonym(self) -> KeyLookup: ...


# -- checks of collections and phases -------------------------------------------------------
def check_plan(plan: object) -> Plan:
    """``plan`` if it is a :class:`Plan`, else a :class:`CalmkitError` naming it."""
    if not isinstance(plan, Plan):
        raise CalmkitError(f"plan ({_show(plan)}) must be a Plan")
    return plan


def check_collection_args(
    collection_id: str,
    plan: Plan,
    k: int,
    token_hash: bytes,
    design: PhasedDesign | None,
    max_reports: int = 0,
    expected_n: int = 0,
) -> None:
    """The arguments of ``create_collection``: a valid id, a plan, ``k`` in [1, d], the
    submit token's SHA-256, a :class:`PhasedDesign` or None, the cap and the expected
    number of users (ints >= 0)."""
    check_collection_id(collection_id)
    check_plan(plan)
    if not is_int(k) or not 1 <= k <= plan.schema.d:
        raise CalmkitError(f"k ({k!r}) must be an int in [1, {plan.schema.d}]")
    if not isinstance(token_hash, bytes) or len(token_hash) != TOKEN_HASH_BYTES:
        raise CalmkitError(
            f"submit_token_hash ({_show(token_hash)}) must be {TOKEN_HASH_BYTES} bytes (sha256)"
        )
    if design is not None and not isinstance(design, PhasedDesign):
        raise CalmkitError(f"design ({_show(design)}) must be a PhasedDesign or None")
    if not is_int(max_reports) or not 0 <= max_reports < 2**63:
        raise CalmkitError(f"max_reports ({_show(max_reports)}) must be an int >= 0 (0: no cap)")
    if not is_int(expected_n) or not 0 <= expected_n < 2**63:
        raise CalmkitError(f"expected_n ({_show(expected_n)}) must be an int >= 0 (0: not given)")


MAX_FLAGS = 100  # flags kept per collection (the first ones: later ones are only logged)
MAX_FLAG_CHARS = 500


def check_flag(flag: object) -> str:
    """A manipulation flag or pilot-check result to store: a str, cut to
    :data:`MAX_FLAG_CHARS`."""
    if not isinstance(flag, str):
        raise CalmkitError(f"flag ({_show(flag)}) must be a str")
    return flag[:MAX_FLAG_CHARS]


def check_cap(collection_id: str, max_reports: int, stored: int, new: int) -> None:
    """Refuse (:class:`CollectionFull`) a batch whose ``new`` reports would take a
    collection holding ``stored`` past its cap ``max_reports`` (0: no cap). Call it
    where the batch's new reports are known and no other batch of the collection can
    commit in between (inside the write transaction / under the collection's lock), so
    it holds under concurrency; a batch of retries only (``new`` 0) always passes."""
    if max_reports and new and stored + new > max_reports:
        raise CollectionFull(
            f"collection_id ({_show(collection_id)}) is full: it takes at most "
            f"{max_reports} reports and holds {stored}, so this batch's {new} new reports "
            "were refused (nothing of the batch was stored; do not resend it)"
        )


def check_pilot_phase(record: CollectionRecord, phase: int, new: int) -> None:
    """Refuse (:class:`PlanMismatch`) a batch with ``new`` reports under ``phase`` when
    that phase is a pilot that failed its check and the phase planned without it is
    stored (``phase`` is not the last): the pilot's reports count nowhere, so more of
    them would only fill the report cap ahead of the users. Call it with the record as
    it is under the lock the cap is checked under, like :func:`check_cap`. A batch of
    retries only (``new`` 0) passes: a stored pilot report is still acknowledged."""
    if new and phase < record.phase and pilot_failed(record.pilot_check):
        raise PlanMismatch(
            f"plan_digest ({record.plans[phase].digest[:12]}) is the pilot's, which "
            f"failed its check: fetch the current plan ({record.plan.digest[:12]}); "
            "nothing of the batch was stored"
        )


def check_next_phase(record: CollectionRecord, phase: int, plan: Plan) -> bool:
    """Whether ``add_phase(phase, plan)`` must store a new phase: False when ``phase``
    exists already (its first plan stays: starting a phase is idempotent), True when
    it is the next one of an open collection and ``plan`` keeps the collection's schema
    and epsilon with a digest of its own; else a :class:`CalmkitError`."""
    current = record.phase
    if phase <= current:
        return False
    if phase != current + 1:
        raise CalmkitError(f"phase ({phase}) must be the next phase ({current + 1})")
    if record.state != OPEN:
        raise CollectionClosed(f"collection_id ({_show(record.collection_id)}) is closed")
    first = record.plans[0]
    if plan.schema != first.schema or plan.epsilon != first.epsilon:
        raise CalmkitError("plan must keep the collection's schema and epsilon")
    if any(p.digest == plan.digest for p in record.plans):
        raise CalmkitError(f"plan ({plan.digest[:12]}) is already one of the phases")
    return True


def check_phase(phase: object, current: int) -> int:
    """``phase`` if it is an int in [0, ``current``], else a :class:`CalmkitError`."""
    if isinstance(phase, bool) or not isinstance(phase, int) or not 0 <= phase <= current:
        raise CalmkitError(f"phase ({_show(phase)}) must be in [0, {current}]")
    return phase


def check_admission(admission: object) -> TicketVerifier | None:
    """``admission`` if it is a :class:`TicketVerifier` or None, else a
    :class:`CalmkitError`."""
    if admission is not None and not isinstance(admission, TicketVerifier):
        raise CalmkitError(f"admission ({_show(admission)}) must be a TicketVerifier or None")
    return admission


def stored_admission(collection_id: str, scheme: str, key: bytes) -> TicketVerifier:
    """A collection's stored admission (scheme, key) read back and checked. Both
    backends store the key as given: the issuer's public key for ed25519, and for
    hmac-sha256 the shared secret key, so the database then holds a key that mints
    tickets (docs/security.md "Admission tickets")."""
    try:
        return TicketVerifier(str(scheme), bytes(key))
    except CalmkitError as exc:
        raise CalmkitError(
            f"admission of collection {_show(collection_id)} is invalid: {exc}"
        ) from None


def not_open(collection_id: str, state: str) -> CollectionClosed:
    """The error refusing reports to a collection in ``state`` (not open)."""
    return CollectionClosed(
        f"collection_id ({_show(collection_id)}) is {state}: it accepts no reports"
    )


def stored_plan(collection_id: str, phase: int, plan_json: str, digest: str) -> Plan:
    """A stored plan, read back with :meth:`Plan.from_json` and its digest checked
    against the stored one."""
    try:
        plan = Plan.from_json(plan_json)
    except CalmkitError as exc:
        raise CalmkitError(
            f"plan_json of collection {_show(collection_id)} (phase {phase}) is invalid: {exc}"
        ) from None
    if plan.digest != digest:
        raise CalmkitError(
            f"digest ({_show(digest)}) of collection {_show(collection_id)} (phase {phase}) "
            f"must match its plan ({plan.digest!r})"
        )
    return plan


# -- batches ----------------------------------------------------------------------------------
def batch_columns(plan: Plan, reports: Sequence[StoredReport] | ReportColumns) -> ReportColumns:
    """A batch for ``plan`` as validated columns: :class:`StoredReport` objects are
    checked and converted (:func:`.columns.columns_from_reports`); columns must have
    been decoded for ``plan``."""
    if isinstance(reports, ReportColumns):
        if reports.plan.digest != plan.digest:
            raise PlanMismatch(
                f"reports (decoded for plan {reports.plan.digest[:12]}) must be decoded "
                f"for plan_digest ({_show(plan.digest)})"
            )
        return reports
    bad = next((i for i, r in enumerate(reports) if not isinstance(r, StoredReport)), None)
    if bad is not None:
        raise CalmkitError(f"reports[{bad}] ({_show(reports[bad])}) must be a StoredReport")
    return columns_from_reports(plan, list(reports))


def _content(batch: ReportColumns) -> np.ndarray:
    """Per report, its whole content (pseudonym, view, payload) as one void value."""
    held = [vp for vp in batch.per_view if len(vp.rows)]  # a view without reports: no columns
    width = max([1] + [vp.payloads.reshape(len(vp.rows), -1).shape[1] * 8 for vp in held])
    payload = np.zeros((len(batch), width), dtype=np.uint8)
    for vp in held:
        raw = np.ascontiguousarray(vp.payloads).reshape(len(vp.rows), -1)
        raw = raw.astype(np.int64) if raw.dtype != np.uint8 else raw
        data = raw.view(np.uint8).reshape(len(vp.rows), -1)
        payload[vp.rows, : data.shape[1]] = data
    views = batch.views.astype("<i8").view(np.uint8).reshape(-1, 8)
    row = np.concatenate([batch.pseudonyms, views, payload], axis=1)
    return np.ascontiguousarray(row).view(f"V{row.shape[1]}").ravel()


def _distinct(keys: np.ndarray) -> bool:
    """Whether (n, 16) uint8 keys are all different, if their first 8 bytes already
    are (one sort of n integers); False when that cannot tell (then compare whole)."""
    head = np.sort(np.ascontiguousarray(keys[:, :8]).view("<u8").ravel())
    return not bool((head[1:] == head[:-1]).any())


def dedupe_batch(batch: ReportColumns) -> np.ndarray:
    """Sorted positions of the batch's distinct reports (the first of each report id).
    Identical repeats collapse; a repeat with other content, or two report ids with one
    pseudonym, raises :class:`ReportConflict` (both are the client's own values, so the
    message may name them)."""
    if _distinct(batch.report_ids) and _distinct(batch.pseudonyms):
        return np.arange(len(batch))  # the usual batch: nothing repeats
    ids = batch.report_ids.view("V16").ravel()
    _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    if first.size < len(batch):
        content = _content(batch)
        differs = np.flatnonzero(content != content[first[inverse]])
        if differs.size:
            i = int(differs[0])
            raise ReportConflict(
                f"reports[{i}].report_id ({_show(bytes(batch.report_ids[i]))}) repeats "
                f"reports[{int(first[inverse[i]])}] with different content"
            )
    firsts = np.sort(first)
    pseudonyms = batch.pseudonyms[firsts].view("V16").ravel()
    _, p_first, p_inverse = np.unique(pseudonyms, return_index=True, return_inverse=True)
    if p_first.size < firsts.size:
        again = np.flatnonzero(p_first[p_inverse] != np.arange(firsts.size))
        k = int(again[0])
        i, j = int(firsts[k]), int(firsts[p_first[p_inverse[k]]])
        raise ReportConflict(
            f"reports[{max(i, j)}].pseudonym ({_show(bytes(batch.pseudonyms[i]))}) already "
            f"holds reports[{min(i, j)}] in this batch"
        )
    return firsts


def new_positions(
    tables: KeyTables,
    collection_id: str,
    distinct: np.ndarray,
    ids: np.ndarray,
    pseudonyms: np.ndarray,
) -> np.ndarray:
    """Of the batch's ``distinct`` positions, those not yet stored (in ``tables``);
    ``ids`` and ``pseudonyms`` are the batch's keys as (n, 2) uint64 words.

    A report whose (report id, pseudonym) pair is stored is a retry: acknowledged as a
    duplicate and the stored report stands, whatever the content sent. A report id
    stored under another pseudonym, or a pseudonym holding another report id, is a
    :class:`ReportConflict` whose message names only what the client sent (see the
    module docstring: no answer reveals a stored report).
    """
    found, owner = tables.by_id.lookup(ids[distinct])
    mine = (owner == pseudonyms[distinct]).all(axis=1)
    taken = np.flatnonzero(found & ~mine)
    if taken.size:
        i = int(distinct[taken[0]])
        raise ReportConflict(
            f"reports[{i}].report_id ({_show(ids[i].tobytes())}) is already used in "
            f"collection {_show(collection_id)}"
        )
    new = distinct[~found]
    held, _ = tables.by_pseudonym.lookup(pseudonyms[new])
    if held.any():
        i = int(new[np.flatnonzero(held)[0]])
        raise ReportConflict(
            f"reports[{i}].pseudonym ({_show(pseudonyms[i].tobytes())}) already holds a report "
            f"in collection {_show(collection_id)} (a device reports once per collection)"
        )
    fresh: np.ndarray = new
    return fresh


def recount_log(
    collection_id: str, plans: tuple[Plan, ...], rows: Iterable[Sequence[Any]]
) -> SupportCounts:
    """The support counts of every phase combined (:func:`~..phases.combine_phases`),
    recounted from the batch log's ``rows`` (seq, phase, count, report_ids, pseudonyms,
    views, cells, bits), each validated again against its phase's plan: an audit of
    the stored counts that also finds a damaged log."""
    parts = [SupportCounts.zeros(p) for p in plans]
    for seq, phase, count, *blobs in rows:
        if not 0 <= phase < len(plans):
            raise CalmkitError(
                f"batch {seq} of collection {_show(collection_id)} has phase "
                f"({phase}) outside [0, {len(plans) - 1}]"
            )
        rid, pseudonyms, views, cells, bits = (bytes(b) for b in blobs)
        try:
            columns = decode_columns(
                plans[phase],
                count,
                report_ids=rid,
                pseudonyms=pseudonyms,
                views=views,
                cells=cells,
                bits=bits,
            )
        except CalmkitError as exc:
            raise CalmkitError(
                f"batch {seq} of collection {_show(collection_id)} is invalid: {exc}"
            ) from None
        n, counts = columns.support_deltas()
        old = parts[phase]
        parts[phase] = SupportCounts(
            old.plan, old.n + n, tuple(a + b for a, b in zip(old.counts, counts))
        )
    return combine_phases(parts)
