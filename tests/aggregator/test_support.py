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


def _phases(seed: int) -> tuple[SupportCounts, SupportCounts]:
    """A pilot of 1,500 users on (0, 1) and (2, 3), then 4,500 on (0, 1) again and
    (1, 2, 3, 4, 5): dependent records (attribute 1 follows attribute 0)."""
    gen = np.random.default_rng(seed)
    codes = gen.integers(0, 2, (6000, SCHEMA.d))
    codes[:, 1] = np.where(gen.random(6000) < 0.8, codes[:, 0], gen.integers(0, 3, 6000))
    pilot = Plan(SCHEMA, 1.0, [(0, 1), (2, 3)], seed=1)
    main = Plan(SCHEMA, 1.0, [(0, 1), (1, 2, 3, 4, 5)], seed=2)
    parts = []
    for plan, rows in ((pilot, slice(0, 1500)), (main, slice(1500, 6000))):
        ids = np.arange(6000)[rows]
        batches = make_reports(plan, codes[rows], ids, np.random.default_rng(seed + 1))
        parts.append(SupportCounts.from_reports(plan, batches))
    return parts[0], parts[1]


def test_a_view_measured_twice_is_pooled_into_one() -> None:
    from calmkit_aggregator.phases import combine_phases

    pilot, main = _phases(5)
    both = combine_phases([pilot, main])
    assert both.plan.views == ((0, 1), (2, 3), (0, 1), (1, 2, 3, 4, 5))
    pooled = both.pooled()
    assert pooled.plan.views == ((0, 1), (2, 3), (1, 2, 3, 4, 5))
    assert pooled.n.tolist() == [pilot.n[0] + main.n[0], pilot.n[1], main.n[1]]
    np.testing.assert_array_equal(pooled.counts[0], pilot.counts[0] + main.counts[0])
    assert pooled.plan.oracles == ("GRR", "GRR", "OUE")
    assert pilot.pooled() is pilot  # nothing repeats
    # the same attributes under another oracle are another measurement: kept apart
    other = Plan(SCHEMA, 1.0, [(0, 1)], oracles=["OUE"], seed=3)
    apart = combine_phases([pilot, SupportCounts.zeros(other)]).pooled()
    assert apart.plan.views == ((0, 1), (2, 3), (0, 1))


@pytest.mark.parametrize("how", ["local", "global"])
def test_reconstruction_pools_repeated_views(how: str) -> None:
    from calmkit_aggregator.phases import combine_phases
    from calmkit_aggregator.reconstruction.pipeline import reconstruct_by

    both = combine_phases(list(_phases(6)))
    got, pooled = reconstruct_by(both, how), reconstruct_by(both.pooled(), how)
    assert got.plan.views == pooled.plan.views
    for query in [(0, 1), (0, 1, 2), (1, 3, 5)]:
        np.testing.assert_array_equal(got.answer(query).values, pooled.answer(query).values)


def test_the_error_bars_bootstrap_the_pooled_views() -> None:
    # the service bootstraps the support of every phase: a view measured in two
    # phases is drawn once, with both phases' reports, as the reconstruction pools it
    from calmkit_aggregator.phases import combine_phases
    from calmkit_aggregator.reconstruction.pipeline import reconstruct
    from calmkit_aggregator.reconstruction.uncertainty import bootstrap

    both = combine_phases(list(_phases(7)))
    estimator = reconstruct(both)
    got = bootstrap(both, estimator, replicates=4, rng=3)
    pooled = bootstrap(both.pooled(), estimator, replicates=4, rng=3)
    for query in [(0, 1), (0, 2, 4)]:
        np.testing.assert_array_equal(
            got.mean_squared_error(query, estimator), pooled.mean_squared_error(query, estimator)
        )
