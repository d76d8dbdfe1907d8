"""Device state: per-collection pseudonyms and memoised reports.

The aggregator keeps one report per user per collection, keyed by a 16-byte
*pseudonym* the client sends with each report. A :class:`DeviceState` holds

* a 32-byte device secret, drawn once from ``os.urandom`` and stored; the pseudonym
  of a collection is ``HMAC-SHA256(secret, msg)[:16]`` with
  ``msg = b"calmkit/pseudonym/v1\\0" + collection_id (UTF-8)`` for the device's own
  user, followed by ``b"\\0" + encode_user_id(user_id)`` when acting for a named user.
  Without the secret, pseudonyms of different collections cannot be linked.
* the report made for each ``(collection_id, pseudonym)`` (memoisation, like RAPPOR's
  permanent response): asking again for the same collection returns the stored report
  unchanged and draws no new randomness, so retries, restarts and repeated calls never
  spend the privacy budget twice. The record passed on a later call is ignored: the
  first report stands. A report is committed to disk before it is returned.

Everything lives in one SQLite file (WAL, ``synchronous=FULL``, created with mode
0o600 on POSIX), or in memory when ``path`` is None (then the secret and the
memoised reports last only as long as the object). One object may be shared by
threads; several processes may open the same file (writes are serialised by SQLite).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import sqlite3
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import TracebackType

import numpy as np
import numpy.typing as npt

from .assignment import UserId, encode_user_id
from .errors import CalmkitError
from .plan import Plan
from .randomness import RngLike
from .report import Report, make_report, make_reports
from .schema import Label

__all__ = ["PSEUDONYM_BYTES", "SECRET_BYTES", "DeviceError", "DeviceState"]

PSEUDONYM_BYTES = 16
SECRET_BYTES = 32
_PREFIX = b"calmkit/pseudonym/v1\0"
_APPLICATION_ID = 0x63616C6D  # "calm": marks a calmkit device-state file
_FORMAT = 1  # PRAGMA user_version
_BUSY_TIMEOUT_S = 30.0
_IN_CHUNK = 500  # pseudonyms per "IN (...)" lookup (well under SQLite's variable limit)

_SCHEMA = (
    """CREATE TABLE device (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        secret BLOB NOT NULL CHECK (length(secret) = 32)
    )""",
    # payload has no declared type: an int (GRR cell) stays INTEGER, bytes (OUE) BLOB
    """CREATE TABLE reports (
        collection_id TEXT NOT NULL,
        pseudonym BLOB NOT NULL CHECK (length(pseudonym) = 16),
        plan_digest TEXT NOT NULL,
        view INTEGER NOT NULL,
        payload NOT NULL,
        report_id BLOB NOT NULL CHECK (length(report_id) = 16),
        PRIMARY KEY (collection_id, pseudonym)
    ) WITHOUT ROWID""",
)

Record = Mapping[str, Label] | Sequence[Label]


class DeviceError(CalmkitError):
    """Bad input to, or a bad or closed state file of, a :class:`DeviceState`."""


def _check_collection_id(collection_id: object) -> bytes:
    """The UTF-8 bytes of a valid collection id (non-empty str without NUL)."""
    if not isinstance(collection_id, str) or not collection_id:
        raise DeviceError(f"collection_id ({collection_id!r}) must be a non-empty string")
    if "\0" in collection_id:
        raise DeviceError(f"collection_id ({collection_id!r}) must not contain NUL")
    try:
        return collection_id.encode("utf-8")
    except UnicodeEncodeError:
        raise DeviceError(f"collection_id ({collection_id!r}) must be valid Unicode") from None


def _check_plan(plan: object) -> Plan:
    if not isinstance(plan, Plan):
        raise DeviceError(f"plan ({type(plan).__name__}) must be a Plan")
    return plan


def _create_private_file(path: str) -> None:
    """Create ``path`` (and its parent folder) with mode 0o600 unless it exists."""
    parent = os.path.dirname(path)
    if os.path.exists(path):
        return
    os.makedirs(parent, mode=0o700, exist_ok=True)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # created by another process meanwhile
        return
    try:
        if os.name == "posix":
            os.fchmod(fd, 0o600)  # exactly 0o600 whatever the umask
            os.fsync(fd)
    finally:
        os.close(fd)
    if os.name == "posix":  # make the new directory entry durable
        dfd = os.open(parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


class DeviceState:
    """A device's secret and its memoised reports, persisted in one SQLite file (or in
    memory when ``path`` is None: then memoisation lasts only as long as the object).

    A missing file (and its parent folder) is created with mode 0o600 (0o700); a new
    file gets a fresh 32-byte secret from ``os.urandom``. Use as a context manager or
    call :meth:`close`.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._secret: bytes | None = None
        if path is None:
            self._where = "in memory"
            target = ":memory:"
        else:
            raw = os.fspath(path)
            if not isinstance(raw, str) or not raw:
                raise DeviceError(f"path ({path!r}) must name a file (or be None for memory)")
            target = os.path.abspath(raw)  # never the special names ":memory:" or ""
            self._where = target
            try:
                _create_private_file(target)
            except OSError as exc:
                raise DeviceError(f"path ({target!r}) cannot be created: {exc}") from None
        try:
            conn = sqlite3.connect(
                target,
                timeout=_BUSY_TIMEOUT_S,
                isolation_level=None,  # explicit BEGIN/COMMIT below
                check_same_thread=False,  # guarded by self._lock
            )
        except sqlite3.Error as exc:
            raise DeviceError(f"device state ({self._where}) cannot be opened: {exc}") from None
        try:
            self._secret = self._initialise(conn, persistent=path is not None)
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    def _initialise(self, conn: sqlite3.Connection, persistent: bool) -> bytes:
        try:
            if persistent:
                conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("BEGIN IMMEDIATE")
            try:
                app_id = conn.execute("PRAGMA application_id").fetchone()[0]
                version = conn.execute("PRAGMA user_version").fetchone()[0]
                if app_id == 0 and version == 0:
                    tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
                    if tables:
                        raise DeviceError(
                            f"device state ({self._where}) must be a calmkit device-state file "
                            f"(found another SQLite database with {tables} schema objects)"
                        )
                    for statement in _SCHEMA:
                        conn.execute(statement)
                    conn.execute(f"PRAGMA application_id={_APPLICATION_ID}")
                    conn.execute(f"PRAGMA user_version={_FORMAT}")
                elif app_id != _APPLICATION_ID:
                    raise DeviceError(
                        f"device state ({self._where}) must be a calmkit device-state file "
                        f"(application_id is {app_id:#x})"
                    )
                elif version != _FORMAT:
                    raise DeviceError(
                        f"device state format ({version}) of {self._where} must be {_FORMAT}"
                    )
                conn.execute(
                    "INSERT OR IGNORE INTO device (id, secret) VALUES (1, ?)",
                    (os.urandom(SECRET_BYTES),),
                )
                secret = conn.execute("SELECT secret FROM device WHERE id = 1").fetchone()[0]
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise DeviceError(f"device state ({self._where}) cannot be opened: {exc}") from None
        if not isinstance(secret, bytes) or len(secret) != SECRET_BYTES:
            raise DeviceError(f"device secret in {self._where} must be {SECRET_BYTES} bytes")
        return secret

    # -- lifecycle -------------------------------------------------------------------
    def close(self) -> None:
        """Close the file (idempotent). In-memory state is gone afterwards."""
        with self._lock:
            conn, self._conn, self._secret = self._conn, None, None
            if conn is not None:
                conn.close()

    @property
    def closed(self) -> bool:
        return self._conn is None

    def __enter__(self) -> DeviceState:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:  # never shows the secret
        state = "closed" if self.closed else "open"
        return f"DeviceState({self._where!r}, {state})"

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """The connection inside ``BEGIN IMMEDIATE`` .. ``COMMIT`` under the lock."""
        with self._lock:
            conn = self._conn
            if conn is None:
                raise DeviceError(f"device state ({self._where}) is closed")
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise DeviceError(f"device state ({self._where}): {exc}") from None
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise DeviceError(f"device state ({self._where}): {exc}") from None
                raise

    # -- pseudonyms --------------------------------------------------------------------
    def _secret_or_raise(self) -> bytes:
        secret = self._secret
        if secret is None:
            raise DeviceError(f"device state ({self._where}) is closed")
        return secret

    def pseudonym(self, collection_id: str, user_id: UserId | None = None) -> bytes:
        """This device's 16-byte pseudonym in a collection (for ``user_id``, or for the
        device's own user when None). Stable for a given state file; pseudonyms of
        different collections, users or devices are unlinkable without the secret."""
        cid = _check_collection_id(collection_id)
        secret = self._secret_or_raise()
        return self._pseudonym(secret, _PREFIX + cid, user_id)

    @staticmethod
    def _pseudonym(secret: bytes, head: bytes, user_id: UserId | None) -> bytes:
        msg = head if user_id is None else head + b"\0" + encode_user_id(user_id)
        return hmac.digest(secret, msg, hashlib.sha256)[:PSEUDONYM_BYTES]

    # -- reports -----------------------------------------------------------------------
    def _stored(self, row: tuple[object, ...]) -> Report:
        digest, view, payload, report_id = row
        try:
            return Report(digest, view, payload, report_id)  # type: ignore[arg-type]
        except CalmkitError as exc:
            raise DeviceError(f"stored report in {self._where} is corrupt: {exc}") from None

    def report_for(
        self,
        collection_id: str,
        plan: Plan,
        record: Record,
        user_id: UserId | None = None,
        rng: RngLike = None,
    ) -> tuple[bytes, Report]:
        """``(pseudonym, report)`` of ``user_id`` in a collection.

        The first call makes the report (:func:`make_report`) and commits it before
        returning; every later call (also after a restart) returns that report
        unchanged, draws no randomness and ignores ``record`` and ``plan``: a user
        reports once per collection, also when the collection has moved on to
        another phase's plan (the report keeps the digest it was made under, which
        the server still accepts).

        ``user_id=None`` is the device's own user: the pseudonym is
        ``pseudonym(collection_id)`` and it is also the id that picks the view (uniform
        over devices, and public anyway: the server sees both).
        """
        cid = _check_collection_id(collection_id)
        plan = _check_plan(plan)
        pseudonym = self._pseudonym(self._secret_or_raise(), _PREFIX + cid, user_id)
        assign_id: UserId = pseudonym if user_id is None else user_id
        with self._transaction() as conn:
            row = conn.execute(
                "SELECT plan_digest, view, payload, report_id FROM reports "
                "WHERE collection_id = ? AND pseudonym = ?",
                (collection_id, pseudonym),
            ).fetchone()
            if row is not None:  # also when made under an earlier phase's plan
                return pseudonym, self._stored(row)
            report = make_report(plan, record, assign_id, rng)
            conn.execute(
                "INSERT INTO reports (collection_id, pseudonym, plan_digest, view, payload, "
                "report_id) VALUES (?, ?, ?, ?, ?, ?)",
                (
                    collection_id,
                    pseudonym,
                    report.plan_digest,
                    report.view,
                    report.payload,
                    report.report_id,
                ),
            )
        return pseudonym, report

    def reports_for(
        self,
        collection_id: str,
        plan: Plan,
        codes_or_records: npt.ArrayLike | Sequence[Mapping[str, Label]],
        user_ids: Sequence[UserId] | np.ndarray,
        rng: RngLike = None,
    ) -> list[tuple[bytes, Report]]:
        """``(pseudonym, report)`` of many users, in input order, in one transaction.

        ``codes_or_records`` is either codes (n, d) (any integer array-like) or a
        sequence of n records given as ``{name: label}`` mappings (a sequence of label
        sequences would be ambiguous with codes, so it is read as codes). Users with a
        stored report get it back unchanged; the others get new reports made
        vectorised per view (:func:`make_reports`), all committed before returning.
        A user id given twice gets one report (made from its first record). A stored
        report made under another (earlier phase's) plan is returned as it is.
        """
        cid = _check_collection_id(collection_id)
        plan = _check_plan(plan)
        codes = self._codes(plan, codes_or_records)
        n = codes.shape[0]
        if isinstance(user_ids, (str, bytes)) or len(user_ids) != n:
            given = "a str" if isinstance(user_ids, (str, bytes)) else f"{len(user_ids)} given"
            raise DeviceError(f"user_ids ({given}) must match the records ({n})")
        ids: list[UserId] = (
            user_ids.tolist() if isinstance(user_ids, np.ndarray) else list(user_ids)
        )
        secret, head = self._secret_or_raise(), _PREFIX + cid
        pseudonyms = [self._pseudonym(secret, head, u) for u in ids]

        with self._transaction() as conn:
            found: dict[bytes, Report] = {}
            unique = list(dict.fromkeys(pseudonyms))
            for lo in range(0, len(unique), _IN_CHUNK):
                chunk = unique[lo : lo + _IN_CHUNK]
                marks = ",".join("?" * len(chunk))
                rows = conn.execute(
                    "SELECT pseudonym, plan_digest, view, payload, report_id FROM reports "
                    f"WHERE collection_id = ? AND pseudonym IN ({marks})",
                    (collection_id, *chunk),
                ).fetchall()
                for row in rows:
                    found[row[0]] = self._stored(row[1:])
            first: dict[bytes, int] = {}  # new pseudonym -> its first row
            for i, p in enumerate(pseudonyms):
                if p not in found and p not in first:
                    first[p] = i
            if first:
                new_rows = np.fromiter(first.values(), dtype=np.int64, count=len(first))
                new_ids = (
                    user_ids[new_rows]
                    if isinstance(user_ids, np.ndarray)
                    else [ids[i] for i in new_rows.tolist()]
                )
                made: list[tuple[bytes, str, int, int | bytes, bytes]] = []
                for batch in make_reports(plan, codes[new_rows], new_ids, rng):
                    grr = batch.payloads.ndim == 1
                    payloads = batch.payloads.tolist() if grr else batch.payloads
                    for k, row_k in enumerate(batch.rows.tolist()):
                        p = pseudonyms[int(new_rows[row_k])]
                        payload = payloads[k] if grr else payloads[k].tobytes()
                        report = Report(
                            plan.digest, batch.view, payload, batch.report_ids[k].tobytes()
                        )
                        found[p] = report
                        made.append(
                            (p, report.plan_digest, report.view, report.payload, report.report_id)
                        )
                conn.executemany(
                    "INSERT INTO reports (collection_id, pseudonym, plan_digest, view, "
                    "payload, report_id) VALUES (?, ?, ?, ?, ?, ?)",
                    [(collection_id, *m) for m in made],
                )
        return [(p, found[p]) for p in pseudonyms]

    @staticmethod
    def _codes(plan: Plan, data: npt.ArrayLike | Sequence[Mapping[str, Label]]) -> np.ndarray:
        """Codes (n, d) of a codes array-like or of a sequence of record mappings."""
        if isinstance(data, Sequence) and not isinstance(data, (str, bytes)):
            kinds = {isinstance(r, Mapping) for r in data}
            if kinds == {True}:
                rows = [plan.schema.encode_record(r) for r in data]  # type: ignore[arg-type]
                return np.array(rows, dtype=np.int64).reshape(len(rows), plan.schema.d)
            if True in kinds:
                raise DeviceError(
                    "codes_or_records (a mix of mappings and other rows) must be codes (n, d) "
                    "or records given as {name: label} mappings"
                )
            if not data:
                return np.empty((0, plan.schema.d), dtype=np.int64)
        if isinstance(data, Mapping):
            raise DeviceError(
                "codes_or_records (one mapping) must be codes (n, d) or a sequence of records"
            )
        return plan.schema.validate_codes(data)  # type: ignore[arg-type]

    def forget(self, collection_id: str) -> None:
        """Delete the memoised reports of a collection (an explicit user action: a
        later report for it spends privacy again)."""
        _check_collection_id(collection_id)
        with self._transaction() as conn:
            conn.execute("DELETE FROM reports WHERE collection_id = ?", (collection_id,))
