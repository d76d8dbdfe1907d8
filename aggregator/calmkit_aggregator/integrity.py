"""Manipulation detection: could an honest population have produced these counts?

The submit token ships in every app, so anyone can submit reports that no device made.
This module tests a collection's (or one batch's) support counts for *feasibility*:
whether honest devices, running the plan's frequency oracles on any data at all, could
plausibly have produced them, and bounds what fakes that pass the test can still do.

**What honest reports look like.** A view's oracle has parameters ``p``, ``q`` and ``L``
cells (:mod:`calmkit_client.oracles`). An honest GRR report lands in cell ``v`` with
probability ``p`` when ``v`` is the device's true cell and ``q`` otherwise, so over
``n`` honest reports the count of cell ``v`` is a sum of ``n`` independent Bernoulli
variables with rates in ``{q, p}``, whatever the devices' data: its rate share
``pi_v = q + (p - q) f_v`` lies in ``[q, p]`` (exactly the image of the simplex).
Such a sum is stochastically below ``Binomial(n, p)`` and above ``Binomial(n, q)``
(couple each Bernoulli with one at rate ``p``, or ``q``). So the one-sided p-values

    upper_v = P(Binomial(n, p) >= c_v),     lower_v = P(Binomial(n, q) <= c_v)

are valid (conservative) for every honest population at once. An OUE report sets each
bit independently (its true cell's with ``p = 1/2``, every other with ``q``), so each
bit count is tested the same way; and the total number of ones over a view's ``n``
reports, ``T = sum_v c_v``, is *exactly* ``Binomial(n, p) + Binomial(n (L - 1), q)``
whatever the data: mean ``n (p + (L - 1) q)``, variance ``n (p (1 - p) + (L - 1)
q (1 - q))``. Reports of all ones (or all zeros) push ``T`` far outside it. Its
p-values come from Bernstein's inequality, ``P(T - mean >= t) <= exp(-t^2 / (2 (var +
t / 3)))`` (a sum of independent variables within 1 of their means), again valid for
every honest population. Storage keeps only per-bit counts, not per-report totals;
``T`` is their sum, so nothing more is needed.

**False alarms.** Every p-value is compared with ``alpha / tests``, where ``tests``
counts the one-sided tests made in the check (two per cell, two per OUE view's total):
a Bonferroni correction, so one check of honest counts raises a flag with probability
at most ``alpha``. The default :data:`DEFAULT_ALPHA` is ``1e-6`` per check: a server
that checks a collection after every change of its counts (thousands of checks over
its life) still raises a false flag with probability at most about ``1e-3``, and a
flag means "almost surely not honest" rather than "worth a look". The price is power:
a cheat must stand out by about 5 standard deviations (more with many cells) before it
is flagged.

**What fakes can do (bounds).** Let a share ``s`` of a view's ``n`` reports be fake.
The view's frequency estimate of cell ``v`` is ``f_hat = (c / n - q) / (p - q)``. With
the honest reports' rate ``pi`` in ``[q, p]`` and the fakes' count share ``g`` in
``[0, s]`` (the share of all reports that are fakes counting in ``v``),
``c / n = (1 - s) pi + g``, while the honest reports alone give ``(pi - q) / (p - q)``.
The shift is therefore

    shift = ((1 - s) pi + g - q - (pi - q)) / (p - q) = (g - s pi) / (p - q),

largest upward at ``g = s``, ``pi = q`` (every fake on a cell the honest population
leaves at its floor: ``s (1 - q) / (p - q)``) and downward at ``g = 0``, ``pi = p``
(``- s p / (p - q)``). Hence

    |shift| <= s * max(p, 1 - q) / (p - q)        (:func:`max_shift_per_share`)

for GRR and OUE alike (an OUE fake sets each bit freely, so ``g`` is per bit). It is at
most the simple bound ``s / (p - q)``. The feasibility test cannot tighten it: a smart
attacker keeps every count inside the honest band (a share of fakes spread so each
cell's rate stays within ``[q, p]``) and still shifts cells by up to this much,
undetected. Only bounding ``s`` itself (admission tickets: one report per admitted
device) bounds the damage; see docs/security.md "Manipulation".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from calmkit_client import CalmkitError
from calmkit_client.oracles import FrequencyOracle

__all__ = [
    "DEFAULT_ALPHA",
    "Feasibility",
    "ViewFlag",
    "check_feasible",
    "max_shift_per_share",
]

DEFAULT_ALPHA = 1e-6  # false-alarm probability of one check of honest counts


def max_shift_per_share(oracle: FrequencyOracle) -> float:
    """The largest shift of one cell's frequency estimate of a view with ``oracle``,
    per unit share of fake reports in that view: ``max(p, 1 - q) / (p - q)`` (the
    module docstring derives it; attained by every fake on a cell whose honest rate is
    ``q``)."""
    p, q = float(oracle.p), float(oracle.q)
    return max(p, 1.0 - q) / (p - q)


@dataclass(frozen=True)
class ViewFlag:
    """One view whose counts no honest population explains: ``view`` (its position in
    the counts checked), ``high``/``low`` cells above ``n p`` / below ``n q``
    significantly, ``total``: "high"/"low" when an OUE view's total of ones is out of
    its band ("" otherwise), ``p_value``: the smallest one-sided p-value of the view
    (before the Bonferroni correction), ``reason``: one line saying so."""

    view: int
    high: tuple[int, ...]
    low: tuple[int, ...]
    total: str
    p_value: float
    reason: str


@dataclass(frozen=True)
class Feasibility:
    """A check's result: the ``flagged`` views, ``tests`` one-sided tests made, each
    at ``alpha / tests``."""

    alpha: float
    tests: int
    flagged: tuple[ViewFlag, ...]

    @property
    def passed(self) -> bool:
        return not self.flagged

    @property
    def reason(self) -> str:
        """One line: "" when passed, else the first flagged view's reason (and how
        many more views are flagged)."""
        if not self.flagged:
            return ""
        more = len(self.flagged) - 1
        return self.flagged[0].reason + (f" (and {more} more views)" if more else "")


def _bernstein(dev: np.ndarray, var: np.ndarray) -> np.ndarray:
    """Bernstein's bound on P(T - mean >= dev) for dev >= 0 (1 for dev <= 0)."""
    dev = np.maximum(dev, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        bound = np.exp(-(dev**2) / (2.0 * (var + dev / 3.0)))
    return np.where(dev > 0, np.nan_to_num(bound, nan=1.0), 1.0)


def _names(views: Sequence[str] | None, j: int) -> str:
    return f"view {j}" + (f" ({views[j]})" if views is not None else "")


def check_feasible(
    oracles: Sequence[FrequencyOracle],
    n: np.ndarray,
    counts: Sequence[np.ndarray],
    alpha: float = DEFAULT_ALPHA,
    views: Sequence[str] | None = None,
) -> Feasibility:
    """Test whether honest devices could have produced these support counts.

    Args:
        oracles: each view's frequency oracle (GRR or OUE).
        n: reports per view, (m,).
        counts: per view its (L_j,) cell (GRR) or bit (OUE) counts.
        alpha: the false-alarm probability of the whole check (Bonferroni over every
            cell and view), in (0, 1).
        views: names of the views for the reasons (e.g. "age x city"), or None.

    Returns a :class:`Feasibility` whose ``flagged`` views have a p-value below
    ``alpha / tests``. Vectorised over all cells of all views at once.
    """
    from scipy import stats  # the service's dependency; storage never imports this

    if not (isinstance(alpha, float | int) and 0 < alpha < 1):
        raise CalmkitError(f"alpha ({alpha!r}) must be in (0, 1)")
    n = np.asarray(n, dtype=np.int64)
    m = len(oracles)
    if n.shape != (m,) or len(counts) != m:
        raise CalmkitError(f"n (shape {n.shape}) and counts ({len(counts)}) must cover {m} views")
    if m == 0:
        return Feasibility(float(alpha), 0, ())
    sizes = np.array([o.L for o in oracles], dtype=np.int64)
    flat = np.concatenate([np.asarray(c, dtype=np.int64) for c in counts])
    if flat.size != sizes.sum():
        raise CalmkitError(f"counts ({flat.size} cells) must hold {int(sizes.sum())} cells")
    p = np.array([o.p for o in oracles], dtype=float)
    q = np.array([o.q for o in oracles], dtype=float)
    oue = np.array([o.name == "OUE" for o in oracles])
    live = n > 0  # a view without reports makes no test
    view_of = np.repeat(np.arange(m), sizes)
    n_cell = n[view_of]
    # A tail can be below alpha / tests (<= 1/2) only beyond the binomial's median, so
    # only counts above n p (upper) or below n q (lower) get a p-value; the others
    # keep 1 (theirs is >= 1/2). Honest counts rarely leave [n q, n p]: most checks
    # of a batch compute no tail at all.
    upper, lower = np.ones(flat.size), np.ones(flat.size)
    hi = (n_cell > 0) & (flat > n_cell * p[view_of])
    lo = (n_cell > 0) & (flat < n_cell * q[view_of])
    if hi.any():
        upper[hi] = stats.binom.sf(flat[hi] - 1, n_cell[hi], p[view_of][hi])
    if lo.any():
        lower[lo] = stats.binom.cdf(flat[lo], n_cell[lo], q[view_of][lo])
    totals = np.add.reduceat(flat, np.concatenate([[0], np.cumsum(sizes)[:-1]]))
    mean = n * (p + (sizes - 1) * q)
    var = n * (p * (1 - p) + (sizes - 1) * q * (1 - q))
    t_high = np.where(oue & live, _bernstein(totals - mean, var), 1.0)
    t_low = np.where(oue & live, _bernstein(mean - totals, var), 1.0)
    tests = int(2 * sizes[live].sum() + 2 * (oue & live).sum())
    level = alpha / max(tests, 1)
    high, low = upper < level, lower < level
    tot_high, tot_low = t_high < level, t_low < level
    bad_view = np.zeros(m, bool)
    bad_view[view_of[high | low]] = True
    bad_view |= tot_high | tot_low
    starts = np.concatenate([[0], np.cumsum(sizes)])
    smallest = np.minimum.reduceat(np.minimum(upper, lower), starts[:-1])
    smallest = np.minimum(smallest, np.minimum(t_high, t_low))
    flagged = []
    for j in np.flatnonzero(bad_view):  # only flagged views: a few reasons to write
        lo, hi = starts[j], starts[j + 1]
        cells_high = tuple(int(i) for i in np.flatnonzero(high[lo:hi]))
        cells_low = tuple(int(i) for i in np.flatnonzero(low[lo:hi]))
        total = "high" if tot_high[j] else "low" if tot_low[j] else ""
        flagged.append(
            ViewFlag(
                int(j),
                cells_high,
                cells_low,
                total,
                float(smallest[j]),
                _reason(oracles[int(j)], int(n[j]), flat[lo:hi], cells_high, cells_low, total)
                .replace("{view}", _names(views, int(j)))
                .replace("{pv}", f"p-value {float(smallest[j]):.2g} < {alpha:g}/{tests} tests"),
            )
        )
    return Feasibility(float(alpha), tests, tuple(flagged))


def _reason(
    oracle: FrequencyOracle,
    n: int,
    counts: np.ndarray,
    high: tuple[int, ...],
    low: tuple[int, ...],
    total: str,
) -> str:
    """One line on why a view is flagged ({view} and {pv} filled in by the caller)."""
    what = "bit" if oracle.name == "OUE" else "cell"
    if high:
        c = int(counts[high[0]])
        return (
            f"{{view}} ({oracle.name}): {what} {high[0]} counts {c} of {n} reports, above any "
            f"honest population's {n * oracle.p:.0f} (rate p = {oracle.p:.3f}; {{pv}})"
        )
    if low:
        c = int(counts[low[0]])
        return (
            f"{{view}} ({oracle.name}): {what} {low[0]} counts {c} of {n} reports, below any "
            f"honest population's {n * oracle.q:.0f} (rate q = {oracle.q:.3f}; {{pv}})"
        )
    ones = int(counts.sum())
    expect = n * (oracle.p + (oracle.L - 1) * oracle.q)
    return (
        f"{{view}} (OUE): {ones} ones in {n} reports, {total}er than honest reports' "
        f"{expect:.0f} ({{pv}})"
    )
