"""How many pairs a pilot measures: as many random matchings (up to MAX_MATCHINGS) as
keep every pair informative at the pilot's reports split over them, else one."""

from __future__ import annotations

import itertools

import pytest

from calmkit_aggregator.planning.pilot import MAX_MATCHINGS, informative_pair, pilot_plan
from calmkit_client import Schema


def _matching_count(views: tuple[tuple[int, ...], ...], d: int) -> int:
    """Each matching holds every attribute once: the views per attribute, at most."""
    return max(sum(a in v for v in views) for a in range(d))


def test_ample_reports_measure_several_matchings_of_distinct_informative_pairs() -> None:
    # 16 binary attributes, 40,000 pilot reports at eps 1: four matchings keep every
    # pair's view (1,250 reports) informative
    schema = Schema.from_sizes([2] * 16)
    views = pilot_plan(schema, 1.0, seed=3, users=40_000).views
    assert all(len(v) == 2 for v in views) and len(set(views)) == len(views)
    assert _matching_count(views, 16) == MAX_MATCHINGS
    assert 16 // 2 < len(views) <= MAX_MATCHINGS * 16 // 2
    per_view = 40_000 // (MAX_MATCHINGS * 8)
    assert all(informative_pair(2, 2, 1.0, per_view) for _ in views)
    # every attribute in every matching: each is in at least one view per matching
    assert all(sum(a in v for v in views) >= 1 for a in range(16))


@pytest.mark.parametrize(("users", "expected"), [(40_000, 4), (12_000, 3), (9_000, 2), (6_000, 1)])
def test_the_count_is_the_largest_that_keeps_every_pair_informative(
    users: int, expected: int
) -> None:
    # binary pairs at eps 1 are informative from 405 reports (the noise of their
    # dependence statistic, 0.017 at a thousand, shrinks as 1/sqrt(reports) to the
    # prior's median 0.022); 8 pairs per matching
    schema = Schema.from_sizes([2] * 16)
    count = max(
        (c for c in range(1, MAX_MATCHINGS + 1) if informative_pair(2, 2, 1.0, users // (8 * c))),
        default=1,
    )
    assert count == expected
    views = pilot_plan(schema, 1.0, seed=0, users=users).views
    if expected == 1:  # one matching, as a pilot of few reports always was
        assert len(views) == 8 and sorted(a for v in views for a in v) == list(range(16))
    else:
        assert _matching_count(views, 16) == expected


def test_large_tables_keep_the_single_matching_rule() -> None:
    # pairs of 8-16 categories are not informative split four ways: one matching, and
    # (test_large_domains) attributes alone where even that cannot tell
    schema = Schema.from_sizes([10, 14, 8, 12, 9, 16])
    views = pilot_plan(schema, 1.0, seed=1, users=16_000).views
    assert sorted(a for v in views for a in v) == list(range(6))


def test_no_pair_is_measured_twice_and_the_seed_fixes_the_matchings() -> None:
    schema = Schema.from_sizes([2, 3, 2, 2, 4, 2, 3, 2])
    first = pilot_plan(schema, 1.0, seed=5, users=20_000).views
    assert first == pilot_plan(schema, 1.0, seed=5, users=20_000).views
    assert first != pilot_plan(schema, 1.0, seed=6, users=20_000).views
    pairs = [v for v in first if len(v) == 2]
    assert len(pairs) == len(set(pairs))
    assert set(pairs) <= set(itertools.combinations(range(8), 2))
