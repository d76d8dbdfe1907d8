"""The dedupe hash table agrees with a Python dict through growth, in batches, and with
keys a client chose to collide in their first or last 8 bytes."""

from __future__ import annotations

import numpy as np
import pytest

from calmkit_aggregator.service.keyset import KeyTable, as_words


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


@pytest.mark.parametrize("bulk", [True, False])
def test_probing_wraps_around_the_end(bulk: bool) -> None:
    """Every key's first slot is the last one: all but one probe past the end."""
    rng = np.random.default_rng(2)
    keys = rng.integers(0, 256, (300, 16), dtype=np.uint8)
    values = rng.integers(0, 256, (300, 16), dtype=np.uint8)
    table = KeyTable()
    last = np.uint64(len(table._used) - 1)
    table._home = lambda k: np.full(k.shape[0], last, dtype=np.uint64)  # type: ignore[method-assign]
    if bulk:  # an empty table: the one-pass fill
        table.insert(as_words(keys), as_words(values))
    else:  # one at a time: the probing insert
        for i in range(300):
            table.insert(as_words(keys[i : i + 1]), as_words(values[i : i + 1]))
    assert table._used[:299].all() and table._used[-1]  # the run wrapped to slot 0 on
    _agrees(
        table,
        {k.tobytes(): v.tobytes() for k, v in zip(keys, values)},
        np.concatenate([keys, rng.integers(0, 256, (50, 16), dtype=np.uint8)]),
    )


@pytest.mark.parametrize("values", [True, False])
def test_export_and_restore_give_the_same_table(values: bool) -> None:
    rng = np.random.default_rng(3)
    keys = rng.integers(0, 256, (5000, 16), dtype=np.uint8)
    vals = rng.integers(0, 256, (5000, 16), dtype=np.uint8)
    table = KeyTable(values=values)
    table.insert(as_words(keys[:4000]), as_words(vals[:4000]) if values else None)
    state = table.export()
    again = KeyTable.restore(**state)
    assert len(again) == 4000
    found, got = again.lookup(as_words(keys))
    assert found.tolist() == [True] * 4000 + [False] * 1000
    if values:
        assert got[:4000].tobytes() == as_words(vals[:4000]).tobytes()
    else:
        assert got.shape == (5000, 0)
    again.insert(as_words(keys[4000:]), as_words(vals[4000:]) if values else None)
    assert again.lookup(as_words(keys))[0].all() and len(again) == 5000
    with pytest.raises(ValueError, match="slots in use"):
        KeyTable.restore(state["salt"], state["used"], state["keys"][:-1], state["values"][:-1])
