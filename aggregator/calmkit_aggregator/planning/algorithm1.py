"""Choosing the view size l, the view count m and the views: CALM Algorithm 1 (Zhang et
al., "CALM: Consistent Adaptive Local Marginal for Marginal Release under Local
Differential Privacy", CCS 2018, §4.3).

Noise error of one attribute estimated from l-way views (eq. 7)::

    NE(n, d, eps, l) = min(4 e^eps, L - 2 + e^eps) / (e^eps - 1)^2 * (L / l) * (d / n)

with L the (expected) number of cells of an l-way view; Algorithm 1 compares
``k * NE`` with the threshold theta. Sampling error (eq. 8): ``SE(n, m) = m / n``.
``CoverDesign(d, k, l)`` is the size of the cover :func:`~.covering.construct_cover`
builds (or reads from a covering folder), so the chosen m is always achievable.

Non-binary schemas: L is the expected cell count of an l-way view whose attributes
are a uniformly random l-subset, ``L = e_l(sizes) / C(d, l)`` (e_l the elementary
symmetric polynomial of the attribute sizes); the paper's "expected number of cells
in one marginal" (§4.3). For binary attributes L = 2^l.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from calmkit_client import CalmkitError, PlanError, validate_epsilon
from calmkit_client.randomness import RngLike
from calmkit_client.validation import check_int, is_int

from .covering import Blocks, construct_cover, cover_lower_bound, greedy_cover, verify_cover

__all__ = [
    "DEFAULT_THETA",
    "Choice",
    "Option",
    "choose_views",
    "even_views",
    "expected_cells",
    "noise_error",
    "sampling_error",
]

DEFAULT_THETA = 0.001
# Exhaustive search of the tie set in even_views up to this many subsets.
_MAX_ENUMERATE = 4096
# Randomised greedy tries otherwise.
_GREEDY_TRIES = 8


# -- error formulas --------------------------------------------------------------------
def expected_cells(sizes: Sequence[int], l: int) -> float:  # noqa: E741
    """Expected cell count ``e_l(sizes) / C(d, l)`` of an l-way view over a uniformly
    random l-subset of attributes (2^l for binary ones); exact integer arithmetic."""
    sizes = _sizes(sizes)
    l = _view_size(l, len(sizes))  # noqa: E741
    e = [1] + [0] * l  # elementary symmetric polynomials e_0..e_l
    for s in sizes:
        for j in range(l, 0, -1):
            e[j] += e[j - 1] * s
    return e[l] / math.comb(len(sizes), l)


def _fo_variance(L: float, epsilon: float) -> float:
    """min(OUE, GRR) per-cell variance factor ``min(4e^eps, L-2+e^eps)/(e^eps-1)^2``,
    written with sinh so that large epsilon does not overflow."""
    half = epsilon / 2
    inv = 1.0 / math.sinh(half) if half < 700 else 0.0  # 1/sinh(eps/2)
    oue = inv * inv  # 4 e^eps / (e^eps - 1)^2
    tail = inv * math.exp(-half) / 2 if half < 700 else 0.0  # 1 / (e^eps - 1)
    grr = oue / 4 + ((L - 2) * tail * tail if L != 2 else 0.0)  # (L-2+e^eps)/(e^eps-1)^2
    return min(oue, grr)


def noise_error(n: int, sizes: Sequence[int], epsilon: float, l: int) -> float:  # noqa: E741
    """NE(n, d, eps, l) of eq. (7) for one attribute (multiply by k for k-way)."""
    sizes = _sizes(sizes)
    eps = _finite_positive("epsilon", epsilon)
    n = check_int("n", n, 1, PlanError)
    l = _view_size(l, len(sizes))  # noqa: E741
    L = expected_cells(sizes, l)
    return _fo_variance(L, eps) * (L / l) * (len(sizes) / n)


def sampling_error(n: int, m: int) -> float:
    """SE(n, m) = m / n of eq. (8)."""
    return check_int("m", m, 1, PlanError) / check_int("n", n, 1, PlanError)


# -- results ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Option:
    """One view size as Algorithm 1 saw it.

    Attributes:
        l: view size.
        cells: L, the expected cell count of an l-way view.
        ne: NE(n, d, eps, l) (eq. 7), one attribute.
        k_ne: k * NE, what Algorithm 1 compares with theta and SE.
        cover_size: CoverDesign(d, k, l) when the algorithm needed it, else None.
        cover_bound: Schönheim's lower bound on CoverDesign(d, k, l) (None if l < k).
    """

    l: int  # noqa: E741
    cells: float
    ne: float
    k_ne: float
    cover_size: int | None = None
    cover_bound: int | None = None

    def se(self, n: int) -> float | None:
        """SE(n, cover_size), or None when the cover was not needed."""
        return None if self.cover_size is None else self.cover_size / n


@dataclass(frozen=True)
class Choice:
    """The outcome of :func:`choose_views`.

    Attributes:
        l, m: view size and number of views.
        views: m distinct sorted attribute tuples of size l.
        n, k, epsilon, theta: the inputs.
        mu: ``max(1, floor(theta * n))``, the largest m with SE <= theta.
        l_upper: l_u, the largest l with k * NE <= theta (Algorithm 1 lines 2-4).
        l_lower: l_b (lines 7-9), None when the algorithm returned before it.
        options: every view size the algorithm evaluated, increasing l.
        rule: which step decided (e.g. ``"l_u < k"``, ``"min max(SE, k*NE)"``,
            ``"fixed l"``).
        covers: whether every k-set of attributes lies in some view.
    """

    l: int  # noqa: E741
    m: int
    views: tuple[tuple[int, ...], ...]
    n: int
    k: int
    epsilon: float
    theta: float
    mu: int
    l_upper: int
    l_lower: int | None
    options: tuple[Option, ...]
    rule: str
    covers: bool

    def __post_init__(self) -> None:
        views = tuple(tuple(int(a) for a in v) for v in self.views)
        if len(views) != self.m:
            raise PlanError(f"views ({len(views)}) must number m ({self.m})")
        for j, v in enumerate(views):
            if len(v) != self.l or list(v) != sorted(set(v)):
                raise PlanError(
                    f"views[{j}] ({list(v)}) must be {self.l} sorted distinct attributes"
                )
        if len(set(views)) != len(views):
            raise PlanError("views must be distinct")
        object.__setattr__(self, "views", views)

    @property
    def option(self) -> Option:
        """The chosen view size's figures."""
        return next(o for o in self.options if o.l == self.l)

    @property
    def noise_error(self) -> float:
        """k * NE of the chosen l."""
        return self.option.k_ne

    @property
    def sampling_error(self) -> float:
        """SE = m / n."""
        return self.m / self.n

    def summary(self) -> str:
        """A few lines for a CLI: the options considered and the choice."""
        lines = [
            f"Algorithm 1: n={self.n} k={self.k} eps={self.epsilon:g} theta={self.theta:g} "
            f"mu={self.mu} l_u={self.l_upper} l_b={self.l_lower}",
            f"{'l':>3} {'L':>10} {'k*NE':>10} {'cover':>8} {'SE':>10}",
        ]
        for o in self.options:
            cover = "-" if o.cover_size is None else str(o.cover_size)
            se = o.se(self.n)
            lines.append(
                f"{o.l:>3} {o.cells:>10.4g} {o.k_ne:>10.5f} {cover:>8} "
                f"{'-' if se is None else f'{se:.5f}':>10}"
            )
        lines.append(
            f"chosen l={self.l} m={self.m} ({self.rule}): k*NE={self.noise_error:.5f} "
            f"SE={self.sampling_error:.5f}, covers every {self.k}-set: {self.covers}"
        )
        return "\n".join(lines)


# -- validation ------------------------------------------------------------------------
def _sizes(sizes: Sequence[int]) -> tuple[int, ...]:
    if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence | np.ndarray):
        raise PlanError(f"sizes ({sizes!r}) must be a sequence of category counts")
    out = tuple(check_int(f"sizes[{i}]", s, 1, PlanError) for i, s in enumerate(sizes))
    if not out:
        raise PlanError("sizes (()) must name at least one attribute")
    return out


def _view_size(l: object, d: int) -> int:  # noqa: E741
    if not is_int(l) or not 1 <= l <= d:
        raise PlanError(f"l ({l!r}) must be an int in [1, {d}] (d = {d} attributes)")
    return int(l)


def _finite_positive(name: str, value: object) -> float:
    """``validate_epsilon``'s check (finite real > 0) for any field, as a PlanError."""
    try:
        return validate_epsilon(value, name)
    except CalmkitError as exc:
        raise PlanError(str(exc)) from None


# -- Algorithm 1 -----------------------------------------------------------------------
def choose_views(
    sizes: Sequence[int],
    epsilon: float,
    n: int,
    k: int,
    theta: float = DEFAULT_THETA,
    rng: RngLike = 0,
    covering_dir: Path | str | None = None,
    l: int | None = None,  # noqa: E741 (the paper's name)
    m: int | None = None,
) -> Choice:
    """Algorithm 1 of §4.3: choose l and m, then the m views of l attributes.

    Args:
        sizes: category count of each of the d attributes.
        epsilon: each user's LDP budget.
        n: expected number of users.
        k: size of the marginals to answer.
        theta: error threshold (a rough guess of reconstruction errors; paper: 0.001).
        rng: seed or generator for cover construction and tie-breaking; the choice is
            deterministic given it.
        covering_dir: optional covering folder (see :mod:`.covering`).
        l: fix the view size instead of choosing it (None: choose).
        m: fix the view count instead of choosing it (None: choose).

    The paper's loop, with d capping l (views hold distinct attributes) and
    ``mu = max(1, floor(theta * n))`` (whole views)::

        l_u = 2; while k * NE(l_u + 1) <= theta: l_u += 1
        if l_u < k: return min(mu, C(d, l_u)), l_u
        l_b = l_u; while l_b > k and CoverDesign(d, k, l_b - 1) <= mu: l_b -= 1
        if l_b == l_u: return min(mu, C(d, l_u)), l_u
        for l_t in [l_b, l_u]: keep (CoverDesign(d, k, l_t), l_t) with the smallest
            max(SE, k * NE) (strictly smaller than the best so far, starting from 1)

    A cover whose Schönheim lower bound already exceeds mu is not built (it cannot
    fit). With only ``l`` fixed, m is CoverDesign(d, k, l) if l >= k, else
    min(mu, C(d, l)). With only ``m`` fixed, l is the smallest l in [k, l_u] whose
    cover fits in m views (least noise with full coverage), else l_u.

    Views: when m covers, the cover plus, if m is larger, extra views chosen by
    :func:`even_views`; when m views cannot hold the cover, the greedy maximum
    coverage of k-sets (l > k) or :func:`even_views` (l <= k, the l < k branch:
    every attribute and pair as evenly as possible).
    """
    sizes = _sizes(sizes)
    d = len(sizes)
    eps = _finite_positive("epsilon", epsilon)
    n = check_int("n", n, 1, PlanError)
    k = check_int("k", k, 1, PlanError)
    if k > d:
        raise PlanError(f"k ({k}) must be <= d ({d} attributes)")
    theta = _finite_positive("theta", theta)
    if l is not None:
        l = _view_size(l, d)  # noqa: E741
    if m is not None:
        m = check_int("m", m, 1, PlanError)
        if l is not None and m > math.comb(d, l):
            raise PlanError(f"m ({m}) must be <= C({d}, {l}) = {math.comb(d, l)} distinct views")
    gen = np.random.default_rng(rng)
    run = _Algorithm1(sizes, eps, n, k, theta, int(gen.integers(1 << 62)), covering_dir)
    l_u = run.upper_l()
    rule, l, m, l_b = run.view_size_and_count(l, m, l_u)  # noqa: E741
    views, covers_all = _select(d, k, l, m, gen, run.cover, run.fits)
    return Choice(
        l=l,
        m=m,
        views=views,
        n=n,
        k=k,
        epsilon=eps,
        theta=theta,
        mu=run.mu,
        l_upper=l_u,
        l_lower=l_b,
        options=run.options(l, l_u),
        rule=rule,
        covers=covers_all,
    )


class _Algorithm1:
    """One run of Algorithm 1 (:func:`choose_views`): its inputs, and the expected cells,
    noise and covering designs of each view size, each computed once."""

    def __init__(
        self,
        sizes: tuple[int, ...],
        eps: float,
        n: int,
        k: int,
        theta: float,
        cover_seed: int,
        covering_dir: Path | str | None,
    ) -> None:
        self.sizes, self.d, self.eps, self.n, self.k = sizes, len(sizes), eps, n, k
        self.theta, self.cover_seed, self.covering_dir = theta, cover_seed, covering_dir
        self.mu = max(1, math.floor(theta * n))  # whole views
        self.cells: dict[int, float] = {}
        self.covers: dict[int, tuple[tuple[int, ...], ...]] = {}

    def k_ne(self, lv: int) -> float:
        """k * NE(lv): the noise of a k-way answer from views of lv attributes."""
        if lv not in self.cells:
            self.cells[lv] = expected_cells(self.sizes, lv)
        cells = self.cells[lv]
        return self.k * _fo_variance(cells, self.eps) * (cells / lv) * (self.d / self.n)

    def cover(self, lv: int) -> tuple[tuple[int, ...], ...]:
        if lv not in self.covers:
            self.covers[lv] = construct_cover(
                self.d, self.k, lv, rng=self.cover_seed, covering_dir=self.covering_dir
            )
        return self.covers[lv]

    def fits(self, lv: int, budget: int) -> bool:
        """CoverDesign(d, k, lv) <= budget, skipping covers that cannot fit."""
        return cover_lower_bound(self.d, self.k, lv) <= budget and len(self.cover(lv)) <= budget

    def upper_l(self) -> int:
        """Lines 2-4: the largest l with k * NE <= theta (at least 2, at most d)."""
        l_u = min(2, self.d)
        self.k_ne(l_u)
        while l_u < self.d and self.k_ne(l_u + 1) <= self.theta:
            l_u += 1
        return l_u

    def view_size_and_count(
        self,
        l: int | None,  # noqa: E741 (the paper's name)
        m: int | None,
        l_u: int,
    ) -> tuple[str, int, int, int | None]:
        """The rule applied, l, m and l_b (None unless lines 7-9 ran)."""
        d, k, mu = self.d, self.k, self.mu
        if l is not None and m is None:
            return "fixed l", l, len(self.cover(l)) if l >= k else min(mu, math.comb(d, l)), None
        if l is None and m is not None:
            return "fixed m", self._size_for(m, l_u), m, None
        if l is not None and m is not None:
            return "fixed l and m", l, m, None
        if l_u < k:  # lines 5-6
            return "l_u < k", l_u, min(mu, math.comb(d, l_u)), None
        l_b = l_u  # lines 7-9
        while l_b > k and self.fits(l_b - 1, mu):
            l_b -= 1
        if l_b == l_u:  # lines 10-11
            return "l_b == l_u", l_u, min(mu, math.comb(d, l_u)), l_b
        best, m, l = 1.0, mu, l_u  # noqa: E741  (lines 12-17)
        for l_t in range(l_b, l_u + 1):
            m_t = len(self.cover(l_t))
            err = max(m_t / self.n, self.k_ne(l_t))
            if err < best:
                best, m, l = err, m_t, l_t  # noqa: E741
        return "min max(SE, k*NE)", l, m, l_b

    def _size_for(self, m: int, l_u: int) -> int:
        """With only m fixed: the smallest l in [k, l_u] whose cover fits in m views."""
        d = self.d
        l = next(  # noqa: E741
            (t for t in range(self.k, l_u + 1) if math.comb(d, t) >= m and self.fits(t, m)),
            l_u,
        )
        if m > math.comb(d, l):
            raise PlanError(
                f"m ({m}) must be <= C({d}, {l}) = {math.comb(d, l)} distinct views "
                f"of the chosen l = {l}; fix l as well"
            )
        return l

    def options(self, l: int, l_u: int) -> tuple[Option, ...]:  # noqa: E741
        """Every view size's figures, from 2 (or l) to l_u + 1 (or l)."""
        d, k = self.d, self.k
        out = []
        for lv in range(min(2, d, l), max(l, min(l_u + 1, d)) + 1):
            ne_k = self.k_ne(lv)
            out.append(
                Option(
                    l=lv,
                    cells=self.cells[lv],
                    ne=ne_k / k,
                    k_ne=ne_k,
                    cover_size=len(self.covers[lv]) if lv in self.covers else None,
                    cover_bound=cover_lower_bound(d, k, lv) if lv >= k else None,
                )
            )
        return tuple(out)


def _select(
    d: int,
    k: int,
    l: int,  # noqa: E741
    m: int,
    gen: np.random.Generator,
    cover: Callable[[int], Blocks],
    fits: Callable[[int, int], bool],
) -> tuple[tuple[tuple[int, ...], ...], bool]:
    """m distinct views of l attributes (see :func:`choose_views`), and whether they
    cover every k-set."""
    if l >= k and fits(l, m):
        base = cover(l)
        return base + even_views(d, l, m - len(base), rng=gen, start=base), True
    if l > k:
        partial = tuple(tuple(int(a) for a in b) for b in greedy_cover(d, k, l, gen, max_blocks=m))
        views = partial + even_views(d, l, m - len(partial), rng=gen, start=partial)
        return views, verify_cover(partial, d, k)
    views = even_views(d, l, m, rng=gen)
    return views, l == k and m == math.comb(d, k)


# -- even views ------------------------------------------------------------------------
def even_views(
    d: int,
    l: int,  # noqa: E741
    m: int,
    rng: RngLike = 0,
    start: Sequence[Sequence[int]] = (),
) -> tuple[tuple[int, ...], ...]:
    """m new distinct l-sets of ``0..d-1`` (none in ``start``) spreading attributes and
    pairs as evenly as possible (the l < k branch of Algorithm 1).

    Greedy: each view takes the l attributes used least so far (counting ``start``);
    among the ties it takes the subset whose pairs were used least (smallest sum of
    pair counts, i.e. the smallest growth of the sum of squared pair counts),
    exhaustively when there are at most 4096 such subsets, else by randomised greedy.
    Repair: while some attribute a is used at least 2 more times than some b, one view
    holding a but not b gets b in place of a (the one with the least pair load whose
    result is unused); each swap lowers the sum of squared counts, so this ends. With
    an empty ``start`` such a view always exists (the views holding a but not b
    outnumber those holding b but not a, so one of them maps to an unused set), hence
    **attribute counts differ by at most 1**. Pair counts are balanced greedily,
    without a guarantee. Returns sorted tuples.
    """
    d = check_int("d", d, 1, PlanError)
    l = _view_size(l, d)  # noqa: E741
    m = check_int("m", m, 0, PlanError)
    gen = np.random.default_rng(rng)
    used = {tuple(sorted(int(a) for a in v)) for v in start}
    if len(used) + m > math.comb(d, l):
        raise PlanError(
            f"m ({m}) must be <= C({d}, {l}) - {len(used)} = {math.comb(d, l) - len(used)} "
            "new distinct views"
        )
    counts = np.zeros(d, np.int64)
    pairs = np.zeros((d, d), np.int64)
    for v in used:
        _tally(v, counts, pairs, 1)
    out = []
    for _ in range(m):
        view = _next_even(d, l, counts, pairs, used, gen)
        used.add(view)
        _tally(view, counts, pairs, 1)
        out.append(view)
    while _repair_step(out, counts, pairs, used):
        pass
    return tuple(out)


def _tally(view: tuple[int, ...], counts: np.ndarray, pairs: np.ndarray, step: int) -> None:
    """Count ``view`` (``step`` = 1) or uncount it (-1): its attributes in ``counts``,
    its pairs (and each attribute with itself) in ``pairs``."""
    idx = np.array(view)
    counts[idx] += step
    pairs[np.ix_(idx, idx)] += step


def _repair_step(
    views: list[tuple[int, ...]],
    counts: np.ndarray,
    pairs: np.ndarray,
    used: set[tuple[int, ...]],
) -> bool:
    """One swap moving a use from a most-used attribute to a least-used one (those
    differing by >= 2) inside one of ``views``; False when none is possible."""
    order = np.argsort(counts, kind="stable")
    for b in order:
        for a in order[::-1]:
            if counts[a] - counts[b] < 2:
                break
            best, best_score = None, None
            for j, v in enumerate(views):
                if a not in v or b in v:
                    continue
                new = tuple(sorted([x for x in v if x != a] + [int(b)]))
                if new in used:
                    continue
                rest = [x for x in v if x != a]
                score = int(pairs[b, rest].sum()) - int(pairs[a, rest].sum())
                if best_score is None or score < best_score:
                    best, best_score = (j, new), score
            if best is not None:
                j, new = best
                _tally(views[j], counts, pairs, -1)
                _tally(new, counts, pairs, 1)
                used.discard(views[j])
                used.add(new)
                views[j] = new
                return True
    return False


def _pair_scores(sets: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    """Sum of pair counts within each row of ``sets`` (c, l)."""
    score = np.zeros(len(sets), np.int64)
    for i, j in itertools.combinations(range(sets.shape[1]), 2):
        score += pairs[sets[:, i], sets[:, j]]
    return score


def _first_unused(
    sets: np.ndarray, score: np.ndarray, used: set[tuple[int, ...]]
) -> tuple[int, ...] | None:
    for j in np.argsort(score, kind="stable"):
        view = tuple(int(a) for a in np.sort(sets[j]))
        if view not in used:
            return view
    return None


def _next_even(
    d: int,
    l: int,  # noqa: E741
    counts: np.ndarray,
    pairs: np.ndarray,
    used: set[tuple[int, ...]],
    gen: np.random.Generator,
) -> tuple[int, ...]:
    tau = np.sort(counts)[l - 1]
    must = np.flatnonzero(counts < tau)
    tie = gen.permutation(np.flatnonzero(counts == tau))
    r = l - len(must)
    if math.comb(len(tie), r) <= _MAX_ENUMERATE:
        picks = np.array(list(itertools.combinations(tie, r)), np.int64).reshape(-1, r)
    else:
        picks = np.array([_greedy_pick(must, tie, r, pairs, gen) for _ in range(_GREEDY_TRIES)])
        picks = np.concatenate([picks, _random_picks(tie, r, 256, gen)])
    sets = np.concatenate([np.broadcast_to(must, (len(picks), len(must))), picks], axis=1)
    view = _first_unused(sets, _pair_scores(sets, pairs), used)
    if view is not None:
        return view
    # No fresh set respects the attribute balance: least (attribute, pair) load.
    if math.comb(d, l) <= 50_000:
        sets = np.array(list(itertools.combinations(range(d), l)), np.int64).reshape(-1, l)
    else:
        sets = _random_picks(np.arange(d), l, 4096, gen)
    load = counts[sets].sum(axis=1) * (l * l * int(pairs.max() + 1)) + _pair_scores(sets, pairs)
    view = _first_unused(sets, load, used)
    while view is None:  # the sample missed every unused set: draw more
        sets = _random_picks(np.arange(d), l, 4096, gen)
        view = _first_unused(sets, counts[sets].sum(axis=1), used)
    return view


def _greedy_pick(
    must: np.ndarray, tie: np.ndarray, r: int, pairs: np.ndarray, gen: np.random.Generator
) -> np.ndarray:
    chosen = list(must)
    free = gen.permutation(tie)
    for _ in range(r):
        cost = pairs[np.ix_(free, chosen)].sum(axis=1) if chosen else np.zeros(len(free))
        j = int(np.argmin(cost))
        chosen.append(int(free[j]))
        free = np.delete(free, j)
    return np.array(chosen[len(must) :], np.int64)


def _random_picks(pool: np.ndarray, r: int, count: int, gen: np.random.Generator) -> np.ndarray:
    keys = gen.random((count, len(pool)))
    return np.asarray(pool)[np.argsort(keys, axis=1)[:, :r]]
