"""What a pilot's pair tables say about how strongly the attributes depend.

Each pilot view over a pair ``(a, b)`` gives a noisy, unbiased table ``T``. Its
statistic ``raw = ||T - T_a (x) T_b||^2`` (``T_a``, ``T_b`` its margins) is the pair's
dependence ``S = ||P_ab - P_a (x) P_b||^2`` plus what the oracle's noise adds. On a
pair of large domains the noise part dwarfs the signal: a 6 x 41 table from 1,100
reports at epsilon 1 adds about 0.8 to ``raw`` where a real pair of that size holds
1e-4 to 0.01. So the statistic is never read alone, but through its law:

- :func:`pair_evidence` measures, per pair, the law of ``raw`` when the attributes are
  independent (``null_mean``, ``null_var``), by drawing the view's estimates exactly as
  the oracle draws reports for a population with the estimated margins (fixed seed);
- :meth:`PairEvidence.log_likelihood` gives the density of the observed ``raw`` for
  any dependence ``S``: the noise part is what those draws show (a kernel density of
  their square roots, reflected at 0, so the long right tail of a sum of squares of
  unequal noise is kept, not replaced by a normal or Gamma law with two of its
  moments: on a 6 x 41 table the
  statistic's skewness is twice a matched Gamma's, and a lighter tail reads large
  noise draws as dependence). Beyond the draws' 90% quantile the density is at least
  an exponential tail fitted to them (:func:`_tail_masses`): a kernel's tail ends a
  bandwidth past the largest of 200 draws, so a statistic the noise reaches once in
  1,000 pilots read as up to e^-20 less likely than it is, and one such pair made a
  pilot of independent attributes look strongly dependent. A signal ``s`` (``S =
  ||s||^2``) adds to noise ``e`` of norm ``v`` (that density) as ``||s + e||^2 = S +
  v^2 + 2 sqrt(S) v t``, ``t`` the cosine between them: the noise's direction is
  random, so ``(t + 1) / 2 ~ Beta((dim - 1) / 2, (dim - 1) / 2)`` (``t = +-1`` for a
  binary pair: ``(sqrt(S) +- v)^2``). Shifting the noise's law by ``S`` and widening it
  by a normal of variance ``4 nu S`` (the same two moments) put ten times too little
  density at a binary pair's small statistics and too little in its tail; on binary
  pilot tables drawn from the prior, the posterior of the mean dependence then lay
  below the truth (the truth above the posterior median in 85% of 120 draws, 56% now:
  tests/aggregator/test_dependence.py).
- :func:`dependence_posterior` pools the pairs: pair ``i``'s dependence (in the
  profile's unit, ``S / (dim / L)``) is ``D w_i r_i``, with ``D`` the mean dependence
  over all pairs, ``w_i`` its weight (what its margins allow) and ``r_i ~ Gamma(alpha,
  1/alpha)`` how far it departs from that (mean 1; small ``alpha``: a few pairs hold
  most of the dependence). ``D`` is log-uniform on the prior range, ``alpha``
  log-uniform on :data:`HETEROGENEITY_PRIOR`; each pair's likelihood is integrated
  over its ``r_i`` and the product over pairs gives the posterior of ``D`` (and each
  measured pair's posterior mean). A pair whose noise swamps every plausible signal has
  a flat likelihood and moves nothing: the posterior then stays at the prior, pulled
  towards independence by every pair that shows none, instead of reading noise as
  dependence.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from calmkit_client import FrequencyOracle

from ..reconstruction.estimate import draw_estimates
from ..reconstruction.marginal import MarginalTable

__all__ = [
    "HETEROGENEITY_PRIOR",
    "DependencePosterior",
    "PairEvidence",
    "dependence_posterior",
    "pair_evidence",
]

# Log-uniform prior range of alpha, the shape of the Gamma(alpha, 1/alpha) law of a
# pair's dependence over what its weight predicts: on real data alpha is 0.04 (dna),
# 0.15-0.35 (Kosarak, retail, Adult, ACS: a few pairs hold most of the dependence)
# and 4 (NLTCS: every pair alike). Its strongest pairs lie 30-230 times above what
# their weight predicts (ACS 30, Kosarak 36-60, dna 87, retail 229), which Gamma(1/16)
# makes a 4e-3 to 3e-9 chance per pair: the range reaches 1/64 (from 1/16), so a
# posterior can hold a few such pairs without reading every pair as strong.
HETEROGENEITY_PRIOR = (1 / 64, 4.0)
QUANTILES = (0.1, 0.3, 0.5, 0.7, 0.9)
_ALPHAS = 11  # quadrature points of the alpha prior (log-spaced)
_RATIO_RANGE = (1e-5, 1e3)  # a pair's r below this counts as 0; above, as beyond any data
_GRID = 201  # lattice points of D over its prior range (3% apart over 500x)
_FLOOR = 1e-12  # a pair's likelihood below this fraction of its peak is FFT round-off
_DENSE = 1024  # pair tables up to this many cells are measured
_BOOTSTRAP = 200  # simulated tables per pair under independence
_NODES = 160  # points of the noise density (of its square root)
_TAIL_FROM = 0.9  # quantile of the null draws past which the exponential tail holds
# Each node's mass is a normal this wide in units of the spacing of the nodes' y = v^2
# (2 v dv): the sum of such normals has no ripple (below 0.1%) between nodes.
_NODE_WIDTH = 0.6
# Where the signal's reach 2 sqrt(S) spans this many of the noise's nodes, the density
# is summed over the nodes with the exact law of the signal's angle to the noise
# (_along_nodes); below, that angle's normal limit (_near_zero).
_EXACT_STEPS = 8.0


@dataclass(frozen=True)
class PairEvidence:
    """The pilot's pair statistics (P pairs).

    Attributes:
        pairs: (P, 2) int64, the attributes of each pair.
        raw: (P,) float64, the observed ``||T - T_a (x) T_b||^2``.
        null: (P, B) float64, the statistic of B simulated tables with independent
            attributes (module docstring).
        unit: (P,) float64, ``dim / L`` of each pair: ``raw - null_mean`` over it is
            the dependence in the profile's unit.
        dim: (P,) float64, ``(L_a - 1)(L_b - 1)``.
    """

    pairs: np.ndarray
    raw: np.ndarray
    null: np.ndarray
    unit: np.ndarray
    dim: np.ndarray

    @property
    def count(self) -> int:
        return int(self.raw.size)

    @property
    def null_mean(self) -> np.ndarray:
        """(P,) what noise alone adds to the statistic, on average."""
        out: np.ndarray = self.null.mean(axis=1)
        return out

    @property
    def estimate(self) -> np.ndarray:
        """(P,) the unbiased estimate of each pair's dependence (profile unit)."""
        out: np.ndarray = (self.raw - self.null_mean) / self.unit
        return out

    def log_likelihood(self, dependence: np.ndarray) -> np.ndarray:
        """Log density of each observed ``raw`` given the pair's dependence (profile
        unit, >= 0; (P, G) or broadcastable to it): the signal added to noise of the
        null draws' norm (their kernel density with its tail, :func:`_root_density`)
        at a random angle (module docstring). Returns (P, G) float64."""
        signal = np.asarray(dependence, dtype=np.float64) * self.unit[:, None]
        signal = np.broadcast_to(signal, np.broadcast_shapes(signal.shape, (self.count, 1)))
        nu = (self.null_mean / self.dim)[:, None]
        h = _bandwidth(self.null)[:, None]
        tau = np.sqrt(h * h + 4.0 * nu * signal)
        # where S is below a thousandth of the bandwidth the density is that at S = 0;
        # where the observed value lies 12 sd below the signal it is 0 for any purpose
        flat = signal < 1e-3 * h
        far = signal - self.raw[:, None] > 12.0 * tau
        out = np.full(signal.shape, -np.inf)
        for i in range(self.count):  # S = 0 and the live points in one pass per pair
            live = ~(flat[i] | far[i])
            values = self._log_density(np.append(0.0, signal[i, live])[None, :], i)[0]
            out[i, flat[i]] = values[0]
            out[i, live] = values[1:]
        return out

    def _log_density(self, signal: np.ndarray, pair: int) -> np.ndarray:
        """:meth:`log_likelihood` of ``pair`` at ``signal`` (raw units, (1, G)). The
        noise's norm ``v`` has the density of :func:`_root_density` (:data:`_NODES`
        points); its direction makes the cosine ``t`` with the signal's, a random
        direction in ``dim`` dimensions, so the statistic is ``S + v^2 + 2 sqrt(S) v
        t``: ``(sqrt(S) +- v)^2`` for a binary pair (:func:`_one_dimension`), else
        :func:`_along_nodes` where the signal spans :data:`_EXACT_STEPS` nodes and
        :func:`_near_zero` below."""
        i = pair
        raw, dim = float(self.raw[i]), int(self.dim[i])
        v, mass = _root_density(self.null[i], raw, float(self.dim[i]))
        s = signal[0]
        if dim <= 1:
            density = _one_dimension(raw, s, v, mass)
        else:
            density = np.empty(s.size)
            wide = 2.0 * np.sqrt(s) >= _EXACT_STEPS * (v[1] - v[0])
            density[wide] = _along_nodes(raw, s[wide], v, mass, dim)
            density[~wide] = _near_zero(raw, s[~wide], v, mass, dim)
        with np.errstate(divide="ignore"):
            out: np.ndarray = np.log(density)[None, :]
        return out


def _one_dimension(raw: float, signal: np.ndarray, v: np.ndarray, mass: np.ndarray) -> np.ndarray:
    """(G,) density of a one-dimensional statistic ``(sqrt(S) + v)^2`` or ``(sqrt(S) -
    v)^2`` (each with probability 1/2) at ``raw``: the norm's density (node masses
    over their spacing) at each ``v`` that gives ``raw``, times ``|dv / d raw| = 1 / (2
    sqrt(raw))``."""
    density = mass / (v[1] - v[0])
    root, root_s = max(math.sqrt(raw), 1e-150), np.sqrt(signal)
    out = np.zeros(signal.size)
    for norm in (root - root_s, root_s - root, root_s + root):
        ok = norm > 0
        out[ok] += np.interp(norm[ok], v, density, right=0.0)
    return out / (4.0 * root)


def _along_nodes(
    raw: float, signal: np.ndarray, v: np.ndarray, mass: np.ndarray, dim: int
) -> np.ndarray:
    """(G,) density at ``raw`` of ``S + v^2 + 2 sqrt(S) v t``: the sum over the nodes
    of each one's mass times the density of ``t`` at ``t(v) = (raw - S - v^2) / (2
    sqrt(S) v)`` over ``2 sqrt(S) v``, that density averaged over the node's cell (the
    difference of ``t``'s distribution function over the ``t`` its cell spans: exact
    where the density is infinite, at ``t = +-1`` for two dimensions)."""
    root = np.sqrt(signal)[None, :]
    step = v[1] - v[0]
    node, live = v[v > 0][:, None], mass[v > 0][:, None]
    ends = [np.maximum(node + d, 1e-300) for d in (step / 2, -step / 2)]
    t_hi, t_lo = ((raw - signal[None, :] - x * x) / (2 * root * x) for x in ends)
    a = (dim - 1) / 2.0
    spread = np.abs(_cdf(t_lo, a) - _cdf(t_hi, a)) / np.maximum(np.abs(t_lo - t_hi), 1e-300)
    out: np.ndarray = (live * spread / (2 * root * node)).sum(axis=0)
    return out


def _cdf(t: np.ndarray, a: float) -> np.ndarray:
    """The distribution function of the cosine ``t``: ``(t + 1) / 2 ~ Beta(a, a)``,
    ``a = (dim - 1) / 2``."""
    from scipy.special import betainc

    out: np.ndarray = betainc(a, a, (np.clip(t, -1.0, 1.0) + 1.0) / 2.0)
    return out


def _near_zero(
    raw: float, signal: np.ndarray, v: np.ndarray, mass: np.ndarray, dim: int
) -> np.ndarray:
    """(G,) the density where ``2 sqrt(S)`` spans fewer than :data:`_EXACT_STEPS` nodes:
    ``t`` normal with variance ``1 / dim``, each node's statistic ``S + v^2`` plus
    ``N(0, 4 S v^2 / dim)``, spread over about its cell (:data:`_NODE_WIDTH`)."""
    s = signal[None, :]
    step = v[1] - v[0]
    width = _NODE_WIDTH**2 * (4.0 * v * v * step * step + step**4)
    var = 4.0 * s * (v * v / dim)[:, None] + width[:, None]
    z2 = (raw - s - (v * v)[:, None]) ** 2 / var
    terms = -0.5 * z2 - 0.5 * np.log(2 * math.pi * var) + np.log(np.maximum(mass, 1e-300))[:, None]
    top = terms.max(axis=0)
    out: np.ndarray = np.exp(top) * np.exp(terms - top).sum(axis=0)
    return out


def _root_density(null: np.ndarray, raw: float, dim: float) -> tuple[np.ndarray, np.ndarray]:
    """Nodes ``v`` (:data:`_NODES`, from 0 past the largest of ``sqrt(null)`` and
    ``sqrt(raw)``) and the probability of each node's cell: the normal kernel density
    of ``sqrt(null)`` reflected at 0 (Silverman's bandwidth), at least the exponential
    tail of :func:`_tail_masses` (then normalised again). The square root makes a
    one-dimensional statistic's spike at 0 (a chi-square with one degree of freedom) a
    smooth half-normal the kernel can follow."""
    roots = np.sqrt(np.maximum(null, 0.0))
    h = float(_bandwidth(roots[None, :])[0])
    v = np.linspace(0.0, max(float(roots.max()), math.sqrt(max(raw, 0.0))) + 8 * h, _NODES)
    dens = (
        np.exp(-0.5 * ((v[:, None] - roots[None, :]) / h) ** 2)
        + np.exp(-0.5 * ((v[:, None] + roots[None, :]) / h) ** 2)
    ).sum(axis=1)
    mass = np.maximum(dens / dens.sum(), _tail_masses(null, v, dim))
    out: np.ndarray = mass / mass.sum()
    return v, out


def _tail_masses(null: np.ndarray, v: np.ndarray, dim: float) -> np.ndarray:
    """The probability of each node's cell ``[(v - step/2)^2, (v + step/2)^2]`` under an
    exponential tail of the statistic past the draws' :data:`_TAIL_FROM` quantile
    ``u``: the share of draws above ``u`` times ``exp(-(y - u) / beta)``. A sum of
    squared normal noise decays as ``exp(-y / (2 lambda_max))``, its largest
    eigenvalue at least ``mean / dim`` (all of them for a 2 x 2 table, a chi-square
    with one degree of freedom); ``beta`` is the largest of ``2 mean / dim``, the
    draws' variance over mean (the same for a chi-square) and their mean excess over
    ``u``, so an estimate from 200 draws errs towards a heavier tail. Measured against
    400,000 draws at tail probabilities 1e-2 to 2e-5: within 1.4 nats of the exact log
    density on 2 x 2 and 2 x 8 tables, up to 1.7 (at 1e-4) and 3.5 (at 2e-5) nats
    light on 6 x 10 and 3 x 12 tables; the kernel alone was up to 135 nats light."""
    u = float(np.quantile(null, _TAIL_FROM))
    above = null[null > u]
    mean = float(null.mean())
    if above.size < 2 or mean <= 0:
        return np.zeros_like(v)
    beta = max(2 * mean / dim, float(null.var()) / mean, float((above - u).mean()))
    step = v[1] - v[0]
    lo, hi = (np.maximum(np.maximum(v + d, 0.0) ** 2, u) for d in (-step / 2, step / 2))
    share = above.size / null.size
    out: np.ndarray = share * (np.exp(-(lo - u) / beta) - np.exp(-(hi - u) / beta))
    return out


def _bandwidth(null: np.ndarray) -> np.ndarray:
    """Silverman's rule per row of (P, B) draws: ``0.9 min(sd, IQR / 1.34) B^-1/5``."""
    sd = null.std(axis=1, ddof=1)
    q75, q25 = np.quantile(null, [0.75, 0.25], axis=1)
    spread = np.minimum(sd, (q75 - q25) / 1.34)
    out: np.ndarray = 0.9 * np.where(spread > 0, spread, sd) * null.shape[1] ** -0.2
    floored: np.ndarray = np.maximum(out, 1e-150)  # squared, still above 0
    return floored


def pair_evidence(
    pilot: Sequence[MarginalTable],
    oracles: Sequence[FrequencyOracle],
    margs: Sequence[np.ndarray],
) -> PairEvidence:
    """The statistic of every pilot pair view (with reports, two attributes of >= 2
    categories, at most :data:`_DENSE` cells) and its law under independence: the
    view's estimates drawn :data:`_BOOTSTRAP` times, as the oracle draws them, for a
    population whose attributes are independent with margins ``margs`` (fixed seed)."""
    gen = np.random.default_rng(_BOOTSTRAP)
    pairs, raw, nulls, dims, cells = [], [], [], [], []
    for table, oracle in zip(pilot, oracles):
        if len(table.attrs) != 2 or table.n < 1 or table.cells > _DENSE:
            continue
        la, lb = table.values.shape
        if (la - 1) * (lb - 1) == 0:
            continue
        truth = np.outer(margs[table.attrs[0]], margs[table.attrs[1]]).reshape(-1)
        draws = draw_estimates(oracle, truth, int(table.n), gen, _BOOTSTRAP)
        nulls.append(dependence_statistic(draws, la, lb))
        pairs.append(table.attrs)
        raw.append(float(dependence_statistic(table.values.reshape(1, -1), la, lb)[0]))
        dims.append((la - 1) * (lb - 1))
        cells.append(la * lb)
    dim = np.array(dims, dtype=np.float64)
    return PairEvidence(
        np.array(pairs, dtype=np.int64).reshape(-1, 2),
        np.array(raw, dtype=np.float64),
        np.array(nulls, dtype=np.float64).reshape(len(raw), _BOOTSTRAP),
        dim / np.array(cells, dtype=np.float64) if cells else np.zeros(0),
        dim,
    )


def dependence_statistic(flat: np.ndarray, la: int, lb: int) -> np.ndarray:
    """``||T - T_a (x) T_b||^2`` of each row of ``flat`` (rows: (la, lb) tables)."""
    tables = flat.reshape(-1, la, lb)
    outer = tables.sum(axis=2)[:, :, None] * tables.sum(axis=1)[:, None, :]
    out: np.ndarray = ((tables - outer) ** 2).sum(axis=(1, 2))
    return out


@dataclass(frozen=True)
class DependencePosterior:
    """The posterior of the mean pair dependence ``D`` (profile unit): its median,
    standard deviation and :data:`QUANTILES`; ``pair_means`` (P,): each measured
    pair's posterior mean dependence."""

    median: float
    sd: float
    quantiles: tuple[float, ...]
    pair_means: np.ndarray


def dependence_posterior(
    evidence: PairEvidence, weights: np.ndarray, bounds: tuple[float, float]
) -> DependencePosterior:
    """The posterior of ``D`` given the pairs (module docstring), on a log lattice of
    :data:`_GRID` points over ``bounds`` (the prior range of ``D``).

    Args:
        evidence: the pilot's pair statistics.
        weights: (P,) each measured pair's weight ``w_i`` (>= 0).
        bounds: ``(lo, hi)``, 0 < lo < hi.

    For each alpha, pair ``i``'s likelihood at ``D`` is ``sum_m mass(m) L_i(D w_i
    e^(m step))`` over the lattice bins of ``log r`` (the Gamma law's exact mass per
    bin; below :data:`_RATIO_RANGE` the mass counts as ``r = 0``), a correlation
    computed by FFT for all pairs at once."""
    lo, hi = bounds
    step = math.log(hi / lo) / (_GRID - 1)
    below = math.ceil(-math.log(_RATIO_RANGE[0]) / step)
    above = math.ceil(math.log(_RATIO_RANGE[1]) / step)
    offsets = np.arange(-below, above + 1)
    lattice = lo * np.exp(step * np.arange(-below, _GRID + above))  # D r, per unit weight
    w = np.asarray(weights, dtype=np.float64)
    log_l = evidence.log_likelihood(w[:, None] * lattice[None, :])
    log_0 = evidence.log_likelihood(np.zeros((evidence.count, 1)))[:, 0]
    top = np.maximum(log_l.max(axis=1), log_0)
    # a pair whose statistic no dependence explains (a table from one report: its noise
    # draws are a few discrete values) has no likelihood at all: it moves nothing
    lost = ~np.isfinite(top)
    log_l[lost], log_0[lost], top[lost] = 0.0, 0.0, 0.0
    lat, zero = np.exp(log_l - top[:, None]), np.exp(log_0 - top)
    edges = np.exp(step * np.append(offsets - 0.5, offsets[-1] + 0.5))
    like, first = _integrate_ratios(lat, zero, edges)  # (alphas, P, G) each
    peak = like.max(axis=(0, 2), keepdims=True)
    like = np.maximum(like / peak, _FLOOR)
    log_post = np.log(like).sum(axis=1)  # (alphas, G): uniform priors on the lattice
    post = np.exp(log_post - log_post.max())
    post /= post.sum()
    grid = lo * np.exp(step * np.arange(_GRID))
    ratio = np.clip(first / peak, 0.0, None) / like  # E[r | x_i, D, alpha]
    pair_means = np.einsum("ag,apg->p", post * grid, ratio) * w
    return _summary(grid, post.sum(axis=0), pair_means)


def _integrate_ratios(
    lat: np.ndarray, zero: np.ndarray, edges: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per alpha (:data:`HETEROGENEITY_PRIOR`, :data:`_ALPHAS` points): each pair's
    likelihood at every lattice ``D`` integrated over ``r ~ Gamma(alpha, 1/alpha)``,
    and the same integral of ``r`` times the likelihood (``r`` times the Gamma(alpha,
    1/alpha) density is the Gamma(alpha + 1, 1/alpha) density). (alphas, P, G)."""
    from scipy.special import gammainc

    likes, firsts = [], []
    for alpha in np.geomspace(*HETEROGENEITY_PRIOR, _ALPHAS):
        cdf = gammainc(alpha, alpha * edges)
        likes.append(_correlate(lat, np.diff(cdf)) + cdf[0] * zero[:, None])
        firsts.append(_correlate(lat, np.diff(gammainc(alpha + 1, alpha * edges))))
    return np.stack(likes), np.stack(firsts)


def _correlate(values: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    """``out[i, j] = sum_m kernel[m] values[i, j + m]`` for every ``j`` where the kernel
    fits (P, J - K + 1), by FFT (a circular convolution of length J has no wrap-around
    there)."""
    size = values.shape[1]
    spectrum = np.fft.rfft(values, size, axis=1) * np.fft.rfft(kernel[::-1], size)[None, :]
    full = np.fft.irfft(spectrum, size, axis=1)
    out: np.ndarray = full[:, kernel.size - 1 :]
    return out


def _summary(grid: np.ndarray, post: np.ndarray, pair_means: np.ndarray) -> DependencePosterior:
    """Median, sd and quantiles of a posterior ``post`` (sums to 1) on ``grid``."""
    cdf = np.cumsum(post)
    quantiles = tuple(
        float(grid[min(grid.size - 1, int(np.searchsorted(cdf, f)))]) for f in QUANTILES
    )
    mean = float(post @ grid)
    sd = math.sqrt(max(0.0, float(post @ (grid - mean) ** 2)))
    return DependencePosterior(quantiles[2], sd, quantiles, pair_means)
