"""Backups of the SQLite store: an online copy while ``calmkit serve`` runs, and the
restore that checks it before putting it in place.

:func:`backup` copies the database with SQLite's online backup API
(``sqlite3.Connection.backup``) in one step, inside one read transaction of the
source: the copy is the database as of one commit, every batch acknowledged before
the backup began included (a batch is committed before its acknowledgement), no batch
half there. In WAL mode a reader does not block the writer, so ingest goes on
meanwhile; the committed batches still in the ``-wal`` file are part of the copy,
which a plain file copy of the main file would miss. The copy is checked
(``PRAGMA quick_check``, the calmkit schema) and written beside ``OUT`` under a
temporary name, then renamed: an interrupted backup leaves no partial ``OUT``.

:func:`restore` checks a backup (a SQLite file with calmkit's tables and a schema
version this build opens, integrity), refuses to replace an existing database unless
``force`` is given (then removes the database's ``-wal``/``-shm`` files and its key
snapshot cache ``FILE-keys/`` too, which belong to the replaced database), copies it
into place the same way and opens it with :class:`~.storage.Storage`, which migrates
an older layout as a server start would.

The key snapshot folder ``FILE-keys/`` is a cache (rebuilt from the batch log) and is
not backed up. PostgreSQL stores are backed up with ``pg_dump`` (see the operator's
guide).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from calmkit_client import CalmkitError

from .storage import SCHEMA_VERSION, Storage

__all__ = ["BackupInfo", "backup", "check_backup", "restore"]

_MAGIC = b"SQLite format 3\x00"
_TABLES = {"collections", "batches", "support"}


@dataclass(frozen=True)
class BackupInfo:
    """What a backup holds: its file, schema version, size in bytes, and per
    collection the reports in its batch log (acknowledged and stored before the copy
    began)."""

    path: str
    schema_version: int
    size: int
    reports: dict[str, int]

    def describe(self) -> str:
        total = sum(self.reports.values())
        return (
            f"{self.path}: schema version {self.schema_version}, {self.size:,} bytes, "
            f"{len(self.reports)} collection(s), {total:,} reports"
        )


def _inspect(conn: sqlite3.Connection, what: str, path: str) -> BackupInfo:
    """The calmkit store behind ``conn`` (its checks named after ``what``)."""
    try:
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.DatabaseError as exc:
        raise CalmkitError(f"{what} ({path!r}) is not a SQLite database: {exc}") from None
    if not _TABLES <= tables or version < 1:
        raise CalmkitError(
            f"{what} ({path!r}) is not a calmkit database (no {sorted(_TABLES - tables)} "
            f"tables, schema version {version})"
        )
    if version > SCHEMA_VERSION:
        raise CalmkitError(
            f"{what} ({path!r}) has schema version {version}; this calmkit opens 1 to "
            f"{SCHEMA_VERSION}: restore it with the calmkit that wrote it, or a newer one"
        )
    check = conn.execute("PRAGMA quick_check").fetchone()[0]
    if check != "ok":
        raise CalmkitError(f"{what} ({path!r}) fails SQLite's integrity check: {check}")
    count = "count" if version >= 3 else "1"  # versions 1-2 stored one row per report
    table = "batches" if version >= 3 else "reports"
    reports = dict(
        conn.execute(f"SELECT collection_id, SUM({count}) FROM {table} GROUP BY collection_id")
    )
    for (cid,) in conn.execute("SELECT id FROM collections"):
        reports.setdefault(cid, 0)
    return BackupInfo(path, version, os.path.getsize(path), {k: int(v) for k, v in reports.items()})


def check_backup(path: str | os.PathLike[str]) -> BackupInfo:
    """Check that ``path`` is a calmkit SQLite database this build can open (schema
    version 1..:data:`~.storage.SCHEMA_VERSION`, SQLite's quick check passes); raises
    :class:`CalmkitError` naming what is wrong."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            head = f.read(len(_MAGIC))
    except OSError as exc:
        raise CalmkitError(f"backup ({path!r}) must be readable: {exc.strerror}") from None
    if head != _MAGIC:
        raise CalmkitError(f"backup ({path!r}) is not a SQLite database (header {head[:16]!r})")
    conn = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True)
    try:
        return _inspect(conn, "backup", path)
    finally:
        conn.close()


def _copy(source: sqlite3.Connection, out: str) -> None:
    """``source``'s database into a new file ``out`` (mode 0600) with the online backup
    API in one step (one read transaction: one commit's state), as one file (rollback
    journal mode: no ``-wal`` beside it); a failure leaves no ``out``."""
    tmp = f"{out}.partial-{os.getpid()}"
    _remove_files([tmp])
    os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    try:
        dest = sqlite3.connect(tmp, isolation_level=None)
        try:
            source.backup(dest)  # pages=-1: every page in one step
            dest.execute("PRAGMA journal_mode=DELETE")
        finally:
            dest.close()
        os.replace(tmp, out)
    except BaseException:
        _remove_files([tmp, tmp + "-journal", tmp + "-wal", tmp + "-shm"])
        raise


def _remove_files(paths: list[str]) -> None:
    for path in paths:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def backup(db: str | os.PathLike[str], out: str | os.PathLike[str]) -> BackupInfo:
    """Copy the calmkit SQLite database ``db`` to the new file ``out`` (refused if it
    exists), consistently while a server writes to ``db``; returns what the copy
    holds, checked."""
    db, out = os.fspath(db), os.fspath(out)
    if not os.path.isfile(db):
        raise CalmkitError(f"db ({db!r}) must be an existing calmkit SQLite database file")
    if os.path.lexists(out):
        raise CalmkitError(
            f"out ({out!r}) exists: give a new file name (a backup never overwrites)"
        )
    if os.path.abspath(out) == os.path.abspath(db):
        raise CalmkitError(f"out ({out!r}) must not be the database itself")
    # not read-only: a read-only connection could not recover a WAL left by a crash
    source = sqlite3.connect(db, isolation_level=None)
    try:
        source.execute("PRAGMA busy_timeout=10000")
        _inspect_header(source, db)
        _copy(source, out)
    except sqlite3.Error as exc:
        raise CalmkitError(f"db ({db!r}) could not be backed up: {exc}") from None
    finally:
        source.close()
    try:
        return check_backup(out)
    except CalmkitError:
        _remove_files([out])
        raise


def _inspect_header(conn: sqlite3.Connection, db: str) -> None:
    """Refuse a ``db`` that is not a calmkit store before copying it."""
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.DatabaseError as exc:
        raise CalmkitError(f"db ({db!r}) is not a SQLite database: {exc}") from None
    if not _TABLES <= tables:
        raise CalmkitError(f"db ({db!r}) is not a calmkit database")


def restore(
    backup_file: str | os.PathLike[str], db: str | os.PathLike[str], force: bool = False
) -> BackupInfo:
    """Put the backup ``backup_file`` in place as the database ``db`` (checked first);
    an existing ``db`` is refused unless ``force`` (stop its server first). The
    restored file is opened with :class:`~.storage.Storage` (an older layout is
    migrated) before this returns; returns what it holds."""
    backup_file, db = os.fspath(backup_file), os.fspath(db)
    check_backup(backup_file)
    if os.path.abspath(backup_file) == os.path.abspath(db):
        raise CalmkitError(f"db ({db!r}) must not be the backup itself")
    sidecars = [db + "-wal", db + "-shm", db + "-journal", db + "-keys"]
    present = [p for p in (db, *sidecars) if os.path.lexists(p)]
    if present and not force:
        raise CalmkitError(
            f"db ({db!r}) exists ({', '.join(present)}): restore refuses to replace a "
            "database; stop its server and pass --force to replace it"
        )
    source = sqlite3.connect(f"{Path(backup_file).resolve().as_uri()}?mode=ro", uri=True)
    try:
        tmp_db = f"{db}.restoring-{os.getpid()}"
        _copy(source, tmp_db)
    finally:
        source.close()
    _remove_files(present)  # the replaced database's files, its WAL and key cache
    os.replace(tmp_db, db)
    Storage(db).close()  # opens (and migrates) as the server will
    return check_backup(db)
