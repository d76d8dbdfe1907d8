"""Snapshots of a collection's key tables (:mod:`.keyset`), so that a restart loads
them instead of rebuilding them from the whole batch log.

One file per open collection, written whole to a temporary file, flushed to disk and
renamed over the previous one (a crash leaves the old snapshot or the new one, never a
mix). Layout (little-endian):

- a 192-byte header: magic ``CALMKEYS``, format version, the number of tables; ``seq``,
  the last batch-log row the tables include, the reports they hold, and an xxh3-64 of
  that row's report ids (so a snapshot is only used with the log it was taken from);
  an xxh3-64 of the collection id; per table its slot bits' length, key count, value
  width and hash salt; an xxh3-64 of the payload;
- the payload: per table, its slots in use as packed bits, then their keys and values
  in slot order (:meth:`.keyset.KeyTable.export`).

:func:`read_snapshot` checks all of it and raises :class:`SnapshotError` saying what is
wrong; the caller then rebuilds from the log. What the snapshot says about the log
(``seq``, ``reports``, ``ids_hash``) the caller checks against the log.
"""

from __future__ import annotations

import contextlib
import os
import struct
import tempfile
import threading
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import xxhash

from .keyset import KeyTable

__all__ = [
    "SNAPSHOT_FIRST",
    "Snapshot",
    "SnapshotError",
    "SnapshotSchedule",
    "ids_hash",
    "read_snapshot",
    "write_snapshot",
]

MAGIC = b"CALMKEYS"
VERSION = 1
_TABLES = 2
_TABLE = struct.Struct("<5Q")  # used bytes, keys, value words, salt 0, salt 1
_HEAD = struct.Struct("<8sII4Q")  # magic, version, tables, seq, reports, ids hash, id hash
HEADER_BYTES = 192
# Reports a collection holds before its first snapshot during ingest (then one each
# time the tables double, so all snapshots together write about twice the last one).
SNAPSHOT_FIRST = 1_000_000
_PAD = HEADER_BYTES - _HEAD.size - _TABLES * _TABLE.size - 8
assert _PAD >= 0


class SnapshotError(ValueError):
    """A snapshot that cannot be used (missing, truncated, corrupt, of another
    collection or format); the message says which."""


@dataclass(frozen=True)
class Snapshot:
    """Key tables (``by_id``, ``by_pseudonym``) as of batch-log row ``seq``, holding
    ``reports`` reports; ``ids_hash``: :func:`ids_hash` of that row's report ids."""

    seq: int
    reports: int
    ids_hash: int
    by_id: KeyTable
    by_pseudonym: KeyTable


def ids_hash(report_ids: bytes) -> int:
    """The xxh3-64 of a batch-log row's report-id blob."""
    return int(xxhash.xxh3_64_intdigest(report_ids))


def _id_hash(collection_id: str) -> int:
    return int(xxhash.xxh3_64_intdigest(collection_id.encode("utf-8")))


def write_snapshot(
    path: str,
    collection_id: str,
    seq: int,
    reports: int,
    ids: int,
    tables: list[dict[str, np.ndarray]],
) -> int:
    """Write ``tables`` (:meth:`.keyset.KeyTable.export` of ``by_id`` and
    ``by_pseudonym``) to ``path`` atomically (mode 0600); the bytes written."""
    parts = []
    meta = []
    for t in tables:
        values = np.ascontiguousarray(t["values"], dtype="<u8")
        parts += [
            np.ascontiguousarray(t["used"], np.uint8),
            np.ascontiguousarray(t["keys"], "<u8"),
            values,
        ]
        meta.append(
            _TABLE.pack(
                t["used"].size,
                t["keys"].shape[0],
                values.shape[1],
                int(t["salt"][0]),
                int(t["salt"][1]),
            )
        )
    digest = xxhash.xxh3_64()
    for part in parts:
        digest.update(part.data)
    header = (
        _HEAD.pack(MAGIC, VERSION, len(tables), seq, reports, ids, _id_hash(collection_id))
        + b"".join(meta)
        + struct.pack("<Q", digest.intdigest())
        + bytes(_PAD)
    )
    folder = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".snap")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(header)
            for part in parts:
                f.write(part.data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return len(header) + sum(part.nbytes for part in parts)


def read_snapshot(path: str, collection_id: str) -> Snapshot:
    """The snapshot at ``path``, every length and checksum checked; raises
    :class:`SnapshotError`."""
    try:
        raw = np.fromfile(path, dtype=np.uint8)
    except FileNotFoundError:
        raise SnapshotError("no snapshot") from None
    except OSError as exc:
        raise SnapshotError(f"unreadable: {exc.strerror}") from None
    if raw.size < HEADER_BYTES:
        raise SnapshotError(f"truncated ({raw.size} bytes)")
    head = raw[:HEADER_BYTES].tobytes()
    magic, version, count, seq, reports, ids, id_hash = _HEAD.unpack_from(head)
    if magic != MAGIC or version != VERSION or count != _TABLES:
        raise SnapshotError(f"not a version {VERSION} snapshot")
    if id_hash != _id_hash(collection_id):
        raise SnapshotError("of another collection")
    metas = [_TABLE.unpack_from(head, _HEAD.size + i * _TABLE.size) for i in range(_TABLES)]
    (payload_hash,) = struct.unpack_from("<Q", head, _HEAD.size + _TABLES * _TABLE.size)
    sizes = [(u, 16 * k, 8 * w * k) for u, k, w, _, _ in metas]
    if raw.size != HEADER_BYTES + sum(sum(s) for s in sizes):
        raise SnapshotError(f"truncated or padded ({raw.size} bytes)")
    payload = raw[HEADER_BYTES:]
    if xxhash.xxh3_64_intdigest(payload.data) != payload_hash:
        raise SnapshotError("checksum mismatch")
    tables = []
    at = 0
    for (_, keys, width, salt0, salt1), (a, b, c) in zip(metas, sizes):
        used = payload[at : at + a]
        key_words = payload[at + a : at + a + b].view("<u8").reshape(keys, 2)
        values = payload[at + a + b : at + a + b + c].view("<u8").reshape(keys, width)
        at += a + b + c
        try:
            tables.append(
                KeyTable.restore(np.array([salt0, salt1], np.uint64), used, key_words, values)
            )
        except ValueError as exc:
            raise SnapshotError(f"inconsistent: {exc}") from None
    if len(tables[0]) != reports or len(tables[1]) != reports:
        raise SnapshotError(
            f"tables ({len(tables[0])}, {len(tables[1])} keys) must hold {reports} reports"
        )
    return Snapshot(seq, reports, ids, tables[0], tables[1])


class _Tables(Protocol):
    """A collection's key tables as a store keeps them."""

    by_id: KeyTable
    snapshot_reports: int


class SnapshotSchedule:
    """Where a store's key snapshots live and when the next is due, shared by both
    storage backends. The store sets ``_snapshots`` (a folder, or None: no snapshots)
    and ``_snapshotter`` (None), and implements ``_snapshot(collection_id)``."""

    _snapshots: str | None
    _snapshotter: threading.Thread | None
    snapshot_bytes: int  # key snapshots written by this process

    def _snapshot(self, collection_id: str) -> None:
        raise NotImplementedError

    def _snapshot_path(self, collection_id: str) -> str | None:
        """Where a collection's key snapshot lives (None: no snapshots)."""
        if self._snapshots is None:
            return None
        return os.path.join(self._snapshots, collection_id.encode("utf-8").hex() + ".snap")

    def _write_snapshot(
        self,
        path: str,
        collection_id: str,
        seq: int,
        reports: int,
        hashed: int,
        tables: list[dict[str, np.ndarray]],
    ) -> None:
        """:func:`write_snapshot` into the snapshot folder (made if missing), counted."""
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        self.snapshot_bytes += write_snapshot(path, collection_id, seq, reports, hashed, tables)

    def _drop_snapshot(self, collection_id: str) -> None:
        """Remove a collection's snapshot, if any (a closed collection takes no reports)."""
        path = self._snapshot_path(collection_id)
        if path is not None:
            with contextlib.suppress(OSError):
                os.unlink(path)

    def _snapshot_due(self, tables: _Tables) -> bool:
        """Past :data:`SNAPSHOT_FIRST` reports, then each time the tables double."""
        stored = len(tables.by_id)
        return (
            self._snapshots is not None
            and stored >= SNAPSHOT_FIRST
            and stored >= 2 * tables.snapshot_reports
        )

    def _snapshot_later(self, collection_id: str) -> None:
        """Start writing a snapshot in the background, unless one is being written."""
        if self._snapshotter is not None and self._snapshotter.is_alive():
            return
        self._snapshotter = threading.Thread(
            target=self._snapshot, args=(collection_id,), name="calmkit-snapshot", daemon=True
        )
        self._snapshotter.start()
