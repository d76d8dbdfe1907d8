"""Storage faults as status codes an app can act on.

A full disk is :class:`~calmkit_client.errors.StorageFull` (RESOURCE_EXHAUSTED) and a
lost database (a locked or vanished SQLite file, a PostgreSQL server that refused or
dropped the connection) is :class:`~calmkit_client.errors.ServiceUnavailable`
(UNAVAILABLE); the client retries both. Their messages are plain: no exception class,
no connection string, host, user or database name. The details go to the server's log
only, with any password in them masked.
"""

from __future__ import annotations

import errno
import re
import sqlite3

from calmkit_client.errors import CollectionError, ServiceUnavailable, StorageFull

__all__ = ["FULL_MESSAGE", "LOST_MESSAGE", "as_fault", "fault_detail", "mask_secrets"]

FULL_MESSAGE = "the server's storage is full; the batch was not stored: retry later"
LOST_MESSAGE = "the server's database is unavailable; nothing was stored: retry later"

_SQLITE_FULL = ("database or disk is full",)
_SQLITE_LOST = ("database is locked", "unable to open database", "disk i/o error", "readonly")
_PASSWORD = re.compile(r"(password\s*=\s*)('[^']*'|\S+)|(://[^:/@\s]*:)[^@\s]*@", re.IGNORECASE)


def mask_secrets(text: str) -> str:
    """``text`` with any ``password=...`` value and URL password replaced by ``***``."""
    return _PASSWORD.sub(lambda m: f"{m[1]}***" if m[1] else f"{m[3]}***@", text)


def _is_psycopg_operational(exc: BaseException) -> bool:
    """A psycopg OperationalError (connection refused, terminated, server shut down),
    recognised without importing psycopg (it is optional)."""
    return any(
        cls.__name__ == "OperationalError" and cls.__module__.startswith("psycopg")
        for cls in type(exc).__mro__
    )


def as_fault(exc: BaseException) -> CollectionError | None:
    """The client-facing error for a storage fault, or None when ``exc`` is not one
    (the caller logs :func:`fault_detail` with it)."""
    text = str(exc).lower()
    if isinstance(exc, sqlite3.OperationalError):
        if any(s in text for s in _SQLITE_FULL):
            return StorageFull(FULL_MESSAGE)
        if any(s in text for s in _SQLITE_LOST):
            return ServiceUnavailable(LOST_MESSAGE)
    elif isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return StorageFull(FULL_MESSAGE)
    elif _is_psycopg_operational(exc):
        return ServiceUnavailable(LOST_MESSAGE)
    return None


def fault_detail(exc: BaseException) -> str:
    """What the server logs of a fault: its class and message, passwords masked."""
    return mask_secrets(f"{type(exc).__name__}: {exc}")
