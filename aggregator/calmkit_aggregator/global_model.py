"""Global reconstruction: one model of the joint distribution fitted to every view at
once, answering any marginal by inference in it (the approach of Private-PGM, McKenna,
Sheldon & Miklau, ICML 2019, on CALM's views; papers/calm-ccs18.txt §4.4-4.5 is the
per-query alternative, :mod:`.calm`).

Steps (post-processing of the reports only: no privacy is spent):

1. **Estimate and pool** the views as the local pipeline does (:func:`~.estimate.
   estimate_views`, :func:`~.consistency.make_consistent`: inverse-variance weights from
   each view's oracle and report count, Norm-Sub for non-negativity).
2. **Prior on each view's own interactions.** The part of a view that no other view
   shares carries the raw oracle noise ``c`` per contrast dimension
   (:meth:`~calmkit_client.FrequencyOracle.contrast_variance`). With a Gaussian prior of
   variance ``tau^2`` on those ``dim`` components around the view's maximum-entropy base
   (its shared marginals), the posterior mean is ``base + lambda (T - base)``,
   ``lambda = tau^2 / (tau^2 + c)``, and the unbiased estimate of ``c / (tau^2 + c)``
   from ``||T - base||^2 ~ (tau^2 + c) chi^2_dim`` is ``(dim - 2) c / ||T - base||^2``
   (Efron & Morris 1973): the James-Stein factor
   ``lambda = max(0, 1 - (dim - 2)+ c / ||T - base||^2)``. The model is fitted to these
   posterior means (the objective's likelihood and prior are both quadratic in the
   view's cells, so the penalised fit is a fit to the posterior mean). A view with
   ``dim <= 2`` (a pair of binary attributes has 1) keeps its estimate: no estimate of
   ``tau`` from so few components improves on it. This differs from
   :mod:`.shrinkage` (``dim`` in place of ``dim - 2``), which is tuned for per-query
   answers; measured in docs/reconstruction.md.
3. **Fit** the maximum-entropy distribution matching those marginals: a log-linear
   model with one factor per view, held on a junction tree of the views' attribute
   sets (:mod:`.junction`), by iterative proportional fitting on the whole joint.
   When the triangulated graph's largest clique would exceed ``max_clique`` cells (many
   overlapping views: at d = 32 with hundreds of pairs the triangulation is the whole
   domain), the model holds the views greedily in order of their interaction strength
   (total correlation), skipping any that would push a clique past the cap.
4. **Answer** a query ``A`` by exact inference in the model (projection from a clique,
   else variable elimination on the subtree holding ``A``). If some views were left
   out of the model, the model's marginal is then moved to the nearest table (in
   relative entropy) that agrees with every view's projection onto ``A`` (IPF started
   at the model's marginal, not at uniform): every view still shapes every answer.
   A dense answer above ``max_cells`` cells is refused with its size
   (:class:`~.junction.TableTooLarge`); :meth:`GlobalEstimator.model` is the factored
   form.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from calmkit_client import CalmkitError, Plan
from calmkit_client.schema import AttrRef

from .consistency import ConsistentViews, make_consistent
from .estimate import estimate_views
from .junction import (
    JunctionTree,
    TableTooLarge,
    TreeModel,
    cells_of,
    fit_maxent,
    junction_tree,
    triangulate,
)
from .marginal import MarginalTable
from .maxent import Answer, query_constraints
from .shrinkage import interaction_dof, shared_sets, shrink_interactions
from .support import SupportCounts

__all__ = [
    "DEFAULT_MAX_CELLS",
    "DEFAULT_MAX_CLIQUE",
    "GlobalEstimator",
    "fit_global",
    "i_projection",
    "reconstruct_global",
    "select_views",
]

DEFAULT_MAX_CLIQUE = 1 << 15  # cells of the model's largest clique (256 KiB of float64)
DEFAULT_MAX_CELLS = 1 << 24  # cells of a dense answer or intermediate (128 MiB)
# The fit stops once no view's marginal moves by more than this share of its noise
# standard deviation in a sweep (IPF on pairwise-consistent views that no joint
# distribution meets settles only slowly into its limit cycle).
FIT_NOISE_SHARE = 1e-3


def i_projection(
    start: np.ndarray,
    constraints: Sequence[tuple[tuple[int, ...], np.ndarray]],
    tol: float = 1e-9,
    max_iter: int = 1000,
) -> tuple[np.ndarray, float, int]:
    """The table closest to ``start`` in relative entropy whose marginal over each
    constraint's ``axes`` is its ``target`` (Csiszár 1975): iterative proportional
    fitting from ``start`` (from uniform this is :func:`~.maxent.maximum_entropy`).
    Stops when the largest residual is below ``tol`` or a sweep no longer moves the
    table (constraints no table meets: IPF's limit cycle). Returns (table, residual,
    sweeps)."""
    p = np.array(start, dtype=np.float64)
    dims = p.ndim
    prepared = []
    for axes, target in constraints:
        other = tuple(ax for ax in range(dims) if ax not in axes)
        bshape = [p.shape[ax] if ax in axes else 1 for ax in range(dims)]
        t = np.clip(np.asarray(target, dtype=np.float64), 0.0, None)
        t = t / t.sum() if t.sum() > 0 else np.full(t.shape, 1.0 / t.size)
        prepared.append((other, t.reshape(bshape)))
    residual, it = np.inf, 0
    while it < max_iter:
        it += 1
        previous = p.copy()
        for other, t in prepared:
            current = p.sum(axis=other, keepdims=True)
            ratio = np.zeros(current.shape)
            np.divide(t, current, out=ratio, where=current > 0)
            p *= ratio
        residual = max(
            (float(np.abs(p.sum(axis=other, keepdims=True) - t).max()) for other, t in prepared),
            default=0.0,
        )
        if residual <= tol or float(np.abs(p - previous).max()) <= tol:
            break
    total = p.sum()
    return (p / total if total > 0 else p), residual, it


def _total_correlation(t: MarginalTable) -> float:
    """KL divergence of a view from the product of its one-way marginals (nats)."""
    values = np.clip(t.values, 0.0, None)
    product = np.ones(values.shape)
    for ax in range(values.ndim):
        other = tuple(i for i in range(values.ndim) if i != ax)
        shape = [1] * values.ndim
        shape[ax] = values.shape[ax]
        product = product * values.sum(axis=other).reshape(shape)
    mask = values > 0
    return float((values[mask] * np.log(values[mask] / product[mask])).sum())


def select_views(
    tables: Sequence[MarginalTable], sizes: Sequence[int], max_clique: int
) -> tuple[JunctionTree, tuple[bool, ...]]:
    """A junction tree holding every view if its largest clique stays within
    ``max_clique`` cells; otherwise views taken greedily by decreasing total
    correlation, each kept only if the triangulation still fits (a view whose
    attributes are already pairwise joined costs nothing). Returns the tree and which
    views it holds."""
    views = [t.attrs for t in tables]
    for t in tables:
        if cells_of(t.attrs, sizes) > max_clique:
            raise CalmkitError(
                f"view {list(t.attrs)} ({cells_of(t.attrs, sizes)} cells) must fit "
                f"max_clique ({max_clique})"
            )
    full = junction_tree(views, sizes)
    if full.largest <= max_clique:
        return full, (True,) * len(tables)
    order = sorted(range(len(tables)), key=lambda i: -_total_correlation(tables[i]))
    d = len(sizes)
    joined = np.zeros((d, d), dtype=bool)
    chordal: list[tuple[int, ...]] = []  # maximal cliques of the graph so far (chordal)
    kept: list[int] = []
    for i in order:
        idx = np.asarray(views[i], dtype=np.int64)
        block = joined[np.ix_(idx, idx)]
        if len(idx) > 1 and not block[~np.eye(len(idx), dtype=bool)].all():
            cliques = triangulate([*chordal, views[i]], sizes)
            if max(cells_of(c, sizes) for c in cliques) > max_clique:
                continue
            chordal = cliques
            for c in cliques:
                ci = np.asarray(c, dtype=np.int64)
                joined[np.ix_(ci, ci)] = True
        kept.append(i)
    # a chordal graph triangulates to itself (min-fill eliminates simplicial
    # attributes first): the tree's cliques are the ones checked against the cap
    tree = junction_tree([*chordal, *(views[j] for j in kept)], sizes)
    held = set(kept)
    return tree, tuple(i in held for i in range(len(tables)))


def _prior_targets(
    views: ConsistentViews, contrast: Sequence[float]
) -> tuple[tuple[MarginalTable, ...], np.ndarray]:
    """Each view's posterior mean under the empirical-Bayes prior on its unshared
    interactions (module docstring, step 2) and its factor lambda: the shrinkage of
    :func:`~.shrinkage.shrink_interactions` with ``c`` scaled by ``(dim - 2)+ / dim``,
    which turns its factor ``1 - dim c / S`` into ``1 - (dim - 2)+ c / S``."""
    closure = views.closure
    scaled = []
    for t, c in zip(views.tables, contrast):
        shared = shared_sets(t.attrs, closure)
        dim = interaction_dof(dict(zip(t.attrs, t.values.shape)), shared)
        scaled.append(c * max(dim - 2, 0) / dim if dim > 0 and np.isfinite(c) else c)
    shrunk = shrink_interactions(views.tables, scaled, closure=closure)
    return shrunk.tables, shrunk.factors


@dataclass(frozen=True)
class GlobalEstimator:
    """Answers any marginal query of a collection by inference in one model fitted to
    all its views (module docstring).

    ``views``: the consistent views after the prior (what the model is fitted to);
    ``model``: the fitted junction-tree distribution; ``held[i]``: whether view i is
    a factor of the model (all True unless the clique cap left some out);
    ``residual``/``iterations``: the fit's largest target residual and sweeps;
    ``shrinkage``: each view's factor lambda (None when the prior was off).
    """

    plan: Plan
    views: ConsistentViews
    model: TreeModel
    held: tuple[bool, ...]
    residual: float
    iterations: int
    shrinkage: np.ndarray | None = None
    tol: float = 1e-9
    max_iter: int = 1000
    max_cells: int = DEFAULT_MAX_CELLS

    def answer(self, attrs: Sequence[AttrRef]) -> Answer:
        """The marginal over ``attrs`` (names or positions; answered over their sorted
        positions): the model's marginal (method ``"model"``), moved onto the views'
        projections when some view is not in the model (``"model+ipf"``).
        :class:`~.junction.TableTooLarge` if the dense table would exceed
        ``max_cells`` cells."""
        query = tuple(sorted(self.plan.schema.resolve(attrs)))
        shape = self.plan.schema.shape(query)
        cells = cells_of(query, self.plan.schema.sizes)
        if cells > self.max_cells:
            raise TableTooLarge(
                f"marginal over {len(query)} attributes ({cells} cells) must have at most "
                f"max_cells ({self.max_cells}) cells: use the factored model "
                "(GlobalEstimator.model)"
            )
        values = self.model.marginal(query, self.max_cells).reshape(shape)
        if all(self.held):
            return Answer(query, values, "model")
        constraints = query_constraints(self.views.tables, query)
        values, residual, it = i_projection(values, constraints, self.tol, self.max_iter)
        return Answer(query, values, "model+ipf", residual, it)


def fit_global(
    plan: Plan,
    tables: Sequence[MarginalTable],
    contrast: Sequence[float] | None = None,
    tol: float = 1e-9,
    max_iter: int = 1000,
    max_clique: int = DEFAULT_MAX_CLIQUE,
    max_cells: int = DEFAULT_MAX_CELLS,
) -> GlobalEstimator:
    """The global model of ``plan``'s estimated views ``tables`` (one per view, in
    order; :func:`~.estimate.estimate_views`): pooled and made non-negative, moved to
    their posterior means under the interaction prior when ``contrast`` (each view's
    noise per contrast dimension; None: no prior) is given, and fitted (module
    docstring). ``max_clique``: cells of the model's largest clique; ``max_cells``: of
    the largest dense answer."""
    for name, value in (("max_clique", max_clique), ("max_cells", max_cells)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise CalmkitError(f"{name} ({value!r}) must be an int >= 1")
    if len(tables) != plan.m:
        raise CalmkitError(f"tables ({len(tables)}) must hold one table per view ({plan.m})")
    views = make_consistent(tables, tol=tol, max_iter=max_iter)
    factors = None
    if contrast is not None:
        shrunk, factors = _prior_targets(views, contrast)
        views = ConsistentViews(shrunk, views.inconsistency, views.negativity,
                                views.iterations, views.closure)  # fmt: skip
    sizes = plan.schema.sizes
    tree, held = select_views(views.tables, sizes, int(max_clique))
    targets = [(t.attrs, t.values) for t, h in zip(views.tables, held) if h]
    maximal = [(a, v) for a, v in targets if not any(set(a) < set(b) for b, _ in targets)]
    unique = list({a: (a, v) for a, v in maximal}.values())  # duplicates agree: consistent
    noise = [t.variance for t, h in zip(views.tables, held) if h and np.isfinite(t.variance)]
    fit_tol = max(tol, FIT_NOISE_SHARE * float(np.sqrt(min(noise, default=0.0))))
    fit = fit_maxent(tree, unique, tol=fit_tol, max_iter=max_iter)
    return GlobalEstimator(plan, views, fit.model, held, fit.residual, fit.iterations,
                           factors, tol, max_iter, int(max_cells))  # fmt: skip


def reconstruct_global(
    support: SupportCounts,
    tol: float = 1e-9,
    max_iter: int = 1000,
    shrink: bool = True,
    max_clique: int = DEFAULT_MAX_CLIQUE,
    max_cells: int = DEFAULT_MAX_CELLS,
) -> GlobalEstimator:
    """Estimate every view from ``support`` and fit the global model to all of them
    (:func:`fit_global`), with the interaction prior unless ``shrink=False``."""
    plan = support.plan
    contrast = None
    if shrink:
        contrast = [
            oracle.contrast_variance(int(n)) if n > 0 else np.inf
            for oracle, n in zip(plan.view_oracles, support.n)
        ]
    return fit_global(plan, estimate_views(support), contrast, tol, max_iter, max_clique,
                      max_cells)  # fmt: skip
