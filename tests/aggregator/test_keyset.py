"""The dedupe hash table agrees with a Python dict through growth, in batches, and with
keys a client chose to collide in their first or last 8 bytes."""

from __future__ import annotations

import numpy as np

from calmkit_aggregator.keyset import KeyTable, as_words


def _agrees(table: KeyTable, reference: dict[bytes, bytes], queries: np.ndarray) -> None:
    found, values = table.lookup(as_words(queries))
    for q, f, v in zip(queries, found, values):
        key = q.tobytes()
        assert f == (key in reference)
        if f:
            assert v.tobytes() == reference[key]


def test_matches_a_dict_through_growth() -> None:
    rng = np.random.default_rng(0)
    table, reference = KeyTable(), {}
    for _ in range(30):  # 30 batches of 500: grows from 1024 slots past 2**15
        keys = rng.integers(0, 256, (500, 16), dtype=np.uint8)
        values = rng.integers(0, 256, (500, 16), dtype=np.uint8)
        found, _ = table.lookup(as_words(keys))
        assert not found.any()
        table.insert(as_words(keys), as_words(values))
        reference.update({k.tobytes(): v.tobytes() for k, v in zip(keys, values)})
        assert len(table) == len(reference)
    stored = np.frombuffer(b"".join(list(reference)[::37]), np.uint8).reshape(-1, 16)
    absent = rng.integers(0, 256, (400, 16), dtype=np.uint8)
    _agrees(table, reference, np.concatenate([stored, absent]))


def test_chosen_collisions_stay_exact() -> None:
    rng = np.random.default_rng(1)
    keys = rng.integers(0, 256, (3000, 16), dtype=np.uint8)
    keys[:1500, :8] = 7  # one shared first half
    keys[1500:, 8:] = 9  # one shared second half
    values = rng.integers(0, 256, (3000, 16), dtype=np.uint8)
    table = KeyTable()
    table.insert(as_words(keys[::2]), as_words(values[::2]))
    reference = {k.tobytes(): v.tobytes() for k, v in zip(keys[::2], values[::2])}
    _agrees(table, reference, keys)  # half present, half absent, all near-collisions
