"""Durable storage of collections and their reports: the service's embedded default,
one implementation of :class:`~.store.ReportStore`.

Ingest validates, deduplicates, persists, then acknowledges. One SQLite file in WAL
mode with ``synchronous=FULL``. A batch is validated whole (in columns, :mod:`.columns`),
deduplicated against in-memory key tables (:mod:`.keyset`) by the rules both backends
share (:mod:`.store`), then appended to the batch log together with the collection's
updated support counts in one transaction, committed (so it survives SIGKILL and power
loss), and only then counted in memory and acknowledged. A batch is accepted whole or
rejected whole; a rejected batch leaves neither rows nor counts behind.

Nothing is keyed by a client's random values on disk, so a batch costs the same with
10 reports stored or 10 million: one appended row, one rewritten counts row.

Tables (schema version :data:`SCHEMA_VERSION` in ``PRAGMA user_version``):

- ``collections(id, plan_json, digest, k, state, submit_token_hash, created_at,
  closed_at, design_json)``: the first phase's plan is stored as
  :meth:`Plan.to_json` and reloaded with :meth:`Plan.from_json`, which checks its
  digest; ``design_json`` (:class:`~..phases.PhasedDesign`, or NULL for one phase)
  says how the next phase is planned.
- ``phases(collection_id, phase, plan_json, digest, created_at)``: the plans of the
  phases after the first (phase 1, 2, ...).
- ``batches(seq, collection_id, phase, count, report_ids, pseudonyms, views, cells,
  bits)``: the append-only batch log, one row per accepted batch holding only its new
  reports, in the columnar layout of :mod:`.columns`.
- ``support(collection_id, phase, n, counts)``: the support counts of every phase,
  int64 little-endian (``n``: reports per view; ``counts``: the views' counts
  concatenated), rewritten in the transaction of each batch, so a restart reads them
  instead of recounting.
- ``collections.max_reports`` (the report cap, 0: none) and ``collections.pilot_check``
  (the pilot's feasibility check), and ``flags(seq, collection_id, created_at, flag)``:
  manipulation flags raised at ingest (:mod:`..integrity`), so ``collection status``
  shows them after a restart. Version 3 files gain them on open with no cap on their
  existing collections (their expected number of reports is not stored).
- ``admissions(collection_id, scheme, key)``: the admission-ticket scheme and key of a
  collection created with one (no row: reports need no ticket). The key is stored as
  given: a public key for ed25519, the shared secret for hmac-sha256 (see
  :func:`~.store.stored_admission`). Added in version 5 (an older file gets the
  empty table on open).
- ``collections.expected_n``: the number of users the collection was planned for
  (``--n``), shown as its progress target. Added in version 6; existing collections
  get 0 (not stored).

Report ids (retries are idempotent) and pseudonyms (a user reports once per
collection, over all phases) are unique per collection: the key tables are rebuilt
from the batch log when the file is opened, in a background thread, so the service
serves plans, queries and health at once and a submit waits only for its collection's
tables. Version 1 and 2 files (one row per report) are migrated in place on open.

Thread safety: one connection shared by the gRPC server's worker threads, every use of
it and every count update guarded by one lock. Validation runs outside the lock.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Any

import numpy as np

from calmkit_client import Plan
from calmkit_client.echo import show as _show
from calmkit_client.errors import (
    CalmkitError,
    CollectionExists,
    CollectionNotFound,
    ServiceUnavailable,
)
from calmkit_client.tickets import TicketVerifier

from ..phases import PhasedDesign, combine_phases
from ..reconstruction.support import SupportCounts
from .columns import KEY_BYTES, ReportColumns, columns_from_reports
from .keyset import KeyTable, as_words
from .snapshot import (
    SnapshotError,
    SnapshotSchedule,
    ids_hash,
    read_snapshot,
)
from .store import (
    CLOSED,
    MAX_FLAGS,
    OPEN,
    BatchOutcome,
    CollectionRecord,
    StoredReport,
    batch_columns,
    check_admission,
    check_cap,
    check_collection_args,
    check_flag,
    check_next_phase,
    check_phase,
    check_pilot_phase,
    check_plan,
    dedupe_batch,
    new_positions,
    not_open,
    recount_log,
    stored_admission,
    stored_plan,
)

__all__ = ["SCHEMA_VERSION", "Storage"]

SCHEMA_VERSION = 6
log = logging.getLogger("calmkit.aggregator")
# Reports per batch-log row when a version 1/2 file is migrated.
_MIGRATE_CHUNK = 10_000
_I64 = np.dtype("<i8")

_PHASES = """CREATE TABLE phases (
    collection_id TEXT NOT NULL REFERENCES collections (id),
    phase INTEGER NOT NULL CHECK (phase >= 1),
    plan_json TEXT NOT NULL,
    digest TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (collection_id, phase)
);"""
_LOG = """CREATE TABLE batches (
    seq INTEGER PRIMARY KEY,  -- rowid: appended at the end of the table
    collection_id TEXT NOT NULL REFERENCES collections (id),
    phase INTEGER NOT NULL,
    count INTEGER NOT NULL,
    report_ids BLOB NOT NULL,
    pseudonyms BLOB NOT NULL,
    views BLOB NOT NULL,
    cells BLOB NOT NULL,
    bits BLOB NOT NULL
);
CREATE INDEX batches_collection ON batches (collection_id, seq);
CREATE TABLE support (
    collection_id TEXT NOT NULL REFERENCES collections (id),
    phase INTEGER NOT NULL,
    n BLOB NOT NULL,
    counts BLOB NOT NULL,
    PRIMARY KEY (collection_id, phase)
);"""
_ADMISSIONS = """CREATE TABLE admissions (
    collection_id TEXT PRIMARY KEY REFERENCES collections (id),
    scheme TEXT NOT NULL,
    key BLOB NOT NULL
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
{_PHASES}
{_LOG}
"""
# Version 3 -> 4 (and part of a new file's schema): the report cap, the pilot check,
# manipulation flags. Existing collections get no cap.
_MIGRATE_3 = """
ALTER TABLE collections ADD COLUMN max_reports INTEGER NOT NULL DEFAULT 0;
ALTER TABLE collections ADD COLUMN pilot_check TEXT NOT NULL DEFAULT '';
CREATE TABLE flags (
    seq INTEGER PRIMARY KEY,
    collection_id TEXT NOT NULL REFERENCES collections (id),
    created_at REAL NOT NULL,
    flag TEXT NOT NULL
);
PRAGMA user_version = 4;
"""
# Version 1 -> 2: phases.
_MIGRATE_1 = f"""
ALTER TABLE collections ADD COLUMN design_json TEXT;
ALTER TABLE reports ADD COLUMN phase INTEGER NOT NULL DEFAULT 0;
{_PHASES}
PRAGMA user_version = 2;
"""
# Version 4 -> 5 (and part of a new file's schema): admission tickets.
_MIGRATE_4 = f"""
{_ADMISSIONS}
PRAGMA user_version = 5;
"""
# Version 5 -> 6 (and part of a new file's schema): the expected number of users (--n);
# existing collections get 0 (not stored).
_MIGRATE_5 = """
ALTER TABLE collections ADD COLUMN expected_n INTEGER NOT NULL DEFAULT 0;
PRAGMA user_version = 6;
"""


@dataclass
class _Entry:
    """In-memory state of one collection: metadata, per phase its live support counts
    (reports per view ``n[phase]`` and ``counts[phase][view]``), and the key tables of
    its stored reports (``by_id``: report id -> pseudonym; ``by_pseudonym``: pseudonym
    -> report id), usable once ``ready`` is set."""

    record: CollectionRecord
    n: list[np.ndarray]
    counts: list[list[np.ndarray]]
    by_id: KeyTable = field(default_factory=KeyTable)
    by_pseudonym: KeyTable = field(default_factory=lambda: KeyTable(values=False))
    ready: threading.Event = field(default_factory=threading.Event)
    load_error: BaseException | None = None
    seq: int = 0  # the last batch-log row in the tables
    ids_hash: int = 0  # snapshot.ids_hash of that row's report ids
    snapshot_seq: int = 0  # the last row in the last snapshot written or read
    snapshot_reports: int = 0
    key_source: str = ""  # where the tables came from: "snapshot" or "log"

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
        return SupportCounts(
            self.record.plans[phase],
            self.n[phase].copy(),
            tuple(c.copy() for c in self.counts[phase]),
        )

    def support_row(self, phase: int) -> tuple[bytes, bytes]:
        """(n, counts) of ``phase`` as the ``support`` table's blobs."""
        return (
            self.n[phase].astype(_I64).tobytes(),
            np.concatenate(self.counts[phase]).astype(_I64).tobytes(),
        )

    def set_support_row(self, phase: int, n_blob: bytes, counts_blob: bytes) -> None:
        plan = self.record.plans[phase]
        sizes = [o.L for o in plan.view_oracles]
        ok = isinstance(n_blob, bytes) and isinstance(counts_blob, bytes)
        ok = ok and len(n_blob) == 8 * plan.m and len(counts_blob) == 8 * sum(sizes)
        n = np.frombuffer(n_blob, dtype=_I64).astype(np.int64) if ok else np.zeros(0)
        flat = np.frombuffer(counts_blob, dtype=_I64).astype(np.int64) if ok else n
        if not ok or (n < 0).any() or (flat < 0).any():
            raise CalmkitError(
                f"stored support of collection {_show(self.record.collection_id)} (phase "
                f"{phase}) must hold {plan.m} view counts and {sum(sizes)} cell counts"
            )
        self.n[phase] = n
        self.counts[phase] = list(np.split(flat, np.cumsum(sizes)[:-1]))


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


class Storage(SnapshotSchedule):
    """Collections and reports in one SQLite file, support counts in memory.

    Args:
        path: the database file (created with the schema when new; a version 1 or 2
            file is migrated). Opening reads every collection and its stored support
            counts; the key tables behind deduplication load in the background.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        memory = self.path == ":memory:" or self.path.startswith("file:")
        self._snapshots = None if memory else self.path + "-keys"
        self._snapshotter: threading.Thread | None = None
        self.snapshot_bytes = 0  # key snapshots written by this process
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
        self._loader = threading.Thread(
            target=self._load_keys, name="calmkit-storage-keys", daemon=True
        )
        self._loader.start()

    # -- opening -----------------------------------------------------------------------
    def _configure(self, conn: sqlite3.Connection) -> None:
        """WAL, full sync, foreign keys; create, migrate or check the schema."""
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if mode != "wal" and self.path != ":memory:":
            raise CalmkitError(f"journal_mode ({mode!r}) of {self.path!r} must be 'wal'")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("PRAGMA busy_timeout=10000")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version == 0:
            tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
            if tables:
                raise CalmkitError(f"database ({self.path!r}) is not a calmkit store")
            conn.executescript(
                f"BEGIN IMMEDIATE; {_SCHEMA} {_MIGRATE_3} {_MIGRATE_4} {_MIGRATE_5} COMMIT;"
            )
        elif version in (1, 2, 3, 4, 5):
            with _transaction(conn):
                if version == 1:
                    _execute_script(conn, _MIGRATE_1)
                if version < 3:
                    _migrate_rows_to_log(conn)
                if version < 4:
                    _execute_script(conn, _MIGRATE_3)
                if version < 5:
                    _execute_script(conn, _MIGRATE_4)
                _execute_script(conn, _MIGRATE_5)
        elif version != SCHEMA_VERSION:
            raise CalmkitError(
                f"schema version ({version}) of {self.path!r} must be {SCHEMA_VERSION} (or 1, "
                "2, 3, 4 or 5, which are migrated)"
            )

    def _load(self, conn: sqlite3.Connection) -> None:
        """Read every collection, its phases' plans and its stored support counts."""
        flags: dict[str, list[str]] = {}
        for cid, flag in conn.execute("SELECT collection_id, flag FROM flags ORDER BY seq"):
            flags.setdefault(cid, []).append(flag)
        extra = {
            cid: (cap, check, expected)
            for cid, cap, check, expected in conn.execute(
                "SELECT id, max_reports, pilot_check, expected_n FROM collections"
            )
        }
        admissions = {
            cid: stored_admission(cid, scheme, key)
            for cid, scheme, key in conn.execute(
                "SELECT collection_id, scheme, key FROM admissions"
            )
        }
        for cid, plans, k, state, token_hash, created, closed, design in _read_collections(conn):
            cap, pilot_check, expected = extra[cid]
            entry = _Entry.empty(
                CollectionRecord(
                    cid,
                    plans,
                    k,
                    state,
                    token_hash,
                    created,
                    closed,
                    0,
                    design,
                    max_reports=cap,
                    flags=tuple(flags.get(cid, ())),
                    pilot_check=pilot_check,
                    admission=admissions.get(cid),
                    expected_n=expected,
                )
            )
            for phase, n_blob, counts_blob in conn.execute(
                "SELECT phase, n, counts FROM support WHERE collection_id = ? ORDER BY phase",
                (cid,),
            ):
                if not 0 <= phase < len(plans):
                    raise CalmkitError(
                        f"stored phase ({phase}) of collection {_show(cid)} must be in "
                        f"[0, {len(plans) - 1}]"
                    )
                entry.set_support_row(phase, n_blob, counts_blob)
            if state != OPEN:
                entry.ready.set()  # a closed collection takes no reports: no key tables
                self._drop_snapshot(cid)
            self._entries[cid] = entry

    def _load_keys(self) -> None:
        """Background: fill the open collections' key tables, from their snapshots and
        the log rows after them, or else from the whole batch log, on a connection of
        its own (WAL readers do not block the writer)."""
        pending = [e for e in self._entries.values() if not e.ready.is_set()]
        if not pending:
            return
        try:
            conn = sqlite3.connect(self.path, check_same_thread=False)
        except sqlite3.Error as exc:
            for entry in pending:
                entry.load_error = exc
                entry.ready.set()
            return
        try:
            for entry in pending:
                try:
                    if not self._load_snapshot(conn, entry):
                        self._load_log(conn, entry)
                except BaseException as exc:  # reported to the submits that wait
                    entry.load_error = exc
                finally:
                    entry.ready.set()
        finally:
            conn.close()

    def _load_log(self, conn: sqlite3.Connection, entry: _Entry) -> None:
        """Fill the tables from the whole batch log."""
        ids, pseudonyms, entry.seq, entry.ids_hash = _stored_keys(conn, entry.record.collection_id)
        # the two tables fill in parallel (numpy's sorts and copies drop the GIL)
        other = threading.Thread(target=entry.by_pseudonym.insert, args=(pseudonyms,))
        other.start()
        entry.by_id.insert(ids, pseudonyms)
        other.join()
        if len(entry.by_pseudonym) != len(ids):
            raise CalmkitError("the pseudonym table did not fill")
        entry.key_source = "log"

    def _load_snapshot(self, conn: sqlite3.Connection, entry: _Entry) -> bool:
        """Fill the tables from the collection's snapshot and the log rows after it;
        False (tables untouched) when there is no usable snapshot: missing, corrupt,
        or not of this log (its last row is not there with the same report ids, or
        the log holds another number of reports up to it)."""
        cid = entry.record.collection_id
        path = self._snapshot_path(cid)
        if path is None or not os.path.exists(path):
            return False
        try:
            snap = read_snapshot(path, cid)
        except SnapshotError as exc:
            log.warning(
                "key snapshot of collection %r not used (%s): rebuilding from the log", cid, exc
            )
            return False
        row = conn.execute(
            "SELECT report_ids, (SELECT coalesce(sum(count), 0) FROM batches WHERE "
            "collection_id = ? AND seq <= ?) FROM batches WHERE collection_id = ? AND seq = ?",
            (cid, snap.seq, cid, snap.seq),
        ).fetchone()
        if row is None or ids_hash(row[0]) != snap.ids_hash or row[1] != snap.reports:
            log.warning(
                "key snapshot of collection %r not used (it does not match the batch "
                "log): rebuilding from the log",
                cid,
            )
            return False
        ids, pseudonyms, seq, hashed = _stored_keys(conn, cid, after=snap.seq)
        snap.by_id.insert(ids, pseudonyms)
        snap.by_pseudonym.insert(pseudonyms)
        entry.by_id, entry.by_pseudonym = snap.by_id, snap.by_pseudonym
        entry.snapshot_seq, entry.snapshot_reports = snap.seq, snap.reports
        entry.seq, entry.ids_hash = (seq, hashed) if ids.size else (snap.seq, snap.ids_hash)
        entry.key_source = "snapshot"
        return True

    # -- key snapshots -------------------------------------------------------------------
    def _snapshot(self, collection_id: str, locked: bool = False) -> None:
        """Write a collection's key snapshot: the tables are copied under the lock
        (``locked``: the caller holds it), the file written outside it. A failure is
        logged: the next restart rebuilds from the log."""
        path = self._snapshot_path(collection_id)
        if path is None:
            return
        try:
            with contextlib.nullcontext() if locked else self._lock:
                entry = self._entries.get(collection_id)
                if (
                    entry is None
                    or not entry.ready.is_set()
                    or entry.load_error is not None
                    or entry.record.state != OPEN
                    or entry.seq <= entry.snapshot_seq
                ):
                    return
                tables = [entry.by_id.export(), entry.by_pseudonym.export()]
                seq, reports, hashed = entry.seq, len(entry.by_id), entry.ids_hash
                entry.snapshot_seq, entry.snapshot_reports = seq, reports
            self._write_snapshot(path, collection_id, seq, reports, hashed, tables)
        except (OSError, CalmkitError) as exc:
            log.warning("key snapshot of collection %r not written: %s", collection_id, exc)

    def recount(self, collection_id: str) -> SupportCounts:
        """The collection's support counts recounted from its batch log (every phase
        combined, like :meth:`support`): an audit of the stored counts."""
        with self._lock:
            conn = self._connection()
            plans = self._entry(collection_id).record.plans
            rows = conn.execute(
                "SELECT seq, phase, count, report_ids, pseudonyms, views, cells, bits FROM "
                "batches WHERE collection_id = ? ORDER BY seq",
                (collection_id,),
            ).fetchall()
        return recount_log(collection_id, plans, rows)

    # -- collections -------------------------------------------------------------------
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
    ) -> CollectionRecord:
        """Create an open collection whose first phase uses ``plan`` (``design``: how
        the next phase is planned, None for one phase; ``max_reports``: the report cap,
        0 for none; ``admission``: the tickets its reports need, None for none;
        ``expected_n``: the users it was planned for, 0 if not given);
        :class:`CollectionExists` if the id is taken."""
        check_collection_args(
            collection_id, plan, k, submit_token_hash, design, max_reports, expected_n
        )
        check_admission(admission)
        record = CollectionRecord(
            collection_id,
            (plan,),
            int(k),
            OPEN,
            bytes(submit_token_hash),
            time.time(),
            None,
            0,
            design,
            max_reports=int(max_reports),
            admission=admission,
            expected_n=int(expected_n),
        )
        with self._lock:
            conn = self._connection()
            if collection_id in self._entries:
                raise CollectionExists(f"collection_id ({_show(collection_id)}) already exists")
            entry = _Entry.empty(record)
            with _transaction(conn):
                conn.execute(
                    "INSERT INTO collections (id, plan_json, digest, k, state, submit_token_hash,"
                    " created_at, closed_at, design_json, max_reports, expected_n) VALUES (?, ?, ?,"
                    " ?, ?, ?, ?, NULL, ?, ?, ?)",
                    (
                        collection_id,
                        plan.to_json(),
                        plan.digest,
                        record.k,
                        OPEN,
                        record.submit_token_hash,
                        record.created_at,
                        None if design is None else design.to_json(),
                        record.max_reports,
                        record.expected_n,
                    ),
                )
                _write_support(conn, collection_id, 0, entry, insert=True)
                if admission is not None:
                    conn.execute(
                        "INSERT INTO admissions (collection_id, scheme, key) VALUES (?, ?, ?)",
                        (collection_id, admission.scheme, admission.key),
                    )
            entry.ready.set()
            self._entries[collection_id] = entry
            return entry.snapshot()

    def get_collection(self, collection_id: str) -> CollectionRecord:
        """The collection's record; :class:`CollectionNotFound` if unknown."""
        with self._lock:
            self._connection()
            return self._entry(collection_id).snapshot()

    def submit_record(self, collection_id: str, plan_digest: str) -> CollectionRecord:
        """What a submit needs of the collection (its plans, submit token hash, state):
        here the same as :meth:`get_collection`. (On PostgreSQL a replica's cached copy,
        whose state may lag another replica's close; :meth:`add_reports` checks.)"""
        return self.get_collection(collection_id)

    def add_flag(self, collection_id: str, flag: str) -> None:
        """Store a manipulation flag (one line; the first
        :data:`~.store.MAX_FLAGS` are kept, later ones only logged by the caller)."""
        flag = check_flag(flag)
        with self._lock:
            conn = self._connection()
            entry = self._entry(collection_id)
            if len(entry.record.flags) >= MAX_FLAGS:
                return
            with _transaction(conn):
                conn.execute(
                    "INSERT INTO flags (collection_id, created_at, flag) VALUES (?, ?, ?)",
                    (collection_id, time.time(), flag),
                )
            entry.record = replace(entry.record, flags=(*entry.record.flags, flag))

    def set_pilot_check(self, collection_id: str, result: str) -> None:
        """Store the pilot's feasibility check ("passed" or "failed: ...")."""
        result = check_flag(result)
        with self._lock:
            conn = self._connection()
            entry = self._entry(collection_id)
            with _transaction(conn):
                conn.execute(
                    "UPDATE collections SET pilot_check = ? WHERE id = ?", (result, collection_id)
                )
            entry.record = replace(entry.record, pilot_check=result)

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
            entry.by_id, entry.by_pseudonym = KeyTable(), KeyTable(values=False)
            self._drop_snapshot(collection_id)  # a closed collection takes no reports
            return entry.snapshot()

    def add_phase(self, collection_id: str, phase: int, plan: Plan) -> CollectionRecord:
        """Start ``phase`` with ``plan`` (committed before it is served). Idempotent
        when that phase already exists (another caller started it first: its plan
        stays); a phase further ahead than the next one is an error."""
        check_plan(plan)
        with self._lock:
            conn = self._connection()
            entry = self._entry(collection_id)
            if not check_next_phase(entry.record, phase, plan):
                return entry.snapshot()
            with _transaction(conn):
                conn.execute(
                    "INSERT INTO phases (collection_id, phase, plan_json, digest, created_at) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (collection_id, phase, plan.to_json(), plan.digest, time.time()),
                )
                entry.record = replace(entry.record, plans=(*entry.record.plans, plan))
                entry.add_phase(plan)
                try:
                    _write_support(conn, collection_id, phase, entry, insert=True)
                except BaseException:
                    entry.record = replace(entry.record, plans=entry.record.plans[:-1])
                    del entry.n[-1], entry.counts[-1]
                    raise
            return entry.snapshot()

    # -- reports -------------------------------------------------------------------------
    def add_reports(
        self,
        collection_id: str,
        plan_digest: str,
        reports: Sequence[StoredReport] | ReportColumns,
    ) -> BatchOutcome:
        """Validate, deduplicate and durably store a batch, then count it.

        ``reports``: :class:`StoredReport` objects, or a :class:`~.columns.ReportColumns`
        decoded against the plan of ``plan_digest``. The batch's new reports are
        appended to the log with the updated counts in one committed transaction and
        only then counted, or nothing of it is written or counted.

        Raises:
            CollectionNotFound, CollectionClosed, PlanMismatch: collection-level errors.
            CalmkitError: a malformed report (the message names ``reports[i].field``
                and its value).
            ReportConflict: a report id already holds a different report, or a
                pseudonym already holds another report (also within the batch).
            PlanMismatch: also new reports under a pilot's plan once the pilot failed
                its check and the next phase is stored (retries still pass:
                :func:`~.store.check_pilot_phase`).
        """
        with self._lock:
            self._connection()
            entry = self._open_entry(collection_id)
            phase = entry.record.phase_of(plan_digest)
            plan = entry.record.plans[phase]
        batch = batch_columns(plan, reports)
        if not len(batch):
            return BatchOutcome(0, 0)
        distinct = dedupe_batch(batch)
        ids, pseudonyms = as_words(batch.report_ids), as_words(batch.pseudonyms)
        if not entry.ready.is_set():
            entry.ready.wait()
        if entry.load_error is not None:
            raise ServiceUnavailable(
                f"collection {_show(collection_id)} cannot take reports: its stored report "
                f"ids could not be read ({type(entry.load_error).__name__})"
            )
        with self._lock:
            conn = self._connection()
            entry = self._open_entry(collection_id)
            new = new_positions(entry, collection_id, distinct, ids, pseudonyms)
            check_pilot_phase(entry.record, phase, int(new.size))
            stored = sum(int(n.sum()) for n in entry.n)  # under the lock every write takes
            check_cap(collection_id, entry.record.max_reports, stored, int(new.size))
            if new.size:
                fresh = batch.take(new)
                n, counts = fresh.support_deltas()
                entry.n[phase] += n
                for j, c in enumerate(counts):
                    entry.counts[phase][j] += c
                try:
                    with _transaction(conn):
                        blobs = fresh.encode()
                        row = conn.execute(
                            "INSERT INTO batches (collection_id, phase, count, report_ids, "
                            "pseudonyms, views, cells, bits) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                            (
                                collection_id,
                                phase,
                                len(fresh),
                                blobs["report_ids"],
                                blobs["pseudonyms"],
                                blobs["views"],
                                blobs["cells"],
                                blobs["bits"],
                            ),
                        )
                        seq = int(row.lastrowid or 0)
                        _write_support(conn, collection_id, phase, entry)
                except BaseException:
                    entry.n[phase] -= n
                    for j, c in enumerate(counts):
                        entry.counts[phase][j] -= c
                    raise
                entry.by_id.insert(ids[new], pseudonyms[new])
                entry.by_pseudonym.insert(pseudonyms[new])
                entry.seq, entry.ids_hash = seq, ids_hash(blobs["report_ids"])
                if self._snapshot_due(entry):
                    self._snapshot_later(collection_id)
        return BatchOutcome(int(new.size), len(batch) - int(new.size))

    def support(self, collection_id: str) -> SupportCounts:
        """A copy of the collection's support counts over every phase (one
        reconstruction plan, :func:`~..phases.combine_phases`), consistent with
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
            return entry.support(check_phase(phase, entry.record.phase))

    # -- lifecycle -------------------------------------------------------------------------
    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until every collection's key tables are loaded; whether they are."""
        self._loader.join(timeout)
        return not self._loader.is_alive()

    def close(self) -> None:
        """Write the open collections' key snapshots, then close the database
        (idempotent); later calls raise :class:`CalmkitError`."""
        if self._snapshotter is not None:
            self._snapshotter.join()
        with self._lock:
            if self._conn is not None:
                for cid in list(self._entries):
                    self._snapshot(cid, locked=True)
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
            raise not_open(collection_id, entry.record.state)
        return entry


# -- transactions and tables --------------------------------------------------------------
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


def _execute_script(conn: sqlite3.Connection, script: str) -> None:
    """Run ``;``-separated statements inside the caller's transaction (``executescript``
    would commit it first)."""
    for statement in script.split(";"):
        if statement.strip():
            conn.execute(statement)


def _read_collections(conn: sqlite3.Connection) -> Iterator[tuple[Any, ...]]:
    """(id, plans, k, state, token hash, created, closed, design) of every collection,
    oldest first, each plan's digest checked."""
    later: dict[str, list[tuple[str, str]]] = {}
    for cid, _phase, plan_json, digest in conn.execute(
        "SELECT collection_id, phase, plan_json, digest FROM phases ORDER BY collection_id, phase"
    ):
        later.setdefault(cid, []).append((plan_json, digest))
    rows = conn.execute(
        "SELECT id, plan_json, digest, k, state, submit_token_hash, created_at, closed_at, "
        "design_json FROM collections ORDER BY created_at, id"
    ).fetchall()
    for cid, plan_json, digest, k, state, token_hash, created, closed, design_json in rows:
        plans = tuple(
            stored_plan(cid, i, text, d)
            for i, (text, d) in enumerate([(plan_json, digest), *later.get(cid, [])])
        )
        design = None if design_json is None else PhasedDesign.from_json(design_json)
        yield cid, plans, k, state, token_hash, created, closed, design


def _write_support(
    conn: sqlite3.Connection, collection_id: str, phase: int, entry: _Entry, insert: bool = False
) -> None:
    """Store ``entry``'s counts of ``phase`` (inside the caller's transaction)."""
    n_blob, counts_blob = entry.support_row(phase)
    if insert:
        conn.execute(
            "INSERT INTO support (collection_id, phase, n, counts) VALUES (?, ?, ?, ?)",
            (collection_id, phase, n_blob, counts_blob),
        )
    else:
        conn.execute(
            "UPDATE support SET n = ?, counts = ? WHERE collection_id = ? AND phase = ?",
            (n_blob, counts_blob, collection_id, phase),
        )


def _stored_keys(
    conn: sqlite3.Connection, collection_id: str, after: int = 0
) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Every stored (report id, pseudonym) of a collection in log rows after ``after``,
    as (n, 2) uint64 words each; the last row read and :func:`.snapshot.ids_hash` of
    its report ids (``after`` and 0 when there is none)."""
    ids, pseudonyms = [], []
    last = after
    for seq, rid_blob, pseudonym_blob in conn.execute(
        "SELECT seq, report_ids, pseudonyms FROM batches WHERE collection_id = ? AND seq > ? "
        "ORDER BY seq",
        (collection_id, after),
    ):
        ids.append(rid_blob)
        pseudonyms.append(pseudonym_blob)
        last = seq

    def as_keys(blobs: list[bytes]) -> np.ndarray:
        return np.frombuffer(b"".join(blobs), np.uint8).reshape(-1, KEY_BYTES)

    hashed = ids_hash(ids[-1]) if ids else 0
    return as_words(as_keys(ids)), as_words(as_keys(pseudonyms)), last, hashed


def _migrate_rows_to_log(conn: sqlite3.Connection) -> None:
    """Version 2 -> 3 (inside the caller's transaction): the per-report rows of every
    collection become batch-log rows (in chunks, per phase) and stored counts; the
    ``reports`` table goes."""
    _execute_script(conn, _LOG)
    for cid, plans, *_ in list(_read_collections(conn)):
        entry = _Entry.empty(CollectionRecord(cid, plans, 1, OPEN, b"", 0.0, None, 0))
        for phase, plan in enumerate(plans):
            rows = conn.execute(
                "SELECT report_id, pseudonym, view, payload FROM reports "
                "WHERE collection_id = ? AND phase = ? ORDER BY report_id",
                (cid, phase),
            ).fetchall()
            for lo in range(0, len(rows), _MIGRATE_CHUNK):
                chunk = [
                    StoredReport(bytes(r), bytes(p), v, x if isinstance(x, int) else bytes(x))
                    for r, p, v, x in rows[lo : lo + _MIGRATE_CHUNK]
                ]
                try:
                    columns = columns_from_reports(plan, chunk)
                except CalmkitError as exc:
                    raise CalmkitError(
                        f"stored reports of collection {_show(cid)} (phase {phase}) are "
                        f"invalid: {exc}"
                    ) from None
                n, counts = columns.support_deltas()
                entry.n[phase] += n
                for j, c in enumerate(counts):
                    entry.counts[phase][j] += c
                blobs = columns.encode()
                conn.execute(
                    "INSERT INTO batches (collection_id, phase, count, report_ids, pseudonyms, "
                    "views, cells, bits) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        cid,
                        phase,
                        len(columns),
                        blobs["report_ids"],
                        blobs["pseudonyms"],
                        blobs["views"],
                        blobs["cells"],
                        blobs["bits"],
                    ),
                )
            _write_support(conn, cid, phase, entry, insert=True)
    conn.execute("DROP TABLE reports")
    conn.execute("PRAGMA user_version = 3")  # the batch log's layout
