"""Estimation of each view's marginal from its support counts (the pipeline's estimation
step: each view's oracle estimates its cells, CALM (Zhang et al., "CALM: Consistent
Adaptive Local Marginal for Marginal Release under Local Differential Privacy", CCS
2018), §2.2)."""

from __future__ import annotations

import numpy as np

from calmkit_client import FrequencyOracle

from .marginal import MarginalTable, inverse_variance_weights
from .support import SupportCounts

__all__ = ["contrast_variances", "draw_estimates", "estimate_views", "side_margins"]


def estimate_views(support: SupportCounts) -> list[MarginalTable]:
    """One unbiased :class:`MarginalTable` per view: ``(C/n_j - q)/(p - q)`` reshaped
    to the view's shape, with the oracle's f-independent per-cell variance (eqs. 1, 2)
    and the oracle itself (:meth:`MarginalTable.cell_variance`: the exact plug-in one).
    A view without reports is uniform with infinite variance (it then gets no weight).
    """
    plan = support.plan
    tables = []
    for j, (view, oracle) in enumerate(zip(plan.views, plan.view_oracles)):
        shape = plan.schema.shape(view)
        n = int(support.n[j])
        if n == 0:
            values = np.full(shape, 1.0 / oracle.L)
            tables.append(MarginalTable(view, values, np.inf, 0))
            continue
        values = oracle.estimate(support.counts[j], n).reshape(shape)
        tables.append(MarginalTable(view, values, float(oracle.variance(n)), n, oracle))
    return tables


def side_margins(support: SupportCounts) -> list[MarginalTable]:
    """One 1-way table per attribute that ``support.margins_from``'s views measure
    (none without it): each such view's unbiased estimate summed onto the attribute
    (:meth:`MarginalTable.project`: its variance times the cells summed), pooled over
    the views by inverse variance. The pipeline makes them consistent with the views
    and then drops them, so the views' margins take these reports in and nothing
    else of the phase does: neither its tables' interactions nor their Norm-Sub."""
    side = support.margins_from
    if side is None:
        return []
    parts: dict[int, list[MarginalTable]] = {}
    for table in estimate_views(side.pooled()):
        if table.n > 0:
            for a in table.attrs:
                parts.setdefault(a, []).append(table.project((a,)))
    return [_pooled(tables) for _, tables in sorted(parts.items())]


def _pooled(tables: list[MarginalTable]) -> MarginalTable:
    """Inverse-variance average of estimates of one marginal (variance 1 / sum 1/var)."""
    weights = inverse_variance_weights(t.variance for t in tables)
    values = sum(w * t.values for w, t in zip(weights, tables))
    variance = 1.0 / sum(1.0 / t.variance for t in tables)
    return MarginalTable(tables[0].attrs, np.asarray(values), variance, sum(t.n for t in tables))


def contrast_variances(support: SupportCounts) -> list[float]:
    """Each view's oracle noise per contrast dimension at its report count
    (:meth:`~calmkit_client.FrequencyOracle.contrast_variance`; inf for a view without
    reports): what the shrinkage steps take the noise to be."""
    return [
        oracle.contrast_variance(int(n)) if n > 0 else np.inf
        for oracle, n in zip(support.plan.view_oracles, support.n)
    ]


def draw_estimates(
    oracle: FrequencyOracle, truth: np.ndarray, n: int, gen: np.random.Generator, draws: int
) -> np.ndarray:
    """(draws, L) estimates of ``n`` reports from a population with view table
    ``truth`` (L cells, normalised here), drawn as the oracle draws them: the users
    spread over the cells (multinomial), then each report perturbed (GRR: one
    multinomial of the reported values; OUE: each bit a binomial)."""
    p, q = oracle.p, oracle.q
    t = truth / truth.sum()
    if oracle.name == "GRR":
        counts = gen.multinomial(n, (p - q) * t + q, size=draws)
    else:
        cells = gen.multinomial(n, t, size=draws)
        counts = gen.binomial(cells, p) + gen.binomial(n - cells, q)
    out: np.ndarray = (counts / n - q) / (p - q)
    return out
