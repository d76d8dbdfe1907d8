"""Shrinkage of each view's own interactions (a calmkit addition to the consistency step
of CALM (Zhang et al., "CALM: Consistent Adaptive Local Marginal for Marginal Release
under Local Differential Privacy", CCS 2018), §4.4; measured in docs/accuracy.md).

After consistency, the part of a view that no other view shares (its interactions
beyond the closure sets it contains and its single attributes) is still as noisy as
the raw oracle estimate: the consistency updates only touch shared marginals. That
part spans ``dim`` degrees of freedom (the ANOVA components of the view in none of
those sets), each carrying the oracle's ``contrast_variance`` ``c``. Each view is
pulled towards its maximum-entropy ``base`` given those shared marginals:

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
from dataclasses import dataclass
from itertools import chain, combinations

import numpy as np

from calmkit_client import CalmkitError

from .consistency import intersection_closure
from .marginal import MarginalTable
from .maxent import maximum_entropy

__all__ = ["ShrunkViews", "interaction_dof", "shared_sets", "shrink_interactions"]


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
