"""The planner's fast view designs (designs.py): the rules each design states, checked
by replaying them on the views it returns, over several seeds; and every input check
with its message."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from calmkit_aggregator.planning import designs
from calmkit_aggregator.planning.designs import (
    DependentStream,
    SpreadStream,
    _least_used,
    _round,
    balanced_views,
    dependent_views,
    pilot_views,
    spread_views,
)
from calmkit_client import PlanError

SEEDS = range(6)


def _is_design(views, attrs, l, m, start=()) -> None:  # type: ignore[no-untyped-def]  # noqa: E741
    """m distinct sorted l-sets of attrs, none of them in start."""
    assert len(views) == m and len(set(views)) == m
    taken = {tuple(sorted(v)) for v in start}
    for v in views:
        assert len(v) == l and list(v) == sorted(set(v)) and set(v) <= set(attrs)
        assert v not in taken


# -- spread designs ------------------------------------------------------------------


def _replay_round(d: int, l: int, pairs: np.ndarray, blocks: list[list[int]]) -> None:  # noqa: E741
    """The round's rule: blocks deal every position once (a short last block is filled
    from the positions not in it), each grows by a position of least load (its pairs'
    uses with the block so far) among the positions not dealt yet, or, once all are
    dealt, among those not in the block."""
    assert len(blocks) == math.ceil(d / l)
    free = np.ones(d, dtype=bool)
    for block in blocks:
        assert len(block) == l == len(set(block))
        assert free[block[0]]
        free[block[0]] = False
        load = pairs[block[0]].astype(np.float64)
        for j, pick in enumerate(block[1:], start=1):
            pool = free.copy() if free.any() else ~np.isin(np.arange(d), block[:j])
            assert pool[pick], (block, j)
            assert load[pick] == load[pool].min(), (block, j, load[pool])
            free[pick] = False
            load += pairs[pick]
    assert not free.any()


@pytest.mark.parametrize(("d", "l"), [(7, 2), (9, 3), (10, 4), (6, 6), (5, 1)])
def test_a_round_grows_each_block_by_a_least_used_position(d: int, l: int) -> None:  # noqa: E741
    # pair uses 0..3 (symmetric): loads differ by whole numbers, ties are random
    for seed in range(30):
        gen = np.random.default_rng(seed)
        raw = gen.integers(0, 4, (d, d))
        pairs = np.triu(raw, 1) + np.triu(raw, 1).T
        _replay_round(d, l, pairs, _round(d, l, pairs, gen))


def test_spread_views_are_new_distinct_l_sets_and_a_stream() -> None:
    attrs = [3, 5, 6, 9, 10, 12, 14, 15]
    start = [(3, 5), (6, 9, 10), (5, 6)]
    for seed in SEEDS:
        views = spread_views(attrs, 2, 20, rng=seed, start=start)
        _is_design(views, attrs, 2, 20, start)
        # the stream deals its rounds once: a short design is a prefix of a longer one
        stream = SpreadStream(attrs, 2, rng=seed, start=start)
        assert stream.first(5) == views[:5] and stream.first(20) == views
        assert stream.first(25) == spread_views(attrs, 2, 25, rng=seed, start=start)
    # every l-set, and the l-sets left over by start
    _is_design(spread_views(range(7), 3, 35), range(7), 3, 35)
    taken = [(3, 5), (0, 1), (4, 5)]
    _is_design(spread_views(range(6), 2, 12, start=taken), range(6), 2, 12, taken)


@pytest.mark.parametrize(("d", "l", "m"), [(12, 4, 30), (12, 3, 28), (15, 3, 35)])
def test_spread_views_hold_every_attribute_equally_over_many_rounds(
    d: int,
    l: int,  # noqa: E741
    m: int,
) -> None:
    # m l / d whole rounds (up to 10), far from C(d, l): random rounds keep finding new
    # blocks, so every attribute is dealt once a round
    for seed in SEEDS:
        counts = np.bincount([a for v in spread_views(range(d), l, m, rng=seed) for a in v])
        assert counts.min() == counts.max() == m * l // d


def test_spread_views_avoid_the_pairs_start_holds() -> None:
    # start: a perfect matching of 6 attributes; two triples can avoid all its pairs,
    # and the least-used rule finds them
    start = [(0, 3), (1, 4), (2, 5)]
    for seed in range(10):
        views = spread_views(range(6), 3, 2, rng=seed, start=start)
        held = {p for v in views for p in itertools.combinations(v, 2)}
        assert not held & set(start), views


def test_least_used_sets_come_last_in_order_of_their_attributes_uses() -> None:
    chosen = [(0, 1), (0, 2), (0, 3), (1, 2)]  # uses: 0: 3, 1: 2, 2: 2, 3: 1, 4: 0
    used = set(chosen)
    free = _least_used([0, 1, 2, 3, 4], 2, 6, used, chosen)
    # sums: (3,4) 1, (1,4) 2, (2,4) 2, (0,4) 3, (1,3) 3, (2,3) 3
    assert free == [(3, 4), (1, 4), (2, 4), (0, 4), (1, 3), (2, 3)]


def test_spread_views_fall_back_to_the_least_used_sets_near_every_set() -> None:
    # m close to C(d, l): once rounds stop finding new blocks, the rest are the unused
    # sets of least-used attributes; the design stays distinct and complete
    for seed in SEEDS:
        views = spread_views(range(6), 3, 19, rng=seed)
        _is_design(views, range(6), 3, 19)
        counts = np.bincount([a for v in views for a in v], minlength=6)
        assert counts.max() - counts.min() <= 1  # 57 slots: 9 or 10 each


def test_spread_inputs_are_checked() -> None:
    for bad in (0, 7, 2.5, True):
        with pytest.raises(PlanError, match=rf"^l \({bad!r}\) must be an int in \[1, 6\] \(6 "):
            spread_views(range(6), bad, 1)  # type: ignore[arg-type]
    for bad in (-1, 16, 2.5, True):
        with pytest.raises(
            PlanError, match=rf"^m \({bad!r}\) must be an int in \[0, 15\] \(distinct"
        ):
            spread_views(range(6), 2, bad)  # type: ignore[arg-type]
    # room: the l-sets of attrs that start does not hold already (a repeated one, one of
    # another size or with another attribute do not count)
    start = [(0, 1), (1, 0), (1, 2, 3), (5, 7)]
    assert len(spread_views(range(6), 2, 14, start=start)) == 14
    with pytest.raises(PlanError, match=r"m \(15\) must be an int in \[0, 14\]"):
        spread_views(range(6), 2, 15, start=start)
    with pytest.raises(PlanError, match=r"m \(1\) must be an int in \[0, 0\]"):
        spread_views(range(3), 3, 1, start=[(0, 1, 2)])  # the whole pool is taken
    assert spread_views(range(6), 2, 0) == ()
    default = spread_views(range(9), 3, 6)
    assert default == spread_views(range(9), 3, 6, rng=0) == SpreadStream(range(9), 3).first(6)


@pytest.mark.parametrize(("d", "l", "m1", "m2"), [(6, 3, 15, 19), (7, 2, 18, 21), (6, 2, 12, 15)])
def test_a_spread_stream_read_twice_near_every_set_is_the_longer_design(
    d: int,
    l: int,  # noqa: E741
    m1: int,
    m2: int,
) -> None:
    for seed in SEEDS:
        stream = SpreadStream(range(d), l, rng=seed)
        first = stream.first(m1)
        assert stream.first(m2) == spread_views(range(d), l, m2, rng=seed)
        assert stream.first(m2)[:m1] == first == stream.first(m1)


class _Rounds:
    """Stands in for ``_round``: hands out ``script`` (lists of blocks) in turn, then
    ``rest`` forever, and records the pair counts each call was given."""

    def __init__(self, script: list[list[list[int]]], rest: list[list[int]]) -> None:
        self.script, self.rest, self.given = list(script), rest, []  # type: ignore[var-annotated]

    def __call__(self, d, l, pairs, gen, gain=None, ranked=None):  # type: ignore[no-untyped-def]  # noqa: E741
        self.given.append(pairs.copy())
        return self.script.pop(0) if self.script else self.rest


def test_spread_falls_back_after_8_fruitless_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    # start holds (0, 1) and (2, 3); rounds that deal only those blocks add nothing: after
    # 8 of them in a row the rest comes from the least-used unused sets
    rounds = _Rounds([], [[0, 1], [2, 3]])
    monkeypatch.setattr(designs, "_round", rounds)
    views = SpreadStream(range(4), 2, rng=0, start=[(0, 1), (2, 3)]).first(1)
    assert len(rounds.given) == 8 and views == ((0, 2),)
    # a round that adds blocks resets the count
    rounds = _Rounds([[[0, 2], [1, 3]]], [[0, 1], [2, 3]])
    monkeypatch.setattr(designs, "_round", rounds)
    views = SpreadStream(range(4), 2, rng=0, start=[(0, 1), (2, 3)]).first(3)
    assert len(rounds.given) == 1 + 8 and views == ((0, 2), (1, 3), (0, 3))


def test_a_design_read_in_pieces_after_the_fallback_is_the_design_read_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One round adds (0, 2) and (1, 3), then rounds only deal blocks start holds: the
    # fallback orders the unused sets by their attributes' uses once, and reading 3 then
    # 5 views gives the 5 views read at once (re-ordering by the uses after the first
    # piece would not: (1, 5) and (2, 5) would follow (0, 4)).
    start = [(0, 1), (2, 3), (4, 5)]

    def stream() -> SpreadStream:
        rounds = _Rounds([[[0, 2], [1, 3], [4, 5]]], [[0, 1], [2, 3], [4, 5]])
        monkeypatch.setattr(designs, "_round", rounds)
        return SpreadStream(range(6), 2, rng=0, start=start)

    at_once = stream().first(5)
    assert at_once == ((0, 2), (1, 3), (0, 4), (0, 5), (1, 4))
    pieces = stream()
    assert pieces.first(3) == at_once[:3] and pieces.first(5) == at_once
    assert pieces.first(12) == stream().first(12)  # every unused set, in one order


def test_a_piece_the_rounds_fill_exactly_leaves_the_fallback_to_the_next_piece(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The first piece (2 views) is exactly what the first round deals, so no fallback is
    # needed yet; the second round adds (0, 2) and (1, 3), then rounds add nothing and
    # the fallback must order the sets still unused then ((0, 3), (1, 2)), not the ones
    # unused after the first piece (that would repeat (0, 2)).
    def stream() -> SpreadStream:
        rounds = _Rounds([[[0, 1], [2, 3]], [[0, 2], [1, 3]]], [[0, 1], [2, 3]])
        monkeypatch.setattr(designs, "_round", rounds)
        return SpreadStream(range(4), 2, rng=0)

    at_once = stream().first(6)
    assert at_once == ((0, 1), (2, 3), (0, 2), (1, 3), (0, 3), (1, 2))
    pieces = stream()
    assert pieces.first(2) == at_once[:2]
    assert pieces.first(6) == at_once


def test_rounds_see_how_often_start_and_chosen_views_hold_each_pair(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # each round is given pairs[a, b] = how many views (start's and those chosen so far)
    # hold both a and b; a block becomes a view unless some view already is it
    real = designs._round
    calls: list[tuple[np.ndarray, list[list[int]]]] = []

    def recording(d, l, pairs, gen, gain=None, ranked=None):  # type: ignore[no-untyped-def]  # noqa: E741
        blocks = real(d, l, pairs, gen, gain, ranked)
        calls.append((pairs.copy(), blocks))
        return blocks

    monkeypatch.setattr(designs, "_round", recording)
    start = [(0, 1, 2), (1, 2), (3, 4), (4, 7, 9)]  # 7 and 9 are not among the attrs
    views = spread_views(range(7), 3, 20, rng=4, start=start)
    assert len(calls) >= 3
    counts = np.zeros((7, 7), dtype=np.int64)
    for v in start:
        for a, b in itertools.permutations([a for a in v if a < 7], 2):
            counts[a, b] += 1
    used, out = {tuple(sorted(v)) for v in start}, []
    off = ~np.eye(7, dtype=bool)
    for pairs, blocks in calls:
        np.testing.assert_array_equal(pairs[off], counts[off])
        for block in blocks:
            view = tuple(sorted(block))
            if view not in used:
                used.add(view)
                out.append(view)
                for a, b in itertools.permutations(view, 2):
                    counts[a, b] += 1
    assert tuple(out[:20]) == views


# -- dependent designs ---------------------------------------------------------------


def _weights(d: int, gen: np.random.Generator, zero: float = 0.5) -> np.ndarray:
    """Symmetric pair weights with about ``zero`` of them 0 (pairs that do not depend)."""
    raw = gen.uniform(0.0, 1.0, (d, d)) * (gen.random((d, d)) >= zero)
    return np.triu(raw, 1) + np.triu(raw, 1).T


def _replay_dependent(views, attrs, l, w, start=()) -> None:  # type: ignore[no-untyped-def]  # noqa: E741
    """The dependent design's rules, view by view: while some attribute is in no view
    (start included), a view holds only such attributes, or all of them when fewer than
    l are left; after that, while some pair no view holds depends (weight > 0), a view
    holds one such pair of the largest weight."""
    held: set[int] = {a for v in start for a in v if a in set(attrs)}
    pairs: set[tuple[int, int]] = {p for v in start for p in itertools.combinations(sorted(v), 2)}
    for v in views:
        live = set(attrs) - held
        if len(live) >= l:
            assert set(v) <= live, (v, live)
        elif live:
            assert live <= set(v), (v, live)
        else:
            unheld = [
                w[a, b] for a, b in itertools.combinations(sorted(attrs), 2) if (a, b) not in pairs
            ]
            top = max(unheld, default=0.0)
            if top > 0:
                best = max(w[a, b] for a, b in itertools.combinations(v, 2) if (a, b) not in pairs)
                assert best >= top * (1 - 1e-12), (v, best, top)
        held |= set(v)
        pairs |= set(itertools.combinations(v, 2))


@pytest.mark.parametrize(("d", "l", "m"), [(9, 2, 20), (10, 3, 15), (7, 4, 12), (8, 2, 27)])
def test_dependent_views_follow_their_rules(d: int, l: int, m: int) -> None:  # noqa: E741
    attrs = list(range(1, d + 1))  # positions: weights are over 0..d
    for seed in SEEDS:
        gen = np.random.default_rng(seed)
        w = _weights(d + 1, gen)
        start = [tuple(sorted(gen.choice(attrs, 2, replace=False).tolist()))]
        views = dependent_views(attrs, l, m, w, rng=seed, start=start)
        _is_design(views, attrs, l, m, start)
        _replay_dependent(views, attrs, l, w, start)
        # a stream: its first views are those of any shorter design
        stream = DependentStream(attrs, l, w, rng=seed, start=start)
        assert stream.first(3) == views[:3] and stream.first(m) == views


def test_dependent_views_hold_start_as_held() -> None:
    # start holds (0, 5): its attributes are held, so the first views pair up the other
    # eight, and the pair's weight is spent
    w = np.full((10, 10), 1.0)
    w[0, 5] = w[5, 0] = 100.0
    for seed in SEEDS:
        views = dependent_views(range(10), 2, 4, w, rng=seed, start=[(0, 5)])
        assert sorted(a for v in views for a in v) == [1, 2, 3, 4, 6, 7, 8, 9]


def test_dependent_views_without_dependence_spread_every_set() -> None:
    # no pair depends: every attribute first, then spread rounds, then every set
    w = np.zeros((6, 6))
    for seed in SEEDS:
        views = dependent_views(range(6), 2, 15, w, rng=seed)
        _is_design(views, range(6), 2, 15)
        assert sorted(a for v in views[:3] for a in v) == list(range(6))
        triples = dependent_views(range(6), 3, 20, w, rng=seed)
        _is_design(triples, range(6), 3, 20)


def test_dependent_inputs_are_checked() -> None:
    w = np.zeros((6, 6))
    for bad in (1, 7, 2.5, True):
        with pytest.raises(PlanError, match=rf"^l \({bad!r}\) must be an int in \[2, 6\] \(6 "):
            dependent_views(range(6), bad, 1, w)  # type: ignore[arg-type]
    for bad in (-1, 16, 2.5, True):
        with pytest.raises(
            PlanError, match=rf"^m \({bad!r}\) must be an int in \[0, 15\] \(distinct"
        ):
            dependent_views(range(6), 2, bad, w)  # type: ignore[arg-type]
    for shape in ((6,), (6, 7), (7, 6), (5, 5), (6, 6, 1)):
        msg = rf"^weights \(shape {re_shape(shape)}\) must be square over every attribute$"
        with pytest.raises(PlanError, match=msg):
            dependent_views(range(6), 2, 1, np.zeros(shape))
    start = [(0, 1), (1, 0), (1, 2, 3), (5, 7)]
    assert len(dependent_views(range(6), 2, 14, w, start=start)) == 14
    with pytest.raises(PlanError, match=r"m \(15\) must be an int in \[0, 14\]"):
        dependent_views(range(6), 2, 15, w, start=start)
    with pytest.raises(PlanError, match=r"m \(1\) must be an int in \[0, 0\]"):
        dependent_views(range(3), 3, 1, np.zeros((3, 3)), start=[(0, 1, 2)])
    assert dependent_views(range(6), 2, 0, w) == ()
    w = _weights(9, np.random.default_rng(1))
    default = dependent_views(range(9), 3, 6, w)
    assert default == dependent_views(range(9), 3, 6, w, rng=0)
    assert default == DependentStream(range(9), 3, w).first(6)


def test_without_dependence_the_rest_is_the_spread_stream_from_the_views_so_far() -> None:
    # zero weights: views of the attributes in no view first (start holds 0 and 1), then,
    # every attribute held, SpreadStream with the same generator and every view as start
    w = np.zeros((8, 8))
    for seed in SEEDS:
        views = dependent_views(range(8), 2, 20, w, rng=seed, start=[(0, 1)])
        _is_design(views, range(8), 2, 20, [(0, 1)])
        assert sorted(a for v in views[:3] for a in v) == [2, 3, 4, 5, 6, 7]
        gen = np.random.default_rng(seed)
        gen.random(28)  # the ties of the pairs' order
        gen.random(8), gen.random(8), gen.random(8)  # one tie draw per grown view
        rest = SpreadStream(range(8), 2, gen, start=[(0, 1), *views[:3]]).first(17)
        assert views[3:] == rest
        # read long, then short: the same prefix
        stream = DependentStream(range(8), 2, w, rng=seed, start=[(0, 1)])
        assert stream.first(20) == views and stream.first(2) == views[:2]


@pytest.mark.parametrize("l", [2, 3, 4, 5])
def test_a_dependent_view_spends_every_pair_it_holds(l: int) -> None:  # noqa: E741
    # every pair of the view (not only those next to each other in the order it grew)
    # loses its weight, and the count of positive unheld pairs follows
    gen = np.random.default_rng(l)
    w = _weights(9, gen, zero=0.0)
    stream = DependentStream(range(9), l, w, rng=l)
    for m in range(1, 4):
        views = stream.first(m)
        held = {p for v in views for p in itertools.combinations(v, 2)}
        for a, b in itertools.combinations(range(9), 2):
            assert stream.gain[a, b] == stream.gain[b, a] == (0.0 if (a, b) in held else w[a, b])
        assert stream.positive == 36 - len(held)
        assert (
            stream.uses.tolist() == np.bincount([a for v in views for a in v], minlength=9).tolist()
        )


def test_a_view_grows_by_the_most_unheld_dependence_then_the_least_used() -> None:
    # Every attribute is held by start; uses: 0, 1, 5: 1; 3, 4: 2; 2: 3. The best unheld
    # pair (0, 1) starts the view; 2 adds the most unheld dependence, with (0, 2) = 5,
    # though it is the most used.
    start = [(0, 3), (1, 4), (2, 5), (2, 3), (2, 4)]
    w = np.zeros((6, 6))
    w[0, 1] = w[1, 0] = 10.0
    w[0, 2] = w[2, 0] = 5.0
    for seed in SEEDS:
        assert dependent_views(range(6), 3, 1, w, rng=seed, start=start) == ((0, 1, 2),)
    # no unheld dependence to add: the least-used attribute, though its pair with the
    # view (0, 2) is held (a held pair adds no dependence, as an unheld one of weight 0)
    start = [(0, 2), (1, 3), (3, 4, 5), (4, 5)]  # uses: 0, 1, 2: 1; 3, 4, 5: 2
    w = np.zeros((6, 6))
    w[0, 1] = w[1, 0] = 10.0
    for seed in range(100):  # random ties come after the uses, whatever they draw
        assert dependent_views(range(6), 3, 1, w, rng=seed, start=start) == ((0, 1, 2),)


# -- balanced designs: spread rounds that hold the heaviest pairs -----------------------


def _replay_weighted_round(
    d: int,
    l: int,  # noqa: E741
    pairs: np.ndarray,
    gain: np.ndarray,
    blocks: list[list[int]],
) -> None:
    """The weighted round's rule: blocks deal every position once; a block starts from
    the free pair of largest gain and grows by the largest gain with the block among
    the positions not dealt yet (once all are dealt, those not in the block)."""
    assert len(blocks) == math.ceil(d / l)
    free = np.ones(d, dtype=bool)
    for block in blocks:
        assert len(block) == l == len(set(block)) and free[block[0]]
        if free.sum() >= 2:  # gains are continuous and > 0 off the diagonal: no ties
            top = np.where(np.outer(free, free), gain, 0.0).max()
            assert gain[block[0], block[1]] == top, (block, top)
        free[block[0]] = False
        gained = gain[block[0]].copy()
        for j, pick in enumerate(block[1:], start=1):
            pool = free.copy() if free.any() else ~np.isin(np.arange(d), block[:j])
            assert pool[pick] and gained[pick] == gained[pool].max(), (block, j)
            free[pick] = False
            gained += gain[pick]
    assert not free.any()


@pytest.mark.parametrize(("d", "l"), [(7, 2), (9, 3), (10, 4), (8, 2), (24, 2), (30, 3)])
def test_a_weighted_round_deals_every_position_and_takes_the_heaviest_pairs(
    d: int,
    l: int,  # noqa: E741
) -> None:
    for seed in range(30):
        gen = np.random.default_rng(seed)
        raw = gen.integers(0, 4, (d, d))
        pairs = np.triu(raw, 1) + np.triu(raw, 1).T
        gain = _weights(d, gen, zero=0.0)
        _replay_weighted_round(d, l, pairs, gain, _round(d, l, pairs, gen, gain))


class _Recorded:
    """Wraps ``_round``: records the blocks of every round it deals."""

    def __init__(self) -> None:
        self.rounds: list[list[list[int]]] = []

    def __call__(self, d, l, pairs, gen, gain=None, ranked=None):  # type: ignore[no-untyped-def]  # noqa: E741
        blocks = _round(d, l, pairs, gen, gain, ranked)
        self.rounds.append(blocks)
        return blocks


@pytest.mark.parametrize(("d", "l", "m"), [(12, 2, 30), (12, 3, 28), (15, 3, 35)])
def test_balanced_views_are_weighted_rounds_and_hold_heavier_pairs_than_spread(
    monkeypatch: pytest.MonkeyPatch,
    d: int,
    l: int,  # noqa: E741
    m: int,
) -> None:
    for seed in SEEDS:
        w = _weights(d, np.random.default_rng(seed), zero=0.0)
        recorded = _Recorded()
        with monkeypatch.context() as patch:
            patch.setattr(designs, "_round", recorded)
            views = balanced_views(range(d), l, m, w, rng=seed)
        _is_design(views, range(d), l, m)
        # the views are the rounds' blocks in order, a block already held skipped; every
        # round deals each attribute once (the replay test above checks how)
        dealt, seen = [], set()
        for blocks in recorded.rounds:
            assert {a for b in blocks for a in b} == set(range(d))
            for b in blocks:
                v = tuple(sorted(b))
                if v not in seen:
                    seen.add(v)
                    dealt.append(v)
        assert tuple(dealt[:m]) == views
        assert views[0] == tuple(sorted(np.unravel_index(np.argmax(w), w.shape))) or l > 2
        held = {p for v in views for p in itertools.combinations(v, 2)}
        spread = {
            p for v in spread_views(range(d), l, m, rng=seed) for p in itertools.combinations(v, 2)
        }
        assert sum(w[p] for p in held) > sum(w[p] for p in spread)


def test_balanced_views_hold_a_star_once_a_round() -> None:
    # attribute 0 depends on every other (and nothing else does): the dependent design
    # gives 0 a view with each; the balanced one holds one pair (0, x) a round, the
    # heaviest left, and deals the others in between
    w = np.zeros((8, 8))
    w[0, 1:] = w[1:, 0] = np.arange(1.0, 8.0)
    for seed in SEEDS:
        views = balanced_views(range(8), 2, 8, w, rng=seed)
        assert views[0] == (0, 7) and views[4] == (0, 6)
        # (a round may skip its last block when the rest are already held: views[7])
        assert sum(0 in v for v in views[1:4]) == sum(0 in v for v in views[5:7]) == 0
        star = dependent_views(range(8), 2, 8, w, rng=seed)
        assert sum(0 in v for v in star) > sum(0 in v for v in views)


def test_balanced_views_without_weights_are_the_spread_views() -> None:
    # zero weights: the same rounds from the same draws as spread_views
    for seed in SEEDS:
        for l, m in ((2, 20), (3, 30)):  # noqa: E741
            start = [(0, 1)]
            assert balanced_views(
                range(9), l, m, np.zeros((9, 9)), rng=seed, start=start
            ) == spread_views(range(9), l, m, rng=seed, start=start)


def test_balanced_views_spend_the_pairs_start_holds() -> None:
    # (0, 1) is the heaviest pair but start holds it: the first round takes the next
    w = np.zeros((6, 6))
    for (a, b), value in {(0, 1): 9.0, (2, 3): 5.0, (4, 5): 4.0, (0, 2): 1.0}.items():
        w[a, b] = w[b, a] = value
    for seed in SEEDS:
        views = balanced_views(range(6), 2, 3, w, rng=seed, start=[(0, 1)])
        assert views[:2] == ((2, 3), (4, 5))
    for shape in ((6,), (6, 7), (5, 5)):
        msg = rf"^weights \(shape {re_shape(shape)}\) must be square over every attribute$"
        with pytest.raises(PlanError, match=msg):
            balanced_views(range(6), 2, 1, np.zeros(shape))


def re_shape(shape: tuple[int, ...]) -> str:
    return str(shape).replace("(", r"\(").replace(")", r"\)")


# -- the pilot's pairs ---------------------------------------------------------------


@pytest.mark.parametrize("d", [2, 3, 4, 5, 8, 9])
def test_pilot_pairs_are_a_matching_with_one_extra_pair_when_odd(d: int) -> None:
    attrs = list(range(10, 10 + d))
    for seed in range(8):
        views = pilot_views(attrs, rng=seed)
        assert len(views) == (d + 1) // 2 and len(set(views)) == len(views)
        assert all(len(v) == 2 and v[0] < v[1] for v in views)
        counts = np.bincount([a - 10 for v in views for a in v], minlength=d)
        assert counts.min() == 1 and counts.sum() == 2 * len(views)
        if d % 2 == 0:
            assert counts.max() == 1
        else:  # the last one pairs with one other: that one is held twice
            assert counts.max() == 2 and (counts == 2).sum() == 1
    assert pilot_views(attrs) == pilot_views(attrs, rng=0)


def test_pilot_with_one_or_no_attribute() -> None:
    assert pilot_views([7]) == ((7,),)
    assert pilot_views([7, 7]) == ((7,),)
    with pytest.raises(PlanError, match=r"^attrs \(\[\]\) must hold at least one attribute"):
        pilot_views([])


@pytest.mark.parametrize("kind", ["spread", "balanced", "dependent"])
def test_views_already_measured_come_again_only_after_every_new_one(kind: str) -> None:
    # 6 attributes, a pilot's 9 of the 15 pairs: 6 new pairs, then the pilot's again
    pilot = [(0, 1), (2, 3), (4, 5), (0, 2), (1, 4), (3, 5), (0, 4), (1, 3), (2, 5)]
    weights = np.ones((6, 6)) - np.eye(6)
    weights[0, 5] = weights[5, 0] = 3.0  # an unheld pair that depends
    if kind == "dependent":
        stream = DependentStream(range(6), 2, weights, rng=1, start=pilot, again=pilot)
    else:
        w = weights if kind == "balanced" else None
        stream = SpreadStream(range(6), 2, rng=1, start=pilot, weights=w, again=pilot)
    assert stream.room == 15
    views = stream.first(15)
    assert len(set(views)) == 15  # never twice within the design
    assert set(views[:6]).isdisjoint(pilot) and set(views[6:]) == set(pilot)
    with pytest.raises(PlanError, match=r"^m \(16\) must be an int in \[0, 15\] \(distinct 2-sets"):
        stream.first(16)
    assert spread_views(range(6), 2, 6, rng=1, start=pilot) == spread_views(
        range(6), 2, 6, rng=1, start=pilot, again=pilot
    )  # while new sets are left, again changes nothing
