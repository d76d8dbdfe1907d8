"""Columnar batches: the blobs round-trip, every malformed field is refused naming the
first bad report, counts equal the per-report path's, and old-format and columnar
batches mixed in one collection give the same counts and dedupe against each other."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from calmkit_aggregator import SupportCounts
from calmkit_aggregator.service.columns import columns_from_reports, decode_columns
from calmkit_aggregator.service.storage import Storage
from calmkit_aggregator.service.store import BatchOutcome
from calmkit_client import CalmkitError
from calmkit_client.errors import ReportConflict

from .test_storage import TOKEN_HASH, assert_counts_equal, make_plan, simulate

PLAN = make_plan()  # views: GRR L=6, GRR L=6, OUE L=15 (2 bytes, 1 padding bit)


def blobs(n: int = 300, seed: int = 1) -> dict[str, bytes]:
    return columns_from_reports(PLAN, simulate(PLAN, n, seed)[1]).encode()


def test_encode_decode_round_trip_and_counts_match_the_oracles() -> None:
    batches, reports = simulate(PLAN, 500, seed=3)
    columns = columns_from_reports(PLAN, reports)
    again = decode_columns(PLAN, len(reports), **columns.encode())
    np.testing.assert_array_equal(again.report_ids, columns.report_ids)
    np.testing.assert_array_equal(again.pseudonyms, columns.pseudonyms)
    np.testing.assert_array_equal(again.views, [r.view for r in reports])
    n, counts = again.support_deltas()
    assert_counts_equal(
        SupportCounts(PLAN, n, tuple(counts)), SupportCounts.from_reports(PLAN, batches)
    )
    # the layout: 16-byte keys in batch order, one uint32 per GRR report
    assert columns.encode()["report_ids"][16:32] == reports[1].report_id
    grr = [r for r in reports if r.view < 2]
    cells = np.frombuffer(columns.encode()["cells"], "<u4")
    np.testing.assert_array_equal(cells, [r.payload for r in grr])
    assert columns.encode()["bits"][:2] == next(r.payload for r in reports if r.view == 2)


def test_take_keeps_views_and_payloads_aligned() -> None:
    _, reports = simulate(PLAN, 200, seed=4)
    columns = columns_from_reports(PLAN, reports)
    keep = np.arange(0, 200, 3)
    taken = columns.take(keep)
    expected = columns_from_reports(PLAN, [reports[i] for i in keep])
    assert taken.encode() == expected.encode()


def _mutated(field: str) -> tuple[int, dict[str, bytes], str]:
    b = blobs()
    n = 300
    views = np.frombuffer(b["views"], "<u4").copy()
    if field == "count":
        return n + 1, b, r"report_ids \(4800 bytes\) must be 16 bytes per report \(4816\)"
    if field == "view":
        views[17] = 3
        return n, {**b, "views": views.tobytes()}, r"reports\[17\]\.view \(3\) must be in \[0, 3\)"
    if field == "cells_length":
        return n, {**b, "cells": b["cells"][:-4]}, r"cells \(\d+ bytes\) must be 4 bytes per GRR"
    if field == "cell":
        first_grr = int(np.flatnonzero(views < 2)[0])
        cells = np.frombuffer(b["cells"], "<u4").copy()
        cells[0] = 6
        return (
            n,
            {**b, "cells": cells.tobytes()},
            (rf"reports\[{first_grr}\]\.cell \(6\) must be < L = 6"),
        )
    if field == "bits_length":
        return n, {**b, "bits": b["bits"] + b"\x00"}, r"bits \(\d+ bytes\) must be the OUE"
    if field == "padding":
        first_oue = int(np.flatnonzero(views == 2)[0])
        bits = bytearray(b["bits"])
        bits[1] |= 1  # the first OUE payload's last byte, its padding bit
        return (
            n,
            {**b, "bits": bytes(bits)},
            rf"reports\[{first_oue}\]\.bits \(last byte 0x[0-9a-f]{{2}}\) must have its 1 "
            "padding bits zero",
        )
    assert field == "pseudonyms"
    return n, {**b, "pseudonyms": b["pseudonyms"][:-1]}, r"pseudonyms \(4799 bytes\)"


@pytest.mark.parametrize(
    "field", ["count", "view", "cells_length", "cell", "bits_length", "padding", "pseudonyms"]
)
def test_each_malformed_field_is_refused_by_name(field: str) -> None:
    count, b, match = _mutated(field)
    with pytest.raises(CalmkitError, match=match):
        decode_columns(PLAN, count, **b)


def test_mixed_formats_in_one_collection_count_alike(tmp_path: Path) -> None:
    batches, reports = simulate(PLAN, 3000, seed=5)
    expected = SupportCounts.from_reports(PLAN, batches)
    with Storage(tmp_path / "mixed.db") as store:
        store.create_collection("mixed", PLAN, 2, TOKEN_HASH)
        for k, lo in enumerate(range(0, 3000, 500)):
            part = reports[lo : lo + 500]
            sent = columns_from_reports(PLAN, part) if k % 2 else part
            assert store.add_reports("mixed", PLAN.digest, sent) == BatchOutcome(500, 0)
        assert_counts_equal(store.support("mixed"), expected)
        assert_counts_equal(store.recount("mixed"), expected)
        # a retry in the other format is recognised as the same reports
        assert store.add_reports("mixed", PLAN.digest, reports[:500]) == BatchOutcome(0, 500)
        retry = columns_from_reports(PLAN, reports[500:1000])
        assert store.add_reports("mixed", PLAN.digest, retry) == BatchOutcome(0, 500)
        assert_counts_equal(store.support("mixed"), expected)


def test_columnar_conflicts_are_refused_whole(tmp_path: Path) -> None:
    _, reports = simulate(PLAN, 100, seed=6)
    with Storage(tmp_path / "c.db") as store:
        store.create_collection("c", PLAN, 2, TOKEN_HASH)
        store.add_reports("c", PLAN.digest, reports[:50])
        # report 60 reuses report 10's pseudonym: the batch is refused, nothing counted
        bad = list(reports[50:])
        bad[10] = type(bad[10])(
            bad[10].report_id, reports[10].pseudonym, bad[10].view, bad[10].payload
        )
        with pytest.raises(ReportConflict, match=r"reports\[10\]\.pseudonym"):
            store.add_reports("c", PLAN.digest, columns_from_reports(PLAN, bad))
        assert store.get_collection("c").reports == 50
