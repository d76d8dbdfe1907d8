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
chi-square metric, ``dof_S = prod(L_a - 1)``. It is measured in L2, where the oracle
noise is exact: for an attribute set ``T`` inside a view, the top-order ANOVA part of
(raw estimate minus its maximum-entropy table given ``T``'s subsets one smaller) has
squared norm ``signal + c_T dof_T`` in expectation (``c_T``: the view's noise power
per contrast dimension times the view's cells summed per cell of ``T``'s marginal).
Dividing ``||gap_T||^2 - c_T dof_T`` by ``T``'s spread ``sum_c M_c prod (1 - M_a)``
estimates ``r_T``, with noise variance about ``2 c_T^2 dof_T / spread^2``; the sets of
one order are pooled by inverse noise variance into ``r_t`` (clipped at 0). For a
query cell ``c`` of the max-ent answer ``M`` and a missing set ``S``, the expected
squared gap is ``r_|S| M_c prod_{a in S} (1 - M_a(c_a))``. The squared gaps of the
missing sets add up (their components are orthogonal).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np

from .marginal import MarginalTable
from .maxent import maximum_entropy, query_constraints

__all__ = ["InteractionScale", "missing_sets", "most_per_dof", "unseen_squared_bias"]

MAX_SETS_PER_ORDER = 256  # observed sets measured per order (evenly spaced beyond it)
NO_EVIDENCE = 1.0  # per-dof chi-square when no set of any order is observed: the most
# a pair of binary attributes can hold (perfect dependence)


def _dof(shape: Sequence[int]) -> int:
    return int(np.prod([s - 1 for s in shape], dtype=np.int64))


def top_interaction(table: np.ndarray) -> np.ndarray:
    """The highest-order ANOVA component of ``table`` (centred along every axis): the
    orthogonal projection onto the contrasts that no smaller marginal determines."""
    out = np.asarray(table, dtype=np.float64)
    for axis in range(out.ndim):
        out = out - out.mean(axis=axis, keepdims=True)
    return out


def lower_order_base(table: np.ndarray) -> np.ndarray:
    """The maximum-entropy table given ``table``'s marginals one axis smaller (each
    clipped at 0: a raw estimate may have negative cells)."""
    axes = set(range(table.ndim))
    constraints = [
        ((tuple(sorted(axes - {drop}))), np.clip(table.sum(axis=drop), 0.0, None)) for drop in axes
    ]
    base, _, _ = maximum_entropy(table.shape, constraints)
    return base


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


@dataclass
class InteractionScale:
    """Pooled interaction strength of each order in the views (module docstring),
    computed per order on first use. ``raw``: each view's unbiased estimate before
    consistency and Norm-Sub (:func:`~.estimate.estimate_views`); ``contrast``: each
    view's oracle noise per contrast dimension
    (:meth:`calmkit_client.FrequencyOracle.contrast_variance`; inf for no reports)."""

    raw: Sequence[MarginalTable]
    contrast: Sequence[float]
    _per_dof: dict[int, float] = field(default_factory=dict)

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

    def measured(self, order: int) -> float | None:
        """``r_order`` from the sets the views hold, None if they hold none."""
        sets = self.observed_sets(order)
        if not sets:
            return None
        chosen = sorted(sets)
        if len(chosen) > MAX_SETS_PER_ORDER:
            step = len(chosen) / MAX_SETS_PER_ORDER
            chosen = [chosen[int(i * step)] for i in range(MAX_SETS_PER_ORDER)]
        signal, weight = 0.0, 0.0
        for s in chosen:
            view, power = sets[s]
            table = self.raw[view].project(s).values
            base = lower_order_base(table)
            gap = top_interaction(table - base)
            dof = _dof(table.shape)
            spread = float(spread_weights(base, range(base.ndim)).sum())
            if spread <= 0:  # a degenerate marginal holds no interaction
                continue
            # set T alone: r_T = (||gap||^2 - power dof) / spread, noise variance
            # 2 power^2 dof / spread^2; pooled by inverse variance
            precision = spread**2 / (2.0 * power**2 * dof) if power > 0 else 1e12 * spread**2
            signal += precision * (float((gap**2).sum()) - power * dof) / spread
            weight += precision
        return max(0.0, signal / weight) if weight > 0 else None

    def per_dof(self, order: int) -> float:
        """``r_order``; an order no view holds takes the highest lower order's value."""
        if order not in self._per_dof:
            value = self.measured(order)
            if value is None:
                value = self.per_dof(order - 1) if order > 2 else NO_EVIDENCE
            self._per_dof[order] = value
        return self._per_dof[order]


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
