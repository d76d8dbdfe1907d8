"""How far a maximum-entropy answer may be from the truth in what no view holds.

A query that no view covers is answered by maximum entropy given the views'
projections onto it (the paper's §4.5): every interaction of the query's attributes
that lies in no single view (a pair no view holds, or the triple of a 3-way query over
pair views) is set to none. No bootstrap can see that error: its replicates are drawn
from the views. What the views do show is how strong the interactions of each order
are where they are observed, so this module serves the size of the unseen ones under
one stated assumption: **an interaction no view holds is, on average, as strong per
degree of freedom as the observed interactions of its order** (the pilot's pairs are
drawn at random from the attributes, so for pairs the observed ones are a fair sample;
a pilot that measured every attribute alone, and views of one attribute, observe no
pair, and the size falls back to the most the table can hold), and an order no view
reaches (a 3-way interaction over pair views) is no stronger per degree of freedom
than the highest order observed (the hierarchy principle of log-linear models).

Strength is the chi-square-isotropic model's: an interaction of set ``S`` with
strength ``r`` per degree of freedom moves cell ``c`` of a table ``M`` by a squared
amount ``r M_c prod_{a in S} (1 - M_a(c_a))`` on average (the variance of a
contingency table's adjusted residual, scaled), which sums to ``r dof_S`` in the
chi-square metric, ``dof_S = prod(L_a - 1)``. It is measured in L2: for an
attribute set ``T`` inside a view, ``gap_T`` is the top-order ANOVA part of (raw
estimate minus its total times its maximum-entropy table given ``T``'s subsets one
smaller). ``||gap_T||^2`` is the signal plus what the noise adds, and the noise's part
is simulated, not read from a formula (:meth:`InteractionScale.strength`): the closed
form ``c_T dof_T`` holds only for uniform margins, and on skewed ones a noisy margin
times another's skew lands in the top interaction too. ``(||gap_T||^2 - noise mean) /
spread_T`` (``spread_T = sum_c M_c prod (1 - M_a)`` of the base) estimates ``r_T``
with the simulated variance (the noise simulated around the observed base, the truth
being unknown: where most of a triple's cells are empty some bias upwards remains,
which widens the bound); the sets of one order are pooled by inverse
variance into ``r_t`` and its standard error. What is served is ``r_t``'s posterior
mean, the strength flat a priori between 0 and the most the observed tables can hold
(:func:`most_per_dof`): a pair or two that the noise swamps then serve about half
that most, not 0 (on 12 attributes of 3-12 categories whose pilot measured 2 pairs,
clipping at 0 served no unseen error and the max-ent intervals covered 65% of cells).
For a query cell ``c`` of the max-ent answer ``M`` and a missing set ``S``, the
expected squared gap is ``r_|S| M_c prod_{a in S} (1 - M_a(c_a))``. The squared gaps of the
missing sets add up (their components are orthogonal).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np

from .estimate import draw_estimates
from .marginal import MarginalTable
from .maxent import query_constraints

__all__ = [
    "InteractionScale",
    "PooledStrength",
    "missing_sets",
    "most_per_dof",
    "unresolved_floor",
    "unseen_sizing",
    "unseen_squared_bias",
]

MAX_SETS_PER_ORDER = 64  # observed sets measured per order (evenly spaced beyond it)
NULL_DRAWS = 32  # simulated noise tables per observed set (InteractionScale.strength)
_SWEEPS = 100  # iterative proportional fitting sweeps at most (lower_order_bases)
_ORDERS = {2: "pairs", 3: "triples"}
NO_EVIDENCE = 1.0  # per-dof chi-square when no set of any order is observed: the most
# a pair of binary attributes can hold (perfect dependence)


def _dof(shape: Sequence[int]) -> int:
    return int(np.prod([s - 1 for s in shape], dtype=np.int64))


def top_interaction(table: np.ndarray, first: int = 0) -> np.ndarray:
    """The highest-order ANOVA component of ``table`` (centred along every axis from
    ``first`` on; ``first = 1`` for a stack of tables): the orthogonal projection onto
    the contrasts that no smaller marginal determines."""
    out = np.asarray(table, dtype=np.float64)
    for axis in range(first, out.ndim):
        out = out - out.mean(axis=axis, keepdims=True)
    return out


def lower_order_base(table: np.ndarray) -> np.ndarray:
    """The maximum-entropy table given ``table``'s marginals one axis smaller (each
    clipped at 0: a raw estimate may have negative cells; normalised)."""
    out: np.ndarray = lower_order_bases(np.asarray(table, dtype=np.float64)[None])[0]
    return out


def spread_weights(values: np.ndarray, axes: Iterable[int]) -> np.ndarray:
    """``M_c prod_{a in axes} (1 - M_a(c_a))`` per cell of ``values`` (``M``): the share
    of cell c in a chi-square-isotropic interaction of ``axes`` (module docstring)."""
    values = np.asarray(values, dtype=np.float64)
    share = np.ones(values.shape)
    for a in axes:
        one_way = values.sum(axis=tuple(b for b in range(values.ndim) if b != a))
        shape = [1] * values.ndim
        shape[a] = values.shape[a]
        share = share * (1.0 - one_way).reshape(shape)
    return np.asarray(share * values)


@dataclass(frozen=True)
class PooledStrength:
    """The observed sets of one order, pooled: ``estimate`` (per dof, not clipped) and
    its standard error ``se``, ``most`` the largest strength any of their tables can
    hold (:func:`most_per_dof`), ``sets`` how many were measured."""

    estimate: float
    se: float
    most: float
    sets: int

    @property
    def within_noise(self) -> bool:
        """Whether the estimate is within 2 standard errors of 0: the views cannot tell
        these interactions from none."""
        return self.estimate < 2.0 * self.se


@dataclass
class InteractionScale:
    """Pooled interaction strength of each order in the views (module docstring),
    computed per order on first use. ``raw``: each view's unbiased estimate before
    consistency and Norm-Sub (:func:`~.estimate.estimate_views`; its oracle, if it
    carries one, is how :meth:`strength` simulates its noise); ``contrast``: each
    view's oracle noise per contrast dimension
    (:meth:`calmkit_client.FrequencyOracle.contrast_variance`; inf for no reports)."""

    raw: Sequence[MarginalTable]
    contrast: Sequence[float]
    _per_dof: dict[int, float] = field(default_factory=dict)
    _pooled: dict[int, PooledStrength | None] = field(default_factory=dict)
    _margin_noise: dict[int, float] = field(default_factory=dict)

    def observed_sets(self, order: int) -> dict[tuple[int, ...], tuple[int, float]]:
        """Every attribute set of ``order`` inside some view: the view measuring it with
        the least noise and that noise per contrast dimension of its marginal (a view of
        ``L`` cells sums ``L / cells`` of its cells into each cell of the marginal)."""
        best: dict[tuple[int, ...], tuple[int, float]] = {}
        for j, (t, c) in enumerate(zip(self.raw, self.contrast)):
            if not np.isfinite(c) or len(t.attrs) < order:
                continue
            for s in combinations(t.attrs, order):
                cells = int(np.prod([t.values.shape[i] for i in t.axes_of(s)]))
                power = c * t.cells / cells
                if s not in best or power < best[s][1]:
                    best[s] = (j, power)
        return best

    def pooled(self, order: int) -> PooledStrength | None:
        """The sets of ``order`` the views hold, pooled (:class:`PooledStrength`; the
        inverse-variance mean of their unbiased strengths, :meth:`strength`); None if
        the views hold no such set. Computed once per order."""
        if order not in self._pooled:
            self._pooled[order] = self._pool(order)
        return self._pooled[order]

    def _pool(self, order: int) -> PooledStrength | None:
        sets = self.observed_sets(order)
        chosen = sorted(sets)
        if len(chosen) > MAX_SETS_PER_ORDER:
            step = len(chosen) / MAX_SETS_PER_ORDER
            chosen = [chosen[int(i * step)] for i in range(MAX_SETS_PER_ORDER)]
        signal, weight, most, count = 0.0, 0.0, 0.0, 0
        for s in chosen:
            measured = self.strength(s, *sets[s])
            if measured is None:  # a degenerate marginal holds no interaction
                continue
            precision = 1.0 / max(measured[1], 1e-300)
            signal += precision * measured[0]
            weight += precision
            table = self.raw[sets[s][0]]
            most = max(most, most_per_dof([table.values.shape[i] for i in table.axes_of(s)]))
            count += 1
        if weight <= 0:
            return None
        return PooledStrength(signal / weight, weight**-0.5, most, count)

    def strength(
        self, attrs: tuple[int, ...], view: int, power: float
    ) -> tuple[float, float] | None:
        """Set ``attrs``' strength per dof from ``view``'s raw estimate: ``(r,
        variance)``, its squared gap (:func:`squared_gap`) less the gap's mean under
        noise alone, over the spread of its lower-order base, and the variance of that
        under the noise; None where a marginal is degenerate.

        The noise is simulated (:data:`NULL_DRAWS` tables, a seed fixed per set): the
        set's table with no interaction of its order (its lower-order base) plus the
        view's estimation noise, drawn as its oracle draws it and projected onto the
        set (a table without an oracle: independent normal noise of ``power`` per
        cell). Read in closed form, the statistic's noise is ``power dof`` only where
        the margins are uniform: a noisy margin times the other attributes' deviation
        from uniform lands in the top interaction, and an OUE table's total is noisy.
        On 12
        attributes of 3-12 categories the closed form read pairs of strength 0.005 as
        0.58 and triples of 0.0001 as 0.1-0.4."""
        table = self.raw[view]
        values = table.project(attrs).values
        null_truth = lower_order_bases(values[None])
        spread = float(spread_weights(null_truth[0], range(values.ndim)).sum())
        if spread <= 1e-12:
            return None
        gen = np.random.default_rng([NULL_DRAWS, *attrs])
        null = squared_gap(null_truth + self._noise(table, attrs, values.shape, power, gen))
        observed = float(squared_gap(values[None])[0])
        estimate = (observed - float(null.mean())) / spread
        return estimate, float(null.var(ddof=1)) * (1 + 1 / null.size) / spread**2

    @staticmethod
    def _noise(
        table: MarginalTable,
        attrs: tuple[int, ...],
        shape: tuple[int, ...],
        power: float,
        gen: np.random.Generator,
    ) -> np.ndarray:
        """(NULL_DRAWS, *shape) estimation noise of ``table`` on ``attrs``' marginal
        (of that ``shape``)."""
        if table.oracle is None or table.n < 1:
            return gen.normal(0.0, np.sqrt(power), (NULL_DRAWS, *shape))
        truth = np.clip(table.values, 0.0, None).reshape(-1)
        truth = truth / truth.sum() if truth.sum() > 0 else np.full(truth.size, 1 / truth.size)
        draws = draw_estimates(table.oracle, truth, int(table.n), gen, NULL_DRAWS) - truth
        keep = table.axes_of(attrs)
        other = tuple(1 + i for i in range(len(table.attrs)) if i not in keep)
        out: np.ndarray = draws.reshape(NULL_DRAWS, *table.values.shape).sum(axis=other)
        return out

    def per_dof(self, order: int) -> float:
        """``r_order`` served: its posterior mean given the pooled estimate
        (:meth:`pooled`), the strength flat on ``[0, most]`` a priori; an order no view
        holds takes the highest lower order's value."""
        if order not in self._per_dof:
            pooled = self.pooled(order)
            if pooled is None:
                value = self.per_dof(order - 1) if order > 2 else NO_EVIDENCE
            else:
                value = _posterior_mean(pooled.estimate, pooled.se, pooled.most)
            self._per_dof[order] = value
        return self._per_dof[order]

    def margin_noise(self, attr: int) -> float:
        """The noise variance of one category of ``attr``'s margin pooled over the raw
        views that hold it (inverse variance, as consistency pools them; a view's
        margin cell sums its cells over the other attributes); inf if none does.
        Computed once per attribute."""
        if attr not in self._margin_noise:
            variances = [t.project((attr,)).variance for t in self.raw if attr in t.attrs]
            precision = sum(1.0 / v for v in variances if 0 < v < np.inf)
            self._margin_noise[attr] = 1.0 / precision if precision > 0 else float("inf")
        return self._margin_noise[attr]

    def sizing(self, order: int) -> str:
        """How the served strength of ``order`` was found, in words (an answer's
        ``variance_method`` says it, so that a user who meets wide max-ent intervals
        reads why)."""
        name = _ORDERS.get(order, f"{order}-way sets")
        pooled = self.pooled(order)
        if pooled is None and order > 2:
            lower = _ORDERS.get(order - 1, f"{order - 1}-way sets")
            return f"{name}: no view holds one, taken as strong as the {lower}"
        if pooled is None:
            return f"{name}: no view holds one, sized at the most their tables can hold"
        if pooled.within_noise:
            return (
                f"{name}: the {pooled.sets} the views hold show no strength above their "
                "noise, sized between none and the most their tables can hold"
            )
        return f"{name}: measured on the {pooled.sets} the views hold"


def _posterior_mean(estimate: float, se: float, most: float) -> float:
    """The mean of a normal law (``estimate``, ``se``) truncated to ``[0, most]``: a
    strength flat on that range a priori, observed with that noise."""
    from scipy.stats import truncnorm

    if se <= 0 or most <= 0:
        return float(min(max(estimate, 0.0), most))
    lo, hi = (0.0 - estimate) / se, (most - estimate) / se
    return float(truncnorm.mean(lo, hi, loc=estimate, scale=se))


def lower_order_bases(tables: np.ndarray) -> np.ndarray:
    """(B, *shape) the maximum-entropy table given each of ``tables``' (B, *shape)
    marginals one axis smaller (clipped at 0, normalised): iterative proportional
    fitting from uniform, all B at once (exact after one sweep for pairs)."""
    batch, dims = tables.shape[0], tables.ndim - 1
    targets = []
    for drop in range(1, dims + 1):
        t = np.clip(tables.sum(axis=drop, keepdims=True), 0.0, None)
        total = t.reshape(batch, -1).sum(axis=1).reshape((batch,) + (1,) * dims)
        safe = np.where(total > 0, total, 1.0)
        targets.append((drop, np.where(total > 0, t / safe, 1.0 / t[0].size)))
    p = np.full(tables.shape, 1.0 / float(np.prod(tables.shape[1:])))
    for _ in range(_SWEEPS):
        previous = p
        for drop, t in targets:
            current = p.sum(axis=drop, keepdims=True)
            p = p * np.where(current > 0, t / np.where(current > 0, current, 1.0), 0.0)
        if dims <= 2 or np.abs(p - previous).max() < 1e-9:
            break
    return p


def squared_gap(tables: np.ndarray) -> np.ndarray:
    """(B,) for each table ``T`` of (B, *shape): ``||top(T - |T| base)||^2``, ``base``
    its lower-order maximum-entropy table (:func:`lower_order_bases`) and ``|T|`` its
    total (an OUE estimate's is noisy)."""
    base = lower_order_bases(tables)
    total = tables.reshape(tables.shape[0], -1).sum(axis=1)
    gap = top_interaction(tables - total.reshape((-1,) + (1,) * (tables.ndim - 1)) * base, 1)
    out: np.ndarray = (gap**2).reshape(gap.shape[0], -1).sum(axis=1)
    return out


def missing_sets(tables: Sequence[MarginalTable], query: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The query's attribute sets (2 or more, as axes of the query) that lie inside no
    constraint of its max-ent answer: the interactions that answer sets to none."""
    held = [set(axes) for axes, _ in query_constraints(tables, query)]
    axes = range(len(query))
    return [
        s
        for r in range(2, len(query) + 1)
        for s in combinations(axes, r)
        if not any(set(s) <= h for h in held)
    ]


def most_per_dof(sizes: Sequence[int]) -> float:
    """The largest strength per degree of freedom an interaction of attributes with
    ``sizes`` categories can have: a table's chi-square against independence is at most
    ``prod(sizes) / max(sizes) - 1`` (per user; one attribute determining the others),
    over ``dof = prod(L_a - 1)``. 1 for a binary pair, ``1 / (L - 1)`` for an L x L
    pair (both: perfect dependence, where the bound is exact)."""
    cells = int(np.prod(sizes, dtype=np.int64))
    dof = _dof(sizes)
    return (cells // max(sizes) - 1) / dof if dof > 0 else 0.0


def unresolved_floor(values: np.ndarray, noise: Sequence[float]) -> np.ndarray:
    """Per-cell squared error the answer ``values`` cannot rule out where it holds a
    category at 0 (Norm-Sub set the category's estimated margin to 0, in the answer and
    in every bootstrap replicate, so the bootstrap sees no error there): the
    category's true share may be as large as its margin's noise (``noise[i]``: the
    variance of one category of axis i's margin, :meth:`InteractionScale.margin_noise`).
    A cell with such a category gets the product over the axes of its categories'
    shares squared, a category at 0 counting its noise's standard deviation (the
    truth spread over the other attributes as their margins are). Zeros elsewhere."""
    values = np.asarray(values, dtype=np.float64)
    product = np.ones(values.shape)
    unresolved = np.zeros(values.shape, dtype=bool)
    for axis, var in enumerate(noise):
        others = tuple(a for a in range(values.ndim) if a != axis)
        margin = values.sum(axis=others, keepdims=True)
        zero = (margin == 0) & bool(np.isfinite(var))  # no view holds it: not set to 0
        product = product * np.where(zero, var, margin**2)
        unresolved = unresolved | zero
    return np.where(unresolved, product, 0.0)


def unseen_sizing(missing: Iterable[tuple[int, ...]], scale: InteractionScale) -> str:
    """How the strengths of the ``missing`` sets' orders were found
    (:meth:`InteractionScale.sizing`), joined, with each lower order an unobserved one
    is taken from; empty for no missing set."""
    orders = {len(s) for s in missing}
    for order in sorted(orders):
        while order > 2 and scale.pooled(order) is None:
            order -= 1
            orders.add(order)
    return "; ".join(scale.sizing(order) for order in sorted(orders))


def unseen_squared_bias(
    values: np.ndarray, missing: Iterable[tuple[int, ...]], scale: InteractionScale
) -> np.ndarray:
    """Per-cell expected squared gap (shape of ``values``) between the max-ent answer
    ``values`` and the truth in the ``missing`` interactions (axes of the answer); a
    strength is never taken above what the set's table can hold (:func:`most_per_dof`:
    without evidence, :data:`NO_EVIDENCE` is a binary pair's most, far above a large
    table's)."""
    total = np.zeros(np.shape(values))
    for s in missing:
        most = most_per_dof([np.shape(values)[a] for a in s])
        total += min(scale.per_dof(len(s)), most) * spread_weights(values, s)
    return total
