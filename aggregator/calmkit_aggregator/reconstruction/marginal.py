"""Marginal tables that carry their noise level (as Private-PGM's measurements do)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from calmkit_client import CalmkitError, FrequencyOracle

__all__ = ["MarginalTable", "inverse_variance_weights"]


@dataclass(frozen=True)
class MarginalTable:
    """A marginal over sorted attribute positions ``attrs``.

    ``values`` has one axis per attribute (in ``attrs`` order, C-order cells as
    :meth:`calmkit_client.Schema.cell_index`), holding fractions. ``variance`` is the
    f-independent variance of each cell (0 for an exact table, ``inf`` for no
    information; consistency weighs views by it); ``n`` the number of reports behind it.

    A view's raw estimate also carries the ``oracle`` that measured it and ``group``,
    how many measured cells each cell sums (1, or C after :meth:`project`): then
    :meth:`cell_variance` is the exact plug-in variance of every cell. Tables made by
    combining several views (consistency, shrinkage) carry no oracle.
    """

    attrs: tuple[int, ...]
    values: np.ndarray
    variance: float = 0.0
    n: int = 0
    oracle: FrequencyOracle | None = None
    group: int = 1

    def __post_init__(self) -> None:
        attrs = tuple(int(a) for a in self.attrs)
        if list(attrs) != sorted(set(attrs)):
            raise CalmkitError(f"attrs ({list(self.attrs)}) must be sorted and unique")
        values = np.asarray(self.values, dtype=np.float64)
        if values.ndim != len(attrs):
            raise CalmkitError(
                f"values (ndim {values.ndim}) must have one axis per attribute ({len(attrs)})"
            )
        if not self.variance >= 0:  # inf: no information (a view without reports)
            raise CalmkitError(f"variance ({self.variance!r}) must be >= 0")
        object.__setattr__(self, "attrs", attrs)
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "variance", float(self.variance))
        if self.oracle is not None and self.oracle.L != values.size * self.group:
            raise CalmkitError(
                f"group ({self.group}) times cells ({values.size}) must be the oracle's "
                f"L ({self.oracle.L})"
            )

    @property
    def cells(self) -> int:
        """Number of cells of the table."""
        return int(self.values.size)

    def axes_of(self, attrs: Iterable[int]) -> tuple[int, ...]:
        """Axes of ``attrs`` (which must be among this table's attributes)."""
        try:
            return tuple(self.attrs.index(a) for a in attrs)
        except ValueError:
            raise CalmkitError(f"attrs ({list(attrs)}) must be within {list(self.attrs)}") from None

    def project(self, attrs: Iterable[int]) -> MarginalTable:
        """The marginal over a subset of the attributes (sorted). Each output cell sums
        ``C = cells / output cells`` input cells, so its variance is ``C * variance``."""
        keep = tuple(sorted(set(attrs)))
        keep_axes = self.axes_of(keep)
        drop = tuple(i for i in range(len(self.attrs)) if i not in keep_axes)
        values = self.values.sum(axis=drop) if drop else self.values
        factor = self.cells // max(1, int(np.prod(values.shape, dtype=np.int64)))
        return MarginalTable(
            keep, values, self.variance * factor, self.n, self.oracle, self.group * factor
        )

    def cell_variance(self) -> np.ndarray:
        """Exact plug-in variance of each cell (shape of ``values``): the oracle's
        variance of a sum of ``group`` cells for a fixed population of ``n`` reports,
        its unknown true frequency replaced by the estimate clipped to [0, 1]
        (:meth:`calmkit_client.FrequencyOracle.sum_variance`). Raises for a table
        that no single oracle measured (consistent or shrunk tables: use
        :func:`calmkit_aggregator.reconstruction.uncertainty.bootstrap`)."""
        if self.oracle is None:
            raise CalmkitError(
                f"table over {list(self.attrs)} was not measured by one oracle: its cells "
                "have no closed-form variance (use a bootstrap)"
            )
        if self.n == 0:
            return np.full(self.values.shape, np.inf)
        plug_in = np.clip(self.values, 0.0, 1.0)
        return np.asarray(self.oracle.sum_variance(self.n, plug_in, self.group))


def inverse_variance_weights(variances: Iterable[float]) -> np.ndarray:
    """Weights (k,) summing to 1 for averaging k estimates of one quantity: ``∝ 1/var``;
    exact estimates (variance 0), when there are any, share all the weight equally;
    equal weights when every variance is 0 or every one is infinite."""
    v = np.asarray(list(variances), dtype=np.float64)
    if np.all(v == 0) or np.all(np.isinf(v)):
        w = np.ones(v.size)
    elif np.any(v == 0):  # exact tables dominate
        w = (v == 0).astype(np.float64)
    else:
        w = 1.0 / v
    out: np.ndarray = w / w.sum()
    return out
