"""Datacube: optimal non-uniform noise budgets for marginal release under central DP
(Cormode, Procopiuc, Srivastava & Yaroslavtsev, "Accurate and Efficient Private Release
of Datacubes and Contingency Tables", ICDE 2013).

The data are the count vector ``x`` over the full domain; the workload ``Q`` is a set
of marginals (the mechanism: all k-way marginals). A strategy ``S`` is measured with
per-row noise, ``z = S x + nu``, and the workload is recovered from ``z`` (§2, Fig. 3):

* ``strategy="marginals"`` (S = Q): every workload marginal is measured; all cells of
  one marginal form a group (Def. 3.1, ``C_r = 1``: a record adds 1 to one cell of
  each marginal). Recovery is generalised least squares (§3.2, eq. 7).
* ``strategy="fourier"`` (binary attributes only, §4.1): the parity sums
  ``F_b = sum_eta (-1)^<b,eta> x_eta`` for every attribute set ``b`` inside some
  workload marginal (the paper's set ``F``, including ``b = {}``, i.e. the count n).
  One group per coefficient; in parity units ``C_b = 1`` (the paper's orthonormal
  coefficients are ``2^{-d/2} F_b`` with ``C = 2^{-d/2}``: the same budgets and
  variances). The Hadamard basis is orthogonal, so the answers computed from the
  measured coefficients are the least-squares answers and consistent by
  construction (Observation 1, §4.3). Non-binary schemas are refused
  (:class:`NotScalable` from :meth:`Datacube.check`): the paper binary-encodes
  attributes, which this module does not do; ``strategy="marginals"`` takes any domain.

**Budgets** (§3.1). With the initial recovery ``R`` the release's total variance is
``sum_r w_r Var_r`` where ``w_r = sum_{i in r} sum_j a_j R_ji^2`` (``a = 1``: total
variance over all workload cells) and ``Var_r = f / eta_r^2`` is the per-row noise of
group ``r`` at budget ``eta_r`` (Laplace: ``f = 2``; Gaussian: ``f = (eps sigma)^2``,
below). The constraint is ``sum_r C_r eta_r = eps`` (Laplace, Lemma 3.2, eq. 5) or
``sum_r C_r^2 eta_r^2 = eps^2`` (Gaussian, App. A), and the optima are

* Laplace (cube-root rule, Cor. 3.3): ``eta_r = eps (w_r/C_r)^{1/3} / sum_t (C_t^2 w_t)^{1/3}``,
  total ``2 (sum_r (C_r^2 w_r)^{1/3})^3 / eps^2`` (the paper's ``s_r = 2 w_r``);
* Gaussian (square-root rule, App. A): ``eta_r^2 = eps^2 sqrt(w_r) / (C_r sum_t C_t sqrt(w_t))``,
  total ``f (sum_r C_r sqrt(w_r))^2 / eps^2``;

and ``budgets="uniform"`` spends ``eps / sum_t C_t`` (``eps / sqrt(sum_t C_t^2)``) on
every group. For S = Q the weights use ``R = I`` (each marginal answered by its own
measurement), as in the paper's Step 2; GLS then changes the variance (the release
reports both: ``step2_variance`` and the exact post-GLS ``predicted_total_variance``).
For S = Fourier, ``w_b = sum_{A in Q, A >= b} a_A 2^{-|A|}`` and Step 3 changes nothing.

**Consistency / GLS** (§3.2 done exactly without the ``2^d`` domain). The table space
of a marginal over ``A`` splits orthogonally into interaction subspaces ``B <= A``
(ANOVA; for binary ``B`` the span of one Hadamard vector). The component of ``C_A x``
in subspace ``B`` is ``theta_B / m_{A,B}`` broadcast over ``A \\ B``, with
``theta_B = P_B C_B x`` (``P_B`` centres the ``B``-marginal along each of its axes)
and ``m_{A,B} = cells(A) / cells(B)``; the ``theta_B`` of different ``B`` are free
parameters of ``x``. So the weighted least-squares problem
``min_x sum_r ||C_{A_r} x - z_r||^2 / sigma_r^2`` decouples per ``B``:

    theta_hat_B = sum_r lambda_rB P_B(z_r summed onto B) / sum_r lambda_rB,
    lambda_rB = 1 / (sigma_r^2 m_{A_r,B}),  Cov(theta_hat_B) = P_B / sum_r lambda_rB

and every answer ``C_A x_hat = sum_{B <= A} theta_hat_B / m_{A,B}`` comes from the same
``x_hat`` (consistent; unbiased; per-cell variance
``sum_B prod_{i in B}(1 - 1/c_i) / (sum_r lambda_rB) / m_{A,B}^2``). Fourier is the same
representation with ``theta_B = 2^{-|B|} F_B chi_B`` (``chi_B(g) = (-1)^{|g|}``).

**Privacy accounting** (Prop. 3.1, add/remove one record: one record adds 1 to one
entry of ``x``). Row ``i`` of group ``r`` gets Laplace(1/eta_r) noise (variance
``2/eta_r^2``) or Gaussian noise of variance ``f/eta_r^2``; the rescaled map
``x -> (eta_r S_i x)`` has L1 sensitivity ``sum_r C_r eta_r = eps`` (L2:
``sqrt(sum_r C_r^2 eta_r^2) = eps``), so the release is eps-DP (Laplace(1) noise) or
(eps, delta)-DP (Gaussian of standard deviation ``eps sigma(eps, delta)``, where
``sigma`` is the analytic calibration of Balle & Wang 2018, Thm 8, for unit L2
sensitivity: exact for every eps, so ``f = (eps sigma)^2``). The paper's Theorem 2.2
uses ``f = 2 log(2/delta)``, valid only for eps < 1; it is larger there (pass
``factor=`` to :func:`gaussian_allocation` to reproduce it). The paper's proof of
Prop. 3.1 carries a factor 2 (replace-one) that its constraint drops; this module uses
add/remove-one throughout. Answers are released as fractions: the noisy counts are
divided by the true n, which is treated as public (as :class:`PriView` does).

**Non-negativity.** The least-squares answers can be negative and their sum is the
noisy total; :meth:`DatacubeRelease.answer` applies Norm-Sub (the Euclidean
projection onto the simplex, :func:`calmkit_aggregator.norm_sub`) to each answer
separately (so answers are no longer exactly mutually consistent);
:meth:`DatacubeRelease.raw` gives the consistent, unbiased answers before it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import combinations

import numpy as np
import numpy.typing as npt
from scipy import optimize, stats

from calmkit_aggregator.reconstruction import norm_sub
from calmkit_client import CalmkitError, Schema, validate_epsilon
from calmkit_client.randomness import RngLike
from calmkit_client.validation import check_int, is_int

from ..population import Population
from .base import Mechanism, NotScalable, Release

__all__ = [
    "Allocation",
    "Datacube",
    "DatacubeRelease",
    "allocation_variance",
    "cell_variance",
    "component_parities",
    "compose",
    "down_closure",
    "exact_components",
    "fourier_component_variances",
    "fourier_components",
    "fourier_parities",
    "fourier_weights",
    "gaussian_allocation",
    "gaussian_sigma",
    "gls_component_variances",
    "gls_components",
    "kway_fourier_variance",
    "laplace_allocation",
    "marginal_weights",
    "workload_counts",
    "workload_variance",
]

Attrs = tuple[int, ...]

_STRATEGIES = ("fourier", "marginals")
_BUDGETS = ("optimal", "uniform")
_NOISES = ("laplace", "gaussian")


# -- validation ------------------------------------------------------------------------
def _check_delta(delta: object) -> float:
    if isinstance(delta, bool) or not isinstance(delta, (int, float, np.integer, np.floating)):
        raise CalmkitError(f"delta ({delta!r}) must be a number in (0, 1)")
    value = float(delta)
    if not 0.0 < value < 1.0:
        raise CalmkitError(f"delta ({value!r}) must be in (0, 1)")
    return value


def _check_k(k: object, d: int) -> int:
    if not is_int(k) or not 1 <= int(k) <= d:
        raise CalmkitError(f"k ({k!r}) must be an int in [1, d={d}]")
    return int(k)


def _check_workload(workload: Sequence[Sequence[int]], d: int | None = None) -> list[Attrs]:
    out = []
    for attrs in workload:
        key = tuple(int(a) for a in attrs)
        if list(key) != sorted(set(key)) or (
            key and (key[0] < 0 or (d is not None and key[-1] >= d))
        ):
            raise CalmkitError(
                f"workload marginal ({tuple(attrs)!r}) must be distinct sorted attribute "
                f"positions in [0, {d})"
            )
        out.append(key)
    if not out or len(set(out)) != len(out):
        raise CalmkitError(f"workload ({list(workload)!r}) must be non-empty without repeats")
    return out


def _positive(values: object, name: str) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64).reshape(-1)
    if arr.size == 0 or not np.all(np.isfinite(arr)) or not np.all(arr > 0):
        raise CalmkitError(f"{name} ({arr.tolist()!r}) must be non-empty, finite and > 0")
    return arr


def _subsets(attrs: Attrs) -> list[Attrs]:
    """Every subset of ``attrs`` (sorted tuples), by size."""
    return [s for r in range(len(attrs) + 1) for s in combinations(attrs, r)]


def down_closure(workload: Sequence[Sequence[int]]) -> list[Attrs]:
    """Every attribute set inside some workload marginal (the paper's ``F`` of §4.3,
    including ``()``), sorted by size then lexicographically."""
    sets = {s for attrs in _check_workload(workload) for s in _subsets(attrs)}
    return sorted(sets, key=lambda s: (len(s), s))


# -- budgets (Step 2, §3.1 and App. A) ------------------------------------------------------
@dataclass(frozen=True)
class Allocation:
    """Per-group budgets and the variance they give.

    ``budgets`` (g,) float64: the budget ``eta_r`` of each group. ``variances`` (g,):
    the noise variance of every row of group r, ``factor / eta_r^2`` (count units).
    ``total_variance``: ``sum_r w_r variances_r`` (the objective (4), a^T Var(y) for
    the initial recovery). ``factor``: 2 for Laplace, ``(eps sigma)^2`` for Gaussian.
    """

    budgets: np.ndarray
    variances: np.ndarray
    total_variance: float
    noise: str
    factor: float

    @property
    def groups(self) -> int:
        return int(self.budgets.shape[0])


def allocation_variance(weights: npt.ArrayLike, budgets: Sequence[float], factor: float) -> float:
    """``factor * sum_r w_r / eta_r^2`` for any budgets (e.g. the paper's 4/9, 5/9)."""
    w = _positive(weights, "weights")
    eta = _positive(budgets, "budgets")
    if w.shape != eta.shape:
        raise CalmkitError(f"budgets ({eta.size}) must be one per weight ({w.size})")
    return float(factor * (w / eta**2).sum())


def _sensitivities(sensitivities: Sequence[float] | None, g: int) -> np.ndarray:
    if sensitivities is None:
        return np.ones(g)
    c = _positive(sensitivities, "sensitivities")
    if c.size != g:
        raise CalmkitError(f"sensitivities ({c.size}) must be one per group ({g})")
    return c


def laplace_allocation(
    weights: npt.ArrayLike,
    epsilon: float,
    *,
    optimal: bool = True,
    sensitivities: Sequence[float] | None = None,
) -> Allocation:
    """Laplace budgets for groups of weight ``w_r`` (> 0) and column norms ``C_r``
    (default 1) under ``sum_r C_r eta_r = eps`` (eq. 5).

    ``optimal``: the cube-root rule of Cor. 3.3,
    ``eta_r = eps (w_r / C_r)^{1/3} / sum_t (C_t^2 w_t)^{1/3}``, total
    ``2 (sum_r (C_r^2 w_r)^{1/3})^3 / eps^2``; else ``eta_r = eps / sum_t C_t``.
    """
    eps = validate_epsilon(epsilon)
    w = _positive(weights, "weights")
    c = _sensitivities(sensitivities, w.size)
    if optimal:
        eta = eps * np.cbrt(w / c) / np.cbrt(c**2 * w).sum()
        total = 2.0 * np.cbrt(c**2 * w).sum() ** 3 / eps**2  # Cor. 3.3 with s_r = 2 w_r
    else:
        eta = np.full(w.size, eps / c.sum())
        total = 2.0 * float((w / eta**2).sum())
    return Allocation(eta, 2.0 / eta**2, float(total), "laplace", 2.0)


def gaussian_sigma(epsilon: float, delta: float) -> float:
    """Smallest sigma with N(0, sigma^2) noise (eps, delta)-DP at unit L2 sensitivity:
    the analytic Gaussian mechanism (Balle & Wang 2018, Thm 8), solving
    ``Phi(1/(2s) - eps s) - e^eps Phi(-1/(2s) - eps s) = delta`` (exact for all eps)."""
    eps = validate_epsilon(epsilon)
    dlt = _check_delta(delta)

    def excess(log_sigma: float) -> float:
        s = math.exp(log_sigma)
        a, b = 0.5 / s, eps * s
        second = math.exp(eps + float(stats.norm.logcdf(-a - b)))
        return float(stats.norm.cdf(a - b)) - second - dlt

    lo = hi = math.log(math.sqrt(2.0 * math.log(1.25 / dlt)) / eps)  # classical sigma
    while excess(lo) <= 0:
        lo -= 1.0
    while excess(hi) > 0:
        hi += 1.0
    return math.exp(float(optimize.brentq(excess, lo, hi, xtol=1e-14, rtol=1e-14)))


def gaussian_allocation(
    weights: npt.ArrayLike,
    epsilon: float,
    delta: float,
    *,
    optimal: bool = True,
    sensitivities: Sequence[float] | None = None,
    factor: float | None = None,
) -> Allocation:
    """Gaussian budgets under ``sum_r C_r^2 eta_r^2 = eps^2`` (App. A): per-row
    variance ``factor / eta_r^2`` with ``factor = (eps gaussian_sigma(eps, delta))^2``
    unless given (the paper's Theorem 2.2: ``2 log(2/delta)``, valid for eps < 1).

    ``optimal``: the square-root rule
    ``eta_r^2 = eps^2 sqrt(w_r) / (C_r sum_t C_t sqrt(w_t))``, total
    ``factor (sum_r C_r sqrt(w_r))^2 / eps^2``; else ``eta_r = eps / sqrt(sum_t C_t^2)``.
    """
    eps = validate_epsilon(epsilon)
    dlt = _check_delta(delta)
    w = _positive(weights, "weights")
    c = _sensitivities(sensitivities, w.size)
    f = (eps * gaussian_sigma(eps, dlt)) ** 2 if factor is None else float(factor)
    if not (math.isfinite(f) and f > 0):
        raise CalmkitError(f"factor ({factor!r}) must be finite and > 0")
    if optimal:
        eta = eps * np.sqrt(np.sqrt(w) / (c * (c * np.sqrt(w)).sum()))
        total = f * float((c * np.sqrt(w)).sum()) ** 2 / eps**2  # App. A
    else:
        eta = np.full(w.size, eps / math.sqrt(float((c**2).sum())))
        total = f * float((w / eta**2).sum())
    return Allocation(eta, f / eta**2, float(total), "gaussian", f)


def kway_fourier_variance(
    d: int,
    k: int,
    epsilon: float,
    *,
    optimal: bool = True,
    noise: str = "laplace",
    delta: float | None = None,
) -> float:
    """Closed-form total variance (counts^2) of all k-way marginals over d binary
    attributes with the Fourier strategy (App. C): Laplace optimal
    ``(sum_{i<=k} C(d,i) C(d-i,k-i)^{1/3})^3 / (2^{k-1} eps^2)``, uniform
    ``2 m^2 C(d,k) / eps^2``; Gaussian optimal
    ``f (sum_i C(d,i) C(d-i,k-i)^{1/2})^2 / (2^k eps^2)``, uniform ``f m C(d,k) / eps^2``;
    ``m = sum_{i<=k} C(d,i)`` coefficients, ``f`` as in :func:`gaussian_allocation`."""
    eps = validate_epsilon(epsilon)
    check_int("d", d, 1)
    k = _check_k(k, int(d))
    m = sum(math.comb(d, i) for i in range(k + 1))
    terms = [(math.comb(d, i), math.comb(d - i, k - i)) for i in range(k + 1)]
    if noise == "laplace":
        if optimal:
            return float(sum(a * b ** (1 / 3) for a, b in terms) ** 3 / (2 ** (k - 1) * eps**2))
        return float(2.0 * m**2 * math.comb(d, k) / eps**2)
    if noise != "gaussian":
        raise CalmkitError(f"noise ({noise!r}) must be one of {_NOISES}")
    f = (eps * gaussian_sigma(eps, _check_delta(delta))) ** 2
    if optimal:
        return float(f * sum(a * math.sqrt(b) for a, b in terms) ** 2 / (2**k * eps**2))
    return float(f * m * math.comb(d, k) / eps**2)


# -- weights of the workload -------------------------------------------------------------
def _query_weights(query_weights: Sequence[float] | None, g: int) -> np.ndarray:
    if query_weights is None:
        return np.ones(g)
    a = _positive(query_weights, "query_weights")
    if a.size != g:
        raise CalmkitError(f"query_weights ({a.size}) must be one per workload marginal ({g})")
    return a


def marginal_weights(
    workload: Sequence[Sequence[int]],
    sizes: Sequence[int],
    query_weights: Sequence[float] | None = None,
) -> np.ndarray:
    """S = Q with R = I: ``w_r = a_r * cells(A_r)`` per workload marginal (g,) float64."""
    marginals = _check_workload(workload, len(sizes))
    a = _query_weights(query_weights, len(marginals))
    cells = np.array([math.prod(sizes[i] for i in m) for m in marginals], dtype=np.float64)
    return a * cells


def fourier_weights(
    workload: Sequence[Sequence[int]],
    coefficients: Sequence[Attrs] | None = None,
    query_weights: Sequence[float] | None = None,
) -> np.ndarray:
    """S = Fourier (parity sums, binary attributes): ``w_b = sum_{A >= b} a_A 2^{-|A|}``
    per coefficient ``b`` (default :func:`down_closure`), (m,) float64. The SSE of the
    k-way answer ``A`` is ``2^{-|A|} sum_{b <= A} Var(F_b)`` (Parseval)."""
    marginals = _check_workload(workload)
    a = _query_weights(query_weights, len(marginals))
    coefs = down_closure(marginals) if coefficients is None else [tuple(b) for b in coefficients]
    position = {b: i for i, b in enumerate(coefs)}
    w = np.zeros(len(coefs))
    for weight, attrs in zip(a, marginals):
        for b in _subsets(attrs):
            if b not in position:
                raise CalmkitError(f"coefficients must include {b!r} (inside marginal {attrs!r})")
            w[position[b]] += weight * 2.0 ** -len(attrs)
    return w


# -- components: the ANOVA / Fourier representation --------------------------------------
def _interaction(table: np.ndarray) -> np.ndarray:
    """``P_B``: centre a B-table along every axis (the pure-interaction projection)."""
    out = np.asarray(table, dtype=np.float64)
    for axis in range(out.ndim):
        out = out - out.mean(axis=axis, keepdims=True)
    return out


def _onto(table: np.ndarray, attrs: Attrs, sub: Attrs) -> np.ndarray:
    """Sum an ``attrs``-table onto the sorted subset ``sub``."""
    drop = tuple(i for i, a in enumerate(attrs) if a not in sub)
    return table.sum(axis=drop) if drop else table


def _check_tables(
    tables: Mapping[Attrs, np.ndarray], sizes: Sequence[int]
) -> dict[Attrs, np.ndarray]:
    marginals = _check_workload(list(tables), len(sizes))
    out = {}
    for attrs, key in zip(marginals, tables):
        table = np.asarray(tables[key], dtype=np.float64)
        shape = tuple(int(sizes[a]) for a in attrs)
        if table.shape != shape:
            raise CalmkitError(f"table {attrs!r} (shape {table.shape}) must have shape {shape}")
        out[attrs] = table
    return out


def exact_components(
    tables: Mapping[Attrs, np.ndarray], sizes: Sequence[int]
) -> dict[Attrs, np.ndarray]:
    """``theta_B = P_B C_B x`` (float64, shape ``sizes[B]``) for every ``B`` in the down
    closure, from mutually consistent (e.g. exact) marginal tables."""
    checked = _check_tables(tables, sizes)
    out: dict[Attrs, np.ndarray] = {}
    for attrs, table in checked.items():
        for b in _subsets(attrs):
            if b not in out:
                out[b] = _interaction(_onto(table, attrs, b))
    return {b: out[b] for b in sorted(out, key=lambda s: (len(s), s))}


def gls_components(
    tables: Mapping[Attrs, np.ndarray],
    variances: Mapping[Attrs, float],
    sizes: Sequence[int],
) -> dict[Attrs, np.ndarray]:
    """Generalised least squares (§3.2, eq. 7) for noisy marginals with iid noise of
    variance ``variances[A]`` per cell of table ``A``: the components ``theta_hat_B`` of
    the x minimising ``sum_A ||C_A x - z_A||^2 / variances[A]`` (module doc), one
    weighted average per interaction ``B``."""
    checked = _check_tables(tables, sizes)
    var = {attrs: float(_positive([variances[attrs]], "variances")[0]) for attrs in checked}
    num: dict[Attrs, np.ndarray] = {}
    den: dict[Attrs, float] = {}
    for attrs, table in checked.items():
        for b in _subsets(attrs):
            u = _interaction(_onto(table, attrs, b))
            lam = u.size / (var[attrs] * table.size)  # 1 / (sigma^2 m_{A,B})
            num[b] = num[b] + lam * u if b in num else lam * u
            den[b] = den.get(b, 0.0) + lam
    return {b: num[b] / den[b] for b in sorted(num, key=lambda s: (len(s), s))}


def gls_component_variances(
    workload: Sequence[Sequence[int]], sizes: Sequence[int], variances: Sequence[float]
) -> dict[Attrs, float]:
    """``s_B`` with ``Cov(theta_hat_B) = s_B P_B`` after GLS: ``1 / sum_r lambda_rB``."""
    marginals = _check_workload(workload, len(sizes))
    var = _positive(variances, "variances")
    if var.size != len(marginals):
        raise CalmkitError(f"variances ({var.size}) must be one per marginal ({len(marginals)})")
    precision: dict[Attrs, float] = {}
    for attrs, v in zip(marginals, var):
        cells = math.prod(sizes[a] for a in attrs)
        for b in _subsets(attrs):
            m = cells / math.prod(sizes[a] for a in b)
            precision[b] = precision.get(b, 0.0) + 1.0 / (float(v) * m)
    return {b: 1.0 / p for b, p in precision.items()}


def fourier_components(
    parities: np.ndarray, coefficients: Sequence[Attrs]
) -> dict[Attrs, np.ndarray]:
    """Components of binary attribute sets from parity sums ``F_b`` (m,):
    ``theta_b = 2^{-|b|} F_b chi_b`` with ``chi_b(g) = (-1)^{sum g}`` of shape (2,)*|b|."""
    values = np.asarray(parities, dtype=np.float64)
    if values.shape != (len(coefficients),):
        raise CalmkitError(f"parities (shape {values.shape}) must be one per coefficient")
    return {
        tuple(b): value * 2.0 ** -len(b) * _chi(len(b)) for value, b in zip(values, coefficients)
    }


@lru_cache(maxsize=32)
def _chi(size: int) -> np.ndarray:
    """``chi(g) = (-1)^{sum g}`` over (2,)*size, read-only float64."""
    chi: np.ndarray = 1.0 - 2.0 * (np.indices((2,) * size).sum(axis=0) % 2)
    chi.setflags(write=False)
    return chi


@lru_cache(maxsize=8)
def _parity_plan(
    workload: tuple[Attrs, ...],
) -> tuple[list[Attrs], list[tuple[list[Attrs], np.ndarray]]]:
    """Coefficients (:func:`down_closure`) and, per marginal size K, the marginals of
    that size and the coefficient index (G, 2^K) of each subset pattern (C order: the
    first attribute is the most significant bit)."""
    coefficients = down_closure(workload)
    position = {b: i for i, b in enumerate(coefficients)}
    plan = []
    for size in sorted({len(a) for a in workload}):
        group = [a for a in workload if len(a) == size]
        patterns = [[i for i in range(size) if (p >> (size - 1 - i)) & 1] for p in range(1 << size)]
        index = np.array(
            [[position[tuple(a[i] for i in pat)] for pat in patterns] for a in group],
            dtype=np.int64,
        ).reshape(len(group), 1 << size)
        plan.append((group, index))
    return coefficients, plan


def fourier_parities(
    tables: Mapping[Attrs, np.ndarray], sizes: Sequence[int]
) -> tuple[list[Attrs], np.ndarray]:
    """The coefficients (:func:`down_closure` of the tables' marginals) and their exact
    parity sums ``F_b`` (m,) float64 from binary marginal count tables: the Hadamard
    transform ``H_K`` of all tables of one size K at once (O(K 2^K) per table)."""
    checked = _check_tables(tables, sizes)
    if any(sizes[a] != 2 for attrs in checked for a in attrs):
        raise CalmkitError(f"sizes ({tuple(sizes)!r}) must be 2 for the Fourier strategy")
    coefficients, plan = _parity_plan(tuple(checked))
    out = np.empty(len(coefficients))
    for group, index in plan:
        h = np.stack([checked[a] for a in group])
        for axis in range(1, h.ndim):  # (t0, t1) -> (t0 + t1, t0 - t1) along each attribute
            a0, a1 = h.take(0, axis=axis), h.take(1, axis=axis)
            h = np.stack((a0 + a1, a0 - a1), axis=axis)
        out[index.reshape(-1)] = h.reshape(-1)
    return coefficients, out


def component_parities(
    components: Mapping[Attrs, np.ndarray], coefficients: Sequence[Attrs]
) -> np.ndarray:
    """Parity sums ``F_b = 2^{|b|} theta_b[0, ..., 0]`` (m,) of binary components."""
    return np.array(
        [2.0 ** len(b) * float(np.asarray(components[tuple(b)]).flat[0]) for b in coefficients]
    )


def fourier_component_variances(
    coefficients: Sequence[Attrs], coefficient_variances: npt.ArrayLike
) -> dict[Attrs, float]:
    """``s_b = 2^{-|b|} Var(F_b)``: ``Cov(theta_b) = 2^{-2|b|} Var(F_b) chi chi^T = s_b P_b``."""
    v = np.asarray(coefficient_variances, dtype=np.float64)
    return {tuple(b): float(x) * 2.0 ** -len(b) for b, x in zip(coefficients, v)}


def compose(
    components: Mapping[Attrs, np.ndarray], attrs: Sequence[int], sizes: Sequence[int]
) -> np.ndarray:
    """The marginal over sorted ``attrs`` from components, in their units:
    ``sum_{B <= A} theta_B / m_{A,B}`` broadcast over ``A \\ B``; shape ``sizes[A]``."""
    query = tuple(int(a) for a in attrs)
    shape = tuple(int(sizes[a]) for a in query)
    cells = math.prod(shape)
    out = np.zeros(shape)
    for b in _subsets(query):
        if b not in components:
            raise CalmkitError(f"query ({query!r}) needs component {b!r}, which was not released")
        theta = np.asarray(components[b], dtype=np.float64)
        out += theta.reshape(tuple(s if a in b else 1 for a, s in zip(query, shape))) * (
            theta.size / cells
        )
    return out


def cell_variance(
    attrs: Sequence[int], sizes: Sequence[int], component_variances: Mapping[Attrs, float]
) -> float:
    """Per-cell variance of :func:`compose` (the same in every cell) when
    ``Cov(theta_B) = s_B P_B`` independently over B:
    ``sum_{B <= A} s_B prod_{i in B}(1 - 1/c_i) / m_{A,B}^2``."""
    query = tuple(int(a) for a in attrs)
    cells = math.prod(sizes[a] for a in query)
    total = 0.0
    for b in _subsets(query):
        m = cells / math.prod(sizes[a] for a in b)
        diag = math.prod(1.0 - 1.0 / sizes[a] for a in b)
        total += component_variances[b] * diag / m**2
    return total


def workload_variance(
    workload: Sequence[Sequence[int]],
    sizes: Sequence[int],
    component_variances: Mapping[Attrs, float],
    query_weights: Sequence[float] | None = None,
) -> float:
    """``a^T Var(y)``: ``sum_A a_A cells(A) cell_variance(A)`` over the workload."""
    marginals = _check_workload(workload, len(sizes))
    a = _query_weights(query_weights, len(marginals))
    return float(
        sum(
            w
            * math.prod(sizes[i] for i in attrs)
            * cell_variance(attrs, sizes, component_variances)
            for w, attrs in zip(a, marginals)
        )
    )


# -- release and mechanism -------------------------------------------------------------------
def workload_counts(
    population: Population, workload: Sequence[Sequence[int]]
) -> dict[Attrs, np.ndarray]:
    """Exact count tables (float64, shape ``sizes[A]``) of the workload marginals: the
    records' codes are transposed and widened once, then one row-major cell index and
    bincount per marginal."""
    sizes = population.schema.sizes
    marginals = _check_workload(workload, len(sizes))
    columns = np.ascontiguousarray(population.codes.T, dtype=np.int64)  # (d, n)
    out = {}
    for attrs in marginals:
        shape = tuple(sizes[a] for a in attrs)
        cell = np.zeros(population.n, dtype=np.int64)
        for a, size in zip(attrs, shape):  # row-major cell index, one column at a time
            cell *= size
            cell += columns[a]
        counts = np.bincount(cell, minlength=math.prod(shape)).astype(np.float64)
        out[attrs] = counts.reshape(shape)
    return out


class DatacubeRelease(Release):
    """Released components (count units) over ``sizes`` for the marginals of
    ``workload``; answers are fractions of n."""

    def __init__(
        self,
        sizes: Sequence[int],
        n: int,
        workload: Sequence[Attrs],
        components: Mapping[Attrs, np.ndarray],
        component_variances: Mapping[Attrs, float],
        chosen: Mapping[str, object],
    ) -> None:
        self.sizes, self.n = tuple(int(s) for s in sizes), int(n)
        self.workload = tuple(tuple(a) for a in workload)
        self.components = dict(components)
        self.component_variances = dict(component_variances)
        self.chosen = dict(chosen)
        self._predicted: float | None = None

    def raw(self, attrs: Sequence[int]) -> np.ndarray:
        """The least-squares marginal over ``attrs`` (any size up to the workload's) as
        fractions before the non-negativity step: unbiased, mutually consistent, sums to
        the noisy total over n (float64, shape ``sizes[attrs]``)."""
        return compose(self.components, tuple(sorted(attrs)), self.sizes) / self.n

    def answer(self, attrs: Sequence[int]) -> np.ndarray:
        """:meth:`raw` projected onto the simplex by Norm-Sub (sums to 1, >= 0)."""
        out: np.ndarray = norm_sub(self.raw(attrs))
        return out

    def cell_variance(self, attrs: Sequence[int]) -> float:
        """Predicted variance of each cell of :meth:`raw` (fractions^2)."""
        var = cell_variance(tuple(sorted(attrs)), self.sizes, self.component_variances)
        return var / self.n**2

    def predicted_total_variance(self) -> float:
        """``sum over workload cells of Var`` of the raw answers (counts^2, a = 1)."""
        if self._predicted is None:
            self._predicted = workload_variance(self.workload, self.sizes, self.component_variances)
        return self._predicted

    def describe(self) -> dict[str, object]:
        """The options, the number of budget groups and the budget range, the Step 2
        objective (counts^2, initial recovery), the exact total variance of the raw
        workload answers (counts^2) and their mean SSE per marginal (fractions)."""
        total = self.predicted_total_variance()
        return {
            **self.chosen,
            "predicted_total_variance": total,
            "predicted_sse": total / (len(self.workload) * float(self.n) ** 2),
        }


def _elementary_symmetric(sizes: Sequence[int], k: int) -> int:
    """``sum over k-subsets of prod sizes``: total cells of all k-way marginals."""
    e = [1] + [0] * k
    for s in sizes:
        for j in range(k, 0, -1):
            e[j] += e[j - 1] * int(s)
    return e[k]


class Datacube(Mechanism):
    """All k-way marginals under central DP with the paper's strategies (S = Q or
    Fourier), optimal (cube-root / square-root) or uniform budgets, and least-squares
    consistency; answers projected by Norm-Sub.

    ``strategy``: ``"fourier"`` (binary schemas) or ``"marginals"``; ``budgets``:
    ``"optimal"`` or ``"uniform"``; ``noise``: ``"laplace"`` (eps-DP) or ``"gaussian"``
    ((eps, delta)-DP, ``delta`` required); ``max_cells``: the largest total number of
    cells of the k-way marginals :meth:`check` accepts.
    """

    name = "Datacube"
    privacy_unit = "central epsilon-DP (add/remove one record; n public); trusted curator"

    def __init__(
        self,
        strategy: str = "fourier",
        budgets: str = "optimal",
        noise: str = "laplace",
        delta: float | None = None,
        max_cells: int = 4_000_000,
    ) -> None:
        if strategy not in _STRATEGIES:
            raise CalmkitError(f"strategy ({strategy!r}) must be one of {_STRATEGIES}")
        if budgets not in _BUDGETS:
            raise CalmkitError(f"budgets ({budgets!r}) must be one of {_BUDGETS}")
        if noise not in _NOISES:
            raise CalmkitError(f"noise ({noise!r}) must be one of {_NOISES}")
        if noise == "gaussian":
            delta = _check_delta(delta)
        elif delta is not None:
            raise CalmkitError(f"delta ({delta!r}) applies only to noise='gaussian'")
        self.max_cells = check_int("max_cells", max_cells, 1)
        self.strategy, self.budgets, self.noise, self.delta = strategy, budgets, noise, delta
        label = "F" if strategy == "fourier" else "Q"
        plus = "+" if budgets == "optimal" else ""
        self.name = f"DC-{label}{plus}" + ("/G" if noise == "gaussian" else "")
        if noise == "gaussian":
            self.privacy_unit = (
                f"central (epsilon, delta={delta:g})-DP (add/remove one record; n public; "
                f"analytic Gaussian); trusted curator"
            )

    def check(self, schema: Schema, n: int, epsilon: float, k: int) -> None:
        validate_epsilon(epsilon)
        k = _check_k(k, schema.d)
        check_int("n", n, 1)
        sizes = schema.sizes
        if self.strategy == "fourier":
            wide = [i for i, s in enumerate(sizes) if s != 2]
            if wide:
                i = wide[0]
                raise NotScalable(
                    f"Datacube strategy='fourier' needs binary attributes (Hadamard basis, "
                    f"§4.1) but attribute {i} ({schema.attributes[i].name}) has {sizes[i]} "
                    f"categories ({len(wide)} non-binary): use strategy='marginals'"
                )
        cells = _elementary_symmetric(sizes, k)
        if cells > self.max_cells:
            extra = ""
            if self.strategy == "fourier":
                coefs = sum(math.comb(schema.d, i) for i in range(k + 1))
                extra = f" ({coefs} Fourier coefficients)"
            fits = [j for j in range(1, k) if _elementary_symmetric(sizes, j) <= self.max_cells]
            hint = f"k <= {max(fits)} fits" if fits else "no k fits"
            raise NotScalable(
                f"Datacube needs all {math.comb(schema.d, k)} {k}-way marginals with {cells} "
                f"cells in total{extra}, more than max_cells={self.max_cells}: {hint}; "
                f"raise max_cells for more"
            )

    def run(
        self, population: Population, epsilon: float, k: int, rng: RngLike = None
    ) -> DatacubeRelease:
        eps = validate_epsilon(epsilon)
        self.check(population.schema, population.n, eps, k)
        workload = list(combinations(range(population.d), int(k)))
        tables = workload_counts(population, workload)
        return self.release(population.schema.sizes, tables, population.n, eps, rng)

    def _allocate(self, weights: np.ndarray, eps: float) -> Allocation:
        optimal = self.budgets == "optimal"
        if self.noise == "laplace":
            return laplace_allocation(weights, eps, optimal=optimal)
        return gaussian_allocation(weights, eps, float(self.delta), optimal=optimal)  # type: ignore[arg-type]

    def release(
        self,
        sizes: Sequence[int],
        tables: Mapping[Attrs, np.ndarray],
        n: int,
        epsilon: float,
        rng: RngLike = None,
    ) -> DatacubeRelease:
        """Measure the strategy for the workload ``tables`` (exact counts, one table of
        shape ``sizes[A]`` per workload marginal ``A``), recover and release. The noise
        is the only randomness, so tests can repeat it on precomputed counts."""
        eps = validate_epsilon(epsilon)
        gen = np.random.default_rng(rng)
        checked = _check_tables(tables, sizes)
        workload = list(checked)
        if self.strategy == "fourier" and any(sizes[a] != 2 for attrs in workload for a in attrs):
            raise NotScalable("Datacube strategy='fourier' needs binary attributes")
        if self.strategy == "marginals":
            weights = marginal_weights(workload, sizes)
            alloc = self._allocate(weights, eps)
            noisy = {
                attrs: table + self._noise(gen, alloc, alloc.budgets[r], table.shape)
                for r, (attrs, table) in enumerate(checked.items())
            }
            variances = dict(zip(workload, alloc.variances.tolist()))
            components = gls_components(noisy, variances, sizes)
            comp_var = gls_component_variances(workload, sizes, alloc.variances.tolist())
        else:
            coefficients, exact = fourier_parities(checked, sizes)
            weights = fourier_weights(workload, coefficients)
            alloc = self._allocate(weights, eps)
            noisy_f = exact + self._noise(gen, alloc, alloc.budgets, exact.shape)
            components = fourier_components(noisy_f, coefficients)
            comp_var = fourier_component_variances(coefficients, alloc.variances)
        chosen: dict[str, object] = {
            "strategy": self.strategy,
            "budgets": self.budgets,
            "noise": self.noise,
            "groups": alloc.groups,
            "budget_min": float(alloc.budgets.min()),
            "budget_max": float(alloc.budgets.max()),
            "step2_variance": alloc.total_variance,
        }
        if self.noise == "gaussian":
            chosen["delta"] = self.delta
        return DatacubeRelease(sizes, n, workload, components, comp_var, chosen)

    @staticmethod
    def _noise(
        gen: np.random.Generator,
        alloc: Allocation,
        budget: np.ndarray | float,
        shape: tuple[int, ...],
    ) -> np.ndarray:
        """Per-row noise at budget eta: Laplace(1/eta) or N(0, factor / eta^2)."""
        eta = np.asarray(budget, dtype=np.float64)
        if alloc.noise == "laplace":
            return gen.laplace(0.0, 1.0 / eta, size=shape)
        return gen.normal(0.0, np.sqrt(alloc.factor) / eta, size=shape)
