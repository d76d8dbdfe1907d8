"""Uncertainty of reconstructed marginals by a parametric bootstrap.

An answer passes through consistency, Norm-Sub, shrinkage and (for a query no view
covers) maximum entropy; none of them is linear, so no closed form gives its
variance. The bootstrap treats the reconstructed views as the truth: each view's
``n_j`` users get cell counts ``round(n_j * table)``, fresh support counts are drawn
from the oracles' exact law for that fixed population (:func:`sample_support`), the
whole pipeline runs again, and the spread of an answer over the replicates is its
variance. A phase counted in the margins only (``SupportCounts.margins_from``) is
drawn afresh too, its views' tables answered by the same reconstruction. A view's raw
estimate (and its projections) has a closed form instead:
:meth:`calmkit_aggregator.reconstruction.marginal.MarginalTable.cell_variance`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from calmkit_client import CalmkitError, Plan
from calmkit_client.randomness import RngLike
from calmkit_client.schema import AttrRef
from calmkit_client.validation import is_int

from .estimate import contrast_variances, estimate_views
from .pipeline import Estimator, reconstruct_by
from .support import SupportCounts
from .unseen import (
    InteractionScale,
    missing_sets,
    unresolved_floor,
    unseen_sizing,
    unseen_squared_bias,
)

__all__ = [
    "PLUG_INS",
    "Bootstrap",
    "bootstrap",
    "interaction_scale",
    "plug_in_counts",
    "sample_support",
]

MAX_REPLICATES = 1000


def sample_support(
    plan: Plan,
    n: np.ndarray,
    true_counts: Sequence[np.ndarray],
    rng: np.random.Generator,
) -> SupportCounts:
    """Support counts of every view's reports, drawn from the oracle's exact law for a
    fixed population: ``n`` (m,) reports per view, ``true_counts[j]`` (L_j,) ints
    the cells of view j's users. OUE: each cell's count is
    ``Bin(N_c, p) + Bin(n_j - N_c, q)`` (independent bits); GRR: a report keeps its
    cell with probability ``p - q`` and is otherwise uniform over all ``L`` cells
    (the same law as :meth:`calmkit_client.GRR.perturb`)."""
    support = []
    for j, oracle in enumerate(plan.view_oracles):
        nv = np.asarray(true_counts[j], dtype=np.int64)
        if oracle.name == "OUE":
            c = rng.binomial(nv, oracle.p) + rng.binomial(n[j] - nv, oracle.q)
        else:
            kept = rng.binomial(nv, oracle.p - oracle.q)
            c = kept + rng.multinomial(n[j] - kept.sum(), np.full(oracle.L, 1.0 / oracle.L))
        support.append(np.asarray(c, dtype=np.int64))
    return SupportCounts(plan, n, tuple(support))


def _replicate_draw(
    support: SupportCounts, truth_of: Estimator
) -> Callable[[np.random.Generator], SupportCounts]:
    """A replicate's support counts drawn from ``truth_of``: every view's, and those
    of ``support.margins_from`` (a set-aside phase: its views' tables are answered by
    ``truth_of``), so that the replicates carry that phase's noise too."""
    truth = plug_in_counts(truth_of, support.n)
    side = support.margins_from.pooled() if support.margins_from is not None else None
    side_truth = (
        _counts([truth_of.answer(list(v)).values for v in side.plan.views], side.n)
        if side is not None
        else []
    )

    def draw(gen: np.random.Generator) -> SupportCounts:
        main = sample_support(support.plan, support.n, truth, gen)
        if side is None:
            return main
        return replace(main, margins_from=sample_support(side.plan, side.n, side_truth, gen))

    return draw


def plug_in_counts(estimator: Estimator, n: np.ndarray) -> list[np.ndarray]:
    """Integer cell counts (L_j,) per view: ``n_j`` times the reconstructed view,
    rounded by largest remainder so that they sum to ``n_j``."""
    return _counts([table.values for table in estimator.views.tables], n)


def _counts(tables: Sequence[np.ndarray], n: np.ndarray) -> list[np.ndarray]:
    """``n_j`` times each table, clipped at 0 and normalised, rounded by largest
    remainder to integers summing to ``n_j``."""
    counts = []
    for values, nj in zip(tables, np.asarray(n, dtype=np.int64)):
        share = np.clip(values.reshape(-1), 0.0, None)
        total = share.sum()
        share = share / total if total > 0 else np.full(share.size, 1.0 / share.size)
        exact = share * int(nj)
        floor = np.floor(exact).astype(np.int64)
        short = int(nj) - int(floor.sum())
        if short > 0:
            floor[np.argsort(floor - exact, kind="stable")[:short]] += 1
        counts.append(floor)
    return counts


@dataclass(frozen=True)
class Bootstrap:
    """Replicate reconstructions of one collection (see module docstring).

    ``plug_in``: the reconstruction the replicates' population was taken from (the
    truth they are measured against); ``scale``: the views' interaction strength, for
    what a max-ent answer cannot see (:mod:`.unseen`). Both None: noise only."""

    replicates: tuple[Estimator, ...]
    plug_in: Estimator | None = None
    scale: InteractionScale | None = None

    def answers(self, attrs: Sequence[AttrRef]) -> np.ndarray:
        """The answer of every replicate, shape (B, *query shape)."""
        return np.stack([r.answer(attrs).values for r in self.replicates])

    def variance(self, attrs: Sequence[AttrRef]) -> np.ndarray:
        """Per-cell variance of the answer over the replicates (ddof 1), query shape:
        the noise only."""
        return np.asarray(self.answers(attrs).var(axis=0, ddof=1))

    def bias(self, attrs: Sequence[AttrRef]) -> np.ndarray:
        """Per-cell bias of the pipeline at the plug-in truth: the replicates' mean
        answer minus the plug-in's own answer (zeros without a plug-in)."""
        answers = self.answers(attrs)
        if self.plug_in is None:
            return np.zeros(answers.shape[1:])
        return np.asarray(answers.mean(axis=0) - self.plug_in.answer(attrs).values)

    def unseen(self, attrs: Sequence[AttrRef], estimator: Estimator) -> np.ndarray:
        """Expected squared gap of ``estimator``'s answer in the interactions no view
        holds (zeros for a projection, or without a scale; :mod:`.unseen`)."""
        answer = estimator.answer(attrs)
        if self.scale is None or answer.method == "projection":
            return np.zeros(answer.values.shape)
        missing = missing_sets(estimator.views.tables, answer.attrs)
        return unseen_squared_bias(answer.values, missing, self.scale)

    def unseen_sizing(self, attrs: Sequence[AttrRef], estimator: Estimator) -> str:
        """How :meth:`unseen` sized the interactions ``estimator``'s answer misses, in
        words (:func:`~.unseen.unseen_sizing`; empty for a projection, or without a
        scale)."""
        answer = estimator.answer(attrs)
        if self.scale is None or answer.method == "projection":
            return ""
        return unseen_sizing(missing_sets(estimator.views.tables, answer.attrs), self.scale)

    def mean_squared_error(self, attrs: Sequence[AttrRef], estimator: Estimator) -> np.ndarray:
        """Per-cell expected squared total error of ``estimator``'s answer, bounded by
        four terms (module docstring): the plug-in pipeline's noise (variance over the
        replicates) and bias (the replicates' mean minus the plug-in's answer, squared,
        less the noise of that mean, ``variance / B``, clipped at 0), how far the served
        answer is from the plug-in's (the shrinkage's displacement, known exactly), and
        what the views cannot show (:meth:`unseen`); at least the floor of a category
        held at 0 (:meth:`unresolved`), which no replicate can see."""
        answers = self.answers(attrs)
        variance = answers.var(axis=0, ddof=1)
        served = estimator.answer(attrs).values
        if self.plug_in is None:
            return np.asarray(variance + self.unseen(attrs, estimator))
        plug_in = self.plug_in.answer(attrs).values
        gap = answers.mean(axis=0) - plug_in
        squared_bias = np.clip(gap**2 - variance / len(self.replicates), 0.0, None)
        displacement = (served - plug_in) ** 2
        total = variance + squared_bias + displacement + self.unseen(attrs, estimator)
        return np.asarray(np.maximum(total, self.unresolved(attrs, estimator)))

    def unresolved(self, attrs: Sequence[AttrRef], estimator: Estimator) -> np.ndarray:
        """The floor of a cell the answer holds at 0 because a category's estimated
        margin is 0 (:func:`~.unseen.unresolved_floor`; zeros without a scale)."""
        answer = estimator.answer(attrs)
        if self.scale is None:
            return np.zeros(answer.values.shape)
        noise = [self.scale.margin_noise(a) for a in answer.attrs]
        return unresolved_floor(answer.values, noise)


PLUG_INS = ("unshrunk", "served")


def _check_replicates(replicates: object) -> int:
    if not is_int(replicates):
        raise CalmkitError(f"replicates ({replicates!r}) must be an int in [2, {MAX_REPLICATES}]")
    if not 2 <= replicates <= MAX_REPLICATES:
        raise CalmkitError(f"replicates ({replicates}) must be in [2, {MAX_REPLICATES}]")
    return int(replicates)


def bootstrap(
    support: SupportCounts,
    estimator: Estimator | None = None,
    replicates: int = 32,
    rng: RngLike = None,
    shrink: bool = True,
    reconstruction: str = "local",
    plug_in: str = "unshrunk",
) -> Bootstrap:
    """A parametric bootstrap of ``reconstruct_by(support, reconstruction, shrink)``.

    ``estimator`` is that reconstruction if already computed. ``plug_in``: the
    population the replicates are drawn from: ``"unshrunk"`` (the default) the
    reconstruction without shrinkage, nearly unbiased, so that the replicates show the
    bias of Norm-Sub and shrinkage too, and the views' interaction strength is
    measured for max-ent answers (:meth:`Bootstrap.mean_squared_error`);
    ``"served"``: ``estimator`` itself, noise only (the variance around what the
    pipeline gives without noise). The relative standard error of a variance from
    ``B`` replicates is about ``sqrt(2 / (B - 1))`` (25% at the default 32, 10% at 200).
    """
    replicates = _check_replicates(replicates)
    if plug_in not in PLUG_INS:
        raise CalmkitError(f"plug_in ({plug_in!r}) must be one of {list(PLUG_INS)}")
    if int(support.n.sum()) == 0:
        raise CalmkitError("support (no reports) has nothing to bootstrap")
    support = support.pooled()  # as the reconstruction sees it: replicates per pooled view
    gen = np.random.default_rng(rng)
    base = estimator if estimator is not None else reconstruct_by(support, reconstruction, shrink)
    truth_of, shrink_runs = base, shrink
    if plug_in == "unshrunk":
        shrink_runs = False
        if shrink:
            truth_of = reconstruct_by(support, reconstruction, shrink=False)
    draw = _replicate_draw(support, truth_of)
    runs = tuple(reconstruct_by(draw(gen), reconstruction, shrink_runs) for _ in range(replicates))
    if plug_in == "served":
        return Bootstrap(runs)
    return Bootstrap(runs, truth_of, interaction_scale(support))


def interaction_scale(support: SupportCounts) -> InteractionScale:
    """The views' interaction strength (:class:`~.unseen.InteractionScale`) from each
    view's unbiased estimate and oracle noise (views measured more than once pooled,
    as the reconstruction pools them)."""
    support = support.pooled()
    return InteractionScale(estimate_views(support), contrast_variances(support))
