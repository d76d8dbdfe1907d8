"""Shrinkage of each attribute's margin and of each view's own interactions (calmkit
additions to the consistency step of CALM (Zhang et al., "CALM: Consistent Adaptive
Local Marginal for Marginal Release under Local Differential Privacy", CCS 2018), §4.4;
measured in docs/accuracy.md and docs/shrinkage.md).

**Margins** (:func:`shrink_margins`, on the raw estimates, before consistency). Where an
attribute has many categories and few reports, its estimated margin is mostly noise:
Norm-Sub then keeps the noise of the cells it leaves positive, and every answer
multiplies it in. Each attribute's main effect (its margin minus uniform, the same ANOVA
component in every view that holds it) is pooled over those views with the consistency
step's weights, to ``z`` with noise ``nu`` per dimension in ``D = L - 1`` dimensions,
and scaled in every view by a factor ``lambda`` in [0, 1]: the posterior mean of
``t / (t + nu)`` under the law of the signal per dimension ``t`` that the margins show
together (:mod:`.margin_prior`: an empirical-Bayes law fitted over every attribute of 4
or more categories; with one such attribute, James-Stein's ``max(0, 1 - D nu /
||z||^2)``). A margin thus borrows how flat its peers are: where most attributes carry
little signal for their reports, a margin whose noise happens to look like signal is
not kept for it, while one far above its noise keeps its signal. Only where that is
predicted to help, and only for 4 or more categories (in fewer than 3 dimensions
shrinkage cannot beat the unbiased estimate, Stein 1956): taking the shrunk margin as
the truth, 64 normal draws of the noise (a fixed seed) are passed through Norm-Sub alone
and through the shrinkage then Norm-Sub (as the pipeline runs them), and the one with
the smaller squared error wins. Skewed margins (a few large cells, many near zero),
where Norm-Sub removes most of the noise, are left as they are; nearly flat ones, where
it removes little, are pulled towards uniform. Scaling one component by the same factor
in every view keeps the views' shared marginals equal, so the consistency step that
follows sees the same problem with less noise. Measured against James-Stein's factor per
margin in docs/margin-shrinkage.md.

**Interactions** (:func:`shrink_interactions`, after consistency). The part of a view
that no other view shares (its interactions beyond the closure sets it contains and its
single attributes) is still as noisy as the raw oracle estimate: the consistency updates
only touch shared marginals. That part spans ``dim`` degrees of freedom (the ANOVA
components of the view in none of those sets), each carrying the oracle's
``contrast_variance`` ``c``. Each view is pulled towards its maximum-entropy ``base``
given those shared marginals:

    T' = base + lambda (T - base),   lambda = max(0, 1 - c * dim / ||T - base||^2),

the positive-part James-Stein factor: the share of the view's own spread that its
noise does not explain. It is chosen per view because interactions differ widely
between attribute sets (a factor pooled over views over-shrinks the strong ones;
measured in docs/accuracy.md). ``T'`` keeps every shared marginal (both terms have
it), so the views stay consistent, and it is a convex combination of two non-negative
tables. A view inside another view (or listed twice) shares all of itself, so it is
left as it is: shrinking it alone would break its consistency with the larger view.
Post-processing only: no privacy is spent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import chain, combinations

import numpy as np

from calmkit_client import CalmkitError

from .consistency import intersection_closure, norm_sub_rows
from .margin_prior import JamesStein, Shrinker, fit_signal_prior
from .marginal import MarginalTable, inverse_variance_weights
from .maxent import maximum_entropy

__all__ = [
    "ShrunkMargins",
    "ShrunkViews",
    "interaction_dof",
    "james_stein_factors",
    "margin_factor",
    "shared_sets",
    "shrink_interactions",
    "shrink_margins",
]

# Noise draws (and their seed) that compare a margin's shrinkage with Norm-Sub alone.
_MARGIN_DRAWS = 64
_MARGIN_SEED = 20181015
# Stein's shrinkage beats the unbiased estimate only in 3 or more dimensions: margins of
# 2 or 3 categories (1 or 2 contrast dimensions) are left to Norm-Sub.
_MARGIN_MIN_CATEGORIES = 4


@dataclass(frozen=True)
class ShrunkViews:
    """Views after shrinkage; ``factors[i]`` is lambda for view i (1 = unchanged)."""

    tables: tuple[MarginalTable, ...]
    factors: np.ndarray


def _subsets(attrs: Sequence[int]) -> chain[tuple[int, ...]]:
    return chain.from_iterable(combinations(attrs, r) for r in range(1, len(attrs) + 1))


def interaction_dof(sizes: dict[int, int], shared: Sequence[Sequence[int]]) -> int:
    """Degrees of freedom of a view over ``sizes`` (attribute -> categories) that no
    ``shared`` attribute set determines: ``cells - 1`` minus the ANOVA components
    ``prod(L_a - 1)`` of every non-empty subset of a shared set."""
    total = int(np.prod(list(sizes.values()), dtype=np.int64)) - 1
    covered = {frozenset(s) for base in shared for s in _subsets(sorted(base))}
    return total - sum(int(np.prod([sizes[a] - 1 for a in s], dtype=np.int64)) for s in covered)


def shared_sets(attrs: Sequence[int], closure: Sequence[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """The maximal attribute sets of view ``attrs`` that it shares or need not doubt:
    the closure sets strictly inside it and its single attributes, none inside another
    (the constraints of its max-ent base)."""
    inside = [s for s in closure if s and set(s) < set(attrs)]
    shared = inside + [(a,) for a in attrs]
    return [s for s in shared if not any(set(s) < set(o) for o in shared)]


def shrink_interactions(
    tables: Sequence[MarginalTable],
    contrast_variance: Sequence[float],
    tol: float = 1e-12,
    max_iter: int = 1000,
    closure: Sequence[tuple[int, ...]] | None = None,
) -> ShrunkViews:
    """Shrink every view's unshared interactions (module docstring). ``tables`` must
    be consistent; ``contrast_variance[i]`` is view i's oracle noise per contrast
    dimension (:meth:`FrequencyOracle.contrast_variance`; 0 exact, inf no reports).
    ``closure``: the views' intersection closure when already known
    (:attr:`~.consistency.ConsistentViews.closure`), else computed here."""
    if len(contrast_variance) != len(tables):
        raise CalmkitError(
            f"contrast_variance (length {len(contrast_variance)}) must have one entry "
            f"per view ({len(tables)})"
        )
    if closure is None:
        closure = intersection_closure([t.attrs for t in tables])
    whole = set(closure)  # views inside (or equal to) another view: nothing unshared
    bases, factors = [], []
    for t, c in zip(tables, contrast_variance):
        if len(t.attrs) == 1 or c == 0 or t.attrs in whole:  # nothing to doubt
            bases.append(t.values)
            factors.append(1.0)
            continue
        shared = shared_sets(t.attrs, closure)
        constraints = [(t.axes_of(s), t.project(s).values) for s in shared]
        base, _, _ = maximum_entropy(t.values.shape, constraints, tol, max_iter)
        bases.append(base)
        spread = float(((t.values - base) ** 2).sum())
        noise = c * interaction_dof(dict(zip(t.attrs, t.values.shape)), shared)
        factors.append(max(0.0, 1.0 - noise / spread) if spread > 0 else 0.0)
    out = tuple(
        MarginalTable(t.attrs, b + lam * (t.values - b), t.variance, t.n)
        for t, b, lam in zip(tables, bases, factors)
    )
    return ShrunkViews(out, np.array(factors))


@dataclass(frozen=True)
class ShrunkMargins:
    """Raw views after their margins' shrinkage; ``factors[a]`` is lambda for attribute
    position ``a`` (1 = kept as estimated: Norm-Sub predicted better, or exact)."""

    tables: tuple[MarginalTable, ...]
    factors: dict[int, float]


@dataclass(frozen=True)
class _MainEffect:
    """One attribute's main effect in each view ``members`` holding it (centred margins
    ``margins``, each cell summing ``cells`` view cells), pooled to ``pooled`` with
    ``noise`` per dimension."""

    members: tuple[int, ...]
    margins: tuple[np.ndarray, ...]
    cells: tuple[int, ...]
    pooled: np.ndarray
    noise: float


def _main_effect(
    tables: Sequence[MarginalTable], contrast: Sequence[float], attr: int
) -> _MainEffect | None:
    """``attr``'s main effect pooled with the consistency step's weights (None when a
    view holds it exactly or no view with reports holds it)."""
    members = tuple(i for i, t in enumerate(tables) if attr in t.attrs and np.isfinite(contrast[i]))
    if not members or any(contrast[i] == 0 for i in members):
        return None
    margins, cells = [], []
    for i in members:
        margin = tables[i].project((attr,)).values
        margins.append(margin - margin.mean())
        cells.append(tables[i].cells // margin.size)
    w = inverse_variance_weights([c * tables[i].variance for c, i in zip(cells, members)])
    pooled = np.tensordot(w, np.array(margins), axes=1)
    noise = float(sum(wj**2 * c * contrast[i] for wj, c, i in zip(w, cells, members)))
    return _MainEffect(members, tuple(margins), tuple(cells), pooled, noise)


def james_stein_factors(z: np.ndarray, noise: float) -> np.ndarray:
    """The positive-part James-Stein factor ``max(0, 1 - D noise / ||z||^2)`` of each
    row of centred margins ``z`` (..., L), ``D = L - 1``, ``noise`` per dimension."""
    spread = (z**2).sum(axis=-1)
    dim = z.shape[-1] - 1
    out: np.ndarray = np.clip(1.0 - dim * noise / np.maximum(spread, 1e-300), 0.0, None)
    return out


def margin_factor(
    z: np.ndarray, noise: float, prior: Shrinker | None = None, draws: int = _MARGIN_DRAWS
) -> float:
    """The factor for a centred pooled margin ``z`` (L,) with ``noise`` per dimension:
    its factor under ``prior`` (the signal's law over the attributes,
    :mod:`.margin_prior`; None: James-Stein's, the margin alone) if the margin has 4
    or more categories and, taking the shrunk margin as the truth, shrinking then
    Norm-Sub has a smaller simulated squared error than Norm-Sub alone; else 1 (module
    docstring; ``draws`` normal draws of the noise, a fixed seed)."""
    if z.size < _MARGIN_MIN_CATEGORIES or noise <= 0:
        return 1.0
    law = prior if prior is not None else JamesStein()
    dim = np.array(z.size - 1)
    lam = float(law.factors(np.array((z**2).sum()), dim, np.array(noise)))
    truth = 1.0 / z.size + lam * z
    gen = np.random.default_rng(_MARGIN_SEED)
    e = gen.standard_normal((draws, z.size)) * np.sqrt(noise)
    x = truth + e - e.mean(axis=1, keepdims=True)  # noise in the contrasts only
    kept = norm_sub_rows(x)
    z_star = x - 1.0 / z.size
    factors = law.factors((z_star**2).sum(axis=1), dim, np.array(noise))
    shrunk = norm_sub_rows(1.0 / z.size + factors[:, None] * z_star)
    better = ((shrunk - truth) ** 2).sum() < ((kept - truth) ** 2).sum()
    return lam if better else 1.0


def shrink_margins(
    tables: Sequence[MarginalTable], contrast_variance: Sequence[float], pooled: bool = True
) -> ShrunkMargins:
    """Shrink every attribute's margin towards uniform where that is predicted better
    than Norm-Sub (module docstring). ``tables``: the raw estimates (one per view,
    :func:`~.estimate.estimate_views`); ``contrast_variance[i]``: view i's oracle noise
    per contrast dimension (0 exact, inf no reports). ``pooled=False``: each margin by
    James-Stein's factor alone (calmkit's default before 2026-11-28, for comparison)."""
    if len(contrast_variance) != len(tables):
        raise CalmkitError(
            f"contrast_variance (length {len(contrast_variance)}) must have one entry "
            f"per view ({len(tables)})"
        )
    values = [t.values.copy() for t in tables]
    sizes = {a: n for t in tables for a, n in zip(t.attrs, t.values.shape)}
    factors: dict[int, float] = dict.fromkeys(sorted(sizes), 1.0)
    effects = {
        a: effect
        for a in sorted(sizes)
        if sizes[a] >= _MARGIN_MIN_CATEGORIES
        and (effect := _main_effect(tables, contrast_variance, a)) is not None
    }
    prior = _signal_law(list(effects.values())) if pooled else JamesStein()
    for attr, effect in effects.items():
        factors[attr] = margin_factor(effect.pooled, effect.noise, prior)
        if factors[attr] == 1.0:
            continue
        for i, margin, c in zip(effect.members, effect.margins, effect.cells):
            shape = [1] * values[i].ndim
            shape[tables[i].attrs.index(attr)] = margin.size
            values[i] -= (1.0 - factors[attr]) * (margin / c).reshape(shape)
    # still each view's own reports and noise level, no longer the oracle's estimate
    out = tuple(replace(t, values=v, oracle=None, group=1) for t, v in zip(tables, values))
    return ShrunkMargins(out, factors)


def _signal_law(effects: Sequence[_MainEffect]) -> Shrinker:
    """The law of the margins' signal fitted to every margin shrinkage may touch
    (:func:`~.margin_prior.fit_signal_prior`); James-Stein's with one margin only."""
    if len(effects) < 2:
        return JamesStein()
    return fit_signal_prior(
        np.array([(e.pooled**2).sum() for e in effects]),
        np.array([e.pooled.size - 1 for e in effects]),
        np.array([e.noise for e in effects]),
    )
