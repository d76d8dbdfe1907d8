"""The default planner's search rules, checked with a stand-in error model whose
predictions are set by the test: which view counts and sizes it scores, when it stops,
how it refines m, when it tries covering and query designs; and its input checks."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np
import pytest

from calmkit_aggregator.planning import search as planning
from calmkit_aggregator.planning.designs import balanced_views, dependent_views
from calmkit_aggregator.planning.error_model import ErrorPrediction, Workload
from calmkit_aggregator.planning.profile import DataProfile
from calmkit_aggregator.planning.search import Candidate, _pair_relevance, choose_plan
from calmkit_client import PlanError


def _model(
    monkeypatch: pytest.MonkeyPatch,
    sse: Callable[[int, int], float],
    noise: Callable[[int, int], float] = lambda size, m: 0.0,
) -> list[tuple[int, int]]:
    """Replace the error model by ``sse(l, m)`` of the new views (their size and
    count), of which ``noise(l, m)`` is noise (default none); returns the list of
    (l, m) scored, in order."""
    scored: list[tuple[int, int]] = []

    def fake(sizes, views, users, eps, workload, profile, deps, **kw):  # type: ignore[no-untyped-def]
        new = views[-1]
        value = sse(len(new), len(views))
        part = noise(len(new), len(views))
        scored.append((len(new), len(views)))
        return [ErrorPrediction(value, part, value - part, ()) for _ in deps]

    monkeypatch.setattr(planning, "predict_errors", fake)
    return scored


def _flat(d: int) -> DataProfile:
    return DataProfile.from_marginals([np.array([0.5, 0.5])] * d, 0.01)


def _ms(chosen, l: int, design: str = "spread") -> set[int]:  # type: ignore[no-untyped-def]  # noqa: E741
    return {c.m for c in chosen.candidates if c.l == l and c.design == design}


def test_m_grows_fourfold_until_it_rises_twice_in_a_row(monkeypatch: pytest.MonkeyPatch) -> None:
    # l = 2 over 100 attributes: m = 50, 200, 800, 3200, then the cap 4096. One rise
    # (200) then a fall (800) resets the count, so 3200 (a rise) does not stop the
    # search and 4096, the best, is found.
    values = {50: 1.0, 200: 1.1, 800: 0.9, 3200: 0.95, 4096: 0.3}
    _model(monkeypatch, lambda size, m: values.get(m, 2.0))
    chosen = choose_plan([2] * 100, 1.0, 1 << 24, Workload(k=3), _flat(100), l=2)
    assert {50, 200, 800, 3200, 4096} <= _ms(chosen, 2) and chosen.m == 4096
    # two rises in a row stop it
    values = {50: 1.0, 200: 1.1, 800: 1.2, 3200: 0.1, 4096: 0.1}
    _model(monkeypatch, lambda size, m: values.get(m, 2.0))
    chosen = choose_plan([2] * 100, 1.0, 1 << 24, Workload(k=3), _flat(100), l=2)
    assert 3200 not in _ms(chosen, 2) and chosen.m == 50


def test_m_stops_growing_once_its_noise_alone_is_past_the_best(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # l = 2 over 100 attributes: m = 50 is the best (1.0); at 200 the noise part alone
    # (1.05) is past it, so more views (more noise) cannot win: 800 is never scored,
    # though no two rises came in a row
    values = {50: 1.0, 200: 1.2, 800: 0.1}
    _model(
        monkeypatch, lambda size, m: values.get(m, 2.0), lambda size, m: 1.05 if m == 200 else 0.0
    )
    chosen = choose_plan([2] * 100, 1.0, 1 << 24, Workload(k=3), _flat(100), l=2)
    assert 800 not in _ms(chosen, 2) and chosen.m == 50
    # noise below the best: the patience rule goes on to 800
    _model(
        monkeypatch, lambda size, m: values.get(m, 2.0), lambda size, m: 0.95 if m == 200 else 0.0
    )
    chosen = choose_plan([2] * 100, 1.0, 1 << 24, Workload(k=3), _flat(100), l=2)
    assert chosen.m == 800


def test_m_is_refined_by_halves_and_square_roots_of_two(monkeypatch: pytest.MonkeyPatch) -> None:
    # l = 2 over 20 attributes: m = 10, 40, 160, 190 (every pair); the best, 40, is
    # refined with 20, 28, 57 and 80
    _model(monkeypatch, lambda size, m: abs(m - 40) + 1.0)
    chosen = choose_plan([2] * 20, 1.0, 1 << 20, Workload(k=3), _flat(20), l=2)
    assert _ms(chosen, 2) == {10, 40, 160, 190, 20, 28, 57, 80} and chosen.m == 40


def test_covers_are_tried_for_view_sizes_k_to_k_plus_2(monkeypatch: pytest.MonkeyPatch) -> None:
    # every design predicted alike: every cover is within reach of the best, the size
    # search never stops early, and covers are built for l = k, k + 1, k + 2 only
    _model(monkeypatch, lambda size, m: 1.0)
    chosen = choose_plan([2] * 8, 1.0, 1 << 20, Workload(k=2), _flat(8))
    assert {c.l for c in chosen.candidates if c.design == "cover"} == {2, 3, 4}
    assert {c.l for c in chosen.candidates} == set(range(1, 9))


def test_view_sizes_stop_two_worse_sizes_after_the_workload_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the error grows with l: l = 2 and 3 are worse than l = 1; the search may stop
    # once l reaches the order (3) and two sizes in a row were worse
    _model(monkeypatch, lambda size, m: float(size))
    chosen = choose_plan([2] * 12, 1.0, 1 << 20, Workload(k=3), _flat(12))
    assert max(c.l for c in chosen.candidates) == 3 and chosen.l == 1
    chosen = choose_plan([2] * 12, 1.0, 1 << 20, Workload(k=2), _flat(12))
    assert max(c.l for c in chosen.candidates) == 3


def test_the_queries_themselves_are_a_design_only_when_l_and_m_are_free() -> None:
    queries = Workload(queries=((0, 1, 2), (3, 4, 5), (0, 4, 7)))
    free = choose_plan([2] * 8, 1.0, 50_000, queries, _flat(8))
    assert any(c.design == "queries" and c.m == 3 for c in free.candidates)
    for fixed in ({"l": 3}, {"m": 3}):
        chosen = choose_plan([2] * 8, 1.0, 50_000, queries, _flat(8), **fixed)  # type: ignore[arg-type]
        assert all(c.design != "queries" for c in chosen.candidates)


def test_typical_is_the_geometric_mean_over_the_dependence_range() -> None:
    c = Candidate(2, 10, "spread", 0.025, 0.02, 0.005, (0.01, 0.04))
    assert c.typical == pytest.approx(0.02, rel=1e-12)
    assert Candidate(2, 10, "spread", 0.3, 0.2, 0.1).typical == pytest.approx(0.3, rel=1e-12)


def test_n_and_m_are_checked_naming_the_value() -> None:
    with pytest.raises(PlanError, match=r"^n \(0\) must be an int >= 1$"):
        choose_plan([2] * 4, 1.0, 0, Workload(k=2))
    with pytest.raises(PlanError, match=r"^n \(1\) users cannot hold a view of the requested"):
        choose_plan([2] * 4, 1.0, 1, Workload(k=2))
    for bad in (2.5, True, 0):
        with pytest.raises(PlanError, match=rf"^m \({bad!r}\) must be an int >= 1$"):
            choose_plan([2] * 4, 1.0, 1000, Workload(k=2), m=bad)  # type: ignore[arg-type]


def test_pair_relevance_weighs_pairs_by_their_interaction_share_and_query_count() -> None:
    sizes = [2, 3, 5, 4]
    margs = [np.full(s, 1.0 / s) for s in sizes]
    weights = np.ones((4, 4))
    weights[0, 1] = weights[1, 0] = 3.0
    profile = DataProfile.from_marginals(margs, 0.01, pair_weights=weights)
    frac = np.array([(s - 1) / s for s in sizes])
    expected = profile.weights * np.outer(frac, frac)  # dim_ab / L_ab
    np.testing.assert_allclose(_pair_relevance(profile, Workload(k=2)), expected, rtol=1e-12)
    queries = Workload(queries=((0, 1, 2), (0, 1), (2, 3)))
    counts = np.zeros((4, 4))
    for q in queries.queries or ():
        for a in q:
            for b in q:
                counts[a, b] += 1
    got = _pair_relevance(profile, queries)
    np.testing.assert_allclose(got, expected * counts, rtol=1e-12)
    assert got[0, 3] == 0.0 and got[0, 1] == pytest.approx(2 * expected[0, 1])


def test_plateaus_are_not_rises_and_a_fall_resets_the_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # equal values do not count as rises: the search goes on to 3200
    values = {50: 1.0, 200: 1.0, 800: 1.0, 3200: 0.5}
    _model(monkeypatch, lambda size, m: values.get(m, 2.0))
    chosen = choose_plan([2] * 100, 1.0, 1 << 24, Workload(k=3), _flat(100), l=2)
    assert 3200 in _ms(chosen, 2) and chosen.m == 3200
    # a fall (200) resets the count to 0: the rises at 800 and 3200 stop the search
    values = {50: 1.0, 200: 0.9, 800: 1.0, 3200: 1.1, 4096: 0.1}
    _model(monkeypatch, lambda size, m: values.get(m, 2.0))
    chosen = choose_plan([2] * 100, 1.0, 1 << 24, Workload(k=3), _flat(100), l=2)
    assert 4096 not in _ms(chosen, 2) and chosen.m == 200


def test_a_cover_is_built_only_near_the_best_unless_m_is_fixed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # l = 1 is best (0.1); a spread design of the cover's size at l = 2 is 1.5x that,
    # beyond _RISE = 1.25: no cover is built. At 1.2x it is.
    for ratio, built in ((1.5, False), (1.2, True)):
        _model(monkeypatch, lambda size, m, r=ratio: 0.1 if size == 1 else 0.1 * r)  # type: ignore[misc]
        chosen = choose_plan([2] * 8, 1.0, 1 << 20, Workload(k=2), _flat(8))
        assert any(c.design == "cover" for c in chosen.candidates) == built
    # with m fixed the cover of that size is always compared
    _model(monkeypatch, lambda size, m: 1.0 if size == 1 else 1.5)
    chosen = choose_plan([2] * 8, 1.0, 1 << 20, Workload(k=2), _flat(8), l=2, m=28)
    assert any(c.design == "cover" and c.l == 2 for c in chosen.candidates)


def test_covers_only_up_to_64_attributes(monkeypatch: pytest.MonkeyPatch) -> None:
    # building a cover costs too much beyond _COVER_MAX_D = 64 attributes
    _model(monkeypatch, lambda size, m: 1.0)
    built: list[int] = []

    def cover(d, k, l, covering_dir):  # type: ignore[no-untyped-def]  # noqa: E741
        built.append(d)
        return tuple(itertools.combinations(range(d), l))

    monkeypatch.setattr(planning, "_cover", cover)
    for d in (64, 65):
        choose_plan([2] * d, 1.0, 1 << 24, Workload(k=2), _flat(d), l=2)
    assert built == [64]


def test_the_main_phase_deals_the_pilots_views_again_after_the_new_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 5 attributes, the pilot's 3 pairs fixed: 7 new pairs, then the pilot's 3 again.
    # More views predicted better: the search reaches all 10, the new ones first
    from calmkit_aggregator.planning.designs import pilot_views

    _model(monkeypatch, lambda size, m: 20.0 - m)
    fixed = pilot_views(range(5), rng=0)

    def plan(m: int | None = None):  # type: ignore[no-untyped-def]
        return choose_plan(
            [2] * 5,
            1.0,
            1 << 20,
            Workload(k=2),
            _flat(5),
            l=2,
            m=m,
            fixed_views=fixed,
            fixed_users=[100.0] * len(fixed),
        )

    chosen = plan()
    assert _ms(chosen, 2) == {3, 5, 7, 10} and chosen.m == 10
    assert set(chosen.views[:7]).isdisjoint(fixed) and set(chosen.views[7:]) == set(fixed)
    seven = plan(7)
    assert set(seven.views).isdisjoint(fixed)  # while new pairs are left, only new ones


def test_the_queries_design_needs_one_size_and_skips_one_category_attributes() -> None:
    # one query: its own view
    single = choose_plan([2] * 6, 1.0, 50_000, Workload(queries=((0, 1, 2),)), _flat(6))
    assert any(c.design == "queries" and (c.l, c.m) == (3, 1) for c in single.candidates)
    assert all(c.l == 3 for c in single.candidates if c.design == "queries")
    # attribute 2 has one category: the queries become (0, 1) and (3, 4, 5), of two
    # sizes, so they are not a design of one view size
    sizes = [2, 2, 1, 2, 2, 2]
    profile = DataProfile.from_marginals([np.full(s, 1.0 / s) for s in sizes], 0.01)
    mixed = choose_plan(sizes, 1.0, 50_000, Workload(queries=((0, 1, 2), (3, 4, 5))), profile)
    assert all(c.design != "queries" for c in mixed.candidates)
    assert all(2 not in v for v in mixed.views)


def test_l_is_checked_naming_the_value() -> None:
    for bad in (0, 5, 2.5, True):
        msg = rf"^l \({bad!r}\) must be an int in \[1, 4\] \(4 attributes with >= 2 categories\)$"
        with pytest.raises(PlanError, match=msg):
            choose_plan([2, 2, 1, 2, 2], 1.0, 1000, Workload(k=2), l=bad)  # type: ignore[arg-type]


def test_shrinkage_is_assumed_unless_turned_off() -> None:
    profile = DataProfile.from_marginals([np.array([0.7, 0.3])] * 6, 0.01)
    args = ([2] * 6, 1.0, 20_000, Workload(k=3), profile)
    default = choose_plan(*args, l=2, m=6)
    on = choose_plan(*args, l=2, m=6, shrink=True)
    off = choose_plan(*args, l=2, m=6, shrink=False)
    assert default.predicted == on.predicted and off.predicted.sse != on.predicted.sse


def test_notes_name_the_attributes_no_view_holds() -> None:
    every = choose_plan([2] * 6, 1.0, 50_000, Workload(k=2), _flat(6))
    assert every.predicted.uncollected == () and every.notes([f"a{i}" for i in range(6)]) == []
    few = choose_plan([2] * 6, 1.0, 50_000, Workload(k=2), _flat(6), l=1, m=2)
    notes = few.notes([f"a{i}" for i in range(6)])
    assert len(few.predicted.uncollected) == 4 and len(notes) == 1
    assert notes[0].startswith("4 attribute(s) in no view")


def test_a_design_scored_twice_keeps_its_own_prediction(monkeypatch: pytest.MonkeyPatch) -> None:
    # the cover's size for k = 2 over 8 attributes (28 pairs) is also the last count of
    # the l = 2 search: its cached prediction (the best, 1.0) decides that the cover is
    # built, not another candidate's
    def sse(size: int, m: int) -> float:
        return 3.0 if size == 1 else (1.0 if m == 28 else 5.0)

    _model(monkeypatch, sse)
    chosen = choose_plan([2] * 8, 1.0, 1 << 20, Workload(k=2), _flat(8))
    assert any(c.design == "cover" and c.l == 2 for c in chosen.candidates)


@pytest.mark.parametrize("better", ["dependent", "balanced"])
def test_weighted_designs_are_tried_at_the_best_spread_count_and_the_better_at_the_next(
    monkeypatch: pytest.MonkeyPatch, better: str
) -> None:
    margs = [np.array([0.5, 0.5])] * 20
    weights = np.random.default_rng(3).exponential(size=(20, 20))
    uneven = DataProfile.from_marginals(margs, 0.01, pair_weights=weights + weights.T)
    relevance = _pair_relevance(uneven, Workload(k=3))
    make = balanced_views if better == "balanced" else dependent_views

    def fake(sizes, views, users, eps, workload, profile, deps, **kw):  # type: ignore[no-untyped-def]
        value = abs(len(views) - 160) + 1.0  # the best m is 160, then 190 (every pair)
        if tuple(views) == make(range(20), 2, len(views), relevance, rng=[0, 2]):
            value -= 0.5
        return [ErrorPrediction(value, 0.0, value, ()) for _ in deps]

    monkeypatch.setattr(planning, "predict_errors", fake)
    chosen = choose_plan([2] * 20, 1.0, 1 << 20, Workload(k=3), uneven, l=2)
    # the m search scored 10, 40, 160, 190: both kinds at 160, the better one at 190
    # too, and the refinement around 160 follows it
    assert _ms(chosen, 2) == {10, 40, 160, 190}
    other = "balanced" if better == "dependent" else "dependent"
    assert _ms(chosen, 2, other) == {160}
    assert {160, 190} <= _ms(chosen, 2, better)
    assert chosen.design == better and chosen.m == 160


def test_a_pilot_holding_every_pair_leaves_pairs_to_measure_again() -> None:
    # every pair already has its view (a first phase): the next phase may measure
    # pairs again (spread and Algorithm 1's plan), and the search goes on to l = 3
    fixed = list(itertools.combinations(range(5), 2))
    chosen = choose_plan(
        [2] * 5, 1.0, 20_000, Workload(k=3), _flat(5), fixed_views=fixed, fixed_users=[1000.0] * 10
    )
    designs = {c.design for c in chosen.candidates if c.l == 2}
    assert {"spread", "paper"} <= designs
    assert any(c.l == 3 for c in chosen.candidates)
    # k = 2, a pilot of every pair at eps 4: measuring the pairs again is predicted
    # best, as on Adult's first 8 attributes (3 views of 3 measured 2.0x the SSE)
    sizes = [6, 7, 5, 16]
    profile = DataProfile.from_marginals([np.full(c, 1.0 / c) for c in sizes], 0.01)
    every = list(itertools.combinations(range(4), 2))
    pairs = choose_plan(
        sizes, 4.0, 36_000, Workload(k=2), profile, fixed_views=every, fixed_users=[1500.0] * 6
    )
    assert pairs.l == 2 and set(pairs.views) == set(every)
    # a first phase of single attributes: the next phase may measure them alone again
    singles = [(a,) for a in range(6)]
    again = choose_plan(
        [2] * 6, 1.0, 20_000, Workload(k=2), _flat(6), fixed_views=singles, fixed_users=[1000.0] * 6
    )
    ones = [c for c in again.candidates if c.l == 1]
    assert ones and ones[0].m == 6
    # m may be every new view there is
    every = choose_plan([2] * 4, 1.0, 20_000, Workload(k=2), _flat(4), l=2, m=6)
    assert len(every.views) == 6
    with pytest.raises(PlanError, match=r"^m \(7\) must be <= 6 distinct views of size 2$"):
        choose_plan([2] * 4, 1.0, 20_000, Workload(k=2), _flat(4), l=2, m=7)
    # m alone: only view sizes that hold m distinct views are scored (4 attributes hold
    # 4 singles, 6 pairs, 4 triples, 1 view of all four: 5 views are pairs)
    five = choose_plan([2] * 4, 1.0, 20_000, Workload(k=2), _flat(4), m=5)
    assert (five.l, five.m) == (2, 5) and len(set(five.views)) == 5
    assert {c.l for c in five.candidates} == {2}
    with pytest.raises(PlanError, match=r"^m \(7\) must be <= 6 distinct views of any size$"):
        choose_plan([2] * 4, 1.0, 20_000, Workload(k=2), _flat(4), m=7)


def test_the_prediction_counts_the_fixed_views_users_in_the_population() -> None:
    from calmkit_aggregator.planning.error_model import predict_error

    fixed = [(0, 1), (2, 3)]
    chosen = choose_plan(
        [2] * 4,
        1.0,
        5000,
        Workload(k=2),
        _flat(4),
        l=2,
        m=2,
        fixed_views=fixed,
        fixed_users=[700.0, 300.0],
    )
    views = list(fixed) + list(chosen.views)
    users = [700.0, 300.0, 2500.0, 2500.0]
    direct = predict_error([2] * 4, views, users, 1.0, Workload(k=2), _flat(4), n=6000.0)
    assert chosen.predicted.sse == pytest.approx(direct.sse, rel=1e-12)


def test_sizes_and_planner_results_are_checked_and_frozen() -> None:
    import dataclasses

    with pytest.raises(PlanError, match=r"^sizes \(\(\)\) must name at least one attribute$"):
        choose_plan([], 1.0, 100, Workload(k=1))
    with pytest.raises(PlanError, match=r"^sizes \(\[2, 0\]\) must be category counts >= 1$"):
        choose_plan([2, 0], 1.0, 100, Workload(k=1))
    one = choose_plan(
        [3], 1.0, 1000, Workload(k=1), DataProfile.from_marginals([np.full(3, 1 / 3)], 0.0)
    )
    assert one.views == ((0,),)
    with pytest.raises(dataclasses.FrozenInstanceError):
        one.m = 5  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        one.candidates[0].m = 5  # type: ignore[misc]


def test_view_sizes_go_up_to_8(monkeypatch: pytest.MonkeyPatch) -> None:
    _model(monkeypatch, lambda size, m: 1.0)  # nothing ever gets worse: every size tried
    chosen = choose_plan([2] * 10, 1.0, 1 << 24, Workload(k=1), _flat(10))
    assert max(c.l for c in chosen.candidates) == 8


def test_boundary_values_are_accepted() -> None:
    # l = d, m = 1, and a view of exactly MAX_VIEW_CELLS (2^20) cells
    assert choose_plan([2] * 4, 1.0, 1000, Workload(k=2), _flat(4), l=4).views == ((0, 1, 2, 3),)
    assert choose_plan([2] * 4, 1.0, 1000, Workload(k=2), _flat(4), l=2, m=1).m == 1
    big = DataProfile.from_marginals([np.full(1024, 1 / 1024)] * 2, 0.0)
    wide = choose_plan([1024, 1024], 1.0, 1 << 20, Workload(k=2), big, l=2)
    assert wide.views == ((0, 1),)
    for bad in (True, 2.5):
        with pytest.raises(PlanError, match=rf"^n \({bad!r}\) must be an int >= 1$"):
            choose_plan([2] * 4, 1.0, bad, Workload(k=2))  # type: ignore[arg-type]


def test_queries_as_many_as_users_are_still_a_design() -> None:
    # three 1-way queries and three users: each query its own view, one user each
    chosen = choose_plan([2] * 3, 1.0, 3, Workload(queries=((0,), (1,), (2,))), _flat(3))
    assert any(c.design == "queries" and c.m == 3 for c in chosen.candidates)
