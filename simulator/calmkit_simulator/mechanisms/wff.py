"""WFF: weighted Fourier factorizations, a central (epsilon, delta)-DP reference
(Lebeda, Nikolov & Tang, "Weighted Fourier Factorizations: Optimal Gaussian Noise for
Differentially Private Marginal and Product Queries", arXiv 2512.21499, 2025; the
notation is this module's own, defined below).

Data: records ``x`` in ``Z_{n_1} x ... x Z_{n_d}``. Workload: attribute sets ``S``
with weights ``w(S) >= 0`` summing to 1; the whole table of every ``S`` is asked, the
weight split evenly over its ``n_S = prod_{i in S} n_i`` cells (paper §3.3).

Mechanism (Algorithm 2, paper §3.3):

* Fourier queries ``f_alpha(D) = sum_{x in D} chi_alpha(x)``,
  ``chi_alpha(x) = exp(2 pi i sum_i alpha_i x_i / n_i)``; a marginal is
  ``q_{S,y} = (1/n_S) sum_{supp(alpha) subset of S} f_alpha conj(chi_alpha(y))`` (eq. 4),
  so a coefficient of support ``T`` serves every workload set ``S >= T``.
* Downward closure ``W↓`` (every ``T`` inside some ``S`` with ``w(S) > 0``, including
  the empty set, whose coefficient is the count ``|D|``); importance
  ``c_T = sum_{S in W, S >= T} w(S) / n_S^2``; ``D_T = prod_{i in T} (n_i - 1)``
  coefficients have support exactly ``T``; ``G = sum_T D_T sqrt(c_T)``.
* Every ``alpha`` with support ``T`` gets independent complex Gaussian noise
  ``CN(0, sigma_T^2)``, ``sigma_T^2 = (2 / mu^2) G / sqrt(c_T)`` (real and imaginary
  parts iid ``N(0, sigma_T^2 / 2)``): variance inversely proportional to ``sqrt(c_T)``.
* Reconstruction (post-processing): ``q~_S = Re(fftn(F~_S)) / n_S`` with ``F~_S`` the
  noisy coefficients of every ``alpha in Z_S`` (numpy's ``fftn`` kernel is
  ``exp(-2 pi i alpha.y / n)``, i.e. ``conj(chi_alpha(y))``).

Privacy accounting. Neighbouring datasets differ by adding or removing one record (the
paper's Definition 2.1). That changes every ``f_alpha`` by a unit complex number
``chi_alpha(x)``: each Fourier query has sensitivity 1. Releasing ``f_alpha + CN(0, s^2)``
is a 2-D real Gaussian mechanism with l2 sensitivity 1 and per-coordinate variance
``s^2 / 2``, i.e. ``sqrt(2) / s``-GDP (Lemma 3.1); GDP composition adds squares, so the
whole release costs ``sum_alpha 2 / sigma_alpha^2 = sum_T D_T mu^2 sqrt(c_T) / G = mu^2``:
it is mu-GDP, and the answers are post-processing. (Under replace-one neighbours the
sensitivity would be 2 and mu would double.) The harness's epsilon is turned into mu by
the exact GDP tradeoff (Dong, Roth & Su): mu-GDP is (epsilon, delta)-DP for every
epsilon >= 0 with ``delta = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)``
(:func:`gdp_delta`); :func:`gdp_mu` inverts it numerically. mu-GDP is also
``mu^2/2``-zCDP.

Error (Lemma 3.7, Theorem 3.8), in counts: ``q~_{S,y} - q_{S,y} ~ N(0, V_S)`` for every
cell, ``V_S = G / (mu^2 n_S^2) sum_{T subset of S} D_T / sqrt(c_T)``, and the weighted
MSE ``sum_S w(S) V_S = G^2 / mu^2``: the weighted RMSE of counts is ``G / mu``
(:func:`predicted_rmse`), optimal among all factorization mechanisms (Theorem 5.8).

Non-negativity (not in the paper): the raw tables all sum to the noisy count
``Re f~_0``; :meth:`WFFRelease.answer` divides by it and applies Norm-Sub (the
Euclidean projection onto the simplex, never farther from the true marginal than the
raw fractions). :meth:`WFFRelease.raw_counts` keeps the unbiased Gaussian answers.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np
from scipy.optimize import brentq
from scipy.special import log_ndtr

from calmkit_aggregator.reconstruction import norm_sub
from calmkit_client import CalmkitError, Schema, validate_epsilon
from calmkit_client.randomness import RngLike
from calmkit_client.validation import check_int, is_int

from ..population import Population
from .base import Mechanism, NotScalable, Release

__all__ = [
    "DEFAULT_DELTA",
    "FourierPlan",
    "WFFRelease",
    "WeightedFourier",
    "Workload",
    "exact_coefficients",
    "gdp_delta",
    "gdp_mu",
    "noisy_release",
    "predicted_rmse",
]

# Data-independent default: under add/remove neighbours n itself is private, so delta
# must not be a function of n. 1e-6 is below 1/n for every population the harness uses
# (NLTCS 21,574 records, Retail 88,162, the paper's resampled 2^18 = 262,144: 1/n >=
# 3.8e-6), the usual "delta << 1/n" rule of thumb.
DEFAULT_DELTA = 1e-6
# Defaults of the NotScalable limits: 16 bytes per complex coefficient (and per cell of
# a marginal's FFT array), one Python dict entry per support.
MAX_COEFFICIENTS = 10_000_000
MAX_SUPPORTS = 1_000_000


# -- GDP accounting --------------------------------------------------------------------
def _positive(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise CalmkitError(f"{name} ({value!r}) must be a finite number > 0")
    out = float(value)
    if not (math.isfinite(out) and out > 0):
        raise CalmkitError(f"{name} ({out!r}) must be finite and > 0")
    return out


def _check_delta(delta: object) -> float:
    if isinstance(delta, bool) or not isinstance(delta, (int, float, np.integer, np.floating)):
        raise CalmkitError(f"delta ({delta!r}) must be a number in (0, 1)")
    out = float(delta)
    if not 0.0 < out < 1.0:
        raise CalmkitError(f"delta ({out!r}) must be in (0, 1)")
    return out


def _log_gdp_delta(mu: float, epsilon: float) -> float:
    """log of :func:`gdp_delta`, as ``log Phi(a) + log(1 - e^eps Phi(b) / Phi(a))``
    (log_ndtr / expm1: no cancellation or underflow for small mu or large eps)."""
    a, b = -epsilon / mu + mu / 2.0, -epsilon / mu - mu / 2.0
    la, lb = float(log_ndtr(a)), float(log_ndtr(b))
    return la + math.log(-math.expm1(min(epsilon + lb - la, -1e-300)))


def gdp_delta(mu: float, epsilon: float) -> float:
    """The delta at which mu-GDP implies (epsilon, delta)-DP (Dong, Roth & Su,
    Corollary 2.13; exact, the tradeoff curve of N(0,1) vs N(mu,1)):
    ``Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)``. ``mu > 0``, ``epsilon >= 0``."""
    mu = _positive(mu, "mu")
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float, np.integer, np.floating)):
        raise CalmkitError(f"epsilon ({epsilon!r}) must be a finite number >= 0")
    eps = float(epsilon)
    if not (math.isfinite(eps) and eps >= 0):
        raise CalmkitError(f"epsilon ({eps!r}) must be finite and >= 0")
    return math.exp(_log_gdp_delta(mu, eps))


def gdp_mu(epsilon: float, delta: float) -> float:
    """The largest mu whose mu-GDP guarantee implies (epsilon, delta)-DP: the root of
    ``gdp_delta(mu, epsilon) = delta`` (increasing in mu), by ``scipy.optimize.brentq``
    on the log scale; relative accuracy about 1e-12."""
    eps = validate_epsilon(epsilon, "epsilon")
    target = math.log(_check_delta(delta))

    def excess(mu: float) -> float:
        return _log_gdp_delta(mu, eps) - target

    lo, hi = 1.0, 1.0
    while excess(lo) > 0:  # delta(mu) -> 0 as mu -> 0
        lo /= 4.0
        if lo < 1e-300:
            raise CalmkitError(f"delta ({delta!r}) too small to solve for mu at epsilon {eps}")
    while excess(hi) < 0:  # delta(mu) -> 1 as mu -> inf
        hi *= 4.0
        if hi > 1e12:
            raise CalmkitError(f"delta ({delta!r}) too close to 1 to solve for mu")
    return float(brentq(excess, lo, hi, xtol=1e-300, rtol=1e-14, maxiter=500))


# -- workloads and the calibration -----------------------------------------------------
@dataclass(frozen=True)
class Workload:
    """A weighted marginal workload: non-empty sorted attribute-position tuples ``sets``
    and ``weights`` (float64, > 0, normalised to sum 1; zero weights are dropped)."""

    sets: tuple[tuple[int, ...], ...]
    weights: tuple[float, ...]
    label: str = field(default="custom", compare=False)

    def __post_init__(self) -> None:
        if len(self.sets) != len(self.weights):
            raise CalmkitError(
                f"workload weights ({len(self.weights)}) must match its sets ({len(self.sets)})"
            )
        sets, weights = [], []
        for s, w in zip(self.sets, self.weights):
            t = tuple(int(a) for a in s)
            if not t or len(set(t)) != len(t) or min(t) < 0:
                raise CalmkitError(
                    f"workload set ({s!r}) must be non-empty distinct positions >= 0"
                )
            wf = float(w)
            if not (math.isfinite(wf) and wf >= 0):
                raise CalmkitError(f"workload weight of {t} ({w!r}) must be finite and >= 0")
            if wf > 0:
                sets.append(tuple(sorted(t)))
                weights.append(wf)
        if len(set(sets)) != len(sets):
            raise CalmkitError("workload sets must not repeat")
        total = sum(weights)
        if total <= 0:
            raise CalmkitError("workload must have a set with weight > 0")
        object.__setattr__(self, "sets", tuple(sets))
        object.__setattr__(self, "weights", tuple(w / total for w in weights))

    @classmethod
    def k_way(cls, d: int, k: int) -> Workload:
        """All C(d, k) k-way marginals, equal weights."""
        sets = tuple(combinations(range(d), _check_k(k, d)))
        return cls(sets, (1.0,) * len(sets), label="k")

    @classmethod
    def up_to(cls, d: int, k: int) -> Workload:
        """All marginals of 1..k attributes, equal weight per marginal."""
        k = _check_k(k, d)
        sets = tuple(s for r in range(1, k + 1) for s in combinations(range(d), r))
        return cls(sets, (1.0,) * len(sets), label="upto-k")

    @classmethod
    def from_mapping(cls, mapping: Mapping[Sequence[int], float]) -> Workload:
        """``{attribute positions: weight}``."""
        return cls(tuple(tuple(s) for s in mapping), tuple(mapping.values()))


def _check_k(k: object, d: int) -> int:
    if not is_int(k) or not 1 <= int(k) <= d:
        raise CalmkitError(f"k ({k!r}) must be an int in [1, {d}]")
    return int(k)


def _subsets(s: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
    """Every subset of ``s`` (sorted tuples), the empty one first."""
    for r in range(len(s) + 1):
        yield from combinations(s, r)


def _block_index(s: tuple[int, ...], t: tuple[int, ...]) -> tuple[slice | int, ...]:
    """Index into an ``n_S`` frequency array selecting the ``alpha`` with support
    exactly ``T``: ``alpha_i >= 1`` on T, ``alpha_i = 0`` on ``S \\ T``."""
    members = set(t)
    return tuple(slice(1, None) if i in members else 0 for i in s)


@dataclass(frozen=True)
class FourierPlan:
    """The data-independent calibration of Algorithm 2 for ``sizes`` and ``workload``.

    ``supports``: ``W↓`` sorted by (size, positions), the empty set first;
    ``c`` (float64, one per support) the importances ``c_T``; ``D`` (int64) the number
    of coefficients with support exactly ``T``; ``offsets`` (int64, ``len + 1``) where
    each support's coefficients start in the flat coefficient vector (C order over
    ``alpha_i = 1..n_i-1``, ``i in T``); ``G`` the normaliser ``sum_T D_T sqrt(c_T)``.
    """

    sizes: tuple[int, ...]
    workload: Workload
    supports: tuple[tuple[int, ...], ...]
    c: np.ndarray
    D: np.ndarray
    offsets: np.ndarray
    G: float
    index: dict[tuple[int, ...], int] = field(compare=False, repr=False)

    @classmethod
    def build(
        cls, sizes: Sequence[int], workload: Workload, max_supports: int = MAX_SUPPORTS
    ) -> FourierPlan:
        sizes = tuple(int(s) for s in sizes)
        if any(s < 1 for s in sizes):
            raise CalmkitError(f"sizes ({sizes}) must all be >= 1")
        for s in workload.sets:
            if s[-1] >= len(sizes):
                raise CalmkitError(f"workload set ({s}) must use positions < d = {len(sizes)}")
        bound = sum(1 << len(s) for s in workload.sets)
        if bound > max_supports:
            raise NotScalable(
                f"WFF workload has up to {bound} supports (subsets of its sets) but "
                f"max_supports is {max_supports}"
            )
        c: dict[tuple[int, ...], float] = {}
        for s, w in zip(workload.sets, workload.weights):
            share = w / math.prod(sizes[i] for i in s) ** 2  # c_T: w(S) / n_S^2 (§3.3, Alg. 2)
            for t in _subsets(s):
                c[t] = c.get(t, 0.0) + share
        supports = tuple(sorted(c, key=lambda t: (len(t), t)))
        cvec = np.array([c[t] for t in supports], dtype=np.float64)
        D = np.array([math.prod(sizes[i] - 1 for i in t) for t in supports], dtype=np.int64)
        offsets = np.concatenate(([0], np.cumsum(D))).astype(np.int64)
        G = float((D * np.sqrt(cvec)).sum())  # G = sum_T D_T sqrt(c_T)
        index = {t: j for j, t in enumerate(supports)}
        return cls(sizes, workload, supports, cvec, D, offsets, G, index)

    @property
    def coefficients(self) -> int:
        """Number of (complex) Fourier coefficients released, ``sum_T D_T``."""
        return int(self.offsets[-1])

    def sigma2(self, mu: float) -> np.ndarray:
        """Complex noise variance per support, ``(2/mu^2) G / sqrt(c_T)`` (float64, one
        per support); Re and Im each get half. ``sum_T D_T 2/sigma_T^2 = mu^2``."""
        mu = _positive(mu, "mu")
        out: np.ndarray = 2.0 * self.G / (mu**2 * np.sqrt(self.c))
        return out

    def gdp_cost(self, mu: float) -> float:
        """``sum_alpha 2 / sigma_alpha^2``: the squared GDP parameter of the release
        (Lemma 3.1 + composition); equals ``mu^2``."""
        return float((self.D * 2.0 / self.sigma2(mu)).sum())

    def query(self, attrs: Sequence[int]) -> tuple[int, ...]:
        """Sorted positions of a query, which must be a non-empty set in ``W↓``."""
        s = tuple(sorted(int(a) for a in attrs))
        if not s or len(set(s)) != len(s) or s not in self.index:
            raise CalmkitError(
                f"query ({tuple(attrs)}) must be a non-empty attribute set inside a "
                f"workload set (WFF measured no coefficients for it)"
            )
        return s

    def variance(self, attrs: Sequence[int], mu: float) -> float:
        """Per-cell variance of the raw counts of marginal ``attrs`` (Lemma 3.7):
        ``V_S = G / (mu^2 n_S^2) sum_{T subset of S} D_T / sqrt(c_T)``."""
        s = self.query(attrs)
        mu = _positive(mu, "mu")
        js = [self.index[t] for t in _subsets(s)]
        n_s = math.prod(self.sizes[i] for i in s)
        return float(self.G / (mu**2 * n_s**2) * (self.D[js] / np.sqrt(self.c[js])).sum())

    def weighted_mse(self, mu: float) -> float:
        """``sum_S w(S) V_S`` (counts^2); equals ``G^2 / mu^2`` (Theorem 3.8)."""
        pairs = zip(self.workload.sets, self.workload.weights)
        return float(sum(w * self.variance(s, mu) for s, w in pairs))


def predicted_rmse(sizes: Sequence[int], workload: Workload, mu: float) -> float:
    """The weighted RMSE of counts ``G / mu`` (Theorem 3.8: cells of ``S`` weighted
    ``w(S) / n_S``, weights summing to 1); divide by n for fractions."""
    return FourierPlan.build(sizes, workload).G / _positive(mu, "mu")


# -- the release -----------------------------------------------------------------------
def exact_coefficients(population: Population, plan: FourierPlan) -> np.ndarray:
    """``f_alpha(D)`` of every support in the plan: complex128 (plan.coefficients,).

    One bincount + inverse FFT per workload set (largest first, skipped when all its
    supports are done): ``f_alpha = sum_y counts_S(y) chi_alpha(y) = n_S ifftn(counts_S)``
    for every ``alpha`` in ``Z_S``."""
    if population.schema.sizes != plan.sizes:
        raise CalmkitError(
            f"population sizes ({population.schema.sizes}) must be the plan's ({plan.sizes})"
        )
    out = np.empty(plan.coefficients, dtype=np.complex128)
    done = np.zeros(len(plan.supports), dtype=bool)
    schema = population.schema
    columns = np.ascontiguousarray(population.codes.T, dtype=np.int64)  # validated once
    for s in sorted(plan.workload.sets, key=len, reverse=True):
        subs = [(t, plan.index[t]) for t in _subsets(s)]
        if all(done[j] for _, j in subs):
            continue
        shape = schema.shape(s)  # the marginal's counts, as Population.counts(s)
        cells = np.zeros(population.n, dtype=np.int64)
        for i, stride in zip(s, schema.strides(s)):  # mixed-radix cell index, C order
            cells += columns[i] * stride
        counts = np.bincount(cells, minlength=math.prod(shape)).reshape(shape).astype(float)
        F = counts.size * np.fft.ifftn(counts)
        for t, j in subs:
            if not done[j]:
                out[plan.offsets[j] : plan.offsets[j + 1]] = F[_block_index(s, t)].reshape(-1)
                done[j] = True
    return out


class WFFRelease(Release):
    """The noisy Fourier coefficients (complex128 (plan.coefficients,)) and the
    marginals reconstructed from them on demand."""

    def __init__(
        self,
        plan: FourierPlan,
        coefficients: np.ndarray,
        mu: float,
        chosen: Mapping[str, object] | None = None,
    ) -> None:
        self.plan, self.coefficients, self.mu = plan, coefficients, float(mu)
        self.chosen = dict(chosen or {})

    @property
    def total(self) -> float:
        """The noisy count ``Re f~_0`` (every raw table sums to it)."""
        return float(self.coefficients[0].real)

    def raw_counts(self, attrs: Sequence[int]) -> np.ndarray:
        """The paper's unbiased answer ``Re(fftn(F~_S)) / n_S`` (counts, float64 of shape
        ``(n_i for i in S)``, may be negative); every cell ``~ N(q_{S,y}, V_S)``."""
        s = self.plan.query(attrs)
        shape = tuple(self.plan.sizes[i] for i in s)
        F = np.zeros(shape, dtype=np.complex128)
        for t in _subsets(s):  # place every support T of S at alpha_i >= 1 on T, 0 off T
            j = self.plan.index[t]
            block = self.coefficients[self.plan.offsets[j] : self.plan.offsets[j + 1]]
            F[_block_index(s, t)] = block.reshape(tuple(self.plan.sizes[i] - 1 for i in t))
        out: np.ndarray = np.fft.fftn(F).real / F.size  # eq. 4 for every y at once
        return out

    def variance(self, attrs: Sequence[int]) -> float:
        """Per-cell variance ``V_S`` (counts^2) of :meth:`raw_counts`."""
        return self.plan.variance(attrs, self.mu)

    def answer(self, attrs: Sequence[int]) -> np.ndarray:
        """Raw counts / the noisy total, then Norm-Sub (Euclidean projection onto the
        simplex): float64 fractions, non-negative, summing to 1."""
        raw = self.raw_counts(attrs)
        out: np.ndarray = norm_sub(raw / max(self.total, 1.0))
        return out

    def describe(self) -> dict[str, object]:
        return {
            "mu": self.mu,
            "rho_zcdp": self.mu**2 / 2.0,
            "G": self.plan.G,
            "predicted_rmse": self.plan.G / self.mu,
            "supports": len(self.plan.supports),
            "coefficients": self.plan.coefficients,
            **self.chosen,
        }


def noisy_release(
    exact: np.ndarray,
    plan: FourierPlan,
    mu: float,
    rng: RngLike = None,
    chosen: Mapping[str, object] | None = None,
) -> WFFRelease:
    """Algorithm 2's noise step: ``f~_alpha = f_alpha + CN(0, sigma_T^2)`` for every
    coefficient (``exact``: complex128 (plan.coefficients,)), one vectorised draw."""
    gen = np.random.default_rng(rng)
    exact = np.asarray(exact, dtype=np.complex128)
    if exact.shape != (plan.coefficients,):
        raise CalmkitError(
            f"exact coefficients (shape {exact.shape}) must be ({plan.coefficients},)"
        )
    std = np.repeat(np.sqrt(plan.sigma2(mu) / 2.0), plan.D)  # per real coordinate
    z = gen.standard_normal((2, plan.coefficients))
    return WFFRelease(plan, exact + std * (z[0] + 1j * z[1]), mu, chosen)


# -- the harness mechanism -------------------------------------------------------------
def _elementary_symmetric(values: Sequence[int], k: int) -> list[int]:
    """``e_0..e_k`` of ``values`` (exact ints): ``e_j`` counts the coefficients of all
    supports of size j when the values are ``n_i - 1``."""
    e = [1] + [0] * k
    for v in values:
        for j in range(k, 0, -1):
            e[j] += v * e[j - 1]
    return e


class WeightedFourier(Mechanism):
    """WFF (Algorithm 2): epsilon -> mu by the exact GDP tradeoff at ``delta``, one
    Gaussian per Fourier coefficient with variance ``∝ 1/sqrt(c_T)``, FFT reconstruction.

    ``workload``: ``"k"`` (all k-way marginals, equal weights; the default),
    ``"upto-k"`` (all marginals of 1..k attributes, equal weights) or a
    :class:`Workload` / ``{positions: weight}`` mapping (then k only bounds the queries
    the harness asks; they must lie inside a workload set). ``max_coefficients``:
    NotScalable above this many coefficients (which bounds every marginal's FFT array:
    a workload set's n_S coefficients are all released);
    ``max_supports``: above this many supports.
    """

    name = "WFF"
    privacy_unit = (
        f"central (epsilon, delta)-DP via mu-GDP, delta={DEFAULT_DELTA:g}, "
        "add/remove one record; trusted curator"
    )

    def __init__(
        self,
        delta: float = DEFAULT_DELTA,
        workload: str | Workload | Mapping[Sequence[int], float] = "k",
        max_coefficients: int = MAX_COEFFICIENTS,
        max_supports: int = MAX_SUPPORTS,
    ) -> None:
        self.delta = _check_delta(delta)
        if isinstance(workload, str):
            if workload not in ("k", "upto-k"):
                raise CalmkitError(f"workload ({workload!r}) must be 'k', 'upto-k' or a Workload")
            self.workload: str | Workload = workload
        elif isinstance(workload, Workload):
            self.workload = workload
        elif isinstance(workload, Mapping):
            self.workload = Workload.from_mapping(workload)
        else:
            raise CalmkitError(f"workload ({workload!r}) must be 'k', 'upto-k' or a Workload")
        self.max_coefficients = check_int("max_coefficients", max_coefficients, 1)
        self.max_supports = check_int("max_supports", max_supports, 1)
        self.privacy_unit = (
            f"central (epsilon, delta)-DP via mu-GDP, delta={self.delta:g}, "
            "add/remove one record; trusted curator"
        )

    def resolve_workload(self, d: int, k: int) -> Workload:
        """The workload for d attributes and query size k."""
        if self.workload == "k":
            return Workload.k_way(d, k)
        if self.workload == "upto-k":
            return Workload.up_to(d, k)
        assert isinstance(self.workload, Workload)
        return self.workload

    def check(self, schema: Schema, n: int, epsilon: float, k: int) -> None:
        validate_epsilon(epsilon, "epsilon")
        sizes = schema.sizes
        d = len(sizes)
        k = _check_k(k, d)
        if isinstance(self.workload, str):  # W↓ = every set of <= k attributes
            supports = sum(math.comb(d, j) for j in range(k + 1))
            coefficients = sum(_elementary_symmetric([s - 1 for s in sizes], k))
            what = f"all supports of <= k = {k} of d = {d} attributes"
        else:
            if self.workload.sets and max(s[-1] for s in self.workload.sets) >= d:
                raise CalmkitError(f"workload sets must use positions < d = {d}")
            supports = sum(1 << len(s) for s in self.workload.sets)
            coefficients = 0
            what = "the custom workload's downward closure"
            if supports <= self.max_supports:
                plan = FourierPlan.build(sizes, self.workload, self.max_supports)
                supports, coefficients = len(plan.supports), plan.coefficients
        if supports > self.max_supports:
            raise NotScalable(
                f"WFF needs {supports:,} supports ({what}) but max_supports is "
                f"{self.max_supports:,}; use a smaller k or fewer attributes"
            )
        if coefficients > self.max_coefficients:
            raise NotScalable(
                f"WFF needs {coefficients:,} Fourier coefficients ({what}, 16 bytes each) "
                f"but max_coefficients is {self.max_coefficients:,} (this also bounds the "
                f"largest marginal's FFT array: its n_S coefficients are all included); use "
                f"a smaller k, cap categories, or raise max_coefficients"
            )

    def run(
        self, population: Population, epsilon: float, k: int, rng: RngLike = None
    ) -> WFFRelease:
        eps = validate_epsilon(epsilon, "epsilon")
        self.check(population.schema, population.n, eps, k)
        gen = np.random.default_rng(rng)
        mu = gdp_mu(eps, self.delta)
        workload = self.resolve_workload(population.d, k)
        plan = FourierPlan.build(population.schema.sizes, workload, self.max_supports)
        chosen = {
            "epsilon": eps,
            "delta": self.delta,
            "workload": workload.label,
            "predicted_rmse_fraction": plan.G / mu / population.n,
        }
        return noisy_release(exact_coefficients(population, plan), plan, mu, gen, chosen)
