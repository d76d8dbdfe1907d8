"""Storage on PostgreSQL: several aggregator processes (replicas) behind one address
share collections, with the guarantees of the embedded SQLite store (:mod:`.storage`).

- A batch is committed before its ack, accepted whole or refused whole.
- Exactly once across retries and replicas: ``reports(collection_id, report_id,
  pseudonym)`` is unique on the report id and on the pseudonym. A batch's ids are
  inserted with ``ON CONFLICT DO NOTHING``. The ones not inserted are classified in the
  same transaction:
  - the stored (report id, pseudonym) pair: a duplicate;
  - anything else: :class:`ReportConflict`, naming no stored value.
  A replica inserting the same key concurrently waits for the other's commit; a deadlock
  between two replicas' batches aborts one with UNAVAILABLE, and its client retries.
- The batch log (``batches``, the columnar layout of :mod:`.columns`) keeps every
  report's payload.
- The support counts are kept one row per (collection, phase, writer). Each replica
  process writes only its own row, in the batch's transaction, so replicas never wait
  on each other's counts. A read sums the rows.
- Every read of a collection (its state, phases, counts) goes to the database, so what
  one replica committed, the others see. Only plans (immutable, by digest) are cached.

The batch's ids are split into 16-byte keys by the database (``substring`` over
``generate_series``), so no Python runs per report.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from types import TracebackType
from typing import Any

import numpy as np

from calmkit_client import CalmkitError, Plan
from calmkit_client.echo import show as _show
from calmkit_client.errors import (
    CollectionClosed,
    CollectionExists,
    CollectionNotFound,
    PlanMismatch,
    ReportConflict,
    ServiceUnavailable,
)

from ..pilot import PhasedDesign, combine_phases
from ..support import SupportCounts
from .columns import ReportColumns, columns_from_reports
from .storage import (
    CLOSED,
    OPEN,
    BatchOutcome,
    CollectionRecord,
    StoredReport,
    _check_collection_args,
    _dedupe_batch,
    _stored_plan,
)

__all__ = ["PG_SCHEMA_VERSION", "PgStorage", "is_postgres_url"]

PG_SCHEMA_VERSION = 1
_I64 = np.dtype("<i8")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS calmkit_schema (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS collections (
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
CREATE TABLE IF NOT EXISTS phases (
    collection_id TEXT NOT NULL REFERENCES collections (id),
    phase INTEGER NOT NULL CHECK (phase >= 1),
    plan_json TEXT NOT NULL,
    digest TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (collection_id, phase)
);
-- No foreign keys on the per-report tables (a trigger per row costs a fifth of the
-- insert): add_reports checks the collection under FOR SHARE in the same transaction.
CREATE TABLE IF NOT EXISTS reports (
    collection_id TEXT NOT NULL,
    report_id BYTEA NOT NULL,
    pseudonym BYTEA NOT NULL,
    PRIMARY KEY (collection_id, report_id),
    UNIQUE (collection_id, pseudonym)
);
CREATE TABLE IF NOT EXISTS batches (
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
CREATE TABLE IF NOT EXISTS support (
    collection_id TEXT NOT NULL REFERENCES collections (id),
    phase INTEGER NOT NULL,
    writer UUID NOT NULL,
    n BYTEA NOT NULL,
    counts BYTEA NOT NULL,
    PRIMARY KEY (collection_id, phase, writer)
);
"""
# The batch's keys, split by the database: (position, report id, pseudonym).
_KEYS = """SELECT i, substring(%(ids)s::bytea FROM 16 * i + 1 FOR 16) AS rid,
                  substring(%(ps)s::bytea FROM 16 * i + 1 FOR 16) AS ps
           FROM generate_series(0, %(n)s - 1) AS i"""
_INSERT_KEYS = f"""WITH batch AS ({_KEYS}),
    added AS (
        INSERT INTO reports (collection_id, report_id, pseudonym)
        SELECT %(cid)s, rid, ps FROM batch ORDER BY rid
        ON CONFLICT DO NOTHING
        RETURNING report_id
    )
    SELECT batch.i FROM batch JOIN added ON added.report_id = batch.rid"""
# For the keys not inserted: is the pair stored (a retry), else is the id taken?
_CLASSIFY = f"""WITH batch AS ({_KEYS})
    SELECT batch.i,
           EXISTS (SELECT 1 FROM reports r WHERE r.collection_id = %(cid)s
                   AND r.report_id = batch.rid AND r.pseudonym = batch.ps),
           EXISTS (SELECT 1 FROM reports r WHERE r.collection_id = %(cid)s
                   AND r.report_id = batch.rid)
    FROM batch WHERE batch.i = ANY(%(positions)s)"""


def is_postgres_url(db: str) -> bool:
    """Whether ``--db`` names a PostgreSQL database (``postgresql://`` or
    ``postgres://``) rather than a SQLite file."""
    return isinstance(db, str) and db.startswith(("postgresql://", "postgres://"))


class PgStorage:
    """Collections and reports in one PostgreSQL database, shared by replicas.

    Args:
        dsn: a libpq connection string or URL (``postgresql://user@host/db``).
    """

    def __init__(self, dsn: str) -> None:
        try:
            import psycopg
        except ImportError:
            raise CalmkitError(
                "db (a postgresql:// URL) needs psycopg: pip install 'calmkit[postgres]'"
            ) from None
        self._psycopg = psycopg
        self.path = _redact(dsn)
        self._lock = threading.Lock()
        self._writer = uuid.uuid4()  # this process's own support rows
        self._plans: dict[str, Plan] = {}
        self._mine: dict[tuple[str, int], tuple[np.ndarray, list[np.ndarray]]] = {}
        try:
            self._conn: Any = psycopg.connect(dsn, autocommit=False)
        except psycopg.Error as exc:
            raise CalmkitError(f"db ({self.path!r}) cannot be opened: {_first_line(exc)}") from None
        with self._transaction() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(hashtext('calmkit schema'))")
            cur.execute(_SCHEMA)
            cur.execute("SELECT version FROM calmkit_schema")
            row = cur.fetchone()
            if row is None:
                cur.execute("INSERT INTO calmkit_schema VALUES (%s)", (PG_SCHEMA_VERSION,))
            elif row[0] != PG_SCHEMA_VERSION:
                raise CalmkitError(
                    f"schema version ({row[0]}) of {self.path!r} must be {PG_SCHEMA_VERSION}"
                )

    # -- transactions ------------------------------------------------------------------
    @contextmanager
    def _transaction(self) -> Iterator[Any]:
        """A cursor in one transaction (committed on exit, rolled back on error);
        connection trouble, deadlocks and serialization failures are
        :class:`ServiceUnavailable` (the client retries)."""
        psycopg = self._psycopg
        if self._conn is None:
            raise ServiceUnavailable("storage is closed (the server is shutting down)")
        try:
            with self._conn.transaction(), self._conn.cursor() as cur:
                yield cur
        except (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure) as exc:
            raise ServiceUnavailable(
                f"the batch met a concurrent one ({_first_line(exc)}): retry"
            ) from None
        except psycopg.OperationalError as exc:
            raise ServiceUnavailable(f"database unavailable: {_first_line(exc)}") from None

    # -- reading -------------------------------------------------------------------------
    def _plan(self, cid: str, phase: int, plan_json: str, digest: str) -> Plan:
        plan = self._plans.get(digest)
        if plan is None:
            plan = self._plans[digest] = _stored_plan(cid, phase, plan_json, digest)
        return plan

    def _record(
        self, cur: Any, collection_id: str, lock: str = "", counts: bool = True
    ) -> CollectionRecord:
        """The collection as stored now (``lock``: ``FOR SHARE`` / ``FOR UPDATE``;
        ``counts=False``: without the report totals, one query fewer)."""
        if not isinstance(collection_id, str):
            raise CollectionNotFound(f"collection_id ({_show(collection_id)}) not found")
        cur.execute(
            "SELECT plan_json, digest, k, state, submit_token_hash, created_at, closed_at, "
            f"design_json FROM collections WHERE id = %s {lock}",
            (collection_id,),
        )
        row = cur.fetchone()
        if row is None:
            raise CollectionNotFound(f"collection_id ({_show(collection_id)}) not found")
        plan_json, digest, k, state, token_hash, created, closed, design_json = row
        plans = [self._plan(collection_id, 0, plan_json, digest)]
        cur.execute(
            "SELECT phase, plan_json, digest FROM phases WHERE collection_id = %s ORDER BY phase",
            (collection_id,),
        )
        for phase, text, d in cur.fetchall():
            plans.append(self._plan(collection_id, phase, text, d))
        design = None if design_json is None else PhasedDesign.from_json(design_json)
        record = CollectionRecord(collection_id, tuple(plans), k, state, bytes(token_hash),
                                  created, closed, 0, design)  # fmt: skip
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

    # -- collections -------------------------------------------------------------------
    def create_collection(
        self,
        collection_id: str,
        plan: Plan,
        k: int,
        submit_token_hash: bytes,
        design: PhasedDesign | None = None,
    ) -> CollectionRecord:
        """Create an open collection (see :meth:`.storage.Storage.create_collection`)."""
        _check_collection_args(collection_id, plan, k, submit_token_hash)
        if design is not None and not isinstance(design, PhasedDesign):
            raise CalmkitError(f"design ({_show(design)}) must be a PhasedDesign or None")
        with self._lock, self._transaction() as cur:
            cur.execute(
                "INSERT INTO collections (id, plan_json, digest, k, state, submit_token_hash, "
                "created_at, closed_at, design_json) VALUES (%s, %s, %s, %s, %s, %s, %s, NULL, %s) "
                "ON CONFLICT (id) DO NOTHING",
                (collection_id, plan.to_json(), plan.digest, int(k), OPEN,
                 bytes(submit_token_hash), time.time(),
                 None if design is None else design.to_json()),
            )  # fmt: skip
            if cur.rowcount == 0:
                raise CollectionExists(f"collection_id ({_show(collection_id)}) already exists")
            return self._record(cur, collection_id)

    def get_collection(self, collection_id: str) -> CollectionRecord:
        """The collection's record as committed now; :class:`CollectionNotFound`."""
        with self._lock, self._transaction() as cur:
            return self._record(cur, collection_id)

    def list_collections(self) -> list[CollectionRecord]:
        """Every collection, oldest first."""
        with self._lock, self._transaction() as cur:
            cur.execute("SELECT id FROM collections ORDER BY created_at, id")
            return [self._record(cur, cid) for (cid,) in cur.fetchall()]

    def close_collection(self, collection_id: str) -> CollectionRecord:
        """Stop accepting reports (idempotent)."""
        with self._lock, self._transaction() as cur:
            cur.execute(
                "UPDATE collections SET state = %s, closed_at = %s WHERE id = %s AND state = %s",
                (CLOSED, time.time(), collection_id, OPEN),
            )
            return self._record(cur, collection_id)

    def add_phase(self, collection_id: str, phase: int, plan: Plan) -> CollectionRecord:
        """Start ``phase`` with ``plan``; idempotent across replicas (the first stored
        plan of a phase stays)."""
        if not isinstance(plan, Plan):
            raise CalmkitError(f"plan ({_show(plan)}) must be a Plan")
        with self._lock, self._transaction() as cur:
            record = self._record(cur, collection_id, "FOR UPDATE")
            current = record.phase
            if phase <= current:
                return record
            if phase != current + 1:
                raise CalmkitError(f"phase ({phase}) must be the next phase ({current + 1})")
            if record.state != OPEN:
                raise CollectionClosed(f"collection_id ({_show(collection_id)}) is closed")
            first = record.plans[0]
            if plan.schema != first.schema or plan.epsilon != first.epsilon:
                raise CalmkitError("plan must keep the collection's schema and epsilon")
            if any(p.digest == plan.digest for p in record.plans):
                raise CalmkitError(f"plan ({plan.digest[:12]}) is already one of the phases")
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
        see :meth:`.storage.Storage.add_reports` for the contract."""
        if isinstance(reports, ReportColumns):
            if reports.plan.digest != plan_digest:
                raise PlanMismatch(
                    f"reports (decoded for plan {reports.plan.digest[:12]}) must be decoded "
                    f"for plan_digest ({_show(plan_digest)})"
                )
            batch = reports
        else:
            bad = next((i for i, r in enumerate(reports) if not isinstance(r, StoredReport)), None)
            if bad is not None:
                raise CalmkitError(f"reports[{bad}] ({_show(reports[bad])}) must be a StoredReport")
            record = self.get_collection(collection_id)
            plan = record.plans[record.phase_of(plan_digest)]
            batch = columns_from_reports(plan, list(reports))
        if not len(batch):
            return BatchOutcome(0, 0)
        firsts = _dedupe_batch(batch)
        distinct = batch.take(firsts)
        keys = {
            "cid": collection_id,
            "n": len(distinct),
            "ids": distinct.report_ids.tobytes(),
            "ps": distinct.pseudonyms.tobytes(),
        }
        with self._lock, self._transaction() as cur:
            # the collection's state and phases, held against a concurrent close
            record = self._record(cur, collection_id, "FOR SHARE", counts=False)
            if record.state != OPEN:
                raise CollectionClosed(
                    f"collection_id ({_show(collection_id)}) is {record.state}: it accepts no "
                    "reports"
                )
            phase = record.phase_of(plan_digest)
            cur.execute(_INSERT_KEYS, keys)
            new = np.sort(np.array([i for (i,) in cur.fetchall()], dtype=np.int64))
            if new.size < len(distinct):
                rest = np.setdiff1d(np.arange(len(distinct)), new)
                cur.execute(_CLASSIFY, {**keys, "positions": rest.tolist()})
                _raise_conflicts(cur.fetchall(), batch, firsts, collection_id)
            counted = (
                self._append(cur, collection_id, phase, distinct.take(new)) if new.size else None
            )
        if counted is not None:  # committed: this writer's row now holds these totals
            self._mine[counted[0]] = counted[1]
        return BatchOutcome(int(new.size), len(batch) - int(new.size))

    def _append(
        self, cur: Any, collection_id: str, phase: int, fresh: ReportColumns
    ) -> tuple[tuple[str, int], tuple[np.ndarray, list[np.ndarray]]]:
        """Log the new reports and write this writer's updated counts (in the caller's
        transaction); returns the new totals, for the caller to keep once committed."""
        blobs = fresh.encode()
        cur.execute(
            "INSERT INTO batches (collection_id, phase, count, report_ids, pseudonyms, views, "
            "cells, bits) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
            (collection_id, phase, len(fresh), blobs["report_ids"], blobs["pseudonyms"],
             blobs["views"], blobs["cells"], blobs["bits"]),
        )  # fmt: skip
        n, counts = fresh.support_deltas()
        key = (collection_id, phase)
        old_n, old_counts = self._mine.get(
            key, (np.zeros_like(n), [np.zeros_like(c) for c in counts])
        )
        total_n = old_n + n
        total = [a + b for a, b in zip(old_counts, counts)]
        cur.execute(
            "INSERT INTO support (collection_id, phase, writer, n, counts) "
            "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (collection_id, phase, writer) "
            "DO UPDATE SET n = excluded.n, counts = excluded.counts",
            (collection_id, phase, self._writer, total_n.astype(_I64).tobytes(),
             np.concatenate(total).astype(_I64).tobytes()),
        )  # fmt: skip
        return key, (total_n, total)

    def support(self, collection_id: str) -> SupportCounts:
        """The support counts over every phase, as committed by every replica."""
        with self._lock, self._transaction() as cur:
            record = self._record(cur, collection_id)
            parts = self._parts(cur, record)
        return combine_phases(parts)

    def phase_support(self, collection_id: str, phase: int) -> SupportCounts:
        """One phase's support counts (its own plan)."""
        with self._lock, self._transaction() as cur:
            record = self._record(cur, collection_id)
            if (
                isinstance(phase, bool)
                or not isinstance(phase, int)
                or not (0 <= phase <= record.phase)
            ):
                raise CalmkitError(f"phase ({_show(phase)}) must be in [0, {record.phase}]")
            return self._parts(cur, record)[phase]

    def recount(self, collection_id: str) -> SupportCounts:
        """The support counts recounted from the batch log (an audit)."""
        from .columns import decode_columns

        with self._lock, self._transaction() as cur:
            record = self._record(cur, collection_id)
            parts = [SupportCounts.zeros(p) for p in record.plans]
            cur.execute(
                "SELECT phase, count, report_ids, pseudonyms, views, cells, bits FROM batches "
                "WHERE collection_id = %s ORDER BY seq",
                (collection_id,),
            )
            for phase, count, rid, ps, views, cells, bits in cur.fetchall():
                columns = decode_columns(record.plans[phase], count, report_ids=bytes(rid),
                                         pseudonyms=bytes(ps), views=bytes(views),
                                         cells=bytes(cells), bits=bytes(bits))  # fmt: skip
                n, counts = columns.support_deltas()
                old = parts[phase]
                summed = tuple(a + b for a, b in zip(old.counts, counts))
                parts[phase] = SupportCounts(old.plan, old.n + n, summed)
        return combine_phases(parts)

    # -- lifecycle -----------------------------------------------------------------------
    def wait_ready(self, timeout: float | None = None) -> bool:
        """Always ready: deduplication lives in the database."""
        return True

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __contains__(self, collection_id: object) -> bool:
        if not isinstance(collection_id, str):
            return False
        with self._lock, self._transaction() as cur:
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


def _raise_conflicts(
    rows: list[tuple[int, bool, bool]], batch: ReportColumns, firsts: np.ndarray, cid: str
) -> None:
    """Keys not inserted (positions among the batch's distinct reports ``firsts``): a
    stored pair is a retry; otherwise the first conflict raises, naming only what the
    client sent and its position in the batch."""
    for k, pair_stored, id_taken in sorted(rows):
        if pair_stored:
            continue
        i = int(firsts[k])
        if id_taken:
            raise ReportConflict(
                f"reports[{i}].report_id ({_show(bytes(batch.report_ids[i]))}) is already used "
                f"in collection {_show(cid)}"
            )
        raise ReportConflict(
            f"reports[{i}].pseudonym ({_show(bytes(batch.pseudonyms[i]))}) already holds a "
            f"report in collection {_show(cid)} (a device reports once per collection)"
        )


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _redact(dsn: str) -> str:
    """The DSN without its password, for messages."""
    if "://" in dsn and "@" in dsn:
        scheme, rest = dsn.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        return f"{scheme}://{creds.split(':', 1)[0]}@{host}"
    return dsn
