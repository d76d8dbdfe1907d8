"""CALM Algorithm 1: choosing l, m and the views (the CALM paper, Zhang et al., CCS 2018, §4.3)."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest

from calmkit_aggregator.planning.algorithm1 import (
    Choice,
    _next_even,
    _repair_step,
    choose_views,
    even_views,
    expected_cells,
    noise_error,
    sampling_error,
)
from calmkit_aggregator.planning.covering import construct_cover, verify_cover
from calmkit_client import Plan, PlanError, Schema

N16 = 2**16
BINARY8 = [2] * 8


def attribute_counts(views: tuple[tuple[int, ...], ...], d: int) -> np.ndarray:
    counts = np.zeros(d, np.int64)
    for v in views:
        counts[list(v)] += 1
    return counts


def check_views(choice: Choice, d: int) -> None:
    assert len(choice.views) == choice.m
    assert len(set(choice.views)) == choice.m
    assert all(len(v) == choice.l and list(v) == sorted(set(v)) for v in choice.views)
    assert all(0 <= a < d for v in choice.views for a in v)
    if choice.l >= choice.k:
        assert choice.covers == verify_cover(choice.views, d, choice.k)
    else:
        assert not choice.covers


# -- the paper's worked example (§4.3) -----------------------------------------------------
def test_worked_example() -> None:
    choice = choose_views(BINARY8, 2.0, N16, 3)
    assert (choice.l, choice.m) == (4, 14)
    assert choice.rule == "min max(SE, k*NE)"
    assert (choice.mu, choice.l_upper, choice.l_lower) == (65, 4, 3)
    assert choice.covers and verify_cover(choice.views, 8, 3)
    check_views(choice, 8)
    by_l = {o.l: o for o in choice.options}
    # l = 3: m = C(8, 3) = 56, max(NE 0.00032, SE 0.00085); l = 4: m = 14,
    # max(NE 0.00076, SE 0.00021) (the paper truncates to 5 decimals).
    assert by_l[3].cover_size == 56
    assert by_l[4].cover_size == 14
    assert by_l[3].k_ne == pytest.approx(0.00032, abs=1e-5)
    assert by_l[3].se(N16) == pytest.approx(0.00085, abs=1e-5)
    assert by_l[4].k_ne == pytest.approx(0.00076, abs=1e-5)
    assert by_l[4].se(N16) == pytest.approx(0.00021, abs=1e-5)
    assert choice.noise_error == by_l[4].k_ne and choice.sampling_error == 14 / N16
    assert by_l[5].k_ne > 0.001  # why l_u stops at 4
    assert "chosen l=4 m=14" in choice.summary()


def test_noise_error_formula() -> None:
    e = math.exp(2.0)
    for l in range(1, 9):  # noqa: E741
        L = 2**l
        expected = min(4 * e, L - 2 + e) / (e - 1) ** 2 * (L / l) * (8 / N16)
        assert noise_error(N16, BINARY8, 2.0, l) == pytest.approx(expected, rel=1e-12)
    assert sampling_error(N16, 14) == 14 / N16
    # Large epsilon: no overflow, NE -> 0.
    assert 0 <= noise_error(N16, BINARY8, 2000.0, 4) < 1e-300


def test_expected_cells_non_binary() -> None:
    sizes = [2, 3, 5, 2, 7]
    for l in range(1, 6):  # noqa: E741
        subsets = list(itertools.combinations(sizes, l))
        brute = sum(math.prod(s) for s in subsets) / len(subsets)
        assert expected_cells(sizes, l) == pytest.approx(brute, rel=1e-12)
    assert expected_cells([3] * 6, 4) == 81
    assert expected_cells(BINARY8, 5) == 32


def test_only_l_2_up_to_eps_1_4() -> None:
    # §4.3 / Fig. 3: with n = 2^16, d = 8, k = 3, theta = 1e-3 only l = 2 can be used
    # for eps <= 1.4.
    for eps in np.arange(0.2, 1.41, 0.2):
        choice = choose_views(BINARY8, float(eps), N16, 3)
        assert choice.l_upper == 2 and choice.l == 2
        assert choice.rule == "l_u < k"
    assert choose_views(BINARY8, 1.6, N16, 3).l_upper == 3


# -- the other branches ------------------------------------------------------------------
def test_l_below_k_branch_is_balanced() -> None:
    choice = choose_views([2] * 16, 1.0, N16, 3)
    assert choice.rule == "l_u < k"
    assert (choice.l, choice.m) == (2, min(65, math.comb(16, 2)))
    check_views(choice, 16)
    counts = attribute_counts(choice.views, 16)
    assert counts.max() - counts.min() <= 1
    # m = min(mu, C(d, l)): all 28 pairs of 8 attributes.
    choice = choose_views(BINARY8, 1.0, N16, 3)
    assert (choice.l, choice.m) == (2, 28)
    assert set(choice.views) == set(itertools.combinations(range(8), 2))


def test_l_b_equals_l_u_branch() -> None:
    # eps = 1.6: l_u = 3 = k, so min(mu, C(8, 3)) = 56 views: every 3-set.
    choice = choose_views(BINARY8, 1.6, N16, 3)
    assert choice.rule == "l_b == l_u"
    assert (choice.l, choice.m) == (3, 56) and choice.covers
    check_views(choice, 8)
    # n = 50000: l_u = 3 still, mu = 50 < C(8, 3): mu views of k attributes, balanced,
    # not a cover.
    choice = choose_views(BINARY8, 2.0, 50_000, 3)
    assert choice.rule == "l_b == l_u" and (choice.l, choice.m) == (3, 50)
    assert not choice.covers
    check_views(choice, 8)
    counts = attribute_counts(choice.views, 8)
    assert counts.max() - counts.min() <= 1


def test_fixed_l() -> None:
    choice = choose_views(BINARY8, 2.0, N16, 3, l=3)
    assert (choice.l, choice.m, choice.rule, choice.covers) == (3, 56, "fixed l", True)
    choice = choose_views(BINARY8, 2.0, N16, 3, l=2)
    assert (choice.l, choice.m) == (2, 28)
    choice = choose_views(BINARY8, 2.0, N16, 3, l=5)
    assert choice.m == len(construct_cover(8, 3, 5)) and choice.covers
    check_views(choice, 8)
    choice = choose_views(BINARY8, 2.0, N16, 3, l=8)
    assert choice.views == (tuple(range(8)),)


def test_fixed_m() -> None:
    # l = 3 needs 56 views; 14 views of 4 cover, so 20 views: the cover + 6 extras.
    choice = choose_views(BINARY8, 2.0, N16, 3, m=20)
    assert (choice.l, choice.m, choice.rule) == (4, 20, "fixed m")
    assert choice.covers
    check_views(choice, 8)
    # 10 < 14: no l <= l_u covers; l_u with the greedy maximum coverage.
    choice = choose_views(BINARY8, 2.0, N16, 3, m=10)
    assert (choice.l, choice.m, choice.covers) == (4, 10, False)
    check_views(choice, 8)
    covered = {s for v in choice.views for s in itertools.combinations(v, 3)}
    assert len(covered) >= 10 * 4 - 9  # greedy: nearly disjoint 3-sets at first


def test_fixed_l_and_m() -> None:
    choice = choose_views(BINARY8, 0.5, N16, 3, l=4, m=14)
    assert (choice.l, choice.m, choice.rule, choice.covers) == (4, 14, "fixed l and m", True)
    choice = choose_views(BINARY8, 0.5, N16, 3, l=2, m=5)
    assert (choice.l, choice.m) == (2, 5)
    check_views(choice, 8)


def test_deterministic_and_plan_ready() -> None:
    sizes = [2, 3, 2, 4, 2, 2, 3, 2]
    first = choose_views(sizes, 3.0, N16, 3, rng=5)
    assert choose_views(sizes, 3.0, N16, 3, rng=5) == first
    check_views(first, 8)
    assert first.option.cells == expected_cells(sizes, first.l)
    plan = Plan(Schema.from_sizes(sizes), 3.0, first.views)
    assert plan.m == first.m


def test_summary_lists_options() -> None:
    text = choose_views(BINARY8, 2.0, N16, 3).summary()
    assert "mu=65 l_u=4 l_b=3" in text
    assert "0.00085" in text and "0.00021" in text


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"theta": -1.0}, r"theta \(-1.0\) must be finite and > 0"),
        ({"theta": float("nan")}, r"theta \(nan\) must be finite and > 0"),
        ({"theta": "x"}, r"theta \('x'\) must be a finite number > 0"),
        ({"epsilon": 0.0}, r"epsilon \(0.0\) must be finite and > 0"),
        ({"n": 0}, r"n \(0\) must be an int >= 1"),
        ({"n": 1.5}, r"n \(1.5\) must be an int >= 1"),
        ({"k": 0}, r"k \(0\) must be an int >= 1"),
        ({"k": 9}, r"k \(9\) must be <= d \(8 attributes\)"),
        ({"l": 0}, r"l \(0\) must be an int in \[1, 8\]"),
        ({"l": 9}, r"l \(9\) must be an int in \[1, 8\]"),
        ({"l": True}, r"l \(True\) must be an int in \[1, 8\]"),
        ({"m": 0}, r"m \(0\) must be an int >= 1"),
        ({"l": 7, "m": 9}, r"m \(9\) must be <= C\(8, 7\) = 8 distinct views"),
        ({"m": 100}, r"m \(100\) must be <= C\(8, 4\) = 70 distinct views"),
        ({"sizes": []}, r"sizes \(\(\)\) must name at least one attribute"),
        ({"sizes": [2, 0]}, r"sizes\[1\] \(0\) must be an int >= 1"),
        ({"sizes": "ab"}, r"sizes \('ab'\) must be a sequence"),
    ],
)
def test_bad_input(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = {"sizes": BINARY8, "epsilon": 2.0, "n": N16, "k": 3, **kwargs}
    with pytest.raises(PlanError, match=match):
        choose_views(**args)  # type: ignore[arg-type]


# -- even views --------------------------------------------------------------------------
def test_even_views_attribute_counts_within_one() -> None:
    for d in range(2, 8):
        for l in range(1, d):  # noqa: E741
            for m in range(1, math.comb(d, l) + 1):
                views = even_views(d, l, m, rng=m)
                assert len(set(views)) == m
                assert all(len(v) == l for v in views)
                counts = attribute_counts(views, d)
                assert counts.max() - counts.min() <= 1, (d, l, m, counts)


def test_even_views_pairs_spread() -> None:
    # 65 pairs of 16 attributes: every attribute 8 or 9 times, no pair twice.
    views = even_views(16, 2, 65)
    assert len(set(views)) == 65
    counts = attribute_counts(views, 16)
    assert set(counts) <= {8, 9}
    # Triples: pair counts spread (no guarantee beyond attributes; checked loosely).
    views = even_views(8, 3, 56 // 2)
    pairs = np.zeros((8, 8), np.int64)
    for v in views:
        for a, b in itertools.combinations(v, 2):
            pairs[a, b] += 1
    upper = pairs[np.triu_indices(8, 1)]
    assert upper.max() - upper.min() <= 2


def test_even_views_extends_start() -> None:
    start = construct_cover(8, 3, 4)
    extra = even_views(8, 4, 20, start=start)
    assert not set(extra) & set(start) and len(set(extra)) == 20
    with pytest.raises(PlanError, match=r"m \(57\) must be <= C\(8, 4\) - 14 = 56"):
        even_views(8, 4, 57, start=start)


# -- edges found by the mutation check (docs/testing.md) ---------------------------------
def test_fixed_m_takes_the_smallest_l_whose_built_cover_fits_not_its_bound() -> None:
    # d = 8, k = 3, m = 7: the Schoenheim bound for l = 5 is 7, but no 7 views of 5
    # cover (C(8, 5, 3) = 8); l = 6 covers with 4 views, so l = 6 with 3 extra views
    choice = choose_views(BINARY8, 6.0, N16, 3, m=7)
    assert (choice.l, choice.m, choice.covers) == (6, 7, True)
    check_views(choice, 8)


def test_k_may_equal_d() -> None:
    choice = choose_views([2, 3, 2], 2.0, 1000, 3)
    assert (choice.k, choice.l, choice.m) == (3, 2, 1)
    check_views(choice, 3)
    whole = choose_views([2, 3, 2], 2.0, 1000, 3, l=3)  # the one view of all three
    assert (whole.views, whole.covers) == (((0, 1, 2),), True)


def test_options_run_from_l_2_to_one_past_l_u_and_show_their_covers() -> None:
    choice = choose_views(BINARY8, 2.0, N16, 3)
    assert [o.l for o in choice.options] == list(range(2, choice.l_upper + 2))
    rows = choice.summary().splitlines()[2:-1]
    assert [int(r.split()[0]) for r in rows] == [o.l for o in choice.options]
    shown = [r.split()[3] for r in rows]
    assert shown == ["-" if o.cover_size is None else str(o.cover_size) for o in choice.options]
    assert "-" in shown and "14" in shown
    # a fixed l below 2 is listed too
    ones = choose_views(BINARY8, 2.0, N16, 3, l=1)
    assert [o.l for o in ones.options][:2] == [1, 2]


def test_a_choice_refuses_views_of_the_wrong_size_or_order() -> None:
    choice = choose_views(BINARY8, 2.0, N16, 3)  # l = 4
    with pytest.raises(PlanError, match=r"^views\[0\] \(\[0, 1\]\) must be 4 sorted distinct"):
        dataclasses.replace(choice, views=((0, 1), *choice.views[1:]))
    backwards = (tuple(reversed(choice.views[0])), *choice.views[1:])
    with pytest.raises(PlanError, match=r"^views\[0\] .* must be 4 sorted distinct"):
        dataclasses.replace(choice, views=backwards)


def test_noise_error_of_one_cell_views() -> None:
    # one-category attributes: L = 1, GRR's variance (L - 2 + e^eps) / (e^eps - 1)^2
    e = math.exp(2.0)
    expected = min(4 * e, 1 - 2 + e) / (e - 1) ** 2 * (1 / 2) * (4 / N16)
    assert noise_error(N16, [1] * 4, 2.0, 2) == pytest.approx(expected, rel=1e-12)
    assert noise_error(N16, [1] * 4, 2000.0, 2) == 0.0  # never negative, even where it underflows
    # three cells: GRR's L - 2 = 1 term counts (min(4e^eps, 1 + e^eps) is GRR's here)
    three = min(4 * e, 3 - 2 + e) / (e - 1) ** 2 * 3 * (3 / N16)
    assert noise_error(N16, [3, 3, 3], 2.0, 1) == pytest.approx(three, rel=1e-12)


@pytest.mark.parametrize("bad", [-1, 2.5, True])
def test_even_views_checks_m(bad: object) -> None:
    with pytest.raises(PlanError, match=rf"^m \({bad!r}\) must be an int >= 0$"):
        even_views(5, 2, bad)  # type: ignore[arg-type]


def test_even_views_with_more_ties_than_it_enumerates() -> None:
    # C(20, 5) = 15,504 candidate sets > 4,096: randomised greedy and random draws
    views = even_views(20, 5, 12, rng=1)
    assert len(set(views)) == 12 and all(len(v) == 5 for v in views)
    counts = attribute_counts(views, 20)
    assert counts.max() - counts.min() <= 1


@pytest.mark.parametrize("seed", range(8))
def test_a_view_takes_the_least_loaded_pairs_among_the_tied_attributes(seed: int) -> None:
    # 16 unused attributes, C(16, 4) = 1,820 tied sets: enumerated, so the view is the
    # set of least pair load (unique here), found by brute force
    gen = np.random.default_rng(seed)
    pairs = np.triu(gen.integers(0, 1000, (16, 16)), 1)
    pairs = pairs + pairs.T
    loads = {
        s: sum(int(pairs[a, b]) for a, b in itertools.combinations(s, 2))
        for s in itertools.combinations(range(16), 4)
    }
    best = min(loads, key=loads.__getitem__)
    assert sorted(loads.values())[1] > loads[best]
    got = _next_even(16, 4, np.zeros(16, np.int64), pairs, set(), gen)
    assert got == best


def test_when_every_balanced_set_is_used_the_least_loaded_unused_set_is_taken() -> None:
    # counts 0 on attributes 0-2, so the balanced sets are the pairs among them, all
    # used; then the unused set of least attribute load (1: one of 3, 4 with one of
    # 0-2), and among those the least pair load: (1, 4), though (3, 4) has no pair load
    counts = np.array([0, 0, 0, 1, 1])
    pairs = np.full((5, 5), 2)
    pairs[1, 4] = pairs[4, 1] = 1
    pairs[3, 4] = pairs[4, 3] = 0
    used = {(0, 1), (0, 2), (1, 2)}
    assert _next_even(5, 2, counts, pairs, used, np.random.default_rng(0)) == (1, 4)


@pytest.mark.parametrize("weight", [1, 8])
def test_the_fallback_puts_attribute_load_before_any_pair_load(weight: int) -> None:
    # l = 3: the balanced set (0, 1, 2) is used, so every set is searched. Sets with
    # one of 3, 4 carry attribute load 1 and pair load 2 * weight; (0, 3, 4) carries
    # attribute load 2 but no pair load. Attribute load comes first, whatever the
    # largest pair count (weight 1 or 8): a multiplier at or below the pair loads'
    # range (C(3, 2) * weight) would take (0, 3, 4)
    counts = np.array([0, 0, 0, 1, 1])
    pairs = np.full((5, 5), weight)
    np.fill_diagonal(pairs, counts)
    for a, b in ((0, 3), (0, 4), (3, 4)):
        pairs[a, b] = pairs[b, a] = 0
    got = _next_even(5, 3, counts, pairs, {(0, 1, 2)}, np.random.default_rng(0))
    assert int(counts[list(got)].sum()) == 1
    assert got in {(0, 1, 3), (0, 1, 4), (0, 2, 3), (0, 2, 4)}  # pair load 2 * weight


@pytest.mark.parametrize("seed", range(5))
def test_the_greedy_pick_adds_the_attribute_of_least_pair_load(seed: int) -> None:
    # C(20, 5) = 15,504 tied sets: too many to enumerate, so greedy picks (and random
    # draws). Pair load w_a + w_b with w = 0 on four attributes, 100 elsewhere: after
    # its random first attribute, each greedy pick adds the attribute of least w, so
    # every pick holds the four light ones (a random draw holds them with chance
    # 16 / 15,504)
    light = [3, 7, 11, 18]
    w = np.full(20, 100)
    w[light] = 0
    pairs = w[:, None] + w[None, :]
    got = _next_even(20, 5, np.zeros(20, np.int64), pairs, set(), np.random.default_rng(seed))
    assert set(light) <= set(got)


@pytest.mark.parametrize(
    ("d", "l", "m", "start"),
    [(6, 2, 10, [(0, 4), (3, 4)]), (7, 3, 27, [(2, 5, 6), (0, 4, 6), (1, 4, 6), (1, 4, 5)])],
)
def test_start_views_count_once(d: int, l: int, m: int, start: list[tuple[int, ...]]) -> None:  # noqa: E741
    # the start views and the new ones together use every attribute equally often, up
    # to 1 (6 x 4 uses at d = 6; 93 uses over 7 attributes): counting a start view
    # twice makes the new views avoid its attributes (spreads of 2 and 3)
    for seed in range(10):
        extra = even_views(d, l, m, rng=seed, start=start)
        counts = attribute_counts((*start, *extra), d)
        assert counts.max() - counts.min() <= 1


def test_the_fallback_draws_until_it_finds_the_last_unused_set() -> None:
    # C(21, 6) = 54,264 > 50,000 sets: sampled, not enumerated; one left unused
    every = itertools.combinations(range(21), 6)
    left = (2, 3, 5, 8, 13, 20)
    used = {s for s in every if s != left}
    got = _next_even(
        21, 6, np.zeros(21, np.int64), np.zeros((21, 21), np.int64), used, np.random.default_rng(0)
    )
    assert got == left


class _CountingGenerator:
    """A seeded Generator that counts its ``random`` calls (one per batch of draws)."""

    def __init__(self, seed: int) -> None:
        self.gen = np.random.default_rng(seed)
        self.batches = 0

    def random(self, size: tuple[int, int]) -> np.ndarray:
        self.batches += 1
        return self.gen.random(size)

    def __getattr__(self, name: str) -> object:
        return getattr(self.gen, name)


def test_the_fallback_checks_every_set_of_each_draw() -> None:
    # the one unused set of C(21, 6) = 54,264 is in a batch of 4,096 draws with chance
    # 7.3%: about 14 batches, more than 200 with chance 0.927^200 < 1e-6 (seed fixed).
    # Checking only l = 6 sets of each batch would take about 9,000 batches (the
    # answer would be the same, found 600 times slower)
    every = itertools.combinations(range(21), 6)
    left = (1, 4, 6, 9, 15, 19)
    used = {s for s in every if s != left}
    gen = _CountingGenerator(3)
    got = _next_even(21, 6, np.zeros(21, np.int64), np.zeros((21, 21), np.int64), used, gen)  # type: ignore[arg-type]
    assert got == left
    assert gen.batches < 200


def _swap_load(v: tuple[int, ...], a: int, b: int, pairs: np.ndarray) -> int:
    rest = [x for x in v if x != a]
    return int(pairs[b, rest].sum() - pairs[a, rest].sum())


def test_a_repair_moves_the_use_inside_the_view_of_least_pair_load() -> None:
    # replayed rule: after one repair step, the view that changed is one whose swap
    # (a -> b) adds the least pair load, pairs[b, rest] - pairs[a, rest]
    gen = np.random.default_rng(3)
    checked = 0
    for _ in range(60):
        pool = [s for s in itertools.combinations(range(7), 3) if 0 in s or gen.random() < 0.2]
        views = [pool[i] for i in gen.choice(len(pool), size=8, replace=False)]
        counts = attribute_counts(tuple(views), 7)
        pairs = np.zeros((7, 7), np.int64)
        for v in views:
            pairs[np.ix_(v, v)] += 1
        before = list(views)
        if not _repair_step(views, counts.copy(), pairs.copy(), set(views)):
            continue
        (j,) = [i for i in range(8) if views[i] != before[i]]
        (a,) = set(before[j]) - set(views[j])
        (b,) = set(views[j]) - set(before[j])

        eligible = [
            v
            for v in before
            if a in v and b not in v and tuple(sorted({*v} - {a} | {b})) not in set(before)
        ]
        scores = {v: _swap_load(v, a, b, pairs) for v in eligible}
        assert scores[before[j]] == min(scores.values())
        checked += len(set(scores.values())) > 1
    assert checked >= 10  # instances where the choice mattered


def test_a_repair_takes_the_most_used_attribute_that_can_move() -> None:
    # attribute 0 (4 uses) cannot move to 5 (0 uses): each of its swaps gives a used
    # set; the next most used, 1 (3 uses), can: (0, 1) becomes (0, 5), not a view of
    # the less used 2 or 3
    views = [(0, 1), (0, 2), (0, 3), (0, 4), (1, 2), (1, 3)]
    counts = attribute_counts(tuple(views), 6)
    assert counts.tolist() == [4, 3, 2, 2, 1, 0]
    pairs = np.zeros((6, 6), np.int64)
    for v in views:
        pairs[np.ix_(v, v)] += 1
    used = {*views, (1, 5), (2, 5), (3, 5), (4, 5)}
    assert _repair_step(views, counts, pairs, used)
    assert views[0] == (0, 5) and views[1:] == [(0, 2), (0, 3), (0, 4), (1, 2), (1, 3)]
    # the counts follow the swap: those of the new views, counted afresh
    assert counts.tolist() == attribute_counts(tuple(views), 6).tolist()
    fresh = np.zeros((6, 6), np.int64)
    for v in views:
        fresh[np.ix_(v, v)] += 1
    np.testing.assert_array_equal(pairs, fresh)
    assert used == {*views, (1, 5), (2, 5), (3, 5), (4, 5)}  # (0, 1) gone, (0, 5) in


def test_algorithm_1_edges() -> None:
    # mu = max(1, floor(theta n)): one view when theta n < 1
    assert choose_views(BINARY8, 2.0, 500, 3).mu == 1
    # only l fixed, l = k: the cover of every k-set (all C(8, 3) = 56), even above mu
    choice = choose_views(BINARY8, 2.0, 10_000, 3, l=3)
    assert (choice.mu, choice.m, choice.covers) == (10, 56, True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        choice.option.l = 2  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        choice.l = 2  # type: ignore[misc]


def test_fixed_m_edges_and_the_smallest_inputs() -> None:
    # m = C(8, 3) = 56: every 3-set is a view (l = k)
    every = choose_views(BINARY8, 2.0, N16, 3, m=56)
    assert (every.l, every.covers) == (3, True)
    # eps 3 (l_u = 6), m = 8: l = 5 is the smallest whose cover fits (C(8, 5, 3) = 8)
    choice = choose_views(BINARY8, 3.0, N16, 3, m=8)
    assert (choice.l_upper, choice.l, choice.covers) == (6, 5, True)
    # one user, 1-way marginals, a one-category attribute: all accepted
    assert choose_views([2, 1, 3], 1.0, 1, 1).n == 1
    # an option's NE is k * NE over k, and the formula's
    for o in choose_views(BINARY8, 2.0, N16, 3).options:
        assert o.ne == pytest.approx(noise_error(N16, BINARY8, 2.0, o.l), rel=1e-12)
        assert o.k_ne == pytest.approx(3 * o.ne, rel=1e-12)
    # even_views' seed is 0 by default
    assert even_views(8, 3, 10) == even_views(8, 3, 10, rng=0)
    assert even_views(8, 3, 10) != even_views(8, 3, 10, rng=1)


def test_counts_equal_to_every_view_and_the_defaults() -> None:
    # m may equal C(d, l): every 7-set (8), or every 4-set when m picks l (70)
    assert choose_views(BINARY8, 2.0, N16, 3, l=7, m=8).m == 8
    every = choose_views(BINARY8, 2.0, N16, 3, m=70)
    assert (every.l, every.m, len(set(every.views))) == (4, 70, 70)
    # Schoenheim's bound is listed from l = k on: C(8, 3, 3) = 56
    choice = choose_views(BINARY8, 2.0, N16, 3)
    assert [o.cover_bound for o in choice.options] == [None, 56, 14, 7]
    # the seed is 0 by default
    assert choice == choose_views(BINARY8, 2.0, N16, 3, rng=0)
    assert choice.views != choose_views(BINARY8, 2.0, N16, 3, rng=1).views


def test_the_min_max_rule_with_l_u_at_d() -> None:
    # eps 4: l_u = d = 8, l_b = 3; the rule compares l = 3..8 only (no l = 9 of 8)
    choice = choose_views(BINARY8, 4.0, N16, 3)
    assert (choice.rule, choice.l_upper, choice.l_lower) == ("min max(SE, k*NE)", 8, 3)
    assert (choice.l, choice.m, choice.covers) == (5, 8, True)


def test_l_b_stops_above_the_first_cover_that_does_not_fit() -> None:
    # n = 20,000: mu = 20; the 3-set cover needs 56 views, the 4-set one 14, so
    # l_b = 4 (lines 7-9 of Algorithm 1), and l_u = 6 at eps 4
    choice = choose_views(BINARY8, 4.0, 20_000, 3)
    assert (choice.mu, choice.l_upper, choice.l_lower, choice.l, choice.m) == (20, 6, 4, 5, 8)


def test_the_min_max_rule_starts_from_an_error_of_1() -> None:
    # k = 1, eps 0.04, n = 8,000: max(SE, k NE) is 1.25 at l = 1 and 3.65 at l = 2,
    # both >= 1, so neither beats the paper's start (1) and Algorithm 1 keeps l_u, mu
    assert 1 <= noise_error(8000, BINARY8, 0.04, 1) < 2
    choice = choose_views(BINARY8, 0.04, 8000, 1)
    assert (choice.rule, choice.l_lower, choice.l, choice.m) == ("min max(SE, k*NE)", 1, 2, 8)


@pytest.mark.parametrize("seed", range(10))
def test_the_fallback_searches_every_set_when_there_are_few(seed: int) -> None:
    # C(22, 4) = 7,315 <= 50,000 sets: all searched, so the one unused set of least
    # load, (0, 1, 2, 21), is found whatever the seed (4,096 random draws would miss
    # it more often than not)
    counts = np.array([0] * 4 + [1] * 18)
    pairs = np.ones((22, 22), np.int64)
    for a, b in itertools.combinations((0, 1, 2, 21), 2):
        pairs[a, b] = pairs[b, a] = 0
    used = {(0, 1, 2, 3)}
    got = _next_even(22, 4, counts, pairs, used, np.random.default_rng(seed))
    assert got == (0, 1, 2, 21)


@pytest.mark.parametrize("seed", range(10))
def test_extra_views_count_the_start_views_uses(seed: int) -> None:
    # attribute 0 is in all three start views, the others once or never: the two new
    # views take the least used attributes, so never 0
    extra = even_views(5, 2, 2, rng=seed, start=[(0, 1), (0, 2), (0, 3)])
    assert all(0 not in v for v in extra) and 4 in extra[0]
