"""An in-memory hash table of 16-byte keys, each with a 16-byte value, in numpy arrays.

Storage uses it to deduplicate reports (report id -> pseudonym, and the set of
pseudonyms) at a cost per batch that does not grow with the number of stored reports:
open addressing with linear probing at load <= 0.7, every lookup and insert vectorised
over the batch (each pass reads 8 slots of every key's probe sequence; one or two
passes settle a batch). Keys are chosen by
clients, so slots come from a keyed mix of the key with a per-table random salt: a
client cannot aim keys at one run of slots.
"""

from __future__ import annotations

import os

import numpy as np

__all__ = ["KeyTable", "as_words"]

_MIX1 = np.uint64(0xBF58476D1CE4E5B9)  # splitmix64's finaliser constants
_MIX2 = np.uint64(0x94D049BB133111EB)
_MIN_SLOTS = 1024
MAX_LOAD = 0.7  # linear probing: about 6 probes per miss at 0.7, 1.6 at 0.35
WINDOW = 8  # slots of a probe sequence read at once
_STEPS = np.arange(WINDOW, dtype=np.intp)


def as_words(keys: np.ndarray) -> np.ndarray:
    """(n, 16) uint8 keys -> (n, 2) uint64 words (a copy in native order)."""
    keys = np.ascontiguousarray(keys, dtype=np.uint8)
    if keys.ndim != 2 or keys.shape[1] != 16:
        raise ValueError(f"keys (shape {keys.shape}) must have shape (n, 16)")
    return keys.view(np.uint64).reshape(-1, 2).copy()


class KeyTable:
    """16-byte keys -> 16-byte values; keys and values as (n, 2) uint64 words
    (:func:`as_words`). ``values=False``: a set of keys (values are (n, 0) arrays)."""

    def __init__(self, capacity: int = 0, values: bool = True) -> None:
        salt = np.frombuffer(os.urandom(16), dtype=np.uint64)
        self._salt = (salt[0], salt[1])
        self._size = 0
        self._width = 2 if values else 0
        self._alloc(_slots_for(capacity))

    def __len__(self) -> int:
        return self._size

    def _alloc(self, slots: int) -> None:
        self._used = np.zeros(slots, dtype=bool)
        self._keys = np.zeros((slots, 2), dtype=np.uint64)
        self._values = np.zeros((slots, self._width), dtype=np.uint64)
        self._mask = np.uint64(slots - 1)
        self._slot_mask = slots - 1

    def export(self) -> dict[str, np.ndarray]:
        """The table's state as arrays (copies): ``salt`` (2,) uint64, ``used`` the
        slots in use as packed bits, and their ``keys`` and ``values`` in slot order.
        :meth:`restore` rebuilds the same table without hashing or probing."""
        return {
            "salt": np.array(self._salt, dtype=np.uint64),
            "used": np.packbits(self._used),
            "keys": self._keys[self._used],
            "values": self._values[self._used],
        }

    @classmethod
    def restore(
        cls, salt: np.ndarray, used: np.ndarray, keys: np.ndarray, values: np.ndarray
    ) -> KeyTable:
        """The table :meth:`export` gave these arrays (``keys``, ``values``: (n, 2) and
        (n, 2 or 0) uint64 words; ``used``: packed bits of a power-of-two slot count);
        ``ValueError`` if they do not fit together."""
        slots = 8 * used.size
        if slots < _MIN_SLOTS or slots & (slots - 1) or salt.shape != (2,):
            raise ValueError(f"slots ({slots}) must be a power of two >= {_MIN_SLOTS}")
        table = cls.__new__(cls)
        table._salt = (np.uint64(salt[0]), np.uint64(salt[1]))
        table._width = values.shape[1] if values.ndim == 2 else -1
        if table._width not in (0, 2) or keys.ndim != 2 or keys.shape[1] != 2:
            raise ValueError(
                f"keys and values (shapes {keys.shape}, {values.shape}) must be "
                "(n, 2) and (n, 2 or 0)"
            )
        table._alloc(slots)
        table._used[:] = np.unpackbits(used).view(bool)
        where = np.flatnonzero(table._used)
        if where.size != keys.shape[0] or where.size != values.shape[0]:
            raise ValueError(
                f"slots in use ({where.size}) must match the keys "
                f"({keys.shape[0]}) and values ({values.shape[0]})"
            )
        if where.size > MAX_LOAD * slots:
            raise ValueError(f"keys ({where.size}) must fill at most {MAX_LOAD} of the slots")
        table._keys[where] = keys
        table._values[where] = values
        table._size = int(where.size)
        return table

    def _home(self, keys: np.ndarray) -> np.ndarray:
        """Each key's first slot: a salted splitmix64 finaliser of its two words."""
        with np.errstate(over="ignore"):
            h = (keys[:, 0] ^ self._salt[0]) + (keys[:, 1] ^ self._salt[1]) * _MIX2
            h ^= h >> np.uint64(30)
            h *= _MIX1
            h ^= h >> np.uint64(27)
            h *= _MIX2
            h ^= h >> np.uint64(31)
        slots: np.ndarray = h & self._mask
        return slots

    def lookup(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(found (n,) bool, values (n, 2) uint64: zeros where not found; (n, 0) for a
        set).

        Each key's probe sequence is read :data:`WINDOW` slots at a time: the key is
        found if it is in the window; absent if the window has an empty slot (no key is
        ever removed, so a key lies before the first empty slot of its sequence); else
        the next window. One round settles nearly every key."""
        n = keys.shape[0]
        found = np.zeros(n, dtype=bool)
        values = np.zeros((n, self._width), dtype=np.uint64)
        start = self._home(keys).astype(np.intp)
        words = self._keys.reshape(-1)  # slot i's key words at 2i and 2i + 1
        first, second = keys[:, 0], keys[:, 1]
        pending = np.arange(n)
        while pending.size:
            s = (start[pending, None] + _STEPS) & self._slot_mask  # (p, WINDOW)
            used = self._used.take(s)
            hit = (
                used
                & (words.take(2 * s) == first[pending, None])
                & (words.take(2 * s + 1) == second[pending, None])
            )
            any_hit = hit.any(axis=1)
            rows = np.flatnonzero(any_hit)
            if rows.size:
                found[pending[rows]] = True
                values[pending[rows]] = self._values[s[rows, hit[rows].argmax(axis=1)]]
            pending = pending[used.all(axis=1) & ~any_hit]  # a full window: the next one
            start[pending] += WINDOW
        return found, values

    def insert(self, keys: np.ndarray, values: np.ndarray | None = None) -> None:
        """Add keys that are absent and distinct (the caller checked with
        :meth:`lookup`), growing the table (at least doubling it) to keep its load
        <= :data:`MAX_LOAD`. ``values``: (n, 2) words (None for a set)."""
        if keys.shape[0] == 0:
            return
        if values is None:
            values = np.zeros((keys.shape[0], self._width), dtype=np.uint64)
        if self._size + keys.shape[0] > MAX_LOAD * self._used.size:
            old = self._used
            old_keys, old_values = self._keys[old], self._values[old]
            self._alloc(_slots_for(self._size + keys.shape[0]))
            self._size = 0
            self._place_empty(old_keys, old_values)
        if self._size == 0:
            self._place_empty(keys, values)
        else:
            self._place(keys, values)

    def _place_empty(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Fill an empty table in one pass: with keys sorted by first slot, linear
        probing puts key i at ``max(home_i, slot_{i-1} + 1)`` = ``i + max_{j<=i}(home_j -
        j)``; the few that would run past the end wrap around through :meth:`_place`."""
        if keys.shape[0] == 0:
            return
        home = self._home(keys).astype(np.int64)
        order = np.argsort(home, kind="stable")
        rank = np.arange(order.size, dtype=np.int64)
        slot = rank + np.maximum.accumulate(home[order] - rank)
        fits = slot < self._used.size
        placed = order[fits]
        self._used[slot[fits]] = True
        self._keys[slot[fits]] = keys[placed]
        self._values[slot[fits]] = values[placed]
        self._size += placed.size
        rest = order[~fits]
        if rest.size:
            self._place(keys[rest], values[rest])

    def _place(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Put each key in the first empty slot of its probe sequence, read
        :data:`WINDOW` slots at a time; of keys aiming at one slot the first takes it
        and the others look again."""
        start = self._home(keys).astype(np.intp)
        placed = np.zeros(keys.shape[0], dtype=bool)
        pending = np.arange(keys.shape[0])
        while pending.size:
            s = (start[pending, None] + _STEPS) & self._slot_mask
            free = ~self._used.take(s)
            has = free.any(axis=1)
            rows = np.flatnonzero(has)
            target = s[rows, free[rows].argmax(axis=1)]
            taken, first = np.unique(target, return_index=True)
            winners = pending[rows[first]]
            self._used[taken] = True
            self._keys[taken] = keys[winners]
            self._values[taken] = values[winners]
            placed[winners] = True
            start[pending[~has]] += WINDOW  # no empty slot in the window: the next one
            pending = pending[~placed[pending]]
        self._size += keys.shape[0]


def _slots_for(count: int) -> int:
    """The smallest power of two that holds ``count`` keys at load <= MAX_LOAD (and
    >= the minimum)."""
    return max(_MIN_SLOTS, 1 << int(np.ceil(np.log2(max(count / MAX_LOAD, 1)))))
