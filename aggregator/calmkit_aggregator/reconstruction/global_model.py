"""Global reconstruction: one model of the joint distribution fitted to every view at
once, answering any marginal with its help (the approach of Private-PGM, McKenna,
Sheldon & Miklau, ICML 2019, on CALM's views; the per-query alternative, :mod:`.pipeline`,
is CALM's consistency and maximum entropy: Zhang et al., "CALM: Consistent Adaptive
Local Marginal for Marginal Release under Local Differential Privacy", CCS 2018,
§4.1-4.4).

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
   answers and which the answers keep for what the views hold (step 4): the model's
   role there is to carry dependence along paths, and a path multiplies the
   shrinkage of its couplings; measured in docs/reconstruction.md.
3. **Fit** the maximum-entropy distribution matching those marginals: a log-linear
   model with one factor per view, held on a junction tree of the views' attribute
   sets (:mod:`.junction`), by iterative proportional fitting on the whole joint.
   When the triangulated graph's largest clique would exceed ``max_clique`` cells (many
   overlapping views: at d = 32 with hundreds of pairs the triangulation is the whole
   domain), the model holds the views greedily in order of their interaction strength
   (total correlation), skipping any that would push a clique past the cap.
4. **Answer** a query ``A`` (``answers="pairs"``, the default): maximum entropy over
   ``A`` given the views' projections onto it, exactly as the local pipeline answers
   (:func:`~.maxent.answer_query`, the views after the local shrinkage,
   :func:`~.shrinkage.shrink_interactions`), and, for each pair of ``A`` that no view
   holds, the model's marginal of that pair (exact inference): the dependence the
   model carries along paths through other attributes, where per-query max-ent would
   fill in independence. A query whose pairs the views all hold is the local answer.
   With exact marginals in, every pair and every query whose marginal is pairwise
   log-linear given the views is answered exactly. ``answers="model"``: the model's
   own marginal of ``A`` (exact for any distribution the model can represent; when
   some views were left out of the model, moved to the nearest table in relative
   entropy that meets every view's projection onto ``A``, IPF started at the model's
   marginal). Measured on noisy views (docs/reconstruction.md), the model's own
   marginal loses to "pairs" where views overlap densely: its higher-order terms come
   from marginalising noisy couplings, and its views keep the weaker prior of step 2.
   A dense answer above ``max_cells`` cells is refused with its size
   (:class:`~.junction.TableTooLarge`); :meth:`GlobalEstimator.model` is the factored
   form.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from calmkit_client import CalmkitError, Plan
from calmkit_client.schema import AttrRef
from calmkit_client.validation import check_int

from .consistency import ConsistentViews, make_consistent
from .estimate import contrast_variances, estimate_views, side_margins
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
from .maxent import Answer, answer_query, maximum_entropy, query_constraints
from .shrinkage import interaction_dof, shared_sets, shrink_interactions, shrink_margins
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


ANSWERS = ("pairs", "model")


@dataclass(frozen=True)
class GlobalEstimator:
    """Answers any marginal query of a collection from one model fitted to all its
    views and from the views themselves (module docstring, step 4).

    ``views``: the consistent views every answer meets, with the local pipeline's
    interaction shrinkage (:func:`~.shrinkage.shrink_interactions`; ``shrinkage`` holds
    its factors, None when off); ``targets``: the views after the model's prior (what
    the model is fitted to; ``prior``: its factors); ``model``: the fitted
    junction-tree distribution; ``held[i]``: whether view i is a factor of the model
    (all True unless the clique cap left some out); ``residual``/``iterations``: the
    fit's largest target residual and sweeps; ``answers``: ``"pairs"`` (the default,
    step 4) or ``"model"`` (the model's own marginal, step 4's alternative);
    ``margins``: each attribute position's margin factor
    (:func:`~.shrinkage.shrink_margins`), None when shrinkage was off.
    """

    plan: Plan
    views: ConsistentViews
    targets: tuple[MarginalTable, ...]
    model: TreeModel
    held: tuple[bool, ...]
    residual: float
    iterations: int
    shrinkage: np.ndarray | None = None
    prior: np.ndarray | None = None
    tol: float = 1e-9
    max_iter: int = 1000
    max_cells: int = DEFAULT_MAX_CELLS
    answers: str = "pairs"
    margins: Mapping[int, float] | None = None

    def __post_init__(self) -> None:
        if self.answers not in ANSWERS:
            raise CalmkitError(f"answers ({self.answers!r}) must be one of {list(ANSWERS)}")

    def answer(self, attrs: Sequence[AttrRef]) -> Answer:
        """The marginal over ``attrs`` (names or positions; answered over their sorted
        positions). ``answers="pairs"``: the local answer (``"projection"`` or
        ``"maxent"``) when the views hold every pair of the query, else max-ent over
        the views' projections and the model's marginals of the pairs no view holds
        (``"maxent+model"``). ``answers="model"``: the model's marginal (``"model"``),
        moved onto the views' projections when some view is not in the model
        (``"model+ipf"``). :class:`~.junction.TableTooLarge` if the dense table would
        exceed ``max_cells`` cells."""
        query = tuple(sorted(self.plan.schema.resolve(attrs)))
        shape = self.plan.schema.shape(query)
        cells = cells_of(query, self.plan.schema.sizes)
        if cells > self.max_cells:
            raise TableTooLarge(
                f"marginal over {len(query)} attributes ({cells} cells) must have at most "
                f"max_cells ({self.max_cells}) cells: use the factored model "
                "(GlobalEstimator.model)"
            )
        if self.answers == "pairs":
            return self._pairs_answer(query, shape)
        values = self.model.marginal(query, self.max_cells).reshape(shape)
        if all(self.held):
            return Answer(query, values, "model")
        constraints = query_constraints(self.targets, query)
        values, residual, it = i_projection(values, constraints, self.tol, self.max_iter)
        return Answer(query, values, "model+ipf", residual, it)

    def _pairs_answer(self, query: tuple[int, ...], shape: tuple[int, ...]) -> Answer:
        constraints = query_constraints(self.views.tables, query)
        held = [set(axes) for axes, _ in constraints]
        free = [
            (i, j)
            for i, j in itertools.combinations(range(len(query)), 2)
            if shape[i] > 1 and shape[j] > 1 and not any({i, j} <= h for h in held)
        ]
        if not free:
            return answer_query(self.views.tables, query, shape, self.tol, self.max_iter)
        pairs = [
            (
                (i, j),
                self.model.marginal((query[i], query[j]), self.max_cells).reshape(
                    shape[i], shape[j]
                ),
            )
            for i, j in free
        ]
        values, residual, it = maximum_entropy(
            shape, [*pairs, *constraints], self.tol, self.max_iter
        )
        return Answer(query, values, "maxent+model", residual, it)


def fit_global(
    plan: Plan,
    tables: Sequence[MarginalTable],
    contrast: Sequence[float] | None = None,
    tol: float = 1e-9,
    max_iter: int = 1000,
    max_clique: int = DEFAULT_MAX_CLIQUE,
    max_cells: int = DEFAULT_MAX_CELLS,
    answers: str = "pairs",
    side: Sequence[MarginalTable] = (),
) -> GlobalEstimator:
    """The global model of ``plan``'s estimated views ``tables`` (one per view, in
    order; :func:`~.estimate.estimate_views`), made consistent with the ``side``
    margins (:func:`~.estimate.side_margins`): pooled and made non-negative; when
    ``contrast`` (each view's noise per contrast dimension; None: neither) is given,
    shrunk as the local pipeline shrinks them (the views answers meet) and moved to
    their posterior means under the model's prior (what the model is fitted to)
    (module docstring). ``max_clique``: cells of the model's largest clique;
    ``max_cells``: of the largest dense answer; ``answers``: see
    :class:`GlobalEstimator`."""
    check_int("max_clique", max_clique, 1)
    check_int("max_cells", max_cells, 1)
    if answers not in ANSWERS:
        raise CalmkitError(f"answers ({answers!r}) must be one of {list(ANSWERS)}")
    if len(tables) != plan.m:
        raise CalmkitError(f"tables ({len(tables)}) must hold one table per view ({plan.m})")
    views = make_consistent(tables, tol=tol, max_iter=max_iter, side=side)
    targets, factors, prior = views.tables, None, None
    if contrast is not None:
        targets, prior = _prior_targets(views, contrast)
        shrunk = shrink_interactions(views.tables, contrast, closure=views.closure)
        views, factors = replace(views, tables=shrunk.tables), shrunk.factors
    sizes = plan.schema.sizes
    tree, held = select_views(targets, sizes, int(max_clique))
    kept = [(t.attrs, t.values) for t, h in zip(targets, held) if h]
    maximal = [(a, v) for a, v in kept if not any(set(a) < set(b) for b, _ in kept)]
    unique = list({a: (a, v) for a, v in maximal}.values())  # duplicates agree: consistent
    noise = [t.variance for t, h in zip(targets, held) if h and np.isfinite(t.variance)]
    fit_tol = max(tol, FIT_NOISE_SHARE * float(np.sqrt(min(noise, default=0.0))))
    fit = fit_maxent(tree, unique, tol=fit_tol, max_iter=max_iter)
    return GlobalEstimator(
        plan,
        views,
        tuple(targets),
        fit.model,
        held,
        fit.residual,
        fit.iterations,
        factors,
        prior,
        tol,
        max_iter,
        int(max_cells),
        answers,
    )


def reconstruct_global(
    support: SupportCounts,
    tol: float = 1e-9,
    max_iter: int = 1000,
    shrink: bool = True,
    max_clique: int = DEFAULT_MAX_CLIQUE,
    max_cells: int = DEFAULT_MAX_CELLS,
    answers: str = "pairs",
) -> GlobalEstimator:
    """Estimate every view from ``support`` and fit the global model to all of them
    (:func:`fit_global`), with the shrinkage (the margins' first,
    :func:`~.shrinkage.shrink_margins`) and the prior unless ``shrink=False``. Views
    measured more than once under one oracle are pooled first
    (:meth:`~.support.SupportCounts.pooled`); the margins of a phase in
    ``support.margins_from`` join the consistency step (:func:`~.estimate.side_margins`).
    """
    support = support.pooled()
    side = side_margins(support)
    sizes = (max_clique, max_cells, answers, side)
    if not shrink:
        tables = estimate_views(support)
        return fit_global(support.plan, tables, None, tol, max_iter, *sizes)
    contrast = contrast_variances(support)
    margins = shrink_margins(estimate_views(support), contrast)
    fitted = fit_global(support.plan, margins.tables, contrast, tol, max_iter, *sizes)
    return replace(fitted, margins=margins.factors)
