"""A pilot in two rounds: the first on random matchings, the second on the pairs whose
attributes the first round found most dependent, as many as stay informative at the
second round's reports; one round where half the pilot cannot measure a pair."""

from __future__ import annotations

import numpy as np
import pytest

from calmkit_aggregator.phases import PhasedDesign, combine_phases
from calmkit_aggregator.planning.pilot import (
    informative_pair,
    pilot_plan,
    pilot_size,
    plan_pilot_round,
    profile_from_pilot,
    round_two_pairs,
    start_pilot,
)
from calmkit_aggregator.planning.profile import DataProfile
from calmkit_client import Plan, Schema
from calmkit_simulator import Population, collect_support

D = 12
MATCHING = tuple((2 * i, 2 * i + 1) for i in range(D // 2))  # the first round's pairs


def _profile(heavy: dict[tuple[int, int], float], sizes: tuple[int, ...] = (2,) * D) -> DataProfile:
    """Uniform margins; every pair of weight 1 but ``heavy`` ones."""
    weights = np.ones((len(sizes), len(sizes)))
    for (a, b), w in heavy.items():
        weights[a, b] = weights[b, a] = w
    margs = [np.full(s, 1.0 / s) for s in sizes]
    return DataProfile.from_marginals(margs, 0.01, pair_weights=weights)


def test_the_pairs_of_the_heaviest_first_round_pairs_attributes_come_first() -> None:
    # (2, 3) holds by far the most dependence, (6, 7) some: pairs with 2 or 3 first
    # (both heavy ends first of all), then with 6 or 7; binary pairs at eps 1 are
    # informative from 405 reports, so 4,050 reports measure 10 of them
    profile = _profile({(2, 3): 50.0, (6, 7): 5.0})
    pairs = round_two_pairs(profile, MATCHING, 1.0, 4_050, seed=1)
    assert len(pairs) == 10 == 4_050 // 405
    assert not set(pairs) & set(MATCHING)
    assert set(pairs[:4]) == {(2, 6), (2, 7), (3, 6), (3, 7)}  # both ends heavy
    assert all({2, 3} & set(p) for p in pairs[4:])  # then the rest of 2's and 3's
    # more reports: every pair with 2 or 3 (20), then 6's and 7's with the others
    pairs = round_two_pairs(profile, MATCHING, 1.0, 40_500, seed=1)
    assert len(pairs) == 60  # every unmeasured pair: 66 - 6
    with_heavy = [i for i, p in enumerate(pairs) if {2, 3} & set(p)]
    assert with_heavy == list(range(20))
    assert all({6, 7} & set(p) for p in pairs[20:36])


@pytest.mark.parametrize("users", [404, 405, 4_049, 4_050, 12_000, 10**6])
def test_as_many_pairs_as_stay_informative_at_the_rounds_reports(users: int) -> None:
    profile = _profile({(0, 1): 9.0})
    pairs = round_two_pairs(profile, MATCHING, 1.0, users, seed=0)
    unmeasured = D * (D - 1) // 2 - len(MATCHING)
    expected = min(unmeasured, users // 405)
    assert len(pairs) == expected and len(set(pairs)) == len(pairs)
    if pairs:
        assert informative_pair(2, 2, 1.0, users // len(pairs))
    if 0 < len(pairs) < unmeasured:  # one more would not be
        assert not informative_pair(2, 2, 1.0, users // (len(pairs) + 1))


def test_pairs_that_need_more_reports_give_way_to_pairs_that_can_be_informative() -> None:
    # attribute 0 (16 categories) is heavy, but its pairs need 2,750+ reports each: with
    # 4,050 reports the round measures binary pairs (ranked next) rather than one
    # 16 x 2 pair
    sizes = (16,) + (2,) * (D - 1)
    profile = _profile({(0, 1): 50.0}, sizes)
    pairs = round_two_pairs(profile, MATCHING, 1.0, 4_050, seed=0)
    assert len(pairs) == 10 and all(0 not in p for p in pairs)
    assert all(1 in p for p in pairs)  # the other heavy end's pairs first
    # with ample reports the pairs of both heavy ends, the 16-category one's too, first
    pairs = round_two_pairs(profile, MATCHING, 1.0, 10**6, seed=0)
    assert set(pairs[:20]) == {(a, b) for a in (0, 1) for b in range(2, D)}


def test_ties_are_broken_by_the_seed_not_by_attribute_order() -> None:
    profile = _profile({})  # every measured pair alike: every unmeasured pair ties
    draws = {round_two_pairs(profile, MATCHING, 1.0, 2_025, seed=s) for s in range(6)}
    assert len(draws) > 1
    firsts = [p for draw in draws for p in draw]
    assert max(max(p) for p in firsts) > 5  # not the lowest-numbered pairs each time


def test_a_pilot_takes_two_rounds_where_its_first_half_measures_pairs() -> None:
    binary = Schema.from_sizes([2] * 16)
    pilot = start_pilot(binary, 1.0, 100_000, seed=4)
    assert (pilot.reports, pilot.first_round) == (20_000, 10_000)
    assert pilot.plan == pilot_plan(binary, 1.0, seed=4, users=10_000)
    assert all(len(v) == 2 for v in pilot.plan.views)
    # half of 4,000 reports over 8 pairs is 250 each: not informative, one round
    pilot = start_pilot(binary, 1.0, 20_000, seed=4)
    assert (pilot.reports, pilot.first_round) == (4_000, 0)
    assert pilot.plan == pilot_plan(binary, 1.0, seed=4, users=4_000)
    # large domains: no pair even with the whole pilot; one round, each attribute alone
    wide = Schema.from_sizes([8 + (32 * i) // 19 for i in range(20)])
    pilot = start_pilot(wide, 1.0, 100_000)
    assert pilot.first_round == 0 and pilot.reports == pilot_size(100_000)
    assert all(len(v) == 1 for v in pilot.plan.views)


def test_the_second_round_finds_a_cluster_the_first_touched() -> None:
    # 16 binary attributes; 0-5 depend strongly on each other, the rest not at all.
    # The first round's matching holds one pair of the cluster (0, 1) and pairs it
    # otherwise with independent attributes; the second round measures the cluster's
    # other pairs first
    gen = np.random.default_rng(7)
    n = 40_000
    codes = gen.integers(0, 2, size=(n, 16))
    hidden = gen.integers(0, 2, size=n)
    for a in range(6):  # each a noisy copy of one hidden bit
        codes[:, a] = np.where(gen.random(n) < 0.85, hidden, 1 - hidden)
    schema = Schema.from_sizes([2] * 16)
    pop = Population(schema, codes)
    first_views = ((0, 1), (2, 6), (3, 7), (4, 8), (5, 9), (10, 11), (12, 13), (14, 15))
    first = Plan(schema, 1.0, first_views, seed=0)
    support = collect_support(pop, first, gen, rows=np.arange(4_000))
    design = PhasedDesign(40_000, 8_000, 3, seed=3, first_round=4_000)
    second = plan_pilot_round(design, support)
    assert second.seed == design.seed + 2
    assert not set(second.views) & set(first_views)
    # the first round saw dependence in (0, 1) only (2-5 were paired with independent
    # attributes): the second round measures 0's and 1's other pairs, a third of them
    # in the cluster
    assert len(second.views) == 4_000 // 405
    assert all({0, 1} & set(v) for v in second.views)
    profile = profile_from_pilot(support)
    assert profile.weights[0, 1] > 10 * profile.weights[10, 11]
    # both rounds together: the cluster pairs the second round measured read as heavier
    # than every other pair it measured
    rows = np.arange(4_000, 8_000)
    both = combine_phases([support, collect_support(pop, second, gen, rows=rows)])
    weights = profile_from_pilot(both).weights
    cluster = [v for v in second.views if max(v) < 6]
    others = [v for v in second.views if max(v) >= 6]
    assert cluster and others
    assert min(weights[v] for v in cluster) > max(weights[v] for v in others)
