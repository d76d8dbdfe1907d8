"""Fast view designs for the planner: m distinct l-sets over chosen attributes that
hold every attribute as evenly as possible and spread the attribute pairs, the same
rounds holding the pairs with the most dependence first, views that hold those pairs
whatever the attributes' balance, and the pilot's pairs.

:func:`spread_views` deals the attributes out in rounds: each round is a partition
of the attributes into blocks of l (a short last block is filled with attributes of
the round), so after r full rounds every attribute has been dealt r times; a block
grows by the attribute whose pairs with it were used least so far, so as many
distinct pairs as possible are held (what max-ent cannot fill is the pairs no view
holds); a block already chosen is skipped. When rounds stop finding new blocks (m
close to C(d, l)), the remaining blocks are the unused l-sets with the least-used
attributes. O(m l d) per view set, against the O(m C(d, l)) balancing of
:func:`~.algorithm1.even_views` that Algorithm 1 uses.

:func:`balanced_views` deals the same rounds, but grows each block by what the
profile expects of each pair's dependence (:attr:`~.profile.DataProfile.weights`):
a block starts from the pair of largest weight no view holds among the attributes
not dealt yet in the round, and grows by the attribute whose unheld pairs with it
weigh most (the least-used pairs breaking ties; where no unheld weight is left, the
spread rule). Every attribute keeps the spread design's share of the views (so its
one-way noise), while the views hold the heaviest pairs a round can: with the
dependence concentrated on a few pairs (one Kosarak pair holds 47% of it at d = 16)
that is where max-ent's error goes. With zero weights it is :func:`spread_views`.

:func:`dependent_views` uses what the profile expects of each pair's dependence
(:attr:`~.profile.DataProfile.weights`): while some attribute is in no view, a view
is grown from those attributes (every attribute held first); then each view starts
from the pair with the largest dependence no view holds yet and grows by the
attribute whose pairs with the view add the most such dependence. Max-ent fills an
unheld pair with the product of its margins, so what it cannot fill is the dependence
of the pairs no view holds: on real data a quarter of the pairs holds most of it
(:mod:`.profile`). O(m (d^2 + l d)) per view set.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

import numpy as np

from calmkit_client import PlanError
from calmkit_client.randomness import RngLike
from calmkit_client.validation import is_int

__all__ = [
    "DependentStream",
    "SpreadStream",
    "balanced_views",
    "dependent_views",
    "pilot_views",
    "spread_views",
]

# Random rounds that add no new block before falling back to enumeration.
_STALL_ROUNDS = 8
# Pairs a weighted round checks at a time for the heaviest one still free.
_CHUNK = 64


def spread_views(
    attrs: Sequence[int],
    l: int,  # noqa: E741 (the paper's name)
    m: int,
    rng: RngLike = 0,
    start: Sequence[Sequence[int]] = (),
    again: Sequence[Sequence[int]] = (),
) -> tuple[tuple[int, ...], ...]:
    """m new distinct sorted l-sets of ``attrs`` (none in ``start``), each attribute
    in ``floor(m l / d)`` or ``ceil(m l / d)`` of them while random rounds find new
    sets (module docstring); then, once no new set is left, the l-sets of ``again``
    (views already measured, e.g. a pilot's, which a later phase may measure again),
    least-used attributes first."""
    return SpreadStream(attrs, l, rng, start, again=again).first(m)


class SpreadStream:
    """The views of :func:`spread_views` as a stream: ``first(m)`` is the design of m
    views, and the first m views of a larger design (so a search over m deals the
    rounds once). With ``weights`` ((D, D) over all attribute positions, symmetric,
    >= 0) it is :func:`balanced_views`: each round still deals every attribute once,
    but its blocks are grown to hold the unheld pairs of largest weight."""

    def __init__(
        self,
        attrs: Sequence[int],
        l: int,  # noqa: E741
        rng: RngLike = 0,
        start: Sequence[Sequence[int]] = (),
        weights: np.ndarray | None = None,
        again: Sequence[Sequence[int]] = (),
    ) -> None:
        self.pool = sorted({int(a) for a in attrs})
        d = len(self.pool)
        if not is_int(l) or not 1 <= l <= d:
            raise PlanError(f"l ({l!r}) must be an int in [1, {d}] ({d} attributes)")
        self.l = int(l)
        self.used = {tuple(sorted(int(a) for a in v)) for v in start}
        self.again = _sets_of(again, self.pool, self.l)
        inside = set(self.pool)
        self.room = (
            math.comb(d, self.l)
            - sum(1 for v in self.used if len(v) == self.l and set(v) <= inside)
            + len(self.again)
        )
        self.gen = np.random.default_rng(rng)
        self.out: list[tuple[int, ...]] = []
        self.arr = np.array(self.pool, dtype=np.int64)
        index = {a: i for i, a in enumerate(self.pool)}
        self.pairs = np.zeros((d, d), dtype=np.int64)  # how often two attributes meet
        for v in self.used:
            pos = np.array([index[a] for a in v if a in index], dtype=np.int64)
            self.pairs[pos[:, None], pos] += 1
        self.gain: np.ndarray | None = None  # weight of the pairs no view holds yet
        self.ranked: np.ndarray | None = None
        if weights is not None:
            w = np.asarray(weights, dtype=np.float64)
            if w.ndim != 2 or w.shape[0] != w.shape[1] or w.shape[0] <= self.arr.max():
                raise PlanError(f"weights (shape {w.shape}) must be square over every attribute")
            self.gain = np.where(self.pairs > 0, 0.0, w[np.ix_(self.arr, self.arr)])
            np.fill_diagonal(self.gain, 0.0)
            self.ranked = _ranked(self.gain)  # gains only drop to 0: the order holds
        self.stall = 0
        self.tail: list[tuple[int, ...]] | None = None  # the fallback's sets, in order

    def first(self, m: int) -> tuple[tuple[int, ...], ...]:
        if not is_int(m) or not 0 <= m <= self.room:
            raise PlanError(
                f"m ({m!r}) must be an int in [0, {self.room}] (distinct {self.l}-sets it may deal)"
            )
        d = len(self.pool)
        while len(self.out) < m and self.stall < _STALL_ROUNDS:
            before = len(self.out)
            for block in _round(d, self.l, self.pairs, self.gen, self.gain, self.ranked):
                view = tuple(sorted(self.arr[block].tolist()))
                if view not in self.used:
                    self.used.add(view)
                    self.out.append(view)
                    idx = np.array(block)
                    self.pairs[idx[:, None], idx] += 1
                    if self.gain is not None:
                        self.gain[idx[:, None], idx] = 0.0
            self.stall = self.stall + 1 if len(self.out) == before else 0
        if len(self.out) < m:
            if self.tail is None:  # ordered once: a design read in pieces is the same
                new = self.room - len(self.again) - len(self.out)
                self.tail = _least_used(self.pool, self.l, new, self.used, self.out)
                chosen = self.out + self.tail
                self.tail += _least_used(
                    self.pool, self.l, len(self.again), set(), chosen, self.again
                )
            take = m - len(self.out)
            self.out.extend(self.tail[:take])
            del self.tail[:take]
            self.used.update(self.out)
        return tuple(self.out[:m])


def balanced_views(
    attrs: Sequence[int],
    l: int,  # noqa: E741 (the paper's name)
    m: int,
    weights: np.ndarray,
    rng: RngLike = 0,
    start: Sequence[Sequence[int]] = (),
    again: Sequence[Sequence[int]] = (),
) -> tuple[tuple[int, ...], ...]:
    """m new distinct sorted l-sets of ``attrs`` (none in ``start``), dealt in rounds
    as :func:`spread_views` (every attribute once a round, a block already held
    skipped), whose blocks hold the unheld pairs of largest ``weights`` ((D, D) over
    all attribute positions, symmetric, >= 0) first (module docstring); then those of
    ``again`` as :func:`spread_views`."""
    return SpreadStream(attrs, l, rng, start, weights, again).first(m)


def dependent_views(
    attrs: Sequence[int],
    l: int,  # noqa: E741 (the paper's name)
    m: int,
    weights: np.ndarray,
    rng: RngLike = 0,
    start: Sequence[Sequence[int]] = (),
    again: Sequence[Sequence[int]] = (),
) -> tuple[tuple[int, ...], ...]:
    """m new distinct sorted l-sets of ``attrs`` (none in ``start``) that hold the
    pairs of largest ``weights`` ((D, D) over all attribute positions, symmetric,
    >= 0), every attribute first (module docstring); then those of ``again`` as
    :func:`spread_views`."""
    return DependentStream(attrs, l, weights, rng, start, again).first(m)


class DependentStream:
    """The views of :func:`dependent_views` as a stream: ``first(m)`` is the design of
    m views and the first m views of any larger one."""

    def __init__(
        self,
        attrs: Sequence[int],
        l: int,  # noqa: E741
        weights: np.ndarray,
        rng: RngLike = 0,
        start: Sequence[Sequence[int]] = (),
        again: Sequence[Sequence[int]] = (),
    ) -> None:
        self.pool = sorted({int(a) for a in attrs})
        d = len(self.pool)
        if not is_int(l) or not 2 <= l <= d:
            raise PlanError(f"l ({l!r}) must be an int in [2, {d}] ({d} attributes)")
        self.l = int(l)
        arr = np.array(self.pool, dtype=np.int64)
        w = np.asarray(weights, dtype=np.float64)
        if w.ndim != 2 or w.shape[0] != w.shape[1] or w.shape[0] <= arr.max():
            raise PlanError(f"weights (shape {w.shape}) must be square over every attribute")
        self.gain = w[np.ix_(arr, arr)].copy()  # dependence of the pairs no view holds
        np.fill_diagonal(self.gain, 0.0)
        self.positive = int(np.count_nonzero(np.triu(self.gain, 1) > 0))  # unheld, > 0
        self.uses = np.zeros(d, dtype=np.int64)
        self.used = {tuple(sorted(int(a) for a in v)) for v in start}
        index = {a: i for i, a in enumerate(self.pool)}
        for v in self.used:
            pos = [index[a] for a in v if a in index]
            self._hold(pos)
        inside = set(self.pool)
        self.again = _sets_of(again, self.pool, self.l)
        self.room = (
            math.comb(d, self.l)
            - sum(1 for v in self.used if len(v) == self.l and set(v) <= inside)
            + len(self.again)
        )
        self.gen = np.random.default_rng(rng)
        self.arr = arr
        self.out: list[tuple[int, ...]] = []
        self.rest: SpreadStream | None = None  # once no unheld pair depends
        self.spread_from = 0
        # every pair by falling dependence (ties at random): gains only ever drop to 0,
        # so the next seed is the first pair of this order still unheld
        upper = np.triu_indices(d, 1)
        order = np.lexsort((self.gen.random(upper[0].size), -self.gain[upper]))
        self.order = np.stack([upper[0][order], upper[1][order]], axis=1)
        self.next = 0

    def _hold(self, pos: Sequence[int]) -> None:
        gain = self.gain  # a view's few pairs one by one: cheaper than fancy indexing
        for i, a in enumerate(pos):
            self.uses[a] += 1
            for b in pos[i + 1 :]:
                if a != b and gain[a, b] > 0:
                    self.positive -= 1
                    gain[a, b] = gain[b, a] = 0.0

    def first(self, m: int) -> tuple[tuple[int, ...], ...]:
        if not is_int(m) or not 0 <= m <= self.room:
            raise PlanError(
                f"m ({m!r}) must be an int in [0, {self.room}] (distinct {self.l}-sets it may deal)"
            )
        while len(self.out) < m and self.rest is None:
            if self.positive == 0 and self.uses.all():
                # every attribute held and no unheld pair depends: spread the rest
                self.rest = SpreadStream(
                    self.pool, self.l, self.gen, start=list(self.used), again=self.again
                )
                self.spread_from = len(self.out)
                break
            block = self._grow()
            view = tuple(sorted(self.arr[block].tolist()))
            self.used.add(view)
            self.out.append(view)
            self._hold(block)
        if len(self.out) < m and self.rest is not None:
            self.out = self.out[: self.spread_from] + list(self.rest.first(m - self.spread_from))
        return tuple(self.out[:m])

    def _grow(self) -> list[int]:
        """One view's positions: the best unheld pair, then the best additions; from
        the attributes in no view while there are any."""
        d = len(self.pool)
        live = self.uses == 0
        tie = self.gen.random(d)
        if not live.any():  # every attribute held: the strongest unheld pair
            while self.gain[self.order[self.next, 0], self.order[self.next, 1]] <= 0:
                self.next += 1
            a, b = self.order[self.next]
            block = [int(a), int(b)]
            live = np.ones(d, dtype=bool)
        elif live.sum() >= 2:
            scores = np.where(np.outer(live, live), self.gain, -np.inf)
            np.fill_diagonal(scores, -np.inf)
            top = scores.max()
            cands = np.argwhere(scores >= top - 1e-12 * abs(top))
            # ties (e.g. no unheld dependence left) at random: every candidate is unused
            a, b = cands[int(np.argmax(tie[cands].sum(axis=1)))]
            block = [int(a), int(b)]
        else:  # one attribute left in no view: it starts the view
            block = [int(np.flatnonzero(live)[0])]
        while len(block) < self.l:
            pool = live.copy()
            pool[block] = False
            if not pool.any():
                pool = np.ones(d, dtype=bool)
                pool[block] = False
            score = np.where(pool, self.gain[block].sum(axis=0), -np.inf)
            top = score.max()
            near = pool & (score >= top - 1e-12 * abs(top))
            rank = np.where(near, self.uses - tie / 2, np.inf)
            block.append(int(np.argmin(rank)))
        return block


def _round(
    d: int,
    l: int,  # noqa: E741
    pairs: np.ndarray,
    gen: np.random.Generator,
    gain: np.ndarray | None = None,
    ranked: np.ndarray | None = None,
) -> list[list[int]]:
    """One round: blocks of l positions covering every position once (a short last
    block is filled with positions of the round not in it); each block grows by the
    position whose pairs with the block were used least (ties at random). With
    ``gain`` (the weights of the unheld pairs) a block starts from the free pair of
    largest gain and grows by the largest gain first, the least used pairs breaking
    ties; where no free pair has gain left, the rule without it. ``ranked``: the
    pairs (rows of a (P, 2) int64 array) by falling gain (:func:`_ranked`), if known."""
    order = gen.permutation(d)
    free = np.ones(d, dtype=bool)
    dealt = np.zeros(d)  # inf where dealt in this round, else 0
    uses = pairs.astype(np.float64)
    jitter = gen.random(((d + l - 1) // l * l, d)) * 0.5
    blocks: list[list[int]] = []
    left = d
    cursor = 0
    heavy = np.zeros((0, 2), dtype=np.int64)  # pairs of positive gain, heaviest first
    if gain is not None:
        heavy = _ranked(gain) if ranked is None else ranked
        heavy = heavy[gain[heavy[:, 0], heavy[:, 1]] > 0]
    while left:
        start = -1
        while heavy.size and left >= 2:  # the heaviest pair of two free positions
            head = heavy[:_CHUNK]
            both = free[head[:, 0]] & free[head[:, 1]]
            if not both.any():  # pairs with a dealt position stay so for the round
                heavy = heavy[head.shape[0] :]
                continue
            heavy = heavy[int(both.argmax()) :]
            start = int(heavy[0, 0])
            break
        if start < 0:
            while not free[order[cursor]]:
                cursor += 1
            start = int(order[cursor])
        free[start] = False
        dealt[start] = np.inf
        left -= 1
        block = [int(start)]
        # the block's pair uses per position, inf where not in the pool (dealt)
        load = uses[start] + dealt
        gained = None if gain is None else gain[start].copy()
        while len(block) < l:
            if not left:  # the round is dealt: fill from the attributes not in the block
                load = uses[block].sum(axis=0)
                load[block] = np.inf
            score = load + jitter[len(blocks) * l + len(block)]
            if gained is not None:  # the largest gain first; the least used among equals
                best = float(np.max(gained, where=score < np.inf, initial=0.0))
                if best > 0:
                    score[gained < best * (1 - 1e-9)] = np.inf
            pick = int(score.argmin())
            if free[pick]:
                free[pick] = False
                dealt[pick] = np.inf
                left -= 1
            block.append(pick)
            if len(block) < l:
                load += uses[pick]
                load[pick] = np.inf
                if gained is not None and gain is not None:
                    gained += gain[pick]
        blocks.append(block)
    return blocks


def _ranked(gain: np.ndarray) -> np.ndarray:
    """The pairs ``(a, b)``, ``a < b``, of positive ``gain`` by falling gain (ties in
    the order of (a, b)), as rows of a (P, 2) int64 array."""
    upper = np.triu_indices(gain.shape[0], 1)
    values = gain[upper]
    keep = np.flatnonzero(values > 0)
    keep = keep[np.argsort(-values[keep], kind="stable")]
    return np.stack([upper[0][keep], upper[1][keep]], axis=1)


def _least_used(
    pool: list[int],
    l: int,  # noqa: E741
    count: int,
    used: set[tuple[int, ...]],
    chosen: list[tuple[int, ...]],
    among: Sequence[tuple[int, ...]] | None = None,
) -> list[tuple[int, ...]]:
    """``count`` unused l-sets of ``pool`` (of ``among`` if given), least-used
    attributes first."""
    uses = {a: 0 for a in pool}
    for v in chosen:
        for a in v:
            uses[a] += 1
    sets = itertools.combinations(pool, l) if among is None else among
    free = [v for v in sets if v not in used]
    free.sort(key=lambda v: (sum(uses[a] for a in v), v))
    return free[:count]


def _sets_of(views: Sequence[Sequence[int]], pool: list[int], l: int) -> list[tuple[int, ...]]:  # noqa: E741
    """The distinct sorted l-sets among ``views`` inside ``pool``."""
    inside = set(pool)
    sets = {tuple(sorted(int(a) for a in v)) for v in views}
    return sorted(v for v in sets if len(v) == l and set(v) <= inside)


def pilot_views(
    attrs: Sequence[int],
    rng: RngLike = 0,
    pairable: Callable[[int, int], bool] | None = None,
) -> tuple[tuple[int, ...], ...]:
    """Disjoint pairs holding every attribute once (a random perfect matching; with an
    odd count the last attribute pairs with a random other one). One attribute alone
    is its own view. With ``pairable``, an attribute pairs only with one it says it may
    (the first such in the random order) and is otherwise a view of its own; the odd
    one left then stays alone too."""
    pool = sorted({int(a) for a in attrs})
    if not pool:
        raise PlanError("attrs ([]) must hold at least one attribute with >= 2 categories")
    if len(pool) == 1:
        return ((pool[0],),)
    gen = np.random.default_rng(rng)
    perm = [int(a) for a in gen.permutation(pool)]
    if pairable is not None:
        return _matched(perm, pairable)
    views = [tuple(sorted(perm[i : i + 2])) for i in range(0, len(perm) - 1, 2)]
    if len(perm) % 2:
        last = perm[-1]
        partner = int(gen.choice([a for a in pool if a != last]))
        views.append(tuple(sorted((last, partner))))
    return tuple(views)


def _matched(order: list[int], pairable: Callable[[int, int], bool]) -> tuple[tuple[int, ...], ...]:
    """Greedy matching along ``order``: each attribute not yet placed pairs with the
    next unplaced one ``pairable`` allows, else stands alone."""
    placed: set[int] = set()
    views: list[tuple[int, ...]] = []
    for i, a in enumerate(order):
        if a in placed:
            continue
        partner = next((b for b in order[i + 1 :] if b not in placed and pairable(a, b)), None)
        placed.add(a)
        if partner is None:
            views.append((a,))
        else:
            placed.add(partner)
            views.append(tuple(sorted((a, partner))))
    return tuple(views)
