"""Assignment of users to views (a step the CALM paper leaves open: Zhang et al., "CALM:
Consistent Adaptive Local Marginal for Marginal Release under Local Differential
Privacy", CCS 2018, §4.2).

A user's view is a public, deterministic function of a pseudonymous id and the plan's
hash seed: ``h = xxh64(id, seed)`` placed on the cumulative view shares scaled to
``[0, 2**64)``. Nothing private enters it.

User ids are encoded to bytes as: int in [0, 2**64) -> 8 bytes little-endian;
str -> UTF-8; bytes as is. Integer ids hash vectorised (:func:`xxh64_u64`, the xxh64
algorithm specialised to one 8-byte lane, checked against the ``xxhash`` package in
the tests); 16-byte keys (pseudonyms) likewise (:func:`xxh64_u128`, two lanes); other ids go
through ``xxhash`` one by one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt
import xxhash

from .errors import PlanError
from .validation import is_int

__all__ = [
    "UserId",
    "encode_user_id",
    "hash_user_id",
    "hash_user_ids",
    "share_bounds",
    "views_of_hashes",
    "xxh64_u64",
    "xxh64_u128",
]

UserId = int | str | bytes

_P1 = np.uint64(0x9E3779B185EBCA87)
_P2 = np.uint64(0xC2B2AE3D27D4EB4F)
_P3 = np.uint64(0x165667B19E3779F9)
_P4 = np.uint64(0x85EBCA77C2B2AE63)
_P5 = np.uint64(0x27D4EB2F165667C5)
_U64_MAX = (1 << 64) - 1


def encode_user_id(user_id: UserId) -> bytes:
    """Canonical bytes of a user id (see module docstring)."""
    if isinstance(user_id, (bytes, bytearray)):
        return bytes(user_id)
    if isinstance(user_id, str):
        return user_id.encode("utf-8")
    if is_int(user_id):
        if 0 <= int(user_id) <= _U64_MAX:
            return int(user_id).to_bytes(8, "little")
    raise PlanError(f"user_id ({user_id!r}) must be an int in [0, 2**64), a str, or bytes")


def _check_seed(seed: int) -> int:
    if not is_int(seed) or not 0 <= int(seed) <= _U64_MAX:
        raise PlanError(f"seed ({seed!r}) must be an int in [0, 2**64)")
    return int(seed)


def hash_user_id(user_id: UserId, seed: int) -> int:
    """``xxh64(encode_user_id(user_id), seed)`` as an int in [0, 2**64)."""
    return int(xxhash.xxh64_intdigest(encode_user_id(user_id), seed=_check_seed(seed)))


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


def xxh64_u64(ids: npt.ArrayLike, seed: int) -> np.ndarray:
    """xxh64 of each id's 8 little-endian bytes, vectorised: uint64 (n,) -> uint64 (n,).

    The xxh64 algorithm for an input of exactly one 8-byte lane (len < 32 path, one
    lane round, avalanche).
    """
    lane = np.asarray(ids).astype(np.uint64, copy=False)
    with np.errstate(over="ignore"):
        h = np.full(lane.shape, np.uint64(_check_seed(seed)), dtype=np.uint64) + _P5
        h = _lane_round(h + np.uint64(8), lane)
        return _avalanche(h)


def xxh64_u128(keys: npt.ArrayLike, seed: int) -> np.ndarray:
    """xxh64 of 16-byte keys, vectorised: (n, 16) uint8 -> uint64 (n,). Equals
    ``xxhash.xxh64_intdigest(key, seed)`` (checked in the tests) and so
    :func:`hash_user_id` of each key as bytes (a pseudonym).

    The xxh64 algorithm for an input of two 8-byte lanes (len < 32 path: two lane
    rounds, avalanche)."""
    raw = np.ascontiguousarray(keys, dtype=np.uint8)
    if raw.ndim != 2 or raw.shape[1] != 16:
        raise PlanError(f"keys (shape {raw.shape}) must have shape (n, 16)")
    lanes = raw.view("<u8").astype(np.uint64, copy=False)
    with np.errstate(over="ignore"):
        h = np.full(raw.shape[0], np.uint64(_check_seed(seed)), dtype=np.uint64) + _P5
        h = h + np.uint64(16)
        for j in range(2):
            h = _lane_round(h, lanes[:, j])
        return _avalanche(h)


def _lane_round(h: np.ndarray, lane: np.ndarray) -> np.ndarray:
    """xxh64's step for one 8-byte lane of a short input (uint64 arrays, wrapping)."""
    out: np.ndarray = _rotl(h ^ (_rotl(lane * _P2, 31) * _P1), 27) * _P1 + _P4
    return out


def _avalanche(h: np.ndarray) -> np.ndarray:
    """xxh64's final mix (uint64 arrays, wrapping)."""
    h = h ^ (h >> np.uint64(33))
    h = h * _P2
    h = h ^ (h >> np.uint64(29))
    h = h * _P3
    out: np.ndarray = h ^ (h >> np.uint64(32))
    return out


def hash_user_ids(user_ids: Sequence[UserId] | np.ndarray, seed: int) -> np.ndarray:
    """Hashes of many ids, uint64 (n,). A numpy integer array, or an (n, 16) uint8
    array of 16-byte ids (pseudonyms), is hashed vectorised; anything else id by id
    (same values: see :func:`encode_user_id`)."""
    if isinstance(user_ids, np.ndarray) and user_ids.dtype == np.uint8 and user_ids.ndim == 2:
        return xxh64_u128(user_ids, seed)
    if isinstance(user_ids, np.ndarray) and user_ids.dtype.kind in "iu" and user_ids.ndim == 1:
        if user_ids.size and user_ids.dtype.kind == "i" and user_ids.min() < 0:
            raise PlanError(f"user_id ({int(user_ids.min())}) must be an int in [0, 2**64)")
        return xxh64_u64(user_ids, seed)
    s = _check_seed(seed)
    ids: Iterable[UserId] = user_ids.tolist() if isinstance(user_ids, np.ndarray) else user_ids
    return np.fromiter(
        (xxhash.xxh64_intdigest(encode_user_id(u), seed=s) for u in ids), dtype=np.uint64
    )


def share_bounds(shares: Sequence[float]) -> np.ndarray:
    """Upper bounds (m-1,) uint64 of the hash ranges of views 0..m-2 (view m-1 takes
    the rest): ``floor(cumsum(shares)[j] * 2**64)``."""
    cum = np.cumsum(np.asarray(shares, dtype=np.float64))[:-1]
    return np.array([min(int(c * 2.0**64), _U64_MAX) for c in cum], dtype=np.uint64)


def views_of_hashes(hashes: npt.ArrayLike, bounds: np.ndarray) -> np.ndarray:
    """View index (n,) int64 of each hash given :func:`share_bounds`."""
    return np.searchsorted(bounds, np.asarray(hashes, dtype=np.uint64), side="right").astype(
        np.int64
    )
