"""Storage on PostgreSQL: several aggregator processes (replicas) behind one address
share collections, with the guarantees of the embedded SQLite store (:mod:`.storage`):
a batch is committed before its ack, accepted whole or refused whole, counted exactly
once across retries, replicas and SIGKILL, and a pseudonym holds one report. Both
implement :class:`~.store.ReportStore` and run the same checks and deduplication rules
(:mod:`.store`).

The database holds what SQLite holds (schema version :data:`PG_SCHEMA_VERSION`):

- ``batches``: the append-only batch log (the columnar layout of :mod:`.columns`), one
  row per accepted batch holding its new reports. ``seq`` grows; nothing is keyed by a
  client's random values, so a batch costs the same with 10 or 10 million stored.
- ``support``: the support counts, one row per (collection, phase, writer). Each
  replica process writes only its own row, in its batches' transactions; a read sums
  the rows.
- ``collections`` and ``phases``: as in SQLite, with ``max_reports`` (the report cap)
  and ``pilot_check``; ``flags``: manipulation flags raised at ingest. Version 2
  databases gain them on open, with no cap on their existing collections;
  ``admissions`` (version 4; older databases get the empty table on open);
  ``collections.expected_n``, the users a collection was planned for (version 5; 0 on
  older databases' collections).

The cap is checked in the transaction that holds the collection's row lock, against
the key tables just brought up to date (every stored report of the collection, from
every replica), so two replicas cannot both take the last places. So is a pilot's
failed check (new reports under a failed pilot's plan are refused once the next phase
is stored), against the pilot check and phases read under that lock.

Deduplication is in memory, as in SQLite: each replica keeps the key tables of
:mod:`.keyset` (report id -> pseudonym, and the pseudonyms) for every collection it
takes reports for, with ``seen``, the last log row they include. A replica commits
batches of a collection in one transaction that:

1. locks the collection's row (``SELECT ... FOR NO KEY UPDATE``): the batches of one
   collection commit one transaction at a time, over all replicas, and a concurrent
   close or new phase waits;
2. reads the log rows other replicas appended since ``seen`` (a new statement, so it
   sees every commit made before the lock was granted) into its tables;
3. deduplicates each batch against the tables with numpy (a retry is acknowledged and
   not counted; a conflict refuses that batch and names no stored value);
4. appends one log row per accepted batch and updates its support row; commits
   (``synchronous_commit`` on: durable before the ack).

Within one collection, log rows therefore commit in ``seq`` order, so step 2 misses
nothing. The row lock is released when the transaction ends, also when a replica dies
mid-transaction (its connection closes and the transaction aborts). Batches that wait
for the lock in one replica go into the next transaction together (group commit):
one commit, one disk flush, for all of them, each still accepted or refused whole.

A replica fills its tables when it starts (in the background: plans, queries and
health are served at once; a submit waits for its collection) or on the first batch of
a collection created by another replica: from its key snapshot (``key_snapshots``, see
:mod:`.snapshot`) and the log rows after it, or from the whole log. Reads of a collection's state
and counts go to the database, so what one replica committed, the others see.

Version 1 databases (every report id and pseudonym in a ``reports`` table under two
unique indexes, as well as in the log) are migrated on open: the log already holds
every report, so the ``reports`` table goes once its size is checked against the log.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Any

import numpy as np

from calmkit_client import CalmkitError, Plan
from calmkit_client.echo import show as _show
from calmkit_client.errors import (
    CollectionClosed,
    CollectionExists,
    CollectionFull,
    CollectionNotFound,
    PlanMismatch,
    ReportConflict,
    ServiceUnavailable,
)
from calmkit_client.tickets import TicketVerifier

from ..phases import PhasedDesign, combine_phases
from ..reconstruction.support import SupportCounts
from .columns import KEY_BYTES, ReportColumns
from .faults import LOST_MESSAGE, mask_secrets
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
    KeyLookup,
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

__all__ = ["PG_SCHEMA_VERSION", "PgStorage", "is_postgres_url"]

PG_SCHEMA_VERSION = 5
_I64 = np.dtype("<i8")
_LOG_COLUMNS = ("report_ids", "pseudonyms", "views", "cells", "bits")
# Reports committed in one transaction at most (group commit takes waiting batches up
# to this many; a larger single batch goes alone).
_GROUP_REPORTS = 100_000
_TABLES = {"collections", "phases", "batches", "support", "reports", "flags", "admissions"}
log = logging.getLogger("calmkit.aggregator")
_SCHEMA = """
CREATE TABLE calmkit_schema (version INTEGER NOT NULL);
CREATE TABLE collections (
    id TEXT PRIMARY KEY,
    plan_json TEXT NOT NULL,
    digest TEXT NOT NULL,
    k INTEGER NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('open', 'closed')),
    submit_token_hash BYTEA NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    closed_at DOUBLE PRECISION,
    design_json TEXT
);
CREATE TABLE phases (
    collection_id TEXT NOT NULL REFERENCES collections (id),
    phase INTEGER NOT NULL CHECK (phase >= 1),
    plan_json TEXT NOT NULL,
    digest TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (collection_id, phase)
);
CREATE TABLE batches (
    seq BIGSERIAL PRIMARY KEY,
    collection_id TEXT NOT NULL,
    phase INTEGER NOT NULL,
    count INTEGER NOT NULL,
    report_ids BYTEA NOT NULL,
    pseudonyms BYTEA NOT NULL,
    views BYTEA NOT NULL,
    cells BYTEA NOT NULL,
    bits BYTEA NOT NULL
);
CREATE TABLE support (
    collection_id TEXT NOT NULL REFERENCES collections (id),
    phase INTEGER NOT NULL,
    writer UUID NOT NULL,
    n BYTEA NOT NULL,
    counts BYTEA NOT NULL,
    PRIMARY KEY (collection_id, phase, writer)
);
"""
# Version 3: a collection's admission-ticket scheme and key (no row: no tickets); the
# key as given (for hmac-sha256 the shared secret: see store.stored_admission).
_ADMISSIONS = """
CREATE TABLE admissions (
    collection_id TEXT PRIMARY KEY REFERENCES collections (id),
    scheme TEXT NOT NULL,
    key BYTEA NOT NULL
);
"""
# Both versions: the log is read per collection in seq order (a tail from ``seen``),
# and its random bytes are stored without compression attempts.
_LOG_SETUP = """
CREATE INDEX IF NOT EXISTS batches_tail ON batches (collection_id, seq);
ALTER TABLE batches ALTER COLUMN report_ids SET STORAGE EXTERNAL,
                    ALTER COLUMN pseudonyms SET STORAGE EXTERNAL,
                    ALTER COLUMN bits SET STORAGE EXTERNAL;
"""
# Version 2 -> 3 (and part of a new database's schema): the report cap, the pilot
# check, manipulation flags.
_MIGRATE_2 = """
ALTER TABLE collections ADD COLUMN IF NOT EXISTS max_reports BIGINT NOT NULL DEFAULT 0,
                        ADD COLUMN IF NOT EXISTS pilot_check TEXT NOT NULL DEFAULT '';
CREATE TABLE IF NOT EXISTS flags (
    seq BIGSERIAL PRIMARY KEY,
    collection_id TEXT NOT NULL REFERENCES collections (id),
    created_at DOUBLE PRECISION NOT NULL,
    flag TEXT NOT NULL
);
"""
# Version 4 -> 5 (and part of a new database's schema): the expected number of users.
_MIGRATE_4 = "ALTER TABLE collections ADD COLUMN IF NOT EXISTS expected_n BIGINT NOT NULL DEFAULT 0"
# the collection's row lock, and what a batch is checked against under it: the state,
# the cap, the pilot check and the number of phases after the first
_LOCK = (
    "SELECT state, max_reports, pilot_check, (SELECT count(*) FROM phases WHERE "
    "phases.collection_id = collections.id) FROM collections WHERE id = %s FOR NO KEY UPDATE"
)
_TAIL = (
    "SELECT seq, report_ids, pseudonyms FROM batches WHERE collection_id = %s "
    "AND seq > %s ORDER BY seq"
)


def is_postgres_url(db: str) -> bool:
    """Whether ``--db`` names a PostgreSQL database (``postgresql://`` or
    ``postgres://``) rather than a SQLite file."""
    return isinstance(db, str) and db.startswith(("postgresql://", "postgres://"))


def refuse_password_in(db: str) -> None:
    """Refuse a ``--db`` URL that holds a password: it would show in ``ps`` and the
    shell's history. libpq reads it from PGPASSWORD or a password file instead."""
    try:
        from psycopg.conninfo import conninfo_to_dict

        has = bool(conninfo_to_dict(db).get("password"))
    except Exception:  # not parseable here (or no psycopg): judge the URL's user part
        creds = db.split("://", 1)[-1].rsplit("@", 1)
        has = len(creds) == 2 and ":" in creds[0]
    if has:
        shown = _redact(db).split("?", 1)[0]
        raise CalmkitError(
            f"db ({shown!r}, password hidden) must not hold a password: it would be "
            "visible in ps and the shell's history; set PGPASSWORD, or use a password file "
            "(PGPASSFILE, ~/.pgpass, or --db-password-file FILE with mode 0600)"
        )


@dataclass
class _Keys:
    """This replica's key tables of one collection: ``by_id`` (report id ->
    pseudonym) and ``by_pseudonym``, holding every log row up to ``seen``; ``lock``
    serialises this replica's commits to the collection; ``queue``: batches waiting
    for the next commit (under ``queue_lock``)."""

    by_id: KeyTable = field(default_factory=KeyTable)
    by_pseudonym: KeyTable = field(default_factory=lambda: KeyTable(values=False))
    seen: int = 0
    loaded: bool = False
    ids_hash: int = 0  # snapshot.ids_hash of row seen's report ids
    snapshot_seq: int = 0  # the last row in the last snapshot written or read
    snapshot_reports: int = 0
    key_source: str = ""  # where the tables came from: "snapshot", "log" or "new"
    lock: threading.Lock = field(default_factory=threading.Lock)
    queue: list[_Pending] = field(default_factory=list)
    queue_lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, ids: np.ndarray, pseudonyms: np.ndarray) -> None:
        """Insert stored keys, new to the tables: (n, 2) uint64 words each."""
        self.by_id.insert(ids, pseudonyms)
        self.by_pseudonym.insert(pseudonyms)


@dataclass
class _Pending:
    """One batch waiting to be committed: validated, deduplicated within itself
    (``distinct`` positions), its keys as words, and the log row's blobs and the count
    deltas of its distinct reports (made before the collection's lock: used when all of
    them turn out new); ``outcome`` or ``error`` once done."""

    plan_digest: str
    batch: ReportColumns
    distinct: np.ndarray
    ids: np.ndarray
    pseudonyms: np.ndarray
    blobs: dict[str, bytes] | None = None
    deltas: tuple[np.ndarray, list[np.ndarray]] | None = None
    done: bool = False
    outcome: BatchOutcome | None = None
    error: BaseException | None = None


class _Either:
    """Lookups in two key tables holding disjoint keys (the stored ones and those of
    batches accepted earlier in the same transaction)."""

    def __init__(self, first: KeyTable, second: KeyTable) -> None:
        self.tables = (first, second)

    def lookup(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        found, values = self.tables[0].lookup(keys)
        more, other = self.tables[1].lookup(keys)
        values[more] = other[more]
        return found | more, values


@dataclass
class _Union:
    """The key tables of a group commit: stored keys and those accepted before in it."""

    by_id: KeyLookup
    by_pseudonym: KeyLookup


class PgStorage(SnapshotSchedule):
    """Collections and reports in one PostgreSQL database, shared by replicas.

    Args:
        dsn: a libpq connection string or URL (``postgresql://user@host/db``). A new
            database gets the schema; a version 1 database is migrated.
        key_snapshots: a folder for this replica's key snapshots (:mod:`.snapshot`:
            written on close and as collections grow, loaded at start with the log
            rows after them); None: the tables are always filled from the whole log.
        password: the database password, when neither PGPASSWORD nor a password file
            (PGPASSFILE, ~/.pgpass), which libpq reads itself, gives it.
    """

    def __init__(
        self,
        dsn: str,
        key_snapshots: str | os.PathLike[str] | None = None,
        password: str | None = None,
    ) -> None:
        try:
            import psycopg
        except ImportError:
            raise CalmkitError(
                "db (a postgresql:// URL) needs psycopg: pip install 'calmkit[postgres]'"
            ) from None
        self._psycopg = psycopg
        self._dsn = dsn
        self._password = password  # kept out of the DSN (and every message)
        self.path = _redact(dsn)
        self._lock = threading.Lock()  # the read connection
        self._write_lock = threading.Lock()  # the write connection
        self._keys_lock = threading.Lock()  # the dict of key tables and the record cache
        self._writer = uuid.uuid4()  # this process's own support rows
        self._plans: dict[str, Plan] = {}
        self._records: dict[str, CollectionRecord] = {}
        self._keys: dict[str, _Keys] = {}
        self._mine: dict[tuple[str, int], tuple[np.ndarray, list[np.ndarray]]] = {}
        self._closed = False
        self._snapshots = None if key_snapshots is None else os.fspath(key_snapshots)
        self._snapshotter: threading.Thread | None = None
        self.snapshot_bytes = 0  # key snapshots written by this process
        # transactions committed, batches in them, seconds waiting for and holding the
        # collections' locks (holding: from the lock granted to the commit returned)
        self.stats = {"commits": 0, "batches": 0, "lock_wait": 0.0, "lock_held": 0.0}
        self._conn: Any = self._connect()
        try:
            with self._transaction(self._conn) as cur:
                cur.execute("SELECT pg_advisory_xact_lock(hashtext('calmkit schema'))")
                self._setup_schema(cur)
                cur.execute("SELECT id FROM collections WHERE state = %s", (OPEN,))
                pending = [cid for (cid,) in cur.fetchall()]
            self._wconn: Any = self._connect(writer=True)
        except BaseException:
            self._conn.close()
            raise
        for cid in pending:
            self._keys[cid] = _Keys()
        self._loader = threading.Thread(
            target=self._load_all, args=(pending,), name="calmkit-pg-keys", daemon=True
        )
        self._loader.start()

    def _connect(self, writer: bool = False) -> Any:
        """A connection with commits durable before they return; the write connection
        gives up waiting for a collection's lock after 10 s (the client retries) and a
        transaction left idle by a stuck replica ends after 60 s, releasing its locks."""
        psycopg = self._psycopg
        try:
            extra = {} if self._password is None else {"password": self._password}
            conn = psycopg.connect(self._dsn, autocommit=True, **extra)
            conn.execute("SET synchronous_commit = on")
            if writer:
                conn.execute("SET lock_timeout = '10s'")
                conn.execute("SET idle_in_transaction_session_timeout = '60s'")
            conn.autocommit = False
        except psycopg.Error as exc:
            raise CalmkitError(f"db ({self.path!r}) cannot be opened: {_first_line(exc)}") from None
        return conn

    def _live(self, name: str) -> Any:
        """The connection ``self.<name>`` (call with its lock held), opened again when
        it broke (PostgreSQL restarted, the network failed): the call that found it
        broken answered UNAVAILABLE, the next one reconnects. Nothing read before is
        stale: a commit is visible only once it is on disk (synchronous commits), so a
        crash of PostgreSQL takes back no row the key tables hold."""
        conn = getattr(self, name, None)
        if conn is None or self._closed:
            raise ServiceUnavailable("storage is closed (the server is shutting down)")
        if conn.broken or conn.closed:
            with contextlib.suppress(Exception):
                conn.close()
            try:
                conn = self._connect(writer=name == "_wconn")
            except CalmkitError as exc:
                log.error("database unavailable (%s): %s", name.strip("_"), mask_secrets(str(exc)))
                raise ServiceUnavailable(LOST_MESSAGE) from None
            setattr(self, name, conn)
            log.warning("reconnected to the database (%s)", name.strip("_"))
        return conn

    def _setup_schema(self, cur: Any) -> None:
        """Create the schema, migrate version 1, or refuse a database that is not a
        calmkit store or is newer (inside the caller's transaction, under the schema
        lock, so replicas starting together migrate once)."""
        cur.execute("SELECT to_regclass('calmkit_schema') IS NOT NULL")
        if not cur.fetchone()[0]:
            cur.execute("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
            clash = sorted(_TABLES & {t for (t,) in cur.fetchall()})
            if clash:
                raise CalmkitError(
                    f"database ({self.path!r}) is not a calmkit store (it has a table named "
                    f"{clash[0]!r} but no calmkit_schema)"
                )
            cur.execute(_SCHEMA)
            cur.execute(_LOG_SETUP)
            cur.execute(_MIGRATE_2)
            cur.execute(_ADMISSIONS)
            cur.execute(_MIGRATE_4)
            cur.execute("INSERT INTO calmkit_schema VALUES (%s)", (PG_SCHEMA_VERSION,))
            return
        cur.execute("SELECT version FROM calmkit_schema")
        row = cur.fetchone()
        version = None if row is None else row[0]
        if version not in (1, 2, 3, 4, PG_SCHEMA_VERSION):
            raise CalmkitError(
                f"schema version ({version}) of {self.path!r} must be {PG_SCHEMA_VERSION} "
                "(or 1, 2, 3 or 4, which are migrated)"
            )
        if version == 1:
            self._migrate_1(cur)
        if version in (1, 2):
            cur.execute(_MIGRATE_2)  # version 2 -> 3: the cap, the pilot check, flags
        if version in (1, 2, 3):
            cur.execute(_ADMISSIONS)  # version 3 -> 4: admission tickets
        if version in (1, 2, 3, 4):
            cur.execute(_MIGRATE_4)  # version 4 -> 5: the expected number of users
            cur.execute("UPDATE calmkit_schema SET version = %s", (PG_SCHEMA_VERSION,))

    def _migrate_1(self, cur: Any) -> None:
        """Version 1 -> 2: the ``reports`` table (one row per report under two unique
        indexes) goes; the batch log, written in the same transactions, already holds
        every report, which is checked per collection first."""
        cur.execute(
            "SELECT c.id, (SELECT count(*) FROM reports r WHERE r.collection_id = c.id), "
            "(SELECT coalesce(sum(count), 0) FROM batches b WHERE b.collection_id = c.id) "
            "FROM collections c ORDER BY c.id"
        )
        for cid, rows, logged in cur.fetchall():
            if rows != logged:
                raise CalmkitError(
                    f"reports of collection {_show(cid)} ({rows}) must equal the reports in "
                    f"its batch log ({logged}) to migrate {self.path!r} to schema version "
                    f"{PG_SCHEMA_VERSION}: this database is damaged"
                )
        cur.execute("DROP TABLE reports")
        cur.execute(_LOG_SETUP)
        cur.execute("UPDATE calmkit_schema SET version = %s", (PG_SCHEMA_VERSION,))

    # -- transactions ------------------------------------------------------------------
    @contextmanager
    def _transaction(self, conn: Any) -> Iterator[Any]:
        """A cursor in one transaction on ``conn`` (committed on exit, rolled back on
        error); lost connections, lock timeouts, deadlocks and serialization failures
        are :class:`ServiceUnavailable` (the client retries)."""
        psycopg = self._psycopg
        if self._closed:
            raise ServiceUnavailable("storage is closed (the server is shutting down)")
        try:
            with conn.transaction(), conn.cursor() as cur:
                yield cur
        except (
            psycopg.errors.DeadlockDetected,
            psycopg.errors.SerializationFailure,
            psycopg.errors.LockNotAvailable,
        ) as exc:
            raise ServiceUnavailable(
                f"the batch met a concurrent one ({_first_line(exc)}): retry"
            ) from None
        except psycopg.OperationalError as exc:
            log.error("database unavailable: %s", mask_secrets(_first_line(exc)))
            raise ServiceUnavailable(LOST_MESSAGE) from None

    # -- reading -------------------------------------------------------------------------
    def _plan(self, cid: str, phase: int, plan_json: str, digest: str) -> Plan:
        plan = self._plans.get(digest)
        if plan is None:
            plan = self._plans[digest] = stored_plan(cid, phase, plan_json, digest)
        return plan

    def _record(self, cur: Any, collection_id: str, counts: bool = True) -> CollectionRecord:
        """The collection as stored now (``counts=False``: without the report totals,
        one query fewer)."""
        if not isinstance(collection_id, str):
            raise CollectionNotFound(f"collection_id ({_show(collection_id)}) not found")
        cur.execute(
            "SELECT plan_json, digest, k, state, submit_token_hash, created_at, closed_at, "
            "design_json, max_reports, pilot_check, expected_n FROM collections WHERE id = %s",
            (collection_id,),
        )
        row = cur.fetchone()
        if row is None:
            raise CollectionNotFound(f"collection_id ({_show(collection_id)}) not found")
        plan_json, digest, k, state, token_hash, created, closed, design_json, cap, check, n = row
        plans = [self._plan(collection_id, 0, plan_json, digest)]
        cur.execute(
            "SELECT phase, plan_json, digest FROM phases WHERE collection_id = %s ORDER BY phase",
            (collection_id,),
        )
        for phase, text, d in cur.fetchall():
            plans.append(self._plan(collection_id, phase, text, d))
        design = None if design_json is None else PhasedDesign.from_json(design_json)
        cur.execute(
            "SELECT flag FROM flags WHERE collection_id = %s ORDER BY seq", (collection_id,)
        )
        flags = tuple(f for (f,) in cur.fetchall())
        cur.execute("SELECT scheme, key FROM admissions WHERE collection_id = %s", (collection_id,))
        found = cur.fetchone()
        admission = None if found is None else stored_admission(collection_id, *found)
        record = CollectionRecord(
            collection_id,
            tuple(plans),
            k,
            state,
            bytes(token_hash),
            created,
            closed,
            0,
            design,
            max_reports=int(cap),
            flags=flags,
            pilot_check=check,
            admission=admission,
            expected_n=int(n),
        )
        with self._keys_lock:
            self._records[collection_id] = record
        if not counts:
            return record
        parts = self._parts(cur, record)
        per_phase = tuple(int(p.n.sum()) for p in parts)
        return replace(record, reports=sum(per_phase), phase_reports=per_phase)

    def _parts(self, cur: Any, record: CollectionRecord) -> list[SupportCounts]:
        """Each phase's support counts: the sum of every writer's row."""
        parts = [SupportCounts.zeros(p) for p in record.plans]
        n = [p.n.copy() for p in parts]
        flat = [np.concatenate(p.counts) for p in parts]
        cur.execute(
            "SELECT phase, n, counts FROM support WHERE collection_id = %s",
            (record.collection_id,),
        )
        for phase, n_blob, counts_blob in cur.fetchall():
            if (
                not 0 <= phase < len(parts)
                or len(n_blob) != 8 * n[phase].size
                or len(counts_blob) != 8 * flat[phase].size
            ):
                raise CalmkitError(
                    f"stored support of collection {_show(record.collection_id)} (phase "
                    f"{phase}) does not fit its plan"
                )
            n[phase] += np.frombuffer(n_blob, _I64)
            flat[phase] += np.frombuffer(counts_blob, _I64)
        out = []
        for plan, n_p, flat_p in zip(record.plans, n, flat):
            sizes = np.cumsum([o.L for o in plan.view_oracles])[:-1]
            out.append(SupportCounts(plan, n_p, tuple(np.split(flat_p, sizes))))
        return out

    def submit_record(self, collection_id: str, plan_digest: str) -> CollectionRecord:
        """The collection's record as this replica last read it, for a submit: plans,
        submit token hash, design. Read again when unknown here or when
        ``plan_digest`` is not among its plans (another replica started a phase). Its
        state and report totals may lag: :meth:`add_reports` checks the state under
        the collection's lock."""
        with self._keys_lock:
            record = self._records.get(collection_id) if isinstance(collection_id, str) else None
        if record is None or all(p.digest != plan_digest for p in record.plans):
            with self._lock, self._transaction(self._live("_conn")) as cur:
                record = self._record(cur, collection_id, counts=False)
        return record

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
        """Create an open collection (see :meth:`.storage.Storage.create_collection`)."""
        check_collection_args(
            collection_id, plan, k, submit_token_hash, design, max_reports, expected_n
        )
        check_admission(admission)
        with self._lock, self._transaction(self._live("_conn")) as cur:
            cur.execute(
                "INSERT INTO collections (id, plan_json, digest, k, state, submit_token_hash, "
                "created_at, closed_at, design_json, max_reports, expected_n) VALUES (%s, %s, %s, "
                "%s, %s, %s, %s, NULL, %s, %s, %s) ON CONFLICT (id) DO NOTHING",
                (
                    collection_id,
                    plan.to_json(),
                    plan.digest,
                    int(k),
                    OPEN,
                    bytes(submit_token_hash),
                    time.time(),
                    None if design is None else design.to_json(),
                    int(max_reports),
                    int(expected_n),
                ),
            )
            if cur.rowcount == 0:
                raise CollectionExists(f"collection_id ({_show(collection_id)}) already exists")
            if admission is not None:
                cur.execute(
                    "INSERT INTO admissions (collection_id, scheme, key) VALUES (%s, %s, %s)",
                    (collection_id, admission.scheme, admission.key),
                )
            record = self._record(cur, collection_id)
        with self._keys_lock:  # committed with no reports: the empty tables are complete
            self._keys.setdefault(collection_id, _Keys(loaded=True, key_source="new"))
        return record

    def get_collection(self, collection_id: str) -> CollectionRecord:
        """The collection's record as committed now; :class:`CollectionNotFound`."""
        with self._lock, self._transaction(self._live("_conn")) as cur:
            return self._record(cur, collection_id)

    def list_collections(self) -> list[CollectionRecord]:
        """Every collection, oldest first."""
        with self._lock, self._transaction(self._live("_conn")) as cur:
            cur.execute("SELECT id FROM collections ORDER BY created_at, id")
            return [self._record(cur, cid) for (cid,) in cur.fetchall()]

    def add_flag(self, collection_id: str, flag: str) -> None:
        """Store a manipulation flag (see :meth:`.storage.Storage.add_flag`)."""
        flag = check_flag(flag)
        with self._lock, self._transaction(self._live("_conn")) as cur:
            cur.execute("SELECT 1 FROM collections WHERE id = %s FOR UPDATE", (collection_id,))
            if cur.fetchone() is None:
                raise CollectionNotFound(f"collection_id ({_show(collection_id)}) not found")
            cur.execute("SELECT count(*) FROM flags WHERE collection_id = %s", (collection_id,))
            if cur.fetchone()[0] >= MAX_FLAGS:
                return
            cur.execute(
                "INSERT INTO flags (collection_id, created_at, flag) VALUES (%s, %s, %s)",
                (collection_id, time.time(), flag),
            )

    def set_pilot_check(self, collection_id: str, result: str) -> None:
        """Store the pilot's feasibility check ("passed" or "failed: ...")."""
        result = check_flag(result)
        with self._lock, self._transaction(self._live("_conn")) as cur:
            cur.execute(
                "UPDATE collections SET pilot_check = %s WHERE id = %s", (result, collection_id)
            )
            if cur.rowcount == 0:
                raise CollectionNotFound(f"collection_id ({_show(collection_id)}) not found")

    def close_collection(self, collection_id: str) -> CollectionRecord:
        """Stop accepting reports (idempotent); this replica drops its key tables."""
        with self._lock, self._transaction(self._live("_conn")) as cur:
            cur.execute(
                "UPDATE collections SET state = %s, closed_at = %s WHERE id = %s AND state = %s",
                (CLOSED, time.time(), collection_id, OPEN),
            )
            record = self._record(cur, collection_id)
        self._forget(collection_id)
        self._drop_snapshot(collection_id)
        return record

    def add_phase(self, collection_id: str, phase: int, plan: Plan) -> CollectionRecord:
        """Start ``phase`` with ``plan``; idempotent across replicas (the first stored
        plan of a phase stays)."""
        check_plan(plan)
        with self._lock, self._transaction(self._live("_conn")) as cur:
            cur.execute("SELECT 1 FROM collections WHERE id = %s FOR UPDATE", (collection_id,))
            record = self._record(cur, collection_id)
            if not check_next_phase(record, phase, plan):
                return record
            cur.execute(
                "INSERT INTO phases (collection_id, phase, plan_json, digest, created_at) "
                "VALUES (%s, %s, %s, %s, %s)",
                (collection_id, phase, plan.to_json(), plan.digest, time.time()),
            )
            return self._record(cur, collection_id)

    # -- reports -------------------------------------------------------------------------
    def add_reports(
        self,
        collection_id: str,
        plan_digest: str,
        reports: Sequence[StoredReport] | ReportColumns,
    ) -> BatchOutcome:
        """Validate, deduplicate (across replicas) and store a batch, then count it;
        see :meth:`.storage.Storage.add_reports` for the contract. Batches that arrive
        while another commit of the collection runs in this replica are committed
        together in the next transaction."""
        record = self.submit_record(collection_id, plan_digest)
        if record.state != OPEN:  # closing is final: a stale "open" is checked again below
            raise not_open(collection_id, record.state)
        batch = batch_columns(record.plans[record.phase_of(plan_digest)], reports)
        if not len(batch):
            return BatchOutcome(0, 0)
        distinct = dedupe_batch(batch)
        fresh = batch.take(distinct) if distinct.size < len(batch) else batch
        mine = _Pending(
            plan_digest,
            batch,
            distinct,
            as_words(batch.report_ids),
            as_words(batch.pseudonyms),
            fresh.encode(),
            fresh.support_deltas(),
        )
        keys = self._keys_of(collection_id)
        with keys.queue_lock:
            keys.queue.append(mine)
        while not mine.done:
            with keys.lock:  # the leader commits what waits, from the front of the queue
                if mine.done:
                    break
                with keys.queue_lock:
                    group: list[_Pending] = []
                    size = 0
                    while keys.queue and (
                        not group or size + len(keys.queue[0].batch) <= _GROUP_REPORTS
                    ):
                        size += len(keys.queue[0].batch)
                        group.append(keys.queue.pop(0))
                try:
                    self._load(collection_id, keys)
                    self._commit(collection_id, keys, group)
                finally:
                    for p in group:  # whatever failed, no batch of the group is left waiting
                        if not p.done:
                            p.error = p.error or ServiceUnavailable(
                                "the batch was not stored: retry"
                            )
                            p.done = True
        if mine.error is not None:
            raise mine.error
        assert mine.outcome is not None
        return mine.outcome

    def _commit(self, collection_id: str, keys: _Keys, group: list[_Pending]) -> None:
        """One transaction for the ``group``'s batches (see the module docstring);
        each batch gets its outcome or its own error."""
        psycopg = self._psycopg
        written: list[tuple[_Pending, int, np.ndarray]] = []  # (batch, phase, new positions)
        try:
            with self._write_lock, self._transaction(self._live("_wconn")) as cur:
                t0 = time.perf_counter()
                cur.execute(_LOCK, (collection_id,))
                row = cur.fetchone()
                t1 = time.perf_counter()
                if row is None:
                    raise CollectionNotFound(f"collection_id ({_show(collection_id)}) not found")
                if row[0] != OPEN:
                    raise not_open(collection_id, row[0])
                self._tail(cur, collection_id, keys)
                cap, stored = int(row[1]), len(keys.by_id)  # every replica's, under the lock
                record = self._records.get(collection_id)
                if (
                    record is None
                    or (record.pilot_check, len(record.plans)) != (row[2], 1 + int(row[3]))
                    or any(all(pl.digest != p.plan_digest for pl in record.plans) for p in group)
                ):  # another replica checked the pilot or started a phase: read it again
                    record = self._record(cur, collection_id, counts=False)
                size = sum(len(p.batch) for p in group)  # keys of the batches accepted so far:
                accepted = _Keys(KeyTable(size), KeyTable(size, values=False), loaded=True)
                both = _Union(
                    _Either(keys.by_id, accepted.by_id),
                    _Either(keys.by_pseudonym, accepted.by_pseudonym),
                )
                rows: list[tuple[Any, ...]] = []
                deltas: dict[int, tuple[np.ndarray, list[np.ndarray]]] = {}
                for p in group:
                    try:
                        phase = record.phase_of(p.plan_digest)
                        tables = both if len(accepted.by_id) else keys
                        new = new_positions(tables, collection_id, p.distinct, p.ids, p.pseudonyms)
                        check_pilot_phase(record, phase, int(new.size))
                        check_cap(collection_id, cap, stored, int(new.size))
                    except (PlanMismatch, ReportConflict, CollectionFull) as exc:
                        p.error, p.done = exc, True
                        continue
                    written.append((p, phase, new))
                    stored += int(new.size)
                    if not new.size:
                        continue
                    if len(group) > 1:
                        accepted.add(p.ids[new], p.pseudonyms[new])
                    if new.size == p.distinct.size and p.blobs is not None and p.deltas:
                        blobs, (n, counts) = p.blobs, p.deltas  # all new: made beforehand
                    else:
                        fresh = p.batch.take(new) if new.size < len(p.batch) else p.batch
                        blobs, (n, counts) = fresh.encode(), fresh.support_deltas()
                    rows.append(
                        (collection_id, phase, int(new.size), *(blobs[c] for c in _LOG_COLUMNS))
                    )
                    if phase in deltas:
                        old_n, old_counts = deltas[phase]
                        n, counts = old_n + n, [a + b for a, b in zip(old_counts, counts)]
                    deltas[phase] = (n, counts)
                last = self._append(cur, rows) if rows else 0
                totals = {ph: self._totals(cur, collection_id, ph, d) for ph, d in deltas.items()}
        except (CalmkitError, psycopg.Error) as exc:
            if not isinstance(exc, CalmkitError):
                exc = ServiceUnavailable(f"database error: {_first_line(exc)}: retry")
            for p in group:
                if not p.done:
                    p.error, p.done = exc, True
            if isinstance(exc, (CollectionClosed, CollectionNotFound)):
                self._forget(collection_id)
                with self._keys_lock:  # closed by another replica: refuse the next at once
                    cached = self._records.get(collection_id)
                    if cached is not None and isinstance(exc, CollectionClosed):
                        self._records[collection_id] = replace(cached, state=CLOSED)
            # the commit's outcome may be unknown: re-read this writer's rows next time
            for key in [k for k in self._mine if k[0] == collection_id]:
                self._mine.pop(key, None)
            return
        # committed: count it here and keep the tables up to date
        self.stats["commits"] += 1
        self.stats["batches"] += len(written)
        self.stats["lock_wait"] += t1 - t0
        self.stats["lock_held"] += time.perf_counter() - t1
        for phase, total in totals.items():
            self._mine[(collection_id, phase)] = total
        for p, _, new in written:
            p.outcome = BatchOutcome(int(new.size), len(p.batch) - int(new.size))
            p.done = True
        try:
            for p, _, new in written:
                if new.size:
                    keys.add(p.ids[new], p.pseudonyms[new])
        except Exception:  # the batches are stored and acknowledged; the tables are not
            self._drop_tables(keys)  # refilled from the log by the next batch
            return
        if last > keys.seen:
            keys.seen, keys.ids_hash = last, ids_hash(rows[-1][3])
        if self._snapshot_due(keys):
            self._snapshot_later(collection_id)

    def _tail(self, cur: Any, collection_id: str, keys: _Keys) -> None:
        """Read the log rows committed since ``keys.seen`` into the tables."""
        cur.execute(_TAIL, (collection_id, keys.seen), binary=True)
        rows = cur.fetchall()
        if not rows:
            return
        ids, pseudonyms = _keys_of_rows([r[1] for r in rows], [r[2] for r in rows])
        try:
            keys.add(ids, pseudonyms)
        except BaseException:
            self._drop_tables(keys)
            raise
        keys.seen, keys.ids_hash = int(rows[-1][0]), ids_hash(rows[-1][1])

    def _append(self, cur: Any, rows: list[tuple[Any, ...]]) -> int:
        """Insert the log rows (one statement); the last ``seq``."""
        values = ", ".join(["(%s, %s, %s, %b, %b, %b, %b, %b)"] * len(rows))
        cur.execute(
            "INSERT INTO batches (collection_id, phase, count, report_ids, pseudonyms, views, "
            f"cells, bits) VALUES {values} RETURNING seq",
            [x for r in rows for x in r],
        )
        return max(int(s) for (s,) in cur.fetchall())

    def _totals(
        self,
        cur: Any,
        collection_id: str,
        phase: int,
        delta: tuple[np.ndarray, list[np.ndarray]],
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """Write this writer's support row of ``phase`` plus ``delta`` (in the
        caller's transaction); the new totals, kept once committed."""
        key = (collection_id, phase)
        n, counts = delta
        old = self._mine.get(key)
        if old is None:  # first use, or after a commit whose outcome was unknown
            cur.execute(
                "SELECT n, counts FROM support WHERE collection_id = %s AND phase = %s "
                "AND writer = %s",
                (collection_id, phase, self._writer),
            )
            row = cur.fetchone()
            if row is None:
                old = (np.zeros_like(n), [np.zeros_like(c) for c in counts])
            else:
                flat = np.frombuffer(row[1], _I64).astype(np.int64)
                sizes = np.cumsum([c.size for c in counts])[:-1]
                old = (np.frombuffer(row[0], _I64).astype(np.int64), np.split(flat, sizes))
        total_n = old[0] + n
        total = [a + b for a, b in zip(old[1], counts)]
        cur.execute(
            "INSERT INTO support (collection_id, phase, writer, n, counts) "
            "VALUES (%s, %s, %s, %b, %b) ON CONFLICT (collection_id, phase, writer) "
            "DO UPDATE SET n = excluded.n, counts = excluded.counts",
            (
                collection_id,
                phase,
                self._writer,
                total_n.astype(_I64).tobytes(),
                np.concatenate(total).astype(_I64).tobytes(),
            ),
        )
        return total_n, total

    # -- key tables ----------------------------------------------------------------------
    def _keys_of(self, collection_id: str) -> _Keys:
        with self._keys_lock:
            keys = self._keys.get(collection_id)
            if keys is None:
                keys = self._keys[collection_id] = _Keys()
            return keys

    def _forget(self, collection_id: str) -> None:
        """Drop a closed collection's key tables (it takes no more reports)."""
        with self._keys_lock:
            self._keys.pop(collection_id, None)

    @staticmethod
    def _drop_tables(keys: _Keys) -> None:
        """After a failure while filling the tables: start them again from the log."""
        keys.by_id, keys.by_pseudonym = KeyTable(), KeyTable(values=False)
        keys.seen, keys.loaded = 0, False

    def _load(self, collection_id: str, keys: _Keys) -> None:
        """Fill empty tables from the collection's key snapshot and the log after it,
        or from the whole log, without the collection's lock (call with ``keys.lock``
        held); the rows committed meanwhile come with the next transaction's tail."""
        if keys.loaded:
            return
        conn = self._connect()
        try:
            with self._transaction(conn) as cur:
                if not self._load_snapshot(cur, collection_id, keys):
                    ids, pseudonyms, last, hashed = _read_keys(cur, collection_id, keys.seen)
                    keys.add(ids, pseudonyms)
                    keys.seen, keys.ids_hash, keys.key_source = last, hashed, "log"
            keys.loaded = True
        except BaseException:
            self._drop_tables(keys)
            raise
        finally:
            conn.close()

    def _load_snapshot(self, cur: Any, collection_id: str, keys: _Keys) -> bool:
        """Fill the tables from this replica's snapshot and the log rows after it;
        False (tables untouched) when there is no usable snapshot (missing, corrupt,
        or not of this log: see :meth:`.storage.Storage._load_snapshot`)."""
        path = self._snapshot_path(collection_id)
        if path is None or not os.path.exists(path):
            return False
        try:
            snap = read_snapshot(path, collection_id)
        except SnapshotError as exc:
            log.warning(
                "key snapshot of collection %r not used (%s): reading the log", collection_id, exc
            )
            return False
        cur.execute(
            "SELECT report_ids, (SELECT coalesce(sum(count), 0) FROM batches WHERE "
            "collection_id = %s AND seq <= %s) FROM batches WHERE collection_id = %s "
            "AND seq = %s",
            (collection_id, snap.seq, collection_id, snap.seq),
            binary=True,
        )
        row = cur.fetchone()
        if row is None or ids_hash(bytes(row[0])) != snap.ids_hash or row[1] != snap.reports:
            log.warning(
                "key snapshot of collection %r not used (it does not match the batch "
                "log): reading the log",
                collection_id,
            )
            return False
        ids, pseudonyms, last, hashed = _read_keys(cur, collection_id, snap.seq)
        snap.by_id.insert(ids, pseudonyms)
        snap.by_pseudonym.insert(pseudonyms)
        keys.by_id, keys.by_pseudonym = snap.by_id, snap.by_pseudonym
        keys.seen, keys.ids_hash = (last, hashed) if ids.size else (snap.seq, snap.ids_hash)
        keys.snapshot_seq, keys.snapshot_reports = snap.seq, snap.reports
        keys.key_source = "snapshot"
        return True

    # -- key snapshots -------------------------------------------------------------------
    def _snapshot(self, collection_id: str) -> None:
        """Write the collection's key snapshot (tables copied under ``keys.lock``,
        the file written outside it); a failure is logged."""
        path = self._snapshot_path(collection_id)
        with self._keys_lock:
            keys = self._keys.get(collection_id)
        if path is None or keys is None:
            return
        try:
            with keys.lock:
                if not keys.loaded or keys.seen <= keys.snapshot_seq:
                    return
                tables = [keys.by_id.export(), keys.by_pseudonym.export()]
                seq, reports, hashed = keys.seen, len(keys.by_id), keys.ids_hash
                keys.snapshot_seq, keys.snapshot_reports = seq, reports
            self._write_snapshot(path, collection_id, seq, reports, hashed, tables)
        except (OSError, CalmkitError) as exc:
            log.warning("key snapshot of collection %r not written: %s", collection_id, exc)

    def _load_all(self, pending: list[str]) -> None:
        """Background, on open: fill the open collections' tables; a submit to one
        that is not filled yet waits for it (or fills it itself)."""
        for cid in pending:
            keys = self._keys_of(cid)
            with keys.lock:
                try:
                    self._load(cid, keys)
                except Exception:  # the first submit to it loads it again
                    continue

    # -- counts ----------------------------------------------------------------------------
    def support(self, collection_id: str) -> SupportCounts:
        """The support counts over every phase, as committed by every replica."""
        with self._lock, self._transaction(self._live("_conn")) as cur:
            record = self._record(cur, collection_id)
            parts = self._parts(cur, record)
        return combine_phases(parts)

    def phase_support(self, collection_id: str, phase: int) -> SupportCounts:
        """One phase's support counts (its own plan)."""
        with self._lock, self._transaction(self._live("_conn")) as cur:
            record = self._record(cur, collection_id)
            return self._parts(cur, record)[check_phase(phase, record.phase)]

    def recount(self, collection_id: str) -> SupportCounts:
        """The support counts recounted from the batch log (an audit)."""
        with self._lock, self._transaction(self._live("_conn")) as cur:
            record = self._record(cur, collection_id)
            cur.execute(
                "SELECT seq, phase, count, report_ids, pseudonyms, views, cells, bits "
                "FROM batches WHERE collection_id = %s ORDER BY seq",
                (collection_id,),
                binary=True,
            )
            rows = cur.fetchall()
        return recount_log(collection_id, record.plans, rows)

    # -- lifecycle -----------------------------------------------------------------------
    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until the open collections' key tables are filled; whether they are."""
        self._loader.join(timeout)
        return not self._loader.is_alive()

    def close(self) -> None:
        """Write the key snapshots (with ``key_snapshots``), then close the
        connections (idempotent)."""
        if self._snapshotter is not None:
            self._snapshotter.join()
        if not self._closed:
            with self._keys_lock:
                pending = list(self._keys)
            for cid in pending:
                self._snapshot(cid)
            commits = max(self.stats["commits"], 1)
            log.info(
                json.dumps(
                    {  # how the collections' locks were used, for the operator
                        "event": "storage",
                        "commits": self.stats["commits"],
                        "batches_per_commit": round(self.stats["batches"] / commits, 2),
                        "lock_wait_ms": round(1e3 * self.stats["lock_wait"] / commits, 2),
                        "lock_held_ms": round(1e3 * self.stats["lock_held"] / commits, 2),
                    }
                )
            )
        self._closed = True
        with self._lock, self._write_lock:
            for name in ("_conn", "_wconn"):
                conn = getattr(self, name, None)
                if conn is not None:
                    conn.close()
                    setattr(self, name, None)

    def __contains__(self, collection_id: object) -> bool:
        """Whether the collection exists (known here, or asked of the database:
        collections are never removed)."""
        if not isinstance(collection_id, str):
            return False
        with self._keys_lock:
            if collection_id in self._records:
                return True
        with self._lock, self._transaction(self._live("_conn")) as cur:
            cur.execute("SELECT 1 FROM collections WHERE id = %s", (collection_id,))
            return cur.fetchone() is not None

    def __enter__(self) -> PgStorage:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _keys_of_rows(ids: list[bytes], pseudonyms: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """Log rows' report id and pseudonym blobs -> (n, 2) uint64 words each."""

    def words(blobs: list[bytes]) -> np.ndarray:
        return as_words(np.frombuffer(b"".join(blobs), np.uint8).reshape(-1, KEY_BYTES))

    return words(ids), words(pseudonyms)


def _read_keys(cur: Any, collection_id: str, after: int) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Every logged (report id, pseudonym) of a collection after ``seq`` ``after``, as
    words, the last ``seq`` read and the xxh3 of its report ids (``after`` and 0 when
    none), streamed in chunks of rows."""
    ids: list[bytes] = []
    pseudonyms: list[bytes] = []
    last = after
    while True:
        cur.execute(_TAIL + " LIMIT 1000", (collection_id, last), binary=True)
        rows = cur.fetchall()
        if not rows:
            break
        for _, rid, ps in rows:
            ids.append(rid)
            pseudonyms.append(ps)
        last = int(rows[-1][0])
    got_ids, got_ps = _keys_of_rows(ids, pseudonyms)
    return got_ids, got_ps, last, ids_hash(ids[-1]) if ids else 0


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _redact(dsn: str) -> str:
    """The DSN without its password, for messages."""
    if "://" in dsn and "@" in dsn:
        scheme, rest = dsn.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        return f"{scheme}://{creds.split(':', 1)[0]}@{host}"
    return dsn
