"""The expected SSE of CALM's whole pipeline for a view design (the planner's model).

CALM's Algorithm 1 (Zhang et al., "CALM: Consistent Adaptive Local Marginal for Marginal
Release under Local Differential Privacy", CCS 2018, §4.3) scores one view's per-cell
noise. What a k-way answer actually carries is the noise left after the pipeline
(estimation, consistency, maximum entropy: the paper's §4.1-4.4) plus what the views do
not hold. This module predicts it, in the ANOVA basis of a table (the orthogonal
components ``W_S``, one per attribute subset ``S``, of dimension
``dim_S = prod (L_a - 1)``):

1. **Oracle noise** of view j (``s_j`` users, ``L_j`` cells): per zero-sum contrast
   dimension ``nu_j = contrast_variance + 1/(L_j s_j)`` (the oracle's exact term plus
   the sampling of users into views). Component ``S`` of the view, read in the
   S-marginal, carries ``I = (L_j / L_S) dim_S nu_j``.
2. **Norm-Sub.** Where a view's noise reaches its smallest cells, Norm-Sub clips it,
   which both lowers the noise and biases the table towards the interior. For such
   views the bias vector and the variance of every component after Norm-Sub are
   measured by simulating the view (its truth a table with the profile's marginals
   and its pair dependence, :mod:`.view_tables`, at the profile's dependence: on
   dependent data a view of many attributes holds many near-empty cells, which the
   product of the marginals does not; its counts drawn exactly as the oracle draws
   them; a fixed seed).
3. **Consistency** averages each component over all views holding it with the
   pipeline's weights ``w_j ∝ 1/(L_j var_j)``, each divided by the share ``k_j`` of
   its raw variance the component keeps after Norm-Sub: ``e_S = (sum w_j |b_j|)^2 +
   sum w_j^2 v_j - dim_S/(L_S n)`` (aligned biases; the last term: the views' users
   partition the population). The pipeline alternates consistency and Norm-Sub
   until both hold, so a view whose Norm-Sub pins a component (a sparse table whose
   noise it clips) pulls it back every round: measured on 20 attributes of 8-40
   categories (n = 10^5, eps 1, pair views of ~1,000 users), the margins after
   adding 20 one-attribute views of 1,000 users stayed as precise as without them
   (summed SSE 0.178 against 0.176), which the raw weights (the singles dominating)
   predicted 2.5x worse and these weights predict within 20%. Where Norm-Sub clips
   less the fixed point lies between the two: on 4 attributes of 8-14 categories
   with single and pair views of 3,000 users (tests/aggregator/test_large_domains.py)
   these weights predict 1.42x the measured SSE, the raw ones 1.10x.
4. **Shrinkage** (:mod:`..reconstruction.shrinkage`) of each view's unshared components: the risk of
   its James-Stein factor at the signal-to-noise ratio the profile predicts
   (tabulated by simulation per dimension count), split over the components. An
   attribute's margin (4 or more categories) is shrunk towards uniform where that beats
   Norm-Sub: its error is the smaller of the two, the shrinkage then Norm-Sub simulated
   at the profile's margin. The model simulates James-Stein's factor, each margin
   alone; the pipeline's law fitted over all margins shrinks flat margins harder, so
   where many are flat the prediction errs high (the law the pipeline would fit
   cannot be simulated per design cheaply, and with the profile's own margins as the
   law the model went 5x low on 4 nearly flat attributes, which such a law from 4
   margins cannot learn).
5. **Answers.** A query ``A`` held by a view is a projection: component ``S ⊆ A``
   adds ``e_S / L_{A\\S}``. Otherwise max-ent spreads each held component along the
   attributes it is not held with: ``e_S prod_{c in A\\S} g(S, c)`` with
   ``g = kappa_c / L_c`` when no view holds ``S + c`` and ``1 / L_c`` when one does;
   ``kappa_c / L_c = ||P_c||^2`` is taken for c's *estimated* marginal, with half of
   what its error adds (:func:`_spread_along`: on attributes of 33-36 categories and
   500 reports per view the true ``||P_c||^2`` alone predicted a third of the
   measured SSE).
   A component no view holds adds its bias (the profile's skew for an attribute,
   ``dependence * w_ab * dim_S / L_S`` for a pair with weight ``w_ab``, 0 beyond)
   with the same spreading.
6. **Workload.** The mean over all k-subsets of the d attributes is a sum over
   components of ``e_S`` times an elementary symmetric polynomial of the ``g(S, c)``,
   evaluated with power sums (Newton's identities), never by enumerating queries.
7. **Global reconstruction** (:mod:`..reconstruction.global_model`) answers what the views hold as
   local does and takes a query's unheld pairs from one model of all views, which
   carries dependence along paths of held pairs. Under the profile a pair's strength
   is ``rho_ab = sqrt(phi^2_ab)`` (its mean-square contingency, :mod:`.profile`: for
   binary attributes the correlation's size); a model that is a chain along a path
   infers ``rho_path``, the product of the strengths on it, so the pair keeps
   ``(1 - rho_path / rho_ab)^2`` of its dependence (exact for binary attributes with
   one path, tested). The largest product over the paths of held pairs is taken
   (a shortest path in ``-log rho``), and the signs along it are assumed to agree
   with the pair's (a positively associated population). Where several paths join a
   pair the model combines them, which this does not count; the noise the inferred
   pair carries is not counted either.

Measured against the real pipeline (docs/planner.md: Kosarak, Adult, NLTCS, plants,
dna, synthetic; 10 reps x 50 queries), the prediction from the data's own profile is
within 2x of the measured SSE on 243 of 249 grid designs (geometric mean ratio 0.98);
the six misses are designs 2-50x worse than the best at their setting.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache, lru_cache

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import shortest_path

from calmkit_client import CalmkitError, FrequencyOracle, choose_oracle, make_oracle
from calmkit_client.validation import check_int

from ..reconstruction.consistency import norm_sub_rows
from ..reconstruction.methods import check_reconstruction
from ..reconstruction.shrinkage import james_stein_factors
from .profile import DataProfile, marginal_pair_weights
from .view_tables import view_tables

__all__ = ["ErrorPrediction", "Workload", "predict_error", "predict_errors"]

# A view's Norm-Sub is simulated when its smallest true cell is within this many
# noise standard deviations of zero.
_CLIP_SDS = 3.0
# Views above this many cells are not simulated (their Norm-Sub is taken as inactive):
# the simulation's component operator is dense, cells x cells (a 2^20-cell view would
# need 8 TiB).
_SIMULATE_MAX_CELLS = 1 << 12
# Simulated repetitions per view for Norm-Sub; values per simulated batch.
_SAMPLES = 32
# Simulated noise draws per attribute for the margins' shrinkage (cheap: one margin each).
_MARGIN_SAMPLES = 128
_BATCH_VALUES = 1 << 18
# Views of one shape and user count simulated per prediction (the rest: nearest truth).
_SIMULATED = 128
# Below this many reports per view counts are drawn exactly, above by their normal law.
_EXACT_BELOW = 40
# James-Stein risk table: dimensions above this use the table of this many.
_JS_MAX_DIM = 256
_JS_DRAWS = 8000
# What the shrinker may take the noise to be, over what it is (rows of its risk table).
_JS_RHOS = 2.0 ** np.arange(-3.0, 3.25, 0.5)


@dataclass(frozen=True)
class Workload:
    """The queries a plan is scored on: all k-way marginals (``k``), or an explicit
    list of attribute sets (``queries``, sorted position tuples)."""

    k: int | None = None
    queries: tuple[tuple[int, ...], ...] | None = None

    def __post_init__(self) -> None:
        if (self.k is None) == (self.queries is None):
            raise CalmkitError("workload must give either k or queries")
        if self.k is not None:
            check_int("k", self.k, 1)
        if self.queries is not None:
            qs = tuple(tuple(sorted({int(a) for a in q})) for q in self.queries)
            if not qs or any(not q for q in qs):
                raise CalmkitError("queries must be a non-empty list of non-empty attribute sets")
            object.__setattr__(self, "queries", qs)

    @property
    def order(self) -> int:
        """The largest query size."""
        return int(self.k) if self.k is not None else max(len(q) for q in self.queries or ())

    def check(self, d: int) -> None:
        """:class:`CalmkitError` unless the workload fits ``d`` attributes."""
        if self.k is not None and self.k > d:
            raise CalmkitError(f"k ({self.k}) must be <= d ({d} attributes)")
        for q in self.queries or ():
            if q[0] < 0 or q[-1] >= d:
                raise CalmkitError(f"query {list(q)} must name attributes in [0, {d})")


@dataclass(frozen=True)
class ErrorPrediction:
    """The predicted mean SSE of the workload's answers: ``sse = noise + bias``
    (``noise``: what the held components carry after the pipeline; ``bias``: what
    the views do not hold). ``uncollected``: attributes with >= 2 categories in no
    view."""

    sse: float
    noise: float
    bias: float
    uncollected: tuple[int, ...]


def predict_error(
    sizes: Sequence[int] | np.ndarray,
    views: Sequence[Sequence[int]],
    users: Sequence[float],
    epsilon: float,
    workload: Workload,
    profile: DataProfile,
    oracles: Sequence[str] | None = None,
    n: float | None = None,
    shrink: bool = True,
    seed: int = 0,
    reconstruction: str = "local",
) -> ErrorPrediction:
    """Predict the pipeline's mean SSE over ``workload`` (module docstring); see
    :func:`predict_errors` for the arguments."""
    return predict_errors(
        sizes,
        views,
        users,
        epsilon,
        workload,
        profile,
        None,
        oracles,
        n,
        shrink,
        seed,
        reconstruction,
    )[0]


def predict_errors(
    sizes: Sequence[int] | np.ndarray,
    views: Sequence[Sequence[int]],
    users: Sequence[float],
    epsilon: float,
    workload: Workload,
    profile: DataProfile,
    dependences: Sequence[float] | None = None,
    oracles: Sequence[str] | None = None,
    n: float | None = None,
    shrink: bool = True,
    seed: int = 0,
    reconstruction: str = "local",
) -> list[ErrorPrediction]:
    """Predict the pipeline's mean SSE over ``workload`` (module docstring) once per
    pair dependence in ``dependences`` (default: the profile's); the noise part is
    computed once.

    Args:
        sizes: category count of each attribute (d,).
        views: attribute sets (sorted distinct positions), one per view.
        users: expected reports per view (m,), > 0.
        epsilon: the LDP budget of each report.
        workload: the queries.
        profile: what is assumed about the data (its sizes must be ``sizes``).
        oracles: "GRR"/"OUE" per view (default: the smaller variance, as plans do).
        n: the population size (default: the sum of ``users``).
        shrink: whether the reconstruction shrinks interactions (the default).
        seed: the seed of the Norm-Sub simulation (the prediction is deterministic).
        reconstruction: how answers are reconstructed, "local" (per-query max-ent) or
            "global" (:mod:`..reconstruction.global_model`: step 7 of the module docstring).
    """
    check_reconstruction(reconstruction)
    sizes_arr = np.asarray(sizes, dtype=np.int64)
    d = sizes_arr.size
    if profile.sizes != tuple(int(s) for s in sizes_arr):
        raise CalmkitError(
            f"profile (sizes {list(profile.sizes)}) must match sizes ({sizes_arr.tolist()})"
        )
    workload.check(d)
    vs = [tuple(int(a) for a in v) for v in views]
    if not vs:
        raise CalmkitError("views ([]) must hold at least one view")
    for j, v in enumerate(vs):
        if not v or list(v) != sorted(set(v)) or v[0] < 0 or v[-1] >= d:
            raise CalmkitError(f"views[{j}] ({list(v)}) must be sorted distinct attributes < {d}")
        if all(sizes_arr[a] == 1 for a in v):
            raise CalmkitError(
                f"views[{j}] ({list(v)}) holds only one-category attributes: a view needs "
                ">= 2 cells"
            )
    s = np.asarray(users, dtype=np.float64)
    if s.shape != (len(vs),) or not np.all(np.isfinite(s)) or np.any(s <= 0):
        raise CalmkitError(f"users (shape {s.shape}) must give one count > 0 per view")
    total = float(s.sum() if n is None else n)
    kmax = workload.order
    vs, s, oracles = _pooled_views(vs, s, oracles)
    views_model = _Views(sizes_arr, vs, s, epsilon, oracles)
    comps = _components(views_model, kmax)
    if comps.count:
        _norm_sub(views_model, comps, profile, seed)
    pooled, groups = _pool(views_model, comps, total)
    if shrink:
        pooled = _shrink_margins(groups, pooled, profile, sizes_arr, seed)
    held = {a for v in vs for a in v if sizes_arr[a] > 1}
    uncollected = tuple(a for a in range(d) if sizes_arr[a] > 1 and a not in held)
    out = []
    g_free = _spread_along(groups, pooled, profile, sizes_arr)
    spread = (
        None if workload.k is None else _spreading(groups, g_free, profile, sizes_arr, workload.k)
    )
    paths = _held_pairs(vs, sizes_arr) if reconstruction == "global" else None
    for dep in [profile.dependence] if dependences is None else dependences:
        bias = _bias(groups, profile, profile.pair_dependence(dep))
        err = _shrink(views_model, comps, groups, pooled, bias, profile) if shrink else pooled
        weights = profile.weights if paths is None else _recovered(profile, dep, paths)
        pair_dep = np.minimum(dep * weights, profile.pair_caps)  # what no view recovers
        if spread is not None:
            noise, biased = spread.parts(err, bias, pair_dep)
        else:
            noise, biased = _explicit(groups, err, g_free, profile, pair_dep, sizes_arr, workload)
        biased = max(0.0, biased)
        out.append(ErrorPrediction(noise + biased, noise, biased, uncollected))
    return out


# -- views and their components -----------------------------------------------------------
class _Views:
    """Per-view oracle constants: cells L, users s, f-independent variance, noise per
    contrast dimension nu; views grouped by shape (the sizes of their attributes)."""

    def __init__(
        self,
        sizes: np.ndarray,
        views: list[tuple[int, ...]],
        users: np.ndarray,
        epsilon: float,
        oracles: Sequence[str] | None,
    ) -> None:
        self.sizes, self.views, self.users, self.epsilon = sizes, views, users, epsilon
        m = len(views)
        if oracles is not None and len(oracles) != m:
            raise CalmkitError(f"oracles ({len(oracles)}) must name one oracle per view")
        by_length: dict[int, list[int]] = {}
        for j, v in enumerate(views):
            by_length.setdefault(len(v), []).append(j)
        self.cells = np.zeros(m, dtype=np.int64)
        # (shape, oracle name) -> (view indices (B,), their attributes (B, l))
        self.shapes: dict[tuple[tuple[int, ...], str], tuple[np.ndarray, np.ndarray]] = {}
        made: dict[tuple[str | None, int], FrequencyOracle] = {}
        self.oracles: list[FrequencyOracle] = [None] * m  # type: ignore[list-item]
        for members in by_length.values():
            idx = np.array(members, dtype=np.int64)
            table = np.array([views[j] for j in members], dtype=np.int64)
            shapes, inverse = np.unique(sizes[table], axis=0, return_inverse=True)
            cells = np.prod(shapes, axis=1)
            self.cells[idx] = cells[inverse.reshape(-1)]
            for u, shape in enumerate(shapes.tolist()):
                sel = np.flatnonzero(inverse.reshape(-1) == u)
                names = [None] * sel.size if oracles is None else [oracles[j] for j in idx[sel]]
                for name in set(names):
                    if (name, int(cells[u])) not in made:
                        made[name, int(cells[u])] = (
                            choose_oracle(int(cells[u]), epsilon)
                            if name is None
                            else make_oracle(name, int(cells[u]), epsilon)
                        )
                    oracle = made[name, int(cells[u])]
                    part = sel[[i for i, x in enumerate(names) if x == name]]
                    for j in idx[part].tolist():
                        self.oracles[j] = oracle
                    key = (tuple(int(x) for x in shape), oracle.name)
                    if key in self.shapes:  # same shape, explicit names mapping alike
                        old_idx, old_table = self.shapes[key]
                        self.shapes[key] = (
                            np.concatenate([old_idx, idx[part]]),
                            np.concatenate([old_table, table[part]]),
                        )
                    else:
                        self.shapes[key] = (idx[part], table[part])
        # each distinct oracle's constants once, then per view by index
        distinct = {id(o): i for i, o in enumerate(made.values())}
        which = np.array([distinct[id(o)] for o in self.oracles], dtype=np.int64)
        made_list = list(made.values())
        gap = np.array([o.p - o.q for o in made_list])[which] ** 2
        q = np.array([o.q for o in made_list])[which]
        power = np.array([o.contrast_power() for o in made_list])[which]
        self.var = q * (1 - q) / (users * gap)
        self.nu = power / (self.cells * users * gap) + 1.0 / (self.cells * users)


@dataclass
class _Components:
    """One row per (view, attribute subset S of it) with 1 <= |S| <= kmax and
    dim_S > 0: the view, S (padded with -1), |S|, dim_S, L_S, and after simulation the
    bias norm and variance of S in the S-marginal. Rows of views of one shape come in
    blocks: ``blocks[shape] = (views (B,), positions (P subsets), rows (B, P))``."""

    view: np.ndarray
    attrs: np.ndarray
    order: np.ndarray
    dim: np.ndarray
    cells: np.ndarray
    bias_norm: np.ndarray
    variance: np.ndarray
    high_dim: np.ndarray  # per view: dimensions of its components above kmax
    blocks: dict[tuple[tuple[int, ...], str], tuple[np.ndarray, list[tuple[int, ...]], np.ndarray]]

    @property
    def count(self) -> int:
        return int(self.view.size)


def _components(model: _Views, kmax: int) -> _Components:
    width = max(1, kmax)
    views_parts, attrs_parts = [], []
    blocks = {}
    high = np.zeros(len(model.views))
    start = 0
    for key, (idx, table) in model.shapes.items():
        shape, _ = key
        members = idx
        patterns = [
            pos
            for r in range(1, min(len(shape), kmax) + 1)
            for pos in itertools.combinations(range(len(shape)), r)
            if all(shape[i] > 1 for i in pos)
        ]
        kept = sum(int(np.prod([shape[i] - 1 for i in pos])) for pos in patterns)
        high[idx] = int(np.prod(shape)) - 1 - kept
        if not patterns:
            continue
        block = np.full((len(members), len(patterns), width), -1, dtype=np.int64)
        for p, pos in enumerate(patterns):
            block[:, p, : len(pos)] = table[:, list(pos)]
        rows = start + np.arange(len(members) * len(patterns)).reshape(len(members), -1)
        blocks[key] = (idx, patterns, rows)
        start += rows.size
        views_parts.append(np.repeat(idx, len(patterns)))
        attrs_parts.append(block.reshape(-1, width))
    view = np.concatenate(views_parts) if views_parts else np.zeros(0, np.int64)
    attrs = np.concatenate(attrs_parts) if attrs_parts else np.zeros((0, width), np.int64)
    order = (attrs >= 0).sum(axis=1)
    safe = np.where(attrs >= 0, attrs, 0)
    sz = np.where(attrs >= 0, model.sizes[safe], 1)
    dim = np.prod(sz - (attrs >= 0), axis=1).astype(np.float64)
    cells = np.prod(sz, axis=1).astype(np.float64)
    lin = model.cells[view] / cells * dim * model.nu[view]
    return _Components(
        view, attrs, order, dim, cells, np.zeros(view.size), lin, np.maximum(high, 0), blocks
    )


# -- Norm-Sub, by simulating the views that need it ----------------------------------------
def _norm_sub(model: _Views, comps: _Components, profile: DataProfile, seed: int) -> None:
    """Overwrite the bias norm and variance of the components of every view whose
    Norm-Sub is active with simulated values. Views of one shape and user count are
    simulated up to :data:`_SIMULATED` at a time; the others take the values of the
    simulated view with the nearest truth. Views above :data:`_SIMULATE_MAX_CELLS`
    cells keep the analytic values."""
    gen = np.random.default_rng(seed)
    for key, (idx, patterns, rows) in comps.blocks.items():
        shape, _ = key
        if math.prod(shape) > _SIMULATE_MAX_CELLS:
            continue
        # truths (B, L): the profile's margins joined with its pair dependence
        truth = view_tables(profile, model.shapes[key][1], shape, profile.dependence)
        users = model.users[idx]
        sd = np.sqrt(model.var[idx] + 1.0 / users)
        active = truth.min(axis=1) < _CLIP_SDS * sd
        if not active.any():
            continue
        oracle = model.oracles[int(idx[np.flatnonzero(active)[0]])]
        for count in np.unique(np.rint(users[active])):
            group = np.flatnonzero(active & (np.rint(users) == count))
            picked = group
            if group.size > _SIMULATED:  # spread over the truths' range
                order = group[np.argsort(truth[group].min(axis=1), kind="stable")]
                at = np.unique(np.linspace(0, order.size - 1, _SIMULATED).astype(np.int64))
                picked = order[at]  # in the order of their smallest true cell
            bias2, var = _simulate_components(
                oracle, users[picked], truth[picked], shape, patterns, gen
            )
            if picked.size < group.size:  # nearest simulated view by smallest true cell
                near = _nearest(truth[picked].min(axis=1), truth[group].min(axis=1))
                bias2, var = bias2[near], var[near]
                target = rows[group]
            else:
                target = rows[picked]
            comps.bias_norm[target] = np.sqrt(bias2)
            comps.variance[target] = var


def _nearest(keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """For each of ``values`` the index of the nearest of the sorted ``keys`` (at least
    two); a value halfway between two keys takes the lower."""
    pos = np.clip(np.searchsorted(keys, values), 1, keys.size - 1)
    left = np.abs(values - keys[pos - 1]) <= np.abs(keys[pos] - values)
    out: np.ndarray = np.where(left, pos - 1, pos)
    return out


def _simulate_components(
    oracle: FrequencyOracle,
    users: np.ndarray,
    truth: np.ndarray,
    shape: tuple[int, ...],
    patterns: Sequence[tuple[int, ...]],
    gen: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """Squared bias norm and variance (B, patterns) of each component after Norm-Sub:
    the simulated errors (:func:`_simulate`) read in each pattern's marginal."""
    chunk = max(1, _BATCH_VALUES // (truth.shape[1] * _SAMPLES))
    bias2 = np.empty((truth.shape[0], len(patterns)))
    var = np.empty_like(bias2)
    for lo in range(0, truth.shape[0], chunk):
        part = slice(lo, lo + chunk)
        errors = _simulate(oracle, users[part], truth[part], gen)  # (B, R, L)
        tables = errors.reshape(*errors.shape[:2], *shape)
        for i, pos in enumerate(patterns):
            comp = _component(tables, pos, len(shape))  # (B, R, L_S)
            mean = comp.mean(axis=1)
            var[part, i] = ((comp - mean[:, None, :]) ** 2).mean(axis=1).sum(axis=1)
            # |mean|^2 overstates |bias|^2 by var / R
            raw = (mean**2).sum(axis=1)
            bias2[part, i] = np.maximum(raw - var[part, i] / (_SAMPLES - 1), 0.0)
    return bias2, var


def _component(tables: np.ndarray, pos: tuple[int, ...], axes: int) -> np.ndarray:
    """The ANOVA component ``pos`` of (B, R, *shape) tables read in its marginal: the
    sum over the other axes, centred along each of ``pos``'s; (B, R, L_S) flat."""
    others = tuple(2 + ax for ax in range(axes) if ax not in pos)
    comp = tables.sum(axis=others) if others else tables
    for ax in range(len(pos)):
        comp = comp - comp.mean(axis=2 + ax, keepdims=True)
    flat: np.ndarray = comp.reshape(*comp.shape[:2], -1)
    return flat


def _simulate(
    oracle: FrequencyOracle, users: np.ndarray, truth: np.ndarray, gen: np.random.Generator
) -> np.ndarray:
    """Errors (B, samples, L) of Norm-Sub(estimate) - truth for B views of ``oracle``
    with ``users`` reports each, drawn exactly as the oracle draws them."""
    s = np.maximum(1, np.rint(users)).astype(np.int64)[:, None]  # (B, 1)
    t = truth / truth.sum(axis=1, keepdims=True)
    size = (t.shape[0], _SAMPLES)
    p, q = oracle.p, oracle.q
    exact = bool(np.all(s < _EXACT_BELOW))
    if oracle.name == "GRR":
        probs = (p - q) * t + q
        counts = (
            gen.multinomial(s, probs[:, None, :], size=size)
            if exact
            else _normal_multinomial(s, probs, gen)
        )
    elif exact:
        cells = gen.multinomial(s, t[:, None, :], size=size)
        counts = gen.binomial(cells, p) + gen.binomial(s[:, :, None] - cells, q)
    else:
        cells = _normal_multinomial(s, t, gen)
        rest = s[:, :, None] - cells
        sd = np.sqrt(np.maximum(cells * p * (1 - p) + rest * q * (1 - q), 0.0))
        counts = cells * p + rest * q + sd * gen.standard_normal(cells.shape)
    est = (counts / s[:, :, None] - q) / (p - q)
    projected = norm_sub_rows(est.reshape(-1, t.shape[1])).reshape(est.shape)
    errors: np.ndarray = projected - t[:, None, :]
    return errors


def _normal_multinomial(s: np.ndarray, probs: np.ndarray, gen: np.random.Generator) -> np.ndarray:
    """Normal draws (B, samples, L) with the mean ``s p`` and covariance
    ``s (diag p - p p^T)`` of Multinomial(s, p): ``s p + sqrt(s) (sqrt(p) g - p (sqrt(p)
    . g))`` for standard normal g."""
    root = np.sqrt(probs)[:, None, :]
    g = gen.standard_normal((probs.shape[0], _SAMPLES, probs.shape[1]))
    centred = root * g - probs[:, None, :] * (root * g).sum(axis=2, keepdims=True)
    draws: np.ndarray = s[:, :, None] * probs[:, None, :] + np.sqrt(s)[:, :, None] * centred
    return draws


# -- consistency pooling ------------------------------------------------------------------
@dataclass
class _Groups:
    """Distinct components: ``index[i]`` is row i's group; per group its attributes
    (padded), order, dim, cells, member count and ``raw``, its pooled error before
    Norm-Sub (the oracle's noise averaged with the pipeline's weights)."""

    index: np.ndarray
    attrs: np.ndarray
    order: np.ndarray
    dim: np.ndarray
    cells: np.ndarray
    members: np.ndarray
    raw: np.ndarray


def _pool(model: _Views, comps: _Components, n: float) -> tuple[np.ndarray, _Groups]:
    if not comps.count:
        empty = np.zeros(0)
        return empty, _Groups(np.zeros(0, np.int64), comps.attrs, empty, empty, empty, empty, empty)
    base = int(comps.attrs.max()) + 2
    if comps.attrs.shape[1] * math.log2(base) <= 62:
        _, first, index = np.unique(
            _keys(comps.attrs, base), return_index=True, return_inverse=True
        )
        uniq = comps.attrs[first]
    else:
        uniq, first, index = np.unique(comps.attrs, axis=0, return_index=True, return_inverse=True)
    index = index.reshape(-1)
    # the pipeline's weights, times how far Norm-Sub cut the component's variance
    raw = model.cells[comps.view] / comps.cells * comps.dim * model.nu[comps.view]
    kept = comps.variance / np.maximum(raw, 1e-300)
    w = 1.0 / (model.cells[comps.view] * model.var[comps.view] * np.maximum(kept, 1e-12))
    wsum = np.bincount(index, w, minlength=len(uniq))
    w = w / wsum[index]
    bias = np.bincount(index, w * comps.bias_norm, minlength=len(uniq)) ** 2
    var = np.bincount(index, w * w * comps.variance, minlength=len(uniq))
    groups = _Groups(
        index,
        uniq,
        comps.order[first],
        comps.dim[first],
        comps.cells[first],
        np.bincount(index, minlength=len(uniq)),
        np.bincount(index, w * w * raw, minlength=len(uniq)),
    )
    err = np.maximum(bias + var - groups.dim / groups.cells / n, 0.0)
    return err, groups


def _pooled_views(
    views: list[tuple[int, ...]], users: np.ndarray, oracles: Sequence[str] | None
) -> tuple[list[tuple[int, ...]], np.ndarray, Sequence[str] | None]:
    """Views repeated under one oracle as one view with their users summed, as the
    reconstruction pools them (:meth:`~..reconstruction.support.SupportCounts.pooled`)."""
    names: list[str | None] = list(oracles) if oracles is not None else [None] * len(views)
    if len(names) != len(views):
        return views, users, oracles  # _Views names the mismatch
    slot: dict[tuple[tuple[int, ...], str | None], int] = {}
    for v, name in zip(views, names):
        slot.setdefault((v, name), len(slot))
    if len(slot) == len(views):
        return views, users, oracles
    summed = np.zeros(len(slot))
    np.add.at(summed, [slot[v, name] for v, name in zip(views, names)], users)
    keys = list(slot)
    pooled_names = None if oracles is None else [str(name) for _, name in keys]
    return [v for v, _ in keys], summed, pooled_names


def _bias(groups: _Groups, profile: DataProfile, pair_dep: np.ndarray) -> np.ndarray:
    """Per group: the error it would have if no view held it (the profile's skew for
    one attribute, the pair's dependence ``pair_dep`` (d, d) x dim/L for a pair, 0
    beyond)."""
    out = np.zeros(groups.order.size)
    one = groups.order == 1
    out[one] = profile.skew[groups.attrs[one, 0]]
    two = groups.order == 2
    if two.any():
        dep = pair_dep[groups.attrs[two, 0], groups.attrs[two, 1]]
        out[two] = dep * groups.dim[two] / groups.cells[two]
    return out


# -- global reconstruction: pairs recovered along paths ---------------------------------------
def _held_pairs(views: list[tuple[int, ...]], sizes: np.ndarray) -> np.ndarray:
    """(d, d) bool: the pairs of attributes (>= 2 categories) that some view holds."""
    d = sizes.size
    held = np.zeros((d, d), dtype=bool)
    for v in views:
        live = [a for a in v if sizes[a] > 1]
        for a, b in itertools.combinations(live, 2):
            held[a, b] = held[b, a] = True
    return held


def _recovered(profile: DataProfile, dependence: float, held: np.ndarray) -> np.ndarray:
    """The pair weights left for global reconstruction (module docstring, step 7): an
    unheld pair's weight times ``(1 - rho_path / rho_ab)^2``, where ``rho_ab =
    sqrt(phi^2_ab)`` is its strength under the profile (``phi^2`` capped at 1) and
    ``rho_path`` the largest product of strengths along a path of held pairs (0 when
    no path joins them, which leaves the weight as it is)."""
    weights = profile.weights
    if not held.any() or dependence <= 0:
        return weights
    scale = marginal_pair_weights(profile.marginals)
    live = scale > 0
    phi2 = np.zeros_like(scale)
    phi2[live] = np.minimum(dependence * weights[live] / scale[live], 1.0)
    rho = np.sqrt(phi2)
    # a sparse graph: its explicit entries are the edges, length 0 (rho = 1) included
    # (a dense matrix would read 0 and lengths near it as no edge)
    a, b = np.nonzero(held & (rho > 0))
    edges = csr_matrix((-np.log(rho[a, b]), (a, b)), shape=rho.shape)
    dist = shortest_path(edges, method="D", directed=False)
    path = np.exp(-dist)  # 0 where no path
    free = ~held & live & (rho > 0)
    ratio = np.ones_like(weights)
    ratio[free] = (1.0 - path[free] / rho[free]) ** 2
    out: np.ndarray = weights * ratio
    return out


# -- shrinkage ------------------------------------------------------------------------------
@cache
def _js_tables(dim: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Risk of the positive-part James-Stein factor ``(1 - rho D nu / |x|^2)_+`` per
    noise dimension, as a function of ``tau = |theta|^2 / (D nu)`` (columns) and of
    ``rho`` (rows, :data:`_JS_RHOS`; returned as logs): x = theta + z, z ~ N(0, nu
    I_D), and the shrinker takes the noise to be ``rho`` times what it is (the
    pipeline takes it from the oracle, ``c`` per dimension, while Norm-Sub has moved
    the view's noise away from that). Only ``z``'s component along theta and the
    chi-square of the rest matter, so each draw is two numbers (fixed seed)."""
    gen = np.random.default_rng(20181015 + dim)
    along = gen.standard_normal(_JS_DRAWS)
    rest = gen.chisquare(dim - 1, _JS_DRAWS) if dim > 1 else np.zeros(_JS_DRAWS)
    taus = np.concatenate([[0.0], np.geomspace(1e-3, 1e3, 61)])
    theta = np.sqrt(taus * dim)[:, None]
    norm2 = (theta + along) ** 2 + rest
    risks = []
    for rho in _JS_RHOS:
        lam = np.clip(1.0 - rho * dim / norm2, 0.0, None)
        risk = (
            (lam**2 * norm2).mean(axis=1)
            - 2 * theta[:, 0] * (lam * (theta + along)).mean(axis=1)
            + theta[:, 0] ** 2
        )
        risks.append(risk / dim)
    return taus, np.log(_JS_RHOS), np.array(risks)


def _js_table(dim: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_js_tables` when the shrinker knows the noise (``rho = 1``)."""
    taus, _, risks = _js_tables(dim)
    return taus, risks[_JS_RHOS.tolist().index(1.0)]


def _js_risk(dim: int | np.ndarray, tau: np.ndarray, rho: np.ndarray) -> np.ndarray:
    """The risk ratio of :func:`_js_tables` at each ``(dim, tau, rho)`` (``dim`` one
    dimension count or one per point): linear in ``tau`` along each row, then in ``log
    rho`` between rows (``rho`` kept inside the table)."""
    dims = np.broadcast_to(np.asarray(dim, dtype=np.int64), np.shape(tau))
    unique, which = np.unique(dims, return_inverse=True)
    taus, log_rhos, risks = _js_stack(tuple(int(d) for d in unique))
    at = np.clip(np.searchsorted(taus, tau, side="right") - 1, 0, taus.size - 2)
    t = np.clip((tau - taus[at]) / (taus[at + 1] - taus[at]), 0.0, 1.0)  # last value beyond
    pos = (np.clip(np.log(rho), log_rhos[0], log_rhos[-1]) - log_rhos[0]) / (
        log_rhos[1] - log_rhos[0]
    )
    low = np.minimum(np.floor(pos).astype(np.int64), log_rhos.size - 2)
    frac = pos - low
    which = which.reshape(np.shape(tau))

    def row(r: np.ndarray) -> np.ndarray:
        out: np.ndarray = risks[which, r, at] * (1 - t) + risks[which, r, at + 1] * t
        return out

    out: np.ndarray = row(low) * (1 - frac) + row(low + 1) * frac
    return out


@lru_cache(maxsize=64)
def _js_stack(dims: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_js_tables` of several dimension counts: the shared ``tau`` and ``log
    rho`` grids and the risks stacked (dims, rhos, taus)."""
    tables = [_js_tables(d) for d in dims]
    return tables[0][0], tables[0][1], np.stack([risks for _, _, risks in tables])


def _shrink_margins(
    groups: _Groups, err: np.ndarray, profile: DataProfile, sizes: np.ndarray, seed: int
) -> np.ndarray:
    """Single attributes of 4 or more categories after the margins' shrinkage
    (:func:`~..reconstruction.shrinkage.shrink_margins`): the squared error of the
    James-Stein factor then Norm-Sub, simulated at the profile's margin with the
    margin's raw noise (:data:`_MARGIN_SAMPLES` draws, a fixed seed), where it is below the
    error after Norm-Sub alone (the pipeline keeps Norm-Sub's margin where shrinking is
    predicted worse)."""
    err = err.copy()
    one = np.flatnonzero((groups.order == 1) & (groups.dim >= 3) & (groups.raw > 0))
    gen = np.random.default_rng(seed)
    for size in np.unique(sizes[groups.attrs[one, 0]]):
        sel = one[sizes[groups.attrs[one, 0]] == size]
        truth = np.array([profile.marginals[a] for a in groups.attrs[sel, 0]])[:, None, :]
        nu = (groups.raw[sel] / (size - 1))[:, None]
        e = gen.standard_normal((sel.size, _MARGIN_SAMPLES, size)) * np.sqrt(nu[..., None])
        z = truth + e - e.mean(axis=2, keepdims=True) - 1.0 / size
        lam = james_stein_factors(z, nu)[..., None]
        shrunk = norm_sub_rows((1.0 / size + lam * z).reshape(-1, size))
        sq = ((shrunk.reshape(z.shape) - truth) ** 2).sum(axis=2).mean(axis=1)
        err[sel] = np.minimum(err[sel], sq)
    return err


def _shrink(
    model: _Views,
    comps: _Components,
    groups: _Groups,
    err: np.ndarray,
    bias: np.ndarray,
    profile: DataProfile,
) -> np.ndarray:
    """Components held by one view only (and of >= 2 attributes) after the view's
    shrinkage towards max-ent (module docstring, step 4).

    The max-ent base a view shrinks towards is built from its noisy shared marginals:
    for a component ``S`` it carries their noise along the other attributes' skew,
    ``sum_c e_(S - c) ||P_c - u||^2`` (:func:`_base_noise`; the base of a pair is the
    product of its two noisy margins), which shrinking moves into ``S`` as it removes
    ``S``'s own noise; the shrinker reads it as signal, beside the component's true
    interaction."""
    err = err.copy()
    rows = np.flatnonzero((groups.members[groups.index] == 1) & (comps.order >= 2))
    m = len(model.views)
    view = comps.view[rows]
    g = groups.index[rows]
    target = bias[g] + _base_noise(groups, err, profile, model.sizes, g)
    to_view = groups.cells[g] / model.cells[view]  # S-marginal units -> view units
    high_noise = model.nu * comps.high_dim
    noise = np.bincount(view, err[g] * to_view, minlength=m) + high_noise
    signal = np.bincount(view, target * to_view, minlength=m)
    dims = np.bincount(view, groups.dim[g], minlength=m) + comps.high_dim
    live = noise > 0
    tau = np.where(live, signal / np.where(live, noise, 1.0), 0.0)
    # the pipeline takes a view's noise to be the oracle's c per dimension (no users'
    # sampling, no Norm-Sub): rho of what the components carry
    pipeline = (model.nu - 1.0 / (model.cells * model.users)) * dims
    rho = np.where(live, pipeline / np.where(live, noise, 1.0), 1.0)
    lam = tau / (1 + tau)
    split = lam[view] ** 2 * err[g] + (1 - lam[view]) ** 2 * target
    base = np.bincount(view, split * to_view, minlength=m) + lam**2 * high_noise
    ratio = np.ones(m)
    rounded = np.clip(np.rint(dims), 1, _JS_MAX_DIM).astype(np.int64)
    if live.any():
        ratio[live] = _js_risk(rounded[live], tau[live], rho[live])
    scale = np.where(live & (base > 0), ratio * noise / np.where(base > 0, base, 1.0), 1.0)
    err[g] = split * scale[view]
    return err


def _base_noise(
    groups: _Groups, err: np.ndarray, profile: DataProfile, sizes: np.ndarray, g: np.ndarray
) -> np.ndarray:
    """For each group in ``g`` (attribute set ``S``, >= 2 attributes): ``sum over c in
    S of err(S - c) ||P_c - u||^2``, the noise of the lower marginals carried into
    ``S`` by a product with the others' deviation from uniform (0 where ``S - c`` is
    no group)."""
    d, width = sizes.size, groups.attrs.shape[1]
    keys = _keys(groups.attrs, d + 1)
    order = np.argsort(keys)
    sorted_keys = keys[order]
    excess = (profile.concentration - 1.0) / sizes  # ||P_c - u||^2
    attrs = groups.attrs[g]
    out = np.zeros(g.size)
    for col in range(width):
        present = attrs[:, col] >= 0
        sub = np.full_like(attrs, -1)
        sub[:, : width - 1] = np.delete(attrs, col, axis=1)
        pos = np.minimum(np.searchsorted(sorted_keys, _keys(sub, d + 1)), sorted_keys.size - 1)
        hit = present & (sorted_keys[pos] == _keys(sub, d + 1))
        out[hit] += err[order[pos[hit]]] * excess[attrs[hit, col]]
    return out


# -- answers over the workload ---------------------------------------------------------------
def _elementary(power: np.ndarray, degree: int) -> np.ndarray:
    """Elementary symmetric polynomials e_0..e_degree (rows) from power sums
    ``power[i]`` = p_{i+1} (Newton's identities), vectorised over columns."""
    e = [np.ones(power.shape[1])]
    for mth in range(1, degree + 1):
        acc = np.zeros(power.shape[1])
        for i in range(1, mth + 1):
            acc = acc + (-1) ** (i - 1) * e[mth - i] * power[i - 1]
        e.append(acc / mth)
    return np.stack(e)


def _keys(attrs: np.ndarray, base: int) -> np.ndarray:
    """Padded attribute rows -> int64 keys (sorted attributes, -1 padding)."""
    key = np.zeros(attrs.shape[0], dtype=np.int64)
    for col in range(attrs.shape[1]):
        key = key * base + (attrs[:, col] + 1)
    return key


def _extensions(groups: _Groups, d: int) -> tuple[np.ndarray, np.ndarray]:
    """Pairs (group of S, attribute c) such that the set S + c is held by a view."""
    width = groups.attrs.shape[1]
    if d + 1 > 1 and width * math.log2(d + 2) > 62:
        raise CalmkitError(f"workload order ({width}) too large for d = {d} in the error model")
    keys = _keys(groups.attrs, d + 1)
    order = np.argsort(keys)
    sorted_keys = keys[order]
    src, ext = [], []
    for r in range(2, width + 1):
        rows = np.flatnonzero(groups.order == r)
        if not rows.size:
            continue
        full = groups.attrs[rows, :r]
        for drop in range(r):
            sub = np.delete(full, drop, axis=1)
            padded = np.full((rows.size, width), -1, dtype=np.int64)
            padded[:, : r - 1] = sub
            k = _keys(padded, d + 1)
            pos = np.searchsorted(sorted_keys, k)
            pos = np.minimum(pos, sorted_keys.size - 1)
            hit = sorted_keys[pos] == k
            src.append(order[pos[hit]])
            ext.append(full[hit, drop])
    if not src:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(src), np.concatenate(ext)


@dataclass(frozen=True)
class _Spreading:
    """What the mean over all k-subsets (module docstring, 6) weighs each group's error
    and bias with, computed once per design: the SSE parts are then linear in them.

    ``skew``: the sum over k-sets of the skews of their unheld attributes, spread;
    ``pair_spread`` (d, d): the same per pair for a unit of dependence, so that
    ``sum_{a<b} dependence_ab pair_spread_ab`` is the pairs' part;
    ``held`` / ``free`` (groups,): a group's weight as held (its error) and as the
    bias it would have had; ``count``: the number of k-sets."""

    skew: float
    pair_spread: np.ndarray
    held: np.ndarray
    free: np.ndarray
    count: int

    def parts(self, err: np.ndarray, bias: np.ndarray, pair_dep: np.ndarray) -> tuple[float, float]:
        """(noise, bias) parts of the mean SSE; ``pair_dep`` (d, d): each pair's
        dependence no view recovers (all of it, or less where the reconstruction
        recovers part of a pair)."""
        base = self.skew + float(np.einsum("ij,ij->", pair_dep, self.pair_spread)) / 2
        # einsum, not a BLAS dot: a threaded dot of this size stalls on a busy machine
        noise = float(np.einsum("i,i->", err, self.held)) if self.held.size else 0.0
        correction = float(np.einsum("i,i->", bias, self.free)) if self.free.size else 0.0
        return noise / self.count, (base - correction) / self.count


def _spread_along(
    groups: _Groups, pooled: np.ndarray, profile: DataProfile, sizes: np.ndarray
) -> np.ndarray:
    """(d,) what max-ent multiplies an error by when it spreads it along attribute c
    (module docstring, step 5): the squared norm of c's *estimated* marginal, not of
    its true one. Two independent estimated marginals ``P + e`` give a product that
    misses by ``|e_a|^2 |P_b|^2 + |e_b|^2 |P_a|^2 + |e_a|^2 |e_b|^2``: spreading
    each error along ``|P|^2 + |e|^2 / 2`` counts the cross term once (``e_c``: c's
    error in ``pooled``; exact for pairs, 3/4 of the triple product for three). Kept
    within [1 / L_c, 1], a distribution's range. It matters where a marginal's error
    rivals its squared norm: many categories, few reports per view. On four
    independent attributes of 33-36 categories, one per view, the pairs' SSE
    measured 0.110 at 2,000 users and eps 0.2 (predicted 0.126; ``|P_c|^2`` alone
    0.036), 0.0185 at 4,000 and eps 0.5 (0.0241; 0.0129), 1.98e-3 at 20,000 and
    eps 1 (2.04e-3; 1.81e-3). Norm-Sub's pull of a noisy marginal towards its small
    cells (``<e_c, P_c> < 0``) is not counted: added, it lowered the predictions of
    pair designs on uncapped Adult 1.4x below their measured SSE."""
    out = profile.concentration / sizes
    one = groups.order == 1
    if one.any():
        out = out.copy()
        out[groups.attrs[one, 0]] += pooled[one] / 2.0
    # an estimated marginal is a distribution: its squared norm lies in [1 / L, 1]
    result: np.ndarray = np.clip(out, 1.0 / sizes, 1.0)
    return result


def _spreading(
    groups: _Groups, g_free: np.ndarray, profile: DataProfile, sizes: np.ndarray, k: int
) -> _Spreading:
    """The weights of :class:`_Spreading` for all k-subsets of the attributes, an
    error spread along an attribute multiplied by ``g_free`` (:func:`_spread_along`)
    unless a view holds both."""
    d = sizes.size
    g_held = 1.0 / sizes
    dim_over_cells = (sizes - 1) / sizes
    powers = np.arange(1, k + 1)[:, None]
    all_power = (g_free[None, :] ** powers).sum(axis=1)  # (k,)
    count = math.comb(d, k)

    # Nothing held: attributes uniform, pairs filled independently.
    e_all = _elementary(all_power[:, None], k)[:, 0]
    out = np.ones(d)  # E_{k-1} over the other attributes, by dividing out (1 + x g_a)
    for j in range(1, k):
        out = e_all[j] - g_free * out
    skew = float(profile.skew @ out)
    pair_spread = np.zeros((d, d))
    if k >= 2:
        # sum over pairs a < b of W_ab c_a c_b E_{k-2}(g over the other attributes),
        # dividing (1 + x g_a) and then (1 + x g_b) out of the generating polynomial
        without_a = np.ones(d)
        without_ab = np.ones((d, d))
        for j in range(1, k - 1):
            without_a = e_all[j] - g_free * without_a
            without_ab = without_a[:, None] - g_free[None, :] * without_ab
        pair_spread = np.outer(dim_over_cells, dim_over_cells) * without_ab
        np.fill_diagonal(pair_spread, 0.0)  # W is symmetric, 0 on the diagonal
    if not groups.order.size:
        empty = np.zeros(0)
        return _Spreading(skew, pair_spread, empty, empty, count)

    # Held components: their error in place of their bias, spread by g(S, c).
    r = groups.order
    attrs = groups.attrs
    safe = np.where(attrs >= 0, attrs, 0)
    own = np.where(attrs[None, :, :] >= 0, g_free[safe][None, :, :] ** powers[:, :, None], 0.0)
    own_power = own.sum(axis=2)  # (k, groups)
    src, ext = _extensions(groups, d)
    swap = np.zeros((k, groups.order.size))
    for i in range(k):
        np.add.at(swap[i], src, g_free[ext] ** (i + 1) - g_held[ext] ** (i + 1))
    free_power = all_power[:, None] - own_power
    e_held = _elementary(free_power - swap, k)
    e_free = _elementary(free_power, k)
    pick = k - r
    rows = np.arange(r.size)
    return _Spreading(skew, pair_spread, e_held[pick, rows], e_free[pick, rows], count)


def _explicit(
    groups: _Groups,
    err: np.ndarray,
    g_free: np.ndarray,
    profile: DataProfile,
    pair_dep: np.ndarray,
    sizes: np.ndarray,
    workload: Workload,
) -> tuple[float, float]:
    """(noise, bias) parts of the mean SSE over an explicit query list (``g_free``:
    :func:`_spread_along`)."""
    g_held = 1.0 / sizes
    held = {tuple(int(a) for a in row if a >= 0): i for i, row in enumerate(groups.attrs.tolist())}
    noise = biased = 0.0
    queries = workload.queries or ()
    for query in queries:
        for rsize in range(1, len(query) + 1):
            for sub in itertools.combinations(query, rsize):
                if np.any(sizes[list(sub)] < 2):
                    continue
                rest = [c for c in query if c not in sub]
                gi = held.get(sub)
                if gi is None:
                    ratio = float(np.prod((sizes[list(sub)] - 1) / sizes[list(sub)]))
                    if rsize == 2:
                        ratio *= float(pair_dep[sub[0], sub[1]])
                    value = profile.skew[sub[0]] if rsize == 1 else ratio if rsize == 2 else 0.0
                    biased += value * float(np.prod(g_free[rest])) if rest else value
                    continue
                spread = 1.0
                for c in rest:
                    ext = tuple(sorted((*sub, c)))
                    spread *= g_held[c] if ext in held else g_free[c]
                noise += float(err[gi]) * spread
    return noise / len(queries), biased / len(queries)
