"""Support counts from what devices send: single Report objects count exactly like the
batches they came from; reports under another plan or of another type are refused."""

from __future__ import annotations

import numpy as np
import pytest

from calmkit_aggregator import SupportCounts
from calmkit_client import Plan, PlanError, Report, Schema, make_reports

SCHEMA = Schema.from_sizes((2, 3, 2, 4, 2, 2))
PLAN = Plan(SCHEMA, 1.0, [(0, 1), (1, 2, 3, 4, 5), (2, 3)], seed=0)  # GRR, OUE, GRR


def _singles(plan: Plan, n: int, seed: int) -> tuple[list[object], list[Report]]:
    codes = np.random.default_rng(seed).integers(0, 2, (n, SCHEMA.d))
    batches = make_reports(plan, codes, np.arange(n), np.random.default_rng(seed + 1))
    singles = [
        Report(plan.digest, b.view, int(p) if p.ndim == 0 else p.tobytes(), rid.tobytes())
        for b in batches
        for p, rid in zip(b.payloads, b.report_ids)
    ]
    return list(batches), singles


def test_single_reports_count_like_their_batches() -> None:
    assert set(PLAN.oracles) == {"GRR", "OUE"}
    batches, singles = _singles(PLAN, 900, 3)
    expected = SupportCounts.from_reports(PLAN, batches)  # type: ignore[arg-type]
    got = SupportCounts.from_reports(PLAN, singles[::-1])
    np.testing.assert_array_equal(got.n, expected.n)
    for a, b in zip(got.counts, expected.counts):
        np.testing.assert_array_equal(a, b)
    mixed = SupportCounts.from_reports(PLAN, [*batches[:1], *singles[expected.n[0] :]])  # type: ignore[list-item]
    np.testing.assert_array_equal(mixed.n, expected.n)


def test_foreign_reports_are_named() -> None:
    _, singles = _singles(PLAN, 10, 4)
    other = Plan(SCHEMA, 2.0, [(0, 1)], seed=0)
    moved = Report(other.digest, 0, 1, b"\1" * 16)
    with pytest.raises(PlanError, match=r"reports\[3\]\.plan_digest \(" + other.digest[:12]):
        SupportCounts.from_reports(PLAN, [*singles[:3], moved])
    with pytest.raises(PlanError, match=r"reports\[1\] \(dict\) must be a Report or ViewReports"):
        SupportCounts.from_reports(PLAN, [singles[0], {}])  # type: ignore[list-item]
