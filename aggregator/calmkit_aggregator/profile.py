"""What the planner assumes about the data: a :class:`DataProfile`.

The error of CALM's pipeline depends on the data in three ways the planner cannot see
without reports (papers/calm-ccs18.txt §4.3 calls the last one "dataset dependent, no
formula"):

1. how far each attribute is from uniform (Norm-Sub clips noisy tables of skewed
   attributes, and max-ent spreads a noisy marginal along the other attributes'
   distributions, amplifying its noise by ``kappa_b = L_b ||P_b||^2`` per attribute);
2. the same, for an attribute no view holds: it stays uniform, error ``||P_a - u||^2``;
3. how strongly pairs of attributes depend on each other: a pair no view holds is
   filled by max-ent, whose error is the pair's dependence ``||P_ab - P_a (x) P_b||^2``.
   The profile keeps its mean over pairs per unit of interaction dimension
   (``dependence`` = mean of ``||P_ab - P_a P_b||^2 / (dim_ab / L_ab)``, with
   ``dim_ab = (L_a-1)(L_b-1)``); for binary pairs that is 4 x the mean squared
   dependence. Dependence beyond pairs (what max-ent given every pair misses) is
   taken as 0: it is below 2e-4 on every dataset we measured.
4. how that dependence is spread over the pairs (``pair_weights``, mean 1): on real
   data it is concentrated, a quarter of the pairs holding 41-97% of it (NLTCS 41%,
   plants 73%, Adult 93%, Kosarak 96-97%). Much of it is predictable from the
   marginals alone (:func:`marginal_pair_weights`): a pair's dependence is its
   mean-square contingency ``phi^2_ab`` (its chi-square per user) times what the
   margins allow, ``h_a h_b dim_ab`` with ``h_a = (1 - ||P_a||^2) / (L_a - 1)``
   (exact for binary pairs: ``||D||^2 = 4 cov^2 = phi^2 4 p_a q_a p_b q_b``; for
   larger tables the average over the directions of the association). With
   ``phi^2`` the same for every pair, the quarter of pairs with the largest
   ``h_a h_b dim_ab`` holds 63% of the dependence on Kosarak d=16 (measured 73%),
   35% on NLTCS (41%), 47% on Adult (66%), 38% on plants (34%), 30% on dna (33%).

The prior on the dependence is therefore put on the shared contingency ``phi^2``
(:data:`CONTINGENCY_PRIOR`, log-uniform): the mean dependence's range is that times
the mean of ``h_a h_b L_a L_b`` over the pairs (:func:`dependence_range`), so data
whose margins allow little dependence (sparse transactions) get a prior scaled down
with them. Measured, the mean dependence of real data spans 440x (0.00026 on retail
and Kosarak at d = 32 to 0.11 on NLTCS) but its ratio to that mean only 65x (0.0028 on
dna to 0.18 on NLTCS).

A profile comes from a **prior** (no reports: each attribute's marginal uniform on the
simplex, i.e. Dirichlet(1); ``phi^2`` log-uniform on CONTINGENCY_PRIOR), from a **pilot**
(:func:`estimate_profile`: a fraction of users report on pair views first, and the
prior is updated with what their noisy tables show; its pair weights come from the
estimated marginals), or from known marginals (:meth:`DataProfile.from_marginals`,
e.g. public data or a simulation's truth, optionally with known pair weights).

Each attribute is represented by one marginal with the expected distance from uniform
(``representative``), which is what the error model's Norm-Sub simulation uses.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from calmkit_client import CalmkitError, FrequencyOracle, Schema

from .marginal import MarginalTable

__all__ = [
    "CONTINGENCY_PRIOR",
    "HETEROGENEITY_PRIOR",
    "DataProfile",
    "dependence_range",
    "estimate_profile",
    "marginal_pair_weights",
    "pair_dependence",
]

# Log-uniform prior range of the contingency phi^2 the pairs share (the dependence of
# a pair of balanced binary attributes; module docstring): real data measured span
# 0.0028 (dna) to 0.18 (NLTCS); a binary pair allows up to 1.
CONTINGENCY_PRIOR = (1e-3, 0.5)
# Log-uniform prior range of alpha, the shape of the Gamma(alpha, 1/alpha) law of a
# pair's dependence over what its weight predicts: on real data alpha is 0.04 (dna),
# 0.15-0.35 (Kosarak, retail, Adult, ACS: a few pairs hold most of the dependence)
# and 4 (NLTCS: every pair alike).
HETEROGENEITY_PRIOR = (1 / 16, 4.0)
_ALPHAS = 9  # quadrature points of the alpha prior (log-spaced)
_RATIO_RANGE = (1e-6, 1e3)  # the pairs' mean over D beyond this is taken as 0 or inf
_QUANTILES = (0.1, 0.3, 0.5, 0.7, 0.9)
_GRID = 4001  # quadrature points of the dependence posterior
_DENSE = 1024  # pair tables up to this many cells estimate the dependence
_BOOTSTRAP = 200  # simulated pilot tables per pair view


@dataclass(frozen=True)
class DataProfile:
    """Per-attribute marginals and the pairwise dependence the planner assumes.

    Attributes:
        marginals: one (L_a,) float64 distribution per attribute: the representative
            marginal (sums to 1, its distance from uniform is the expected one).
        dependence: mean pair dependence per unit of interaction dimension (module
            docstring), >= 0.
        source: ``"prior"``, ``"pilot"`` or ``"given"``.
        reports: pilot reports behind the profile (0 for a prior or given profile).
        dependence_sd: posterior standard deviation of ``dependence`` (0 if given).
        dependence_quantiles: the 10%, 30%, 50%, 70% and 90% posterior quantiles of
            the dependence (``(dependence,)`` when it is given): equally likely
            values. The planner picks the design with the smallest mean log ratio to
            the best design over them.
        pair_weights: (d, d) float64, symmetric, >= 0: how the dependence is spread
            over the pairs; pair ``(a, b)``'s dependence is ``dependence *
            pair_weights[a, b]``. Normalised to mean 1 over the pairs of attributes
            with >= 2 categories (0 on the diagonal and for one-category attributes).
            None: every pair alike.
    """

    marginals: tuple[np.ndarray, ...]
    dependence: float
    source: str = "given"
    reports: int = 0
    dependence_sd: float = 0.0
    dependence_quantiles: tuple[float, ...] | None = None
    pair_weights: np.ndarray | None = None

    def __post_init__(self) -> None:
        margs = []
        for a, p in enumerate(self.marginals):
            arr = np.asarray(p, dtype=np.float64)
            if arr.ndim != 1 or arr.size < 1:
                raise CalmkitError(f"marginals[{a}] (shape {arr.shape}) must be a 1-D table")
            if not (np.all(np.isfinite(arr)) and np.all(arr >= 0) and abs(arr.sum() - 1) < 1e-6):
                raise CalmkitError(f"marginals[{a}] must be a distribution (>= 0, sums to 1)")
            margs.append(arr / arr.sum())
        if not margs:
            raise CalmkitError("marginals (()) must hold one marginal per attribute")
        dep = float(self.dependence)
        if not (math.isfinite(dep) and dep >= 0):
            raise CalmkitError(f"dependence ({self.dependence!r}) must be finite and >= 0")
        sd = float(self.dependence_sd)
        if not (math.isfinite(sd) and sd >= 0):
            raise CalmkitError(f"dependence_sd ({self.dependence_sd!r}) must be finite and >= 0")
        if self.source not in ("prior", "pilot", "given"):
            raise CalmkitError(f"source ({self.source!r}) must be prior, pilot or given")
        quantiles = (dep,) if self.dependence_quantiles is None else self.dependence_quantiles
        quantiles = tuple(float(x) for x in quantiles)
        if (
            not quantiles
            or not all(math.isfinite(x) and x >= 0 for x in quantiles)
            or list(quantiles) != sorted(quantiles)
        ):
            raise CalmkitError(
                f"dependence_quantiles ({self.dependence_quantiles!r}) must be finite, >= 0 "
                "and increasing"
            )
        object.__setattr__(self, "marginals", tuple(margs))
        object.__setattr__(self, "dependence", dep)
        object.__setattr__(self, "dependence_sd", sd)
        object.__setattr__(self, "dependence_quantiles", quantiles)
        if self.pair_weights is not None:
            object.__setattr__(self, "pair_weights", _normalised_weights(
                self.pair_weights, [m.size for m in margs]))  # fmt: skip

    # -- constructors --------------------------------------------------------------------
    @classmethod
    def prior(cls, schema: Schema) -> DataProfile:
        """No reports yet: every marginal Dirichlet(1) (uniform on the simplex), whose
        expected squared distance from uniform is ``(L-1) / (L (L+1))``; dependence
        log-uniform on :func:`dependence_range` of those marginals (its median and
        quantiles)."""
        margs = tuple(
            _representative(np.full(s, 1.0 / s), (s - 1) / (s * (s + 1))) for s in schema.sizes
        )
        lo, hi = dependence_range(margs)
        mean = (hi - lo) / math.log(hi / lo)
        second = (hi * hi - lo * lo) / (2 * math.log(hi / lo))
        sd = math.sqrt(max(0.0, second - mean * mean))
        quantiles = tuple(lo * (hi / lo) ** f for f in _QUANTILES)
        return cls(margs, math.sqrt(lo * hi), "prior", 0, sd, quantiles)

    @classmethod
    def from_marginals(
        cls,
        marginals: Sequence[np.ndarray],
        dependence: float,
        source: str = "given",
        pair_weights: np.ndarray | None = None,
    ) -> DataProfile:
        """Known marginals (e.g. public data, or a simulation's truth), mean pair
        dependence and (optionally) its spread over the pairs."""
        margs = tuple(np.asarray(p, dtype=np.float64) for p in marginals)
        return cls(margs, dependence, source, pair_weights=pair_weights)

    # -- derived -------------------------------------------------------------------------
    @property
    def d(self) -> int:
        return len(self.marginals)

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(int(p.size) for p in self.marginals)

    @cached_property
    def concentration(self) -> np.ndarray:
        """``kappa_a = L_a ||P_a||^2`` (d,): 1 for a uniform attribute, up to L_a."""
        return np.array([p.size * float(p @ p) for p in self.marginals])

    @cached_property
    def weights(self) -> np.ndarray:
        """``pair_weights`` as a (d, d) matrix (every pair of attributes with >= 2
        categories 1 when they are None)."""
        if self.pair_weights is not None:
            return self.pair_weights
        return _normalised_weights(np.ones((self.d, self.d)), list(self.sizes))

    @property
    def uneven(self) -> bool:
        """Whether the dependence is spread unevenly over the pairs."""
        if self.pair_weights is None:
            return False
        live = self.pair_weights[np.triu_indices(self.d, 1)]
        live = live[live > 0]
        return bool(live.size and not np.allclose(live, live[0], rtol=1e-9))

    @cached_property
    def skew(self) -> np.ndarray:
        """``||P_a - u||^2`` (d,): the error of leaving attribute a uniform."""
        return np.array([float(((p - 1.0 / p.size) ** 2).sum()) for p in self.marginals])

    def check(self, schema: Schema) -> None:
        """Raise if the profile does not describe ``schema``'s attributes."""
        if self.sizes != tuple(schema.sizes):
            raise CalmkitError(
                f"profile (sizes {list(self.sizes)}) must match the schema "
                f"(sizes {list(schema.sizes)})"
            )

    def to_dict(self) -> dict[str, object]:
        return {
            "source": self.source,
            "reports": self.reports,
            "dependence": self.dependence,
            "dependence_sd": self.dependence_sd,
            "dependence_quantiles": list(self.dependence_quantiles or ()),
            "mean_concentration": float(self.concentration.mean()),
            "pair_weights": "uneven" if self.uneven else "even",
        }


def _normalised_weights(weights: np.ndarray, sizes: Sequence[int]) -> np.ndarray:
    """``weights`` (d, d) checked, symmetrised, zeroed on the diagonal and on
    one-category attributes, and scaled to mean 1 over the remaining pairs (all
    pairs alike when they are all 0)."""
    d = len(sizes)
    w = np.array(weights, dtype=np.float64)
    if w.shape != (d, d):
        raise CalmkitError(f"pair_weights (shape {w.shape}) must be ({d}, {d})")
    if not (np.all(np.isfinite(w)) and np.all(w >= 0)):
        raise CalmkitError("pair_weights must be finite and >= 0")
    if not np.allclose(w, w.T, rtol=1e-9, atol=0.0):
        raise CalmkitError("pair_weights must be symmetric")
    mask = _live_pairs(sizes)
    w = np.where(mask, w, 0.0)
    pairs = int(mask.sum())
    total = float(w.sum())
    if pairs == 0:
        return w
    if total <= 0:
        w = mask.astype(np.float64)
        total = float(pairs)
    out: np.ndarray = w * (pairs / total)
    out.setflags(write=False)
    return out


def _live_pairs(sizes: Sequence[int]) -> np.ndarray:
    """(d, d) bool: the ordered pairs of distinct attributes with >= 2 categories."""
    live = np.array(sizes) > 1
    mask: np.ndarray = np.outer(live, live)
    np.fill_diagonal(mask, False)
    return mask


def marginal_pair_weights(marginals: Sequence[np.ndarray]) -> np.ndarray:
    """(d, d) pair weights predicted from the marginals alone (module docstring, 4):
    ``h_a h_b L_a L_b`` with ``h_a = (1 - ||P_a||^2) / (L_a - 1)``, the dependence per
    unit of interaction dimension a pair has when every pair has the same
    mean-square contingency. Not normalised."""
    h = np.array([
        (1.0 - float(p @ p)) / (p.size - 1) * p.size if p.size > 1 else 0.0
        for p in (np.asarray(m, dtype=np.float64) for m in marginals)
    ])  # fmt: skip
    out: np.ndarray = np.outer(h, h)
    np.fill_diagonal(out, 0.0)
    return out


def dependence_range(marginals: Sequence[np.ndarray]) -> tuple[float, float]:
    """The prior range of the mean pair dependence for these marginals:
    :data:`CONTINGENCY_PRIOR` times the mean of :func:`marginal_pair_weights` over the
    pairs of attributes with >= 2 categories (times 1 when there is no such pair)."""
    mask = _live_pairs([np.asarray(m).size for m in marginals])
    scale = float(marginal_pair_weights(marginals)[mask].mean()) if mask.any() else 1.0
    lo, hi = CONTINGENCY_PRIOR
    scale = max(scale, 1e-12)
    return lo * scale, hi * scale


def _representative(mean: np.ndarray, skew: float) -> np.ndarray:
    """A distribution along ``mean - u`` (or a fixed direction when ``mean`` is
    uniform) whose squared distance from uniform is ``skew``, kept inside the
    simplex."""
    size = mean.size
    u = np.full(size, 1.0 / size)
    if size == 1:
        return np.ones(1)
    direction = mean - u
    norm = float(np.sqrt(direction @ direction))
    if norm < 1e-12:  # no direction known: one category heavier than the rest
        direction = -np.full(size, 1.0 / size)
        direction[0] += 1.0
        norm = float(np.sqrt(direction @ direction))
    direction /= norm
    step = math.sqrt(max(0.0, skew))
    neg = direction < 0
    if neg.any():  # stay inside the simplex
        step = min(step, float(np.min(u[neg] / -direction[neg])))
    out: np.ndarray = np.clip(u + step * direction, 0.0, None)
    normalised: np.ndarray = out / out.sum()
    return normalised


# -- pilot estimation ---------------------------------------------------------------------
def pair_dependence(table: np.ndarray) -> float:
    """``||P_ab - P_a (x) P_b||^2 / (dim_ab / L_ab)`` of a 2-D table (the profile's
    unit); 0 when an attribute has one category."""
    t = np.asarray(table, dtype=np.float64)
    dim = int((t.shape[0] - 1) * (t.shape[1] - 1))
    if dim == 0:
        return 0.0
    delta = t - np.outer(t.sum(axis=1), t.sum(axis=0))
    return float((delta**2).sum()) / (dim / t.size)


def estimate_profile(
    schema: Schema,
    pilot: Sequence[MarginalTable],
    oracles: Sequence[FrequencyOracle],
    prior: DataProfile | None = None,
) -> DataProfile:
    """Update ``prior`` (default :meth:`DataProfile.prior`) with pilot views.

    Args:
        schema: the collection's schema.
        pilot: the pilot's estimated views (:func:`~.estimate.estimate_views`), each
            over one or two attributes, with their report counts ``n``.
        oracles: the frequency oracle of each view.

    Marginals: per attribute the pilot's margin ``p_hat`` (pooled over its views by
    inverse variance) shrinks towards uniform by the prior's share of the variance,
    ``k = v0 / (v0 + v)`` (Gaussian approximation of the Dirichlet(1) prior, per-cell
    variance ``v0 = (L-1)/(L^2 (L+1))``); its expected squared distance from uniform
    is ``k^2 ||p_hat - u||^2 + (1 - k) v0 L``.

    Pair weights: :func:`marginal_pair_weights` of the estimated marginals.

    Dependence: each pair view gives an unbiased estimate (:func:`_pair_statistics`)
    of its pair's dependence, which is ``dependence * w * r`` (``w`` its pair weight,
    ``r`` how far the pair departs from it: Gamma(alpha, 1/alpha), mean 1). Their ratio
    estimate ``sum x / sum w`` is that ``dependence`` times a Gamma-distributed mean
    of the ``r`` plus normal noise; :func:`_dependence_posterior` gives the posterior
    (log-uniform priors on :func:`dependence_range` and HETEROGENEITY_PRIOR), and the
    profile keeps its median, standard deviation and quantiles. With heavy-tailed
    pairs (small alpha) a few pilot pairs often miss the ones that hold most of the
    dependence: the posterior then reaches well above their ratio estimate.
    """
    prior = DataProfile.prior(schema) if prior is None else prior
    prior.check(schema)
    if len(oracles) != len(pilot):
        raise CalmkitError(f"oracles ({len(oracles)}) must give one per pilot view")
    sizes = schema.sizes
    sums: list[np.ndarray | None] = [None] * schema.d
    weights = np.zeros(schema.d)
    for table, oracle in zip(pilot, oracles):
        if len(table.attrs) > 2:
            raise CalmkitError(f"pilot view {list(table.attrs)} must hold one or two attributes")
        if table.n < 1:
            continue  # a view without reports tells nothing
        per_cell = float(oracle.variance(int(table.n))) + 1.0 / (table.n * table.cells)
        for ax, a in enumerate(table.attrs):
            other = tuple(i for i in range(len(table.attrs)) if i != ax)
            margin = table.values.sum(axis=other) if other else table.values
            w = 1.0 / (per_cell * table.cells / sizes[a])  # a margin cell sums C cells
            previous = sums[a]
            sums[a] = margin * w if previous is None else previous + margin * w
            weights[a] += w
    margs = []
    for a, size in enumerate(sizes):
        if size == 1 or sums[a] is None:
            margs.append(prior.marginals[a])
            continue
        p_hat = sums[a] / weights[a]
        var = 1.0 / weights[a]
        v0 = (size - 1) / (size * size * (size + 1))
        k = v0 / (v0 + var)
        u = np.full(size, 1.0 / size)
        mean = u + k * (p_hat - u)
        skew = k * k * float(((p_hat - u) ** 2).sum()) + (1 - k) * v0 * size
        margs.append(_representative(mean, skew))

    weights = _normalised_weights(marginal_pair_weights(margs), sizes)
    pairs, values, variances = _pair_statistics(pilot, oracles, margs)
    reports = int(sum(t.n for t in pilot))
    if not values.size:
        return DataProfile(tuple(margs), prior.dependence, "pilot", reports,
                           prior.dependence_sd, prior.dependence_quantiles,
                           weights)  # fmt: skip
    # pair i's statistic has mean dependence * w_i: the ratio estimate sum x / sum w
    pw = weights[pairs[:, 0], pairs[:, 1]]
    if not pw.sum() > 0:
        pw = np.ones(values.size)
    x = float(values.sum() / pw.sum())
    noise = float(variances.sum() / pw.sum() ** 2)
    count = float(pw.sum() ** 2 / (pw @ pw))  # the effective number of pairs
    mean, sd, quantiles = _dependence_posterior(x, noise, count, dependence_range(margs))
    # measured pairs: their weight times their own posterior ratio; the mean over all
    # pairs moves with them, so that dependence x weight stays each measured pair's
    # estimate once the weights are normalised again (with every pair measured, the
    # dependence is theirs, whatever the unmeasured ones might have been)
    measured = _pair_posterior(values, variances, mean * pw)
    weights = weights.copy()
    weights[pairs[:, 0], pairs[:, 1]] = weights[pairs[:, 1], pairs[:, 0]] = pw * measured
    factor = float(weights.sum() / max(int(_live_pairs(sizes).sum()), 1))
    quantiles = tuple(q * factor for q in quantiles)
    return DataProfile(tuple(margs), mean * factor, "pilot", reports, sd * factor, quantiles,
                       weights)  # fmt: skip


def _pair_posterior(values: np.ndarray, variances: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """Posterior mean (P,) of each measured pair's dependence relative to what its
    weight predicts, ``r = dependence_ab / expected_ab``: a Gamma(alpha, 1/alpha)
    prior on r (mean 1; real pairs are heavy-tailed around the marginal prediction)
    and the pair's statistic ``x ~ N(expected r, variance)``. ``alpha`` by moments
    over the pairs: ``1/alpha = var(x/expected) - mean(variance/expected^2)``,
    within [1/16, 4]."""
    mu = np.maximum(expected, 1e-12)
    z = values / mu
    if values.size > 1:
        excess = float(np.var(z, ddof=1) - np.mean(variances / mu**2))
    else:
        excess = 1.0
    alpha = 1.0 / min(16.0, max(0.25, excess))
    grid = np.geomspace(1e-3, 1e3, _GRID // 10)  # log-spaced: prior density times r
    log_prior = alpha * np.log(grid) - alpha * grid
    log_like = -((values[:, None] - mu[:, None] * grid[None, :]) ** 2) / (
        2 * np.maximum(variances, 1e-300)[:, None]
    )
    log_post = log_prior[None, :] + log_like
    w = np.exp(log_post - log_post.max(axis=1, keepdims=True))
    out: np.ndarray = (w @ grid) / w.sum(axis=1)
    return out


def _pair_statistics(
    pilot: Sequence[MarginalTable],
    oracles: Sequence[FrequencyOracle],
    margs: Sequence[np.ndarray],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per pair view (with reports, at most :data:`_DENSE` cells): its attributes (a
    row of the (P, 2) int64 array), an unbiased estimate of its dependence (the
    profile's unit) and that estimate's variance.

    The statistic is ``||D||^2`` (``D`` the table minus the outer product of its
    margins). What noise alone adds to it, and its spread, are measured by simulating
    the view: :data:`_BOOTSTRAP` estimates of a population with independent
    attributes (the estimated marginals), drawn exactly as the oracle draws reports
    (fixed seed). The estimate is ``||D||^2`` minus that mean; its variance is the
    simulated one plus ``4 |D|^2 nu`` for the noise across the signal (``nu`` the
    simulated noise per dimension)."""
    gen = np.random.default_rng(_BOOTSTRAP)
    pairs, values, variances = [], [], []
    for table, oracle in zip(pilot, oracles):
        if len(table.attrs) != 2 or table.n < 1 or table.cells > _DENSE:
            continue
        la, lb = table.values.shape
        dim = (la - 1) * (lb - 1)
        if dim == 0:
            continue
        unit = dim / (la * lb)
        truth = np.outer(margs[table.attrs[0]], margs[table.attrs[1]]).reshape(-1)
        noise = _dependence_stat(_draw_estimates(oracle, truth, int(table.n), gen), la, lb)
        raw = float(_dependence_stat(table.values.reshape(1, -1), la, lb)[0])
        mean, spread = float(noise.mean()), float(noise.var(ddof=1))
        signal = max(0.0, raw - mean)
        pairs.append(table.attrs)
        values.append((raw - mean) / unit)
        variances.append((spread + 4 * signal * mean / dim) / unit**2)
    return np.array(pairs, dtype=np.int64).reshape(-1, 2), np.array(values), np.array(variances)


def _draw_estimates(
    oracle: FrequencyOracle, truth: np.ndarray, n: int, gen: np.random.Generator
) -> np.ndarray:
    """(_BOOTSTRAP, L) estimates of ``n`` reports from a population with view table
    ``truth``, drawn as the oracle draws them."""
    p, q = oracle.p, oracle.q
    t = truth / truth.sum()
    if oracle.name == "GRR":
        counts = gen.multinomial(n, (p - q) * t + q, size=_BOOTSTRAP)
    else:
        cells = gen.multinomial(n, t, size=_BOOTSTRAP)
        counts = gen.binomial(cells, p) + gen.binomial(n - cells, q)
    return (counts / n - q) / (p - q)


def _dependence_stat(flat: np.ndarray, la: int, lb: int) -> np.ndarray:
    """``||T - T_a (x) T_b||^2`` of each row of ``flat`` (rows: (la, lb) tables)."""
    tables = flat.reshape(-1, la, lb)
    outer = tables.sum(axis=2)[:, :, None] * tables.sum(axis=1)[:, None, :]
    out: np.ndarray = ((tables - outer) ** 2).sum(axis=(1, 2))
    return out


def _dependence_posterior(
    x: float, noise: float, count: float, bounds: tuple[float, float]
) -> tuple[float, float, tuple[float, ...]]:
    """Posterior median, sd and quantiles (_QUANTILES) of the mean dependence ``D``
    given the pilot's ratio estimate ``x`` (:func:`estimate_profile`).

    Model: ``x = D u + e``, ``e ~ N(0, noise)`` and ``u`` the weighted mean of the
    pairs' ``r ~ Gamma(alpha, 1/alpha)``, itself Gamma with shape ``alpha * count``
    and mean 1 (``count`` the effective number of pairs, ``(sum w)^2 / sum w^2``:
    exact for equal weights, matching the first two moments otherwise). Priors:
    ``D`` log-uniform on ``bounds``, ``alpha`` log-uniform on HETEROGENEITY_PRIOR.

    Computed on one log-spaced lattice (:data:`_GRID` points over ``bounds``) for
    ``D`` and for ``D u``: for each alpha the likelihood is the correlation of the
    noise's density along ``D u`` with the Gamma's exact mass per lattice bin of
    ``log u`` (FFT); mass below :data:`_RATIO_RANGE` counts as ``D u = 0``, above it
    as beyond any ``x``. Noise narrower than the lattice is widened to it."""
    from scipy import signal, special

    lo, hi = bounds
    step = math.log(hi / lo) / (_GRID - 1)
    grid = lo * np.exp(step * np.arange(_GRID))
    u_lo, u_hi = _RATIO_RANGE
    below, above = math.ceil(-math.log(u_lo) / step), math.ceil(math.log(u_hi) / step)
    offsets = np.arange(-below, above + 1)  # lattice steps of log u
    ys = lo * np.exp(step * np.arange(-below, _GRID + above))  # D u on the lattice
    sd = math.sqrt(max(noise, 0.0) + (step * abs(x)) ** 2 + 1e-300)
    density = np.exp(-0.5 * ((x - ys) / sd) ** 2)
    at_zero = math.exp(-0.5 * (x / sd) ** 2)
    edges = np.exp(step * np.append(offsets - 0.5, offsets[-1] + 0.5))
    alphas = np.geomspace(*HETEROGENEITY_PRIOR, _ALPHAS)
    like = np.zeros(_GRID)
    for alpha in alphas:
        shape = alpha * max(count, 1e-12)
        cdf = special.gammainc(shape, shape * edges)
        mass = np.diff(cdf)  # P(log u in each bin)
        # sum_m mass[m] density[j + m + below]: density correlated with mass
        like += signal.fftconvolve(density, mass[::-1], mode="valid") + cdf[0] * at_zero
    # below 1e-10 of the noise density's peak is FFT round-off, not likelihood
    w = np.where(like > 1e-10 * _ALPHAS * max(float(density.max()), at_zero), like, 0.0)
    if not w.sum() > 0:  # x far outside what any D explains: the nearer end
        w = np.zeros(_GRID)
        w[0 if x < lo else -1] = 1.0
    w /= w.sum()
    cdf_d = np.cumsum(w)
    quantiles = tuple(
        float(grid[min(grid.size - 1, int(np.searchsorted(cdf_d, f)))]) for f in _QUANTILES
    )
    mean = float(w @ grid)
    return quantiles[2], float(np.sqrt(max(0.0, w @ (grid - mean) ** 2))), quantiles
