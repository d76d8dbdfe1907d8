"""What the planner assumes about the data: a :class:`DataProfile`.

The error of CALM's pipeline depends on the data in three ways the planner cannot see
without reports (CALM (Zhang et al., "CALM: Consistent Adaptive Local Marginal for
Marginal Release under Local Differential Privacy", CCS 2018), §4.3 calls the last one
"dataset dependent, no formula"):

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
   larger tables it takes the association along one direction: spread evenly over
   all ``dim_ab`` directions it would be ``dim_ab`` times smaller, but on uncapped
   Adult (2-41 categories) the one-direction form follows the pairs' dependence
   better, log correlation 0.66 against 0.55). A pair never holds more than its
   margins allow (:func:`pair_caps`). With
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
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from calmkit_client import CalmkitError, FrequencyOracle, Schema

from ..reconstruction.marginal import MarginalTable
from .dependence import QUANTILES, dependence_posterior, pair_evidence

__all__ = [
    "CONTINGENCY_PRIOR",
    "DataProfile",
    "dependence_range",
    "estimate_profile",
    "estimated_marginal",
    "marginal_pair_weights",
    "pair_caps",
    "pair_dependence",
]

# Log-uniform prior range of the contingency phi^2 the pairs share (the dependence of
# a pair of balanced binary attributes; module docstring): real data measured span
# 0.0028 (dna) to 0.18 (NLTCS); a binary pair allows up to 1.
CONTINGENCY_PRIOR = (1e-3, 0.5)
# An estimated marginal goes at most this share of the way to a single category.
_MOST_SKEW = 0.95
# ... and its prior reaches down to this share: below what a pilot can resolve, so
# that a margin the noise swamps is read as flat as the data allow, not as the floor
# of the prior (1e-3 read near-uniform margins of 8-40 categories as 5x their skew)
_LEAST_SKEW = 1e-5
# Two sets of marginals, one per attribute each (DataProfile.marginal_range).
_MarginalRange = tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]


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
        marginal_range: the representative marginals at the 10% and at the 90%
            posterior quantile of each attribute's distance from uniform (a pilot's
            profile: what its noisy margins cannot rule out; the planner's choice of a
            design over the safe ones must hold at both), or None (marginals known).
    """

    marginals: tuple[np.ndarray, ...]
    dependence: float
    source: str = "given"
    reports: int = 0
    dependence_sd: float = 0.0
    dependence_quantiles: tuple[float, ...] | None = None
    pair_weights: np.ndarray | None = None
    marginal_range: _MarginalRange | None = None

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
            object.__setattr__(
                self,
                "pair_weights",
                _normalised_weights(self.pair_weights, [m.size for m in margs]),
            )
        if self.marginal_range is not None:
            object.__setattr__(self, "marginal_range", self._checked_range(self.marginal_range))

    def _checked_range(self, ends: Sequence[Sequence[np.ndarray]]) -> _MarginalRange:
        """``marginal_range`` checked: two sets of marginals of this profile's sizes."""
        if len(ends) != 2:
            raise CalmkitError(f"marginal_range ({len(ends)} sets) must hold two sets of marginals")
        out = []
        for end in ends:
            end_t = DataProfile(tuple(end), 0.0).marginals  # each one checked as above
            if tuple(p.size for p in end_t) != self.sizes:
                raise CalmkitError(
                    f"marginal_range (sizes {[p.size for p in end_t]}) must match the "
                    f"marginals (sizes {list(self.sizes)})"
                )
            out.append(end_t)
        return (out[0], out[1])

    def with_marginals(self, marginals: Sequence[np.ndarray]) -> DataProfile:
        """This profile with other representative ``marginals`` (its dependence and pair
        weights kept) and no marginal range."""
        return replace(self, marginals=tuple(marginals), marginal_range=None)

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
        quantiles = tuple(lo * (hi / lo) ** f for f in QUANTILES)
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
        """Number of attributes."""
        return len(self.marginals)

    @property
    def sizes(self) -> tuple[int, ...]:
        """Category count of each attribute."""
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
    def pair_caps(self) -> np.ndarray:
        """(d, d): the most dependence (profile unit) each pair's margins allow
        (:func:`pair_caps`)."""
        return pair_caps(self.marginals)

    def pair_dependence(self, dependence: float) -> np.ndarray:
        """(d, d): each pair's dependence at mean ``dependence``: ``dependence x
        weight``, at most what its margins allow."""
        out: np.ndarray = np.minimum(dependence * self.weights, self.pair_caps)
        return out

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
        """JSON-ready summary (source, dependence and its spread, skew)."""
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
    h = np.array(
        [
            (1.0 - float(p @ p)) / (p.size - 1) * p.size if p.size > 1 else 0.0
            for p in (np.asarray(m, dtype=np.float64) for m in marginals)
        ]
    )
    out: np.ndarray = np.outer(h, h)
    np.fill_diagonal(out, 0.0)
    return out


def dependence_range(marginals: Sequence[np.ndarray]) -> tuple[float, float]:
    """The prior range of the mean pair dependence for these marginals:
    :data:`CONTINGENCY_PRIOR` times the mean of :func:`marginal_pair_weights` over the
    pairs of attributes with >= 2 categories (times 1 when there is no such pair), its
    top at most the mean of :func:`pair_caps` (on large domains the contingency allows
    far more than any table can hold: a 30 x 30 pair with uniform margins holds at most
    0.035), its range at least 500x."""
    mask = _live_pairs([np.asarray(m).size for m in marginals])
    scale = float(marginal_pair_weights(marginals)[mask].mean()) if mask.any() else 1.0
    lo, hi = CONTINGENCY_PRIOR
    scale = max(scale, 1e-12)
    top = hi * scale
    if mask.any():
        top = min(top, max(float(pair_caps(marginals)[mask].mean()), 1e-12))
    return min(lo * scale, top * lo / hi), top


def pair_caps(marginals: Sequence[np.ndarray]) -> np.ndarray:
    """(d, d): an upper bound of each pair's dependence (profile unit) given its
    margins: ``||P_ab - P_a (x) P_b||^2 <= ||P_ab||^2 + ||P_a||^2 ||P_b||^2`` with
    ``||P_ab||^2 <= min(||P_a||^2, ||P_b||^2)`` (a row of P_ab sums to P_a(i)), over
    ``dim_ab / L_ab``; 0 for a one-category attribute."""
    sizes = np.array([np.asarray(m).size for m in marginals], dtype=np.float64)
    power = np.array([float(np.asarray(m, dtype=np.float64) @ np.asarray(m)) for m in marginals])
    bound = np.minimum.outer(power, power) + np.outer(power, power)
    dim = np.outer(sizes - 1, sizes - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        out: np.ndarray = np.where(dim > 0, bound * np.outer(sizes, sizes) / dim, 0.0)
    np.fill_diagonal(out, 0.0)
    return out


def estimated_marginal(
    p_hat: np.ndarray, var: float, unbiased: bool = False, quantile: float = 0.5
) -> np.ndarray:
    """The representative marginal (L,) of a noisy margin ``p_hat`` whose cells each
    carry noise of variance ``var``.

    Its squared distance from uniform ``s2`` is estimated from ``T = ||p_hat - u||^2``
    (``p_hat`` first moved onto the plane of sum 1): its posterior ``quantile``
    (:func:`_skew_posterior`; default the median), or with ``unbiased`` as ``T - (L -
    1) var`` within [0, :data:`_MOST_SKEW` of a single category's]. The unbiased
    form is what simulating a pilot table under independence needs (the noise a
    table's statistic carries grows linearly with ``||P||^2``, so an unbiased
    ``||P||^2`` gives an unbiased noise level; the posterior's pull towards small skew
    would read the rest as dependence).
    Its shape is the Norm-Sub of ``p_hat``: the categories that stand out of the
    noise, the others 0. The shape is then moved towards uniform, or sharpened
    (:func:`_sharpened`), until its distance is ``s2``. What the error model reads from
    a marginal is mostly that distance (``||P||^2``: how much Norm-Sub clips, how
    max-ent spreads noise) and where the small cells are; a prior that pulls every
    margin towards uniform (Dirichlet(1)) reads a margin of 41 categories with one at
    91% as nearly uniform.
    """
    return _estimated_marginals(p_hat, var, unbiased, (quantile,))[0]


def _estimated_marginals(
    p_hat: np.ndarray, var: float, unbiased: bool, quantiles: Sequence[float]
) -> list[np.ndarray]:
    """:func:`estimated_marginal` at each of ``quantiles`` (one posterior)."""
    from ..reconstruction.consistency import norm_sub

    size = p_hat.size
    u = np.full(size, 1.0 / size)
    plane = p_hat - (p_hat.sum() - 1.0) / size
    observed = float(((plane - u) ** 2).sum())
    if unbiased:
        s2 = min(max(observed - (size - 1) * var, 0.0), _MOST_SKEW * (1.0 - 1.0 / size))
        skews = [s2] * len(quantiles)
    else:
        skews = _skew_posterior(observed, var, size, quantiles)
    shape = norm_sub(plane)
    reach = float(((shape - u) ** 2).sum())
    return [_sharpened(shape, s2) if s2 > reach else _representative(shape, s2) for s2 in skews]


def _skew_posterior(
    observed: float, var: float, size: int, quantiles: Sequence[float] = (0.5,)
) -> list[float]:
    """Posterior ``quantiles`` (default the median) of ``s2 = ||P - u||^2`` given
    ``T = ||p_hat - u||^2`` from a margin whose L cells carry independent noise of
    variance ``var``: ``T ~ N(s2 + (L - 1) var, 2 (L - 1) var^2 + 4 s2 var)`` (the
    noise's L - 1 dimensions in the plane of sum 1, and its part along the signal),
    and ``s2 / (1 - 1/L)``, the distance's share of a single category's, log-uniform
    on [:data:`_LEAST_SKEW`, :data:`_MOST_SKEW`]. Precise margins give ``T - (L - 1)
    var``; a margin the noise swamps (a pilot pair table of 40 x 37 cells) gives the
    geometric middle of the prior's floor and the largest distance the noise could
    hide, not the unbiased estimate whose spread (and its truncation at 0) makes flat
    attributes look skewed."""
    top = 1.0 - 1.0 / size
    lo, hi = _LEAST_SKEW * top, _MOST_SKEW * top
    noise = (size - 1) * var
    # a log grid over the prior, and a fine one where the likelihood peaks (it may be
    # far narrower than the log grid's steps)
    width = math.sqrt(2.0 * (size - 1) * var * var + 4.0 * abs(observed) * var)
    near = observed - noise + width * np.linspace(-6.0, 6.0, 121)
    s2 = np.unique(np.concatenate([np.geomspace(lo, hi, 400), near[(near > lo) & (near < hi)]]))
    spread = 2.0 * (size - 1) * var * var + 4.0 * s2 * var
    log_post = -0.5 * (observed - s2 - noise) ** 2 / spread - 0.5 * np.log(spread)
    # the log-uniform prior: density 1/s2, times each point's share of the axis
    post = np.exp(log_post - log_post.max()) * np.gradient(s2) / s2
    cdf = np.cumsum(post) / post.sum()
    return [float(np.interp(q, cdf, s2)) for q in quantiles]


def _sharpened(shape: np.ndarray, skew: float) -> np.ndarray:
    """``shape ** g`` normalised, with ``g >= 1`` such that its squared distance from
    uniform is ``skew`` (as far as a one-hot on the largest cell allows; bisection
    on ``log g``)."""
    size = shape.size
    u = 1.0 / size
    top = shape == shape.max()
    if skew >= (1.0 - 1.0 / size) * (1 - 1e-9) or top.all():
        out = top / top.sum()
        return np.asarray(out, dtype=np.float64)
    logs = np.log(np.maximum(shape / shape.max(), 1e-300))
    lo, hi = 0.0, 12.0  # log g
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        power = np.exp(np.exp(mid) * logs)
        power /= power.sum()
        lo, hi = (mid, hi) if float(((power - u) ** 2).sum()) < skew else (lo, mid)
    out = np.exp(np.exp(lo) * logs)
    normalised: np.ndarray = out / out.sum()
    return normalised


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
        pilot: the pilot's estimated views (:func:`~..reconstruction.estimate.estimate_views`), each
            over one or two attributes, with their report counts ``n``.
        oracles: the frequency oracle of each view.

    Marginals: per attribute the pilot's margin ``p_hat`` (pooled over its views by
    inverse variance), read by :func:`estimated_marginal` (its unbiased form for the
    pair statistics' simulation under independence).

    Pair weights: :func:`marginal_pair_weights` of the estimated marginals.

    Dependence: each pair view's statistic and its law under independence
    (:func:`~.dependence.pair_evidence`); the pairs' dependences are ``dependence * w
    * r`` (``w`` the pair's weight, ``r`` how far the pair departs from it:
    Gamma(alpha, 1/alpha), mean 1), and :func:`~.dependence.dependence_posterior`
    gives the posterior of ``dependence`` from every pair's own likelihood (log-uniform
    priors on :func:`dependence_range` and on alpha). The profile keeps its median,
    standard deviation and quantiles, and each measured pair's posterior mean in its
    weight. A pair whose noise swamps any plausible dependence (large domains, few
    reports) moves nothing; with heavy-tailed pairs (small alpha) a few pilot pairs
    may miss the ones that hold most of the dependence, and the posterior then reaches
    above what they show.
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
    margs, null_margs, ends = _pilot_marginals(prior, sums, weights)
    weights = _normalised_weights(marginal_pair_weights(margs), sizes)
    evidence = pair_evidence(pilot, oracles, null_margs)
    reports = int(sum(t.n for t in pilot))
    if not evidence.count:
        return DataProfile(
            tuple(margs),
            prior.dependence,
            "pilot",
            reports,
            prior.dependence_sd,
            prior.dependence_quantiles,
            weights,
            ends,
        )
    pairs = evidence.pairs
    pw = weights[pairs[:, 0], pairs[:, 1]]
    post = dependence_posterior(evidence, pw, dependence_range(margs))
    # measured pairs: their weight times their posterior mean over what the median
    # predicts; the mean over all pairs moves with them, so that dependence x weight
    # stays each measured pair's posterior mean once the weights are normalised again
    # (with every pair measured, the dependence is theirs)
    measured = np.where(pw > 0, post.pair_means / np.maximum(post.median * pw, 1e-300), 0.0)
    weights = weights.copy()
    weights[pairs[:, 0], pairs[:, 1]] = weights[pairs[:, 1], pairs[:, 0]] = pw * measured
    factor = float(weights.sum() / max(int(_live_pairs(sizes).sum()), 1))
    quantiles = tuple(q * factor for q in post.quantiles)
    median, sd = post.median * factor, post.sd * factor
    return DataProfile(tuple(margs), median, "pilot", reports, sd, quantiles, weights, ends)


def _pilot_marginals(
    prior: DataProfile, sums: Sequence[np.ndarray | None], weights: np.ndarray
) -> tuple[list[np.ndarray], list[np.ndarray], _MarginalRange]:
    """Each attribute's representative marginal from its pooled pilot margin
    (``sums[a] / weights[a]``, noise variance ``1 / weights[a]`` per cell; the prior's
    where no view held it): at the median of its distance from uniform (the error
    model's), its unbiased form (the independence simulation's) and the marginals at
    the 10% and 90% quantiles (``marginal_range``)."""
    margs: list[np.ndarray] = []
    null_margs: list[np.ndarray] = []
    low: list[np.ndarray] = []
    high: list[np.ndarray] = []
    for a, pooled in enumerate(sums):
        if prior.marginals[a].size == 1 or pooled is None:
            for out in (margs, null_margs, low, high):
                out.append(prior.marginals[a])
            continue
        p_hat, var = pooled / weights[a], 1.0 / weights[a]
        lo, mid, hi = _estimated_marginals(p_hat, var, False, (0.1, 0.5, 0.9))
        for out, value in zip((margs, low, high), (mid, lo, hi)):
            out.append(value)
        null_margs.append(estimated_marginal(p_hat, var, True))
    return margs, null_margs, (tuple(low), tuple(high))
