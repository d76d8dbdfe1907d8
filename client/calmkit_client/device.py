"""Device state: per-collection pseudonyms and memoised reports.

The aggregator keeps one report per user per collection, keyed by a 16-byte
*pseudonym* the client sends with each report. A :class:`DeviceState` holds

* a 32-byte device secret, drawn once from the OS entropy source (``os.urandom``,
  through :class:`~.randomness.OsEntropy`) and stored; the pseudonym
  of a collection is ``HMAC-SHA256(secret, msg)[:16]`` with
  ``msg = b"calmkit/pseudonym/v1\\0" + collection_id (UTF-8)`` for the device's own
  user, followed by ``b"\\0" + encode_user_id(user_id)`` when acting for a named user.
  Without the secret, pseudonyms of different collections cannot be linked.
* the report made for each ``(collection_id, pseudonym)`` (memoisation, like RAPPOR's
  permanent response): asking again for the same collection returns the stored report
  unchanged and draws no new randomness, so retries, restarts and repeated calls never
  spend the privacy budget twice. The record passed on a later call is ignored: the
  first report stands. A report is committed to disk before it is returned.

* a privacy ledger: the epsilon each user has spent in each collection, committed in
  the same transaction as the report that spent it. Ledger rows are keyed by
  ``HMAC-SHA256(secret, b"calmkit/ledger/v1\\0" [+ b"\\0" + user id])[:16]``, so the
  ledgers of several users on one device stay apart and link no pseudonyms. Before a
  new report is made the ledger is checked against a :class:`~.budget.PrivacyBudget`;
  a report that would exceed it is never made (:class:`~.errors.BudgetExceeded`).

Everything lives in one SQLite file (WAL, ``synchronous=FULL``, created with mode
0o600 on POSIX). ``DeviceState()`` opens the per-user default file
(:func:`default_state_path`), so an app that passes nothing still reports once per
user and collection across launches. :meth:`DeviceState.in_memory` is the explicit
opt-out: its secret, reports and ledger last only as long as the object, and each new
object is a new user to the server. Deleting the file has the same effect (a new
secret: new pseudonyms, a fresh ledger); that is the user's right to reset, and an app
must not do it casually. One object may be shared by threads; several processes may
open the same file (writes are serialised by SQLite).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
import sqlite3
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Self

import numpy as np
import numpy.typing as npt
import platformdirs

from .assignment import UserId, encode_user_id
from .budget import DEFAULT_BUDGET, PrivacyBudget
from .errors import BudgetExceeded, CalmkitError
from .ids import check_collection_id
from .plan import Plan
from .randomness import OsEntropy, SourceLike
from .report import Report, make_report, make_reports
from .schema import Label

__all__ = [
    "PSEUDONYM_BYTES",
    "SECRET_BYTES",
    "STATE_ENV",
    "DeviceError",
    "DeviceState",
    "default_state_path",
]

PSEUDONYM_BYTES = 16
SECRET_BYTES = 32
STATE_ENV = "CALMKIT_DEVICE_STATE"  # overrides the default state file's path
_PREFIX = b"calmkit/pseudonym/v1\0"
_LEDGER_PREFIX = b"calmkit/ledger/v1\0"
_APPLICATION_ID = 0x63616C6D  # "calm": marks a calmkit device-state file
_FORMAT = 2  # PRAGMA user_version; format 1 (no ledger) is migrated in place
_MEMORY = ":memory:"
_IN_MEMORY = object()  # DeviceState's path sentinel, only passed by in_memory()
_EPS_SLACK = 1e-9  # relative: sums of epsilons like 0.1 + 0.2 must not trip a cap
_BUSY_TIMEOUT_S = 30.0
_IN_CHUNK = 500  # pseudonyms per "IN (...)" lookup (well under SQLite's variable limit)

# epsilon NULL: a report made before the ledger existed (format 1), amount unknown
_LEDGER_SCHEMA = (
    """CREATE TABLE ledger (
        ledger_key BLOB NOT NULL CHECK (length(ledger_key) = 16),
        collection_id TEXT NOT NULL,
        epsilon REAL CHECK (epsilon IS NULL OR epsilon > 0),
        PRIMARY KEY (ledger_key, collection_id)
    ) WITHOUT ROWID""",
)
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
    *_LEDGER_SCHEMA,
)

Record = Mapping[str, Label] | Sequence[Label]


class DeviceError(CalmkitError):
    """Bad input to, or a bad or closed state file of, a :class:`DeviceState`."""


def _check_collection_id(collection_id: object) -> bytes:
    """The ASCII bytes of a valid collection id (see :mod:`calmkit_client.ids`)."""
    try:
        return check_collection_id(collection_id).encode("ascii")
    except CalmkitError as exc:
        raise DeviceError(str(exc)) from None


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


def default_state_path() -> Path:
    """Where ``DeviceState()`` keeps its file: ``$CALMKIT_DEVICE_STATE`` if set, else
    ``device-state.sqlite`` in the user's state folder (platformdirs): Linux
    ``$XDG_STATE_HOME/calmkit`` (default ``~/.local/state/calmkit``), macOS
    ``~/Library/Application Support/calmkit``, Windows ``%LOCALAPPDATA%\\calmkit``.
    One file per OS user; an app with its own storage area passes its own path."""
    override = os.environ.get(STATE_ENV)
    if override:
        return Path(override)
    return platformdirs.user_state_path("calmkit", appauthor=False) / "device-state.sqlite"


def _over(spent: float, cap: float) -> bool:
    return spent > cap * (1 + _EPS_SLACK)


class DeviceState:
    """A device's secret, its memoised reports and its privacy ledger, persisted in
    one SQLite file.

    ``DeviceState()`` opens the per-user default file (:func:`default_state_path`);
    pass ``path`` to keep it elsewhere, or use :meth:`in_memory` to opt out of
    persistence. A missing file (and its parent folder) is created with mode 0o600
    (0o700); a new file gets a fresh 32-byte secret from the OS entropy source; a format-1
    file is migrated in place. Use as a context manager or call :meth:`close`.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._secret: bytes | None = None
        if path is _IN_MEMORY:
            self._where = "in memory"
            target = _MEMORY
        else:
            raw = os.fspath(default_state_path() if path is None else path)
            if not isinstance(raw, str) or not raw:
                raise DeviceError(f"path ({path!r}) must name a file")
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
            self._secret = self._initialise(conn, persistent=target != _MEMORY)
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    @classmethod
    def in_memory(cls) -> Self:
        """A state that is never written anywhere: its secret, reports and ledger last
        only as long as the object. Every new in-memory state is a new user to the
        server (new pseudonyms, a fresh report, an empty ledger), so use it only for
        tests, simulations or an app that keeps the object for its user's lifetime."""
        return cls(_IN_MEMORY)  # type: ignore[arg-type]

    @property
    def path(self) -> str | None:
        """The state file's absolute path (None in memory)."""
        return None if self._where == "in memory" else self._where

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
                elif version not in (1, _FORMAT):
                    raise DeviceError(
                        f"device state format ({version}) of {self._where} must be 1 or "
                        f"{_FORMAT} (written by a newer calmkit?)"
                    )
                row = conn.execute("SELECT secret FROM device WHERE id = 1").fetchone()
                if row is None:  # a new file: its secret, under this transaction's write lock
                    secret = OsEntropy().token(SECRET_BYTES)
                    conn.execute("INSERT INTO device (id, secret) VALUES (1, ?)", (secret,))
                else:
                    secret = row[0]
                if version == 1:
                    self._migrate_from_1(conn, secret)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise DeviceError(f"device state ({self._where}) cannot be opened: {exc}") from None
        if not isinstance(secret, bytes) or len(secret) != SECRET_BYTES:
            raise DeviceError(f"device secret in {self._where} must be {SECRET_BYTES} bytes")
        return secret

    def _migrate_from_1(self, conn: sqlite3.Connection, secret: object) -> None:
        """Format 1 had no ledger. Add it and charge the device's own user for every
        collection it reported in, amount unknown (NULL, counted as the whole
        per-collection cap). Named users' old reports are attributed when that user is
        next seen in the collection (their user ids are not stored, so not before)."""
        if not isinstance(secret, bytes) or len(secret) != SECRET_BYTES:
            raise DeviceError(f"device secret in {self._where} must be {SECRET_BYTES} bytes")
        for statement in _LEDGER_SCHEMA:
            conn.execute(statement)
        own_key = self._pseudonym(secret, _LEDGER_PREFIX, None)
        cids = [r[0] for r in conn.execute("SELECT DISTINCT collection_id FROM reports")]
        for cid in cids:
            own = self._pseudonym(secret, _PREFIX + cid.encode("utf-8"), None)
            stored = conn.execute(
                "SELECT 1 FROM reports WHERE collection_id = ? AND pseudonym = ?", (cid, own)
            ).fetchone()
            if stored is not None:
                conn.execute(
                    "INSERT INTO ledger (ledger_key, collection_id, epsilon) VALUES (?, ?, NULL)",
                    (own_key, cid),
                )
        conn.execute(f"PRAGMA user_version={_FORMAT}")

    # -- lifecycle -------------------------------------------------------------------
    def close(self) -> None:
        """Close the file (idempotent). In-memory state is gone afterwards."""
        with self._lock:
            conn, self._conn, self._secret = self._conn, None, None
            if conn is not None:
                conn.close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called."""
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
    def _bulk_source(self) -> SourceLike:
        """Where bulk reports (:meth:`reports_for`) draw their randomness: the OS
        entropy source. Only ``calmkit_simulator.SimulatedDevices`` overrides it, for
        reproducible simulations (never on a device)."""
        return None

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

    # -- the privacy ledger --------------------------------------------------------------
    def ledger(self, user_id: UserId | None = None) -> dict[str, float | None]:
        """``{collection id: epsilon spent}`` of ``user_id`` (the device's own user when
        None); None marks a report made before the ledger existed (amount unknown,
        charged as the whole per-collection cap)."""
        key = self._pseudonym(self._secret_or_raise(), _LEDGER_PREFIX, user_id)
        with self._transaction() as conn:
            rows = conn.execute(
                "SELECT collection_id, epsilon FROM ledger WHERE ledger_key = ? "
                "ORDER BY collection_id",
                (key,),
            ).fetchall()
        return {cid: eps for cid, eps in rows}

    def spent(self, user_id: UserId | None = None) -> float:
        """Total epsilon ``user_id`` has spent on this device (known amounts only; see
        :meth:`ledger` for reports of unknown amount)."""
        return math.fsum(e for e in self.ledger(user_id).values() if e is not None)

    def _charge(
        self,
        conn: sqlite3.Connection,
        collection_id: str,
        keys: Sequence[bytes],
        epsilon: float,
        budget: PrivacyBudget,
        who: Sequence[UserId | None],
    ) -> None:
        """Raise :class:`BudgetExceeded` unless every user (ledger ``keys``) can spend
        ``epsilon`` more in ``collection_id``; otherwise record it (same transaction as
        the reports)."""
        if not isinstance(budget, PrivacyBudget):
            raise DeviceError(f"budget ({type(budget).__name__}) must be a PrivacyBudget")
        if _over(epsilon, budget.per_collection):
            raise BudgetExceeded(
                f"epsilon ({epsilon!r}) of collection {collection_id!r} must be <= the "
                f"per-collection cap ({budget.per_collection!r}); no report was made"
            )
        here: dict[bytes, float] = {}
        total: dict[bytes, float] = {}
        unique = list(dict.fromkeys(keys))
        for lo in range(0, len(unique), _IN_CHUNK):
            chunk = unique[lo : lo + _IN_CHUNK]
            marks = ",".join("?" * len(chunk))
            for key, cid, eps in conn.execute(
                "SELECT ledger_key, collection_id, epsilon FROM ledger "
                f"WHERE ledger_key IN ({marks})",
                chunk,
            ):
                cost = budget.per_collection if eps is None else float(eps)
                total[key] = total.get(key, 0.0) + cost
                if cid == collection_id:
                    here[key] = cost
        for key, user in zip(keys, who):
            name = "the device's user" if user is None else f"user {_short(user)}"
            if _over(here.get(key, 0.0) + epsilon, budget.per_collection):
                raise BudgetExceeded(
                    f"{name} has spent {here[key]!r} in collection {collection_id!r}: "
                    f"{epsilon!r} more would pass the per-collection cap "
                    f"({budget.per_collection!r}); no report was made"
                )
            if _over(total.get(key, 0.0) + epsilon, budget.total):
                raise BudgetExceeded(
                    f"{name} has spent {total.get(key, 0.0)!r} of the total budget "
                    f"({budget.total!r}): collection {collection_id!r} needs {epsilon!r} "
                    "more; no report was made"
                )
        conn.executemany(
            "INSERT INTO ledger (ledger_key, collection_id, epsilon) VALUES (?, ?, ?) "
            "ON CONFLICT (ledger_key, collection_id) DO UPDATE SET epsilon = epsilon + "
            "excluded.epsilon",
            [(key, collection_id, epsilon) for key in unique],
        )

    @staticmethod
    def _attribute(conn: sqlite3.Connection, collection_id: str, keys: Sequence[bytes]) -> None:
        """Users seen with a stored report but no ledger row (made under format 1):
        charge them an unknown amount in this collection."""
        conn.executemany(
            "INSERT OR IGNORE INTO ledger (ledger_key, collection_id, epsilon) VALUES (?, ?, NULL)",
            [(key, collection_id) for key in dict.fromkeys(keys)],
        )

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
        budget: PrivacyBudget = DEFAULT_BUDGET,
    ) -> tuple[bytes, Report]:
        """``(pseudonym, report)`` of ``user_id`` in a collection.

        The first call checks the user's ledger against ``budget``
        (:class:`~.errors.BudgetExceeded`, nothing made, if the plan's epsilon does not
        fit), makes the report (:func:`make_report`, OS entropy) and commits it with
        its ledger entry before returning; every later call (also after a restart)
        returns that report unchanged, spends nothing, draws no randomness and ignores
        ``record`` and ``plan``: a user reports once per collection, also when the
        collection has moved on to another phase's plan (the report keeps the digest
        it was made under, which the server still accepts, unless that phase was a
        pilot that failed its check: then the server refuses the report, and it is
        not made again under the new plan).

        ``user_id=None`` is the device's own user. The pseudonym
        (``pseudonym(collection_id, user_id)``) is the id that picks the view, also
        for a named ``user_id``: uniform over users, public anyway (the server sees
        both), and what a collection with admission tickets checks, so a ticket holder
        cannot choose a view. (Reports memoised before this rule, assigned by the
        ``user_id``, are returned unchanged; only a collection with admission refuses
        them.)
        """
        cid = _check_collection_id(collection_id)
        plan = _check_plan(plan)
        secret = self._secret_or_raise()
        pseudonym = self._pseudonym(secret, _PREFIX + cid, user_id)
        key = self._pseudonym(secret, _LEDGER_PREFIX, user_id)
        with self._transaction() as conn:
            row = conn.execute(
                "SELECT plan_digest, view, payload, report_id FROM reports "
                "WHERE collection_id = ? AND pseudonym = ?",
                (collection_id, pseudonym),
            ).fetchone()
            if row is not None:  # also when made under an earlier phase's plan
                self._attribute(conn, collection_id, [key])
                return pseudonym, self._stored(row)
            self._charge(conn, collection_id, [key], plan.epsilon, budget, [user_id])
            report = make_report(plan, record, pseudonym)
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
        budget: PrivacyBudget = DEFAULT_BUDGET,
    ) -> list[tuple[bytes, Report]]:
        """``(pseudonym, report)`` of many users, in input order, in one transaction.

        ``codes_or_records`` is either codes (n, d) (any integer array-like) or a
        sequence of n records given as ``{name: label}`` mappings (a sequence of label
        sequences would be ambiguous with codes, so it is read as codes). Users with a
        stored report get it back unchanged; the others get new reports made
        vectorised per view (:func:`make_reports`, OS entropy), all committed with
        their ledger entries before returning. If any new user's ledger cannot take
        the plan's epsilon under ``budget``, nothing is made or stored
        (:class:`~.errors.BudgetExceeded` names the first such user). A user id given
        twice gets one report (made from its first record). A stored report made under
        another (earlier phase's) plan is returned as it is.
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
            if found:
                seen = [i for i, p in enumerate(pseudonyms) if p in found]
                self._attribute(
                    conn,
                    collection_id,
                    [self._pseudonym(secret, _LEDGER_PREFIX, ids[i]) for i in seen],
                )
            if first:
                new_rows = np.fromiter(first.values(), dtype=np.int64, count=len(first))
                new_users = [ids[i] for i in new_rows.tolist()]
                keys = [self._pseudonym(secret, _LEDGER_PREFIX, u) for u in new_users]
                self._charge(conn, collection_id, keys, plan.epsilon, budget, new_users)
                new_keys = np.frombuffer(
                    b"".join(pseudonyms[i] for i in new_rows.tolist()), dtype=np.uint8
                ).reshape(-1, PSEUDONYM_BYTES)  # the views are the pseudonyms' (see report_for)
                made: list[tuple[bytes, str, int, int | bytes, bytes]] = []
                for batch in make_reports(plan, codes[new_rows], new_keys, self._bulk_source()):
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
        later report for it spends privacy again). The ledger keeps what was spent: a
        new report there is charged on top, within the per-collection cap."""
        _check_collection_id(collection_id)
        with self._transaction() as conn:
            conn.execute("DELETE FROM reports WHERE collection_id = ?", (collection_id,))


def _short(value: object, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
