"""Durable storage of collections and their reports: the service's embedded default.

DESIGN.md "Service" and data flow step 4 (ingest): validate, deduplicate, persist, then
acknowledge; keep per-view support counts in memory, rebuilt from storage on restart.

One SQLite file in WAL mode with ``synchronous=FULL``: a batch is validated whole, then
written in one transaction, committed (so it survives SIGKILL and power loss) and only
then counted in memory and acknowledged. A batch is accepted whole or rejected whole;
a rejected batch leaves neither rows nor counts behind.

Tables (schema version :data:`SCHEMA_VERSION` in ``PRAGMA user_version``):

- ``collections(id, plan_json, digest, k, state, submit_token_hash, created_at,
  closed_at, design_json)``: the first phase's plan is stored as
  :meth:`Plan.to_json` and reloaded with :meth:`Plan.from_json`, which checks its
  digest; ``design_json`` (:class:`~.pilot.PhasedDesign`, or NULL for one phase)
  says how the next phase is planned.
- ``phases(collection_id, phase, plan_json, digest, created_at)``: the plans of the
  phases after the first (phase 1, 2, ...).
- ``reports(collection_id, report_id, pseudonym, view, payload, phase)``, keyed by
  ``(collection_id, report_id)`` (retries are idempotent) with one report per
  ``(collection_id, pseudonym)`` over all phases (the unique index
  ``reports_pseudonym``): a user reports once. ``view`` indexes the plan of
  ``phase``. A GRR payload is an INTEGER cell, an OUE payload a BLOB of
  ``ceil(L/8)`` packed bytes.

A version 1 file (one phase, no ``phases`` table) is migrated in place on open.

Thread safety: one connection shared by the gRPC server's worker threads, every use of
it and every count update guarded by one lock. Validation runs outside the lock.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any

import numpy as np

from calmkit_client import REPORT_ID_BYTES, FrequencyOracle, Plan
from calmkit_client.echo import show as _show
from calmkit_client.errors import (
    CalmkitError,
    CollectionClosed,
    CollectionExists,
    CollectionNotFound,
    OracleError,
    PlanMismatch,
    ReportConflict,
    ServiceUnavailable,
)
from calmkit_client.ids import check_collection_id

from .pilot import PhasedDesign, combine_phases
from .support import SupportCounts

__all__ = [
    "PSEUDONYM_BYTES",
    "SCHEMA_VERSION",
    "BatchOutcome",
    "CollectionRecord",
    "Storage",
    "StoredReport",
]

SCHEMA_VERSION = 2
PSEUDONYM_BYTES = 16
TOKEN_HASH_BYTES = 32  # sha256
OPEN, CLOSED = "open", "closed"
# Keys per "IN (...)" lookup: well under SQLite's host-parameter limit.
_LOOKUP_CHUNK = 500
# Page cache (negative: KiB): report ids are random keys, so inserts touch random pages.
_CACHE_KIB = -64 * 1024
# Longest value repr an error message shows.

_PHASES = """CREATE TABLE phases (
    collection_id TEXT NOT NULL REFERENCES collections (id),
    phase INTEGER NOT NULL CHECK (phase >= 1),
    plan_json TEXT NOT NULL,
    digest TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (collection_id, phase)
);"""
_SCHEMA = f"""
CREATE TABLE collections (
    id TEXT PRIMARY KEY,
    plan_json TEXT NOT NULL,
    digest TEXT NOT NULL,
    k INTEGER NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('{OPEN}', '{CLOSED}')),
    submit_token_hash BLOB NOT NULL,
    created_at REAL NOT NULL,
    closed_at REAL,
    design_json TEXT
);
CREATE TABLE reports (
    collection_id TEXT NOT NULL REFERENCES collections (id),
    report_id BLOB NOT NULL,
    pseudonym BLOB NOT NULL,
    view INTEGER NOT NULL,
    payload BLOB NOT NULL,  -- no conversion: GRR stores an INTEGER, OUE a BLOB
    phase INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (collection_id, report_id)
) WITHOUT ROWID;
-- UNIQUE (collection_id, pseudonym) as a named index, so lookups can name it
CREATE UNIQUE INDEX reports_pseudonym ON reports (collection_id, pseudonym);
{_PHASES}
PRAGMA user_version = {SCHEMA_VERSION};
"""
# Version 1 -> 2: phases.
_MIGRATE_1 = f"""
ALTER TABLE collections ADD COLUMN design_json TEXT;
ALTER TABLE reports ADD COLUMN phase INTEGER NOT NULL DEFAULT 0;
{_PHASES}
PRAGMA user_version = 2;
"""


@dataclass(frozen=True)
class StoredReport:
    """One report as stored: ``report_id`` and ``pseudonym`` (16 bytes each), ``view``
    (int) and ``payload`` (GRR: int cell; OUE: packed bytes). The wire layer validates
    these; :meth:`Storage.add_reports` checks them again against the plan."""

    report_id: bytes
    pseudonym: bytes
    view: int
    payload: int | bytes


@dataclass(frozen=True)
class CollectionRecord:
    """A collection's metadata and its number of counted reports.

    ``plans``: the plan of each phase so far (the last is the current one);
    ``design``: how the next phase is planned (None: one phase)."""

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

    @property
    def plan(self) -> Plan:
        """The current phase's plan: what new reports use."""
        return self.plans[-1]

    @property
    def phase(self) -> int:
        """The current phase (0-based)."""
        return len(self.plans) - 1

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


@dataclass
class _Entry:
    """In-memory state of one collection: metadata and, per phase, its live support
    counts (reports per view ``n[phase]`` and ``counts[phase][view]``)."""

    record: CollectionRecord
    n: list[np.ndarray]
    counts: list[list[np.ndarray]]

    @classmethod
    def empty(cls, record: CollectionRecord) -> _Entry:
        """An entry with zero counts."""
        entry = cls(record, [], [])
        for plan in record.plans:
            entry.add_phase(plan)
        return entry

    def add_phase(self, plan: Plan) -> None:
        zeros = SupportCounts.zeros(plan)
        self.n.append(zeros.n)
        self.counts.append(list(zeros.counts))

    def snapshot(self) -> CollectionRecord:
        """The record with the current report totals."""
        per_phase = tuple(int(n.sum()) for n in self.n)
        return replace(self.record, reports=sum(per_phase), phase_reports=per_phase)

    def support(self, phase: int) -> SupportCounts:
        return SupportCounts(self.record.plans[phase], self.n[phase].copy(),
                             tuple(c.copy() for c in self.counts[phase]))  # fmt: skip


@dataclass(frozen=True)
class _Batch:
    """A validated batch: columns (Python values, ready to bind) and per view the batch
    positions ``rows[j]`` and their validated payload arrays ``arrays[j]``."""

    ids: list[bytes]
    pseudonyms: list[bytes]
    views: list[int]
    payloads: list[int | bytes]
    rows: tuple[np.ndarray, ...]
    arrays: tuple[np.ndarray, ...]

    def key(self, i: int) -> tuple[bytes, int, int | bytes]:
        """What must match for report ``i`` to be a duplicate: (pseudonym, view, payload)."""
        return self.pseudonyms[i], self.views[i], self.payloads[i]


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _create_private(path: str) -> None:
    """Create a new database file with mode 0600 (SQLite gives its -wal and -shm files
    the database's mode); an existing file keeps its mode."""
    if path == ":memory:" or path.startswith("file:") or os.path.exists(path):
        return
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return
    except OSError as exc:
        raise CalmkitError(f"db ({path!r}) cannot be created: {exc.strerror}") from None


class Storage:
    """Collections and reports in one SQLite file, support counts in memory.

    Args:
        path: the database file (created with the schema when new). Opening an existing
            file rebuilds every collection's support counts from its reports.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        _create_private(self.path)
        try:
            self._conn: sqlite3.Connection | None = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise CalmkitError(f"db ({self.path!r}) cannot be opened: {exc}") from None
        try:
            self._configure(self._conn)
            self._load(self._conn)
        except sqlite3.OperationalError as exc:
            self._conn.close()
            self._conn = None
            raise CalmkitError(f"db ({self.path!r}) cannot be opened for writing: {exc}") from None
        except BaseException:
            self._conn.close()
            self._conn = None
            raise

    # -- opening -----------------------------------------------------------------------
    def _configure(self, conn: sqlite3.Connection) -> None:
        """WAL, full sync, foreign keys; create or check the schema."""
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if mode != "wal" and self.path != ":memory:":
            raise CalmkitError(f"journal_mode ({mode!r}) of {self.path!r} must be 'wal'")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("PRAGMA busy_timeout=10000")
        conn.execute(f"PRAGMA cache_size={_CACHE_KIB}")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version == 0:
            tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
            if tables:
                raise CalmkitError(f"database ({self.path!r}) is not a calmkit store")
            conn.executescript(f"BEGIN IMMEDIATE; {_SCHEMA} COMMIT;")
        elif version == 1:
            conn.executescript(f"BEGIN IMMEDIATE; {_MIGRATE_1} COMMIT;")
        elif version != SCHEMA_VERSION:
            raise CalmkitError(
                f"schema version ({version}) of {self.path!r} must be {SCHEMA_VERSION} (or 1, "
                "which is migrated)"
            )

    def _load(self, conn: sqlite3.Connection) -> None:
        """Read every collection and rebuild its support counts from its reports."""
        rows = conn.execute(
            "SELECT id, plan_json, digest, k, state, submit_token_hash, created_at, closed_at, "
            "design_json FROM collections ORDER BY created_at, id"
        ).fetchall()
        later: dict[str, list[tuple[str, str]]] = {}
        for cid, _phase, plan_json, digest in conn.execute(
            "SELECT collection_id, phase, plan_json, digest FROM phases "
            "ORDER BY collection_id, phase"
        ):
            later.setdefault(cid, []).append((plan_json, digest))
        for cid, plan_json, digest, k, state, token_hash, created, closed, design_json in rows:
            plans = tuple(
                _stored_plan(cid, i, text, d)
                for i, (text, d) in enumerate([(plan_json, digest), *later.get(cid, [])])
            )
            design = None if design_json is None else PhasedDesign.from_json(design_json)
            entry = _Entry.empty(
                CollectionRecord(cid, plans, k, state, token_hash, created, closed, 0, design)
            )
            self._recount(conn, entry)
            self._entries[cid] = entry

    @staticmethod
    def _recount(conn: sqlite3.Connection, entry: _Entry) -> None:
        """Support counts of one collection from its stored reports, per phase and
        view in bulk."""
        record = entry.record
        rows = conn.execute(
            "SELECT phase, view, payload FROM reports WHERE collection_id = ?",
            (record.collection_id,),
        ).fetchall()
        phases = np.fromiter((p for p, _, _ in rows), np.int64, count=len(rows))
        views = np.fromiter((v for _, v, _ in rows), np.int64, count=len(rows))
        if phases.size and (phases.min() < 0 or phases.max() > record.phase):
            bad = int(phases.min() if phases.min() < 0 else phases.max())
            raise CalmkitError(
                f"stored phase ({bad}) of collection {_show(record.collection_id)} must be in "
                f"[0, {record.phase}]"
            )
        for phase, plan in enumerate(record.plans):
            in_phase = phases == phase
            v = views[in_phase]
            if v.size and (v.min() < 0 or v.max() >= plan.m):
                bad = int(v.min() if v.min() < 0 else v.max())
                raise CalmkitError(
                    f"stored view ({bad}) of collection {_show(record.collection_id)} must be in "
                    f"[0, {plan.m})"
                )
            positions = np.flatnonzero(in_phase)
            for j, oracle in enumerate(plan.view_oracles):
                idx = positions[v == j]
                if not idx.size:
                    continue
                values = [rows[i][2] for i in idx.tolist()]
                try:
                    arr = _stored_payloads(oracle, values)
                    entry.counts[phase][j] += oracle.support(arr)
                except (CalmkitError, TypeError, ValueError) as exc:
                    raise CalmkitError(
                        f"stored payloads of view {j} (phase {phase}) of collection "
                        f"{_show(record.collection_id)} are invalid: {exc}"
                    ) from None
                entry.n[phase][j] = idx.size

    # -- collections -------------------------------------------------------------------
    def create_collection(
        self,
        collection_id: str,
        plan: Plan,
        k: int,
        submit_token_hash: bytes,
        design: PhasedDesign | None = None,
    ) -> CollectionRecord:
        """Create an open collection whose first phase uses ``plan`` (``design``: how
        the next phase is planned, None for one phase); :class:`CollectionExists` if
        the id is taken."""
        _check_collection_args(collection_id, plan, k, submit_token_hash)
        if design is not None and not isinstance(design, PhasedDesign):
            raise CalmkitError(f"design ({_show(design)}) must be a PhasedDesign or None")
        record = CollectionRecord(
            collection_id, (plan,), int(k), OPEN, bytes(submit_token_hash), time.time(), None,
            0, design,
        )  # fmt: skip
        with self._lock:
            conn = self._connection()
            if collection_id in self._entries:
                raise CollectionExists(f"collection_id ({_show(collection_id)}) already exists")
            with _transaction(conn):
                conn.execute(
                    "INSERT INTO collections (id, plan_json, digest, k, state, submit_token_hash,"
                    " created_at, closed_at, design_json) VALUES (?, ?, ?, ?, ?, ?, ?, NULL, ?)",
                    (
                        collection_id,
                        plan.to_json(),
                        plan.digest,
                        record.k,
                        OPEN,
                        record.submit_token_hash,
                        record.created_at,
                        None if design is None else design.to_json(),
                    ),
                )
            entry = _Entry.empty(record)
            self._entries[collection_id] = entry
            return entry.snapshot()

    def get_collection(self, collection_id: str) -> CollectionRecord:
        """The collection's record; :class:`CollectionNotFound` if unknown."""
        with self._lock:
            self._connection()
            return self._entry(collection_id).snapshot()

    def list_collections(self) -> list[CollectionRecord]:
        """Every collection, oldest first."""
        with self._lock:
            self._connection()
            return [entry.snapshot() for entry in self._entries.values()]

    def close_collection(self, collection_id: str) -> CollectionRecord:
        """Stop accepting reports. Idempotent: closing a closed collection returns it."""
        with self._lock:
            conn = self._connection()
            entry = self._entry(collection_id)
            if entry.record.state == CLOSED:
                return entry.snapshot()
            closed_at = time.time()
            with _transaction(conn):
                conn.execute(
                    "UPDATE collections SET state = ?, closed_at = ? WHERE id = ?",
                    (CLOSED, closed_at, collection_id),
                )
            entry.record = replace(entry.record, state=CLOSED, closed_at=closed_at)
            return entry.snapshot()

    def add_phase(self, collection_id: str, phase: int, plan: Plan) -> CollectionRecord:
        """Start ``phase`` with ``plan`` (committed before it is served). Idempotent
        when that phase already exists (another caller started it first: its plan
        stays); a phase further ahead than the next one is an error."""
        if not isinstance(plan, Plan):
            raise CalmkitError(f"plan ({_show(plan)}) must be a Plan")
        with self._lock:
            conn = self._connection()
            entry = self._entry(collection_id)
            current = entry.record.phase
            if phase <= current:
                return entry.snapshot()
            if phase != current + 1:
                raise CalmkitError(f"phase ({phase}) must be the next phase ({current + 1})")
            if entry.record.state != OPEN:
                raise CollectionClosed(f"collection_id ({_show(collection_id)}) is closed")
            first = entry.record.plans[0]
            if plan.schema != first.schema or plan.epsilon != first.epsilon:
                raise CalmkitError("plan must keep the collection's schema and epsilon")
            if any(p.digest == plan.digest for p in entry.record.plans):
                raise CalmkitError(f"plan ({plan.digest[:12]}) is already one of the phases")
            with _transaction(conn):
                conn.execute(
                    "INSERT INTO phases (collection_id, phase, plan_json, digest, created_at) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (collection_id, phase, plan.to_json(), plan.digest, time.time()),
                )
            entry.record = replace(entry.record, plans=(*entry.record.plans, plan))
            entry.add_phase(plan)
            return entry.snapshot()

    # -- reports -------------------------------------------------------------------------
    def add_reports(
        self, collection_id: str, plan_digest: str, reports: Sequence[StoredReport]
    ) -> BatchOutcome:
        """Validate, deduplicate and durably store a batch, then count it.

        The batch is written whole in one committed transaction and only then counted,
        or nothing of it is written or counted.

        Raises:
            CollectionNotFound, CollectionClosed, PlanMismatch: collection-level errors.
            CalmkitError: a malformed report (the message names ``reports[i].field``
                and its value).
            ReportConflict: a report id already holds a different report, or a
                pseudonym already holds another report (also within the batch).
        """
        with self._lock:
            self._connection()
            entry = self._open_entry(collection_id)
            phase = entry.record.phase_of(plan_digest)
            plan = entry.record.plans[phase]
        batch = _validate(plan, list(reports))
        if not batch.ids:
            return BatchOutcome(0, 0)
        unique, by_pseudonym = _dedupe_batch(batch)
        with self._lock:
            conn = self._connection()
            entry = self._open_entry(collection_id)
            with _transaction(conn):
                new = self._check_stored(conn, collection_id, phase, batch, unique, by_pseudonym)
                conn.executemany(
                    "INSERT INTO reports (collection_id, report_id, pseudonym, view, payload, "
                    "phase) VALUES (?, ?, ?, ?, ?, ?)",
                    _rows(collection_id, phase, batch, new),
                )
                deltas = _deltas(plan, batch, new)
            for j, (n_j, c_j) in enumerate(deltas):
                entry.n[phase][j] += n_j
                entry.counts[phase][j] += c_j
        return BatchOutcome(len(new), len(batch.ids) - len(new))

    def _check_stored(
        self,
        conn: sqlite3.Connection,
        collection_id: str,
        phase: int,
        batch: _Batch,
        unique: dict[bytes, int],
        by_pseudonym: dict[bytes, int],
    ) -> list[int]:
        """Batch positions of the reports not yet stored.

        A report whose (report id, pseudonym) pair is stored is a retry: acknowledged
        as a duplicate and the stored report stands, whatever the content sent. A report
        id stored under another pseudonym, or a pseudonym holding another report id,
        is a :class:`ReportConflict`. No answer depends on a stored report's view,
        payload or phase, and no error names a stored value (docs/security.md
        "Conflicting reports"): a submit-token holder who learns a victim's pseudonym
        cannot probe the victim's report.
        """
        stored = _lookup(conn, _BY_REPORT_ID, collection_id, list(unique))
        for report_id, pseudonym, _view, _payload, _phase in stored:
            i = unique[report_id]
            if pseudonym != batch.pseudonyms[i]:
                raise ReportConflict(
                    f"reports[{i}].report_id ({_show(report_id)}) is already used in "
                    f"collection {_show(collection_id)}"
                )
        owners = _lookup(conn, _BY_PSEUDONYM, collection_id, list(by_pseudonym))
        for report_id, pseudonym in owners:
            i = by_pseudonym[pseudonym]
            if report_id != batch.ids[i]:
                raise ReportConflict(
                    f"reports[{i}].pseudonym ({_show(pseudonym)}) already holds a report in "
                    f"collection {_show(collection_id)} (a device reports once per collection)"
                )
        if not stored:
            return sorted(unique.values())
        seen = {row[0] for row in stored}
        return sorted(i for rid, i in unique.items() if rid not in seen)

    def support(self, collection_id: str) -> SupportCounts:
        """A copy of the collection's support counts over every phase (one
        reconstruction plan, :func:`~.pilot.combine_phases`), consistent with
        committed rows."""
        with self._lock:
            self._connection()
            entry = self._entry(collection_id)
            parts = [entry.support(i) for i in range(len(entry.record.plans))]
        return combine_phases(parts)

    def phase_support(self, collection_id: str, phase: int) -> SupportCounts:
        """A copy of one phase's support counts (its own plan)."""
        with self._lock:
            self._connection()
            entry = self._entry(collection_id)
            if isinstance(phase, bool) or not isinstance(phase, int) or not (
                0 <= phase <= entry.record.phase
            ):
                raise CalmkitError(f"phase ({_show(phase)}) must be in [0, {entry.record.phase}]")
            return entry.support(phase)

    # -- lifecycle -------------------------------------------------------------------------
    def close(self) -> None:
        """Close the database (idempotent); later calls raise :class:`CalmkitError`."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> Storage:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- helpers (call with the lock held) ----------------------------------------------
    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise ServiceUnavailable("storage is closed (the server is shutting down)")
        return self._conn

    def __contains__(self, collection_id: object) -> bool:
        """Whether a collection with this id is stored."""
        return isinstance(collection_id, str) and collection_id in self._entries

    def _entry(self, collection_id: str) -> _Entry:
        entry = self._entries.get(collection_id) if isinstance(collection_id, str) else None
        if entry is None:
            raise CollectionNotFound(f"collection_id ({_show(collection_id)}) not found")
        return entry

    def _open_entry(self, collection_id: str) -> _Entry:
        """The entry of an open collection."""
        entry = self._entry(collection_id)
        if entry.record.state != OPEN:
            raise CollectionClosed(
                f"collection_id ({_show(collection_id)}) is {entry.record.state}: it accepts "
                "no reports"
            )
        return entry


# -- transactions and lookups ------------------------------------------------------------
@contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``; ``ROLLBACK`` if the body or the commit fails."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


_BY_REPORT_ID = (
    "SELECT report_id, pseudonym, view, payload, phase FROM reports "
    "WHERE collection_id = ? AND report_id IN ({})"
)
# Named: SQLite's planner would otherwise scan the collection through the primary key.
_BY_PSEUDONYM = (
    "SELECT report_id, pseudonym FROM reports INDEXED BY reports_pseudonym "
    "WHERE collection_id = ? AND pseudonym IN ({})"
)


def _lookup(
    conn: sqlite3.Connection, query: str, collection_id: str, keys: list[bytes]
) -> list[tuple[Any, ...]]:
    """Rows of ``query`` (:data:`_BY_REPORT_ID` or :data:`_BY_PSEUDONYM`) for ``keys``,
    in chunks of IN lookups."""
    out: list[tuple[Any, ...]] = []
    for lo in range(0, len(keys), _LOOKUP_CHUNK):
        chunk = keys[lo : lo + _LOOKUP_CHUNK]
        marks = ",".join("?" * len(chunk))
        out.extend(conn.execute(query.format(marks), (collection_id, *chunk)))
    return out


def _rows(
    collection_id: str, phase: int, batch: _Batch, positions: list[int]
) -> Iterator[tuple[str, bytes, bytes, int, int | bytes, int]]:
    """Insert tuples of the batch reports at ``positions``."""
    for i in positions:
        yield (collection_id, batch.ids[i], batch.pseudonyms[i], batch.views[i],
               batch.payloads[i], phase)  # fmt: skip


def _deltas(plan: Plan, batch: _Batch, positions: list[int]) -> list[tuple[int, np.ndarray]]:
    """Per view: (reports added, support counts added) by the reports at ``positions``."""
    new = np.zeros(len(batch.ids), dtype=bool)
    new[positions] = True
    out = []
    for oracle, rows, arr in zip(plan.view_oracles, batch.rows, batch.arrays):
        keep = new[rows]
        out.append((int(keep.sum()), oracle.support(arr[keep])))
    return out


def _stored_plan(collection_id: str, phase: int, plan_json: str, digest: str) -> Plan:
    """A stored plan, its digest checked."""
    try:
        plan = Plan.from_json(plan_json)
    except CalmkitError as exc:
        raise CalmkitError(
            f"plan_json of collection {_show(collection_id)} (phase {phase}) is invalid: {exc}"
        ) from None
    if plan.digest != digest:
        raise CalmkitError(
            f"digest ({_show(digest)}) of collection {_show(collection_id)} (phase {phase}) "
            "must match "
            f"its plan ({plan.digest!r})"
        )
    return plan


# -- validation ----------------------------------------------------------------------------
def _check_collection_args(collection_id: str, plan: Plan, k: int, token_hash: bytes) -> None:
    check_collection_id(collection_id)
    if not isinstance(plan, Plan):
        raise CalmkitError(f"plan ({_show(plan)}) must be a Plan")
    if not _is_int(k) or not 1 <= int(k) <= plan.schema.d:
        raise CalmkitError(f"k ({k!r}) must be an int in [1, {plan.schema.d}]")
    if not isinstance(token_hash, bytes) or len(token_hash) != TOKEN_HASH_BYTES:
        raise CalmkitError(
            f"submit_token_hash ({_show(token_hash)}) must be {TOKEN_HASH_BYTES} bytes (sha256)"
        )


def _validate(plan: Plan, reports: list[StoredReport]) -> _Batch:
    """Check every report against ``plan``; the first bad one raises a
    :class:`CalmkitError` naming ``reports[i].field`` and its value."""
    bad = next((i for i, r in enumerate(reports) if not isinstance(r, StoredReport)), None)
    if bad is not None:
        raise CalmkitError(f"reports[{bad}] ({_show(reports[bad])}) must be a StoredReport")
    ids = [r.report_id for r in reports]
    pseudonyms = [r.pseudonym for r in reports]
    _check_bytes("report_id", ids, REPORT_ID_BYTES)
    _check_bytes("pseudonym", pseudonyms, PSEUDONYM_BYTES)
    raw_views = [r.view for r in reports]
    bad = next((i for i, v in enumerate(raw_views) if not _is_int(v) or not 0 <= v < plan.m), None)
    if bad is not None:
        shown = _show(raw_views[bad])
        raise CalmkitError(f"reports[{bad}].view ({shown}) must be in [0, {plan.m})")
    views = np.array(raw_views, dtype=np.int64).reshape(-1)
    payloads: list[int | bytes] = [r.payload for r in reports]
    order = np.argsort(views, kind="stable")
    starts = np.searchsorted(views[order], np.arange(plan.m + 1))
    rows, arrays = [], []
    for j, oracle in enumerate(plan.view_oracles):
        rows_j = order[starts[j] : starts[j + 1]]
        arr = _view_payloads(oracle, j, rows_j, payloads)
        if oracle.name == "GRR":  # bind Python ints, whatever int type was given
            for i, p in zip(rows_j.tolist(), arr.tolist()):
                payloads[i] = p
        rows.append(rows_j)
        arrays.append(arr)
    return _Batch(ids, pseudonyms, views.tolist(), payloads, tuple(rows), tuple(arrays))


def _check_bytes(field: str, values: list[Any], size: int) -> None:
    bad = next(
        (i for i, v in enumerate(values) if not isinstance(v, bytes) or len(v) != size), None
    )
    if bad is not None:
        raise CalmkitError(f"reports[{bad}].{field} ({_show(values[bad])}) must be {size} bytes")


def _view_payloads(
    oracle: FrequencyOracle, view: int, rows: np.ndarray, payloads: list[int | bytes]
) -> np.ndarray:
    """The payloads at batch positions ``rows`` (all of view ``view``) as the oracle's
    validated array: (n,) int64 (GRR) or (n, ceil(L/8)) uint8 (OUE)."""
    positions = rows.tolist()
    values = [payloads[i] for i in positions]
    if oracle.name == "GRR":
        bad = next((k for k, p in enumerate(values) if not _is_int(p)), None)
        what = f"an int cell (view {view} is GRR, L={oracle.L})"
    else:
        nbytes = (oracle.L + 7) // 8
        bad = next(
            (k for k, p in enumerate(values) if not isinstance(p, bytes) or len(p) != nbytes),
            None,
        )
        what = f"{nbytes} bytes (view {view} is OUE, L={oracle.L})"
    if bad is not None:
        raise CalmkitError(
            f"reports[{positions[bad]}].payload ({_show(values[bad])}) must be {what}"
        )
    try:
        return oracle.check_payloads(_payload_array(oracle, values))
    except OracleError:
        k, exc = _first_bad_payload(oracle, values)
        raise CalmkitError(
            f"reports[{positions[k]}].payload ({_show(values[k])}) is not a valid view {view} "
            f"payload: {exc}"
        ) from None


def _payload_array(oracle: FrequencyOracle, values: list[Any]) -> np.ndarray:
    """Type-checked payloads of one view as an array: ints (n,) or bytes (n, nbytes)."""
    if oracle.name == "GRR":
        return np.array(values) if values else np.zeros(0, np.int64)
    nbytes = (oracle.L + 7) // 8
    return np.frombuffer(b"".join(values), dtype=np.uint8).reshape(len(values), nbytes)


def _first_bad_payload(oracle: FrequencyOracle, values: list[Any]) -> tuple[int, OracleError]:
    """The first payload the oracle rejects, with its error (error path only)."""
    for k in range(len(values)):
        try:
            oracle.check_payloads(_payload_array(oracle, values[k : k + 1]))
        except OracleError as exc:
            return k, exc
    raise AssertionError("check_payloads rejected the batch but no single row")  # pragma: no cover


def _dedupe_batch(batch: _Batch) -> tuple[dict[bytes, int], dict[bytes, int]]:
    """``report_id -> first position`` and ``pseudonym -> position`` of the batch's
    distinct reports. Identical repeats collapse; a repeat with other content, or two
    report ids with one pseudonym, raises :class:`ReportConflict`."""
    n = len(batch.ids)
    unique = dict(zip(reversed(batch.ids), range(n - 1, -1, -1)))
    if len(unique) < n:
        for i, rid in enumerate(batch.ids):
            first = unique[rid]
            if first != i and batch.key(i) != batch.key(first):
                raise ReportConflict(
                    f"reports[{i}].report_id ({_show(rid)}) repeats reports[{first}] with "
                    f"different content"
                )
    firsts = sorted(unique.values())
    by_pseudonym = dict(zip((batch.pseudonyms[i] for i in reversed(firsts)), reversed(firsts)))
    if len(by_pseudonym) < len(firsts):
        for i in firsts:
            first = by_pseudonym[batch.pseudonyms[i]]
            if first != i:
                raise ReportConflict(
                    f"reports[{max(i, first)}].pseudonym ({_show(batch.pseudonyms[i])}) already "
                    f"holds reports[{min(i, first)}] in this batch"
                )
    return unique, by_pseudonym


def _stored_payloads(oracle: FrequencyOracle, values: list[Any]) -> np.ndarray:
    """Stored payload values of one view as the oracle's array (reload path)."""
    if oracle.name == "GRR":
        if not all(_is_int(v) for v in values):
            raise CalmkitError("GRR payloads must be INTEGER cells")
    else:
        nbytes = (oracle.L + 7) // 8
        if not all(isinstance(v, bytes) and len(v) == nbytes for v in values):
            raise CalmkitError(f"OUE payloads must be BLOBs of {nbytes} bytes")
    return oracle.check_payloads(_payload_array(oracle, values))
