"""MWEM, a central-DP reference (Hardt, Ligett & McSherry, "A Simple and Practical
Algorithm for Differentially Private Data Release", NIPS 2012): a trusted curator holds
all n records and releases a distribution over the whole domain, from which every k-way
marginal is read off.

The algorithm (Figure 1, with the cuboid queries of §3.3). The estimate ``p`` is a
distribution over the full domain (``prod(schema.sizes)`` cells), uniform at the start.
The candidate queries Q are all C(d, k) k-way marginals (whole cuboids). Each of T
rounds:

1. *Exponential mechanism* at ``epsilon / 2T``: score each candidate marginal S by the
   L1 distance between the estimate's counts and the true counts,
   ``s(S) = sum_cells |n p_S - B_S| (- cells(S), the §3.3 heuristic)``, and pick S with
   probability ``exp((epsilon / 2T) s(S) / 2)`` normalised (sensitivity 1, see
   :data:`SCORE_SENSITIVITY`).
2. *Laplace measurement* at ``epsilon / 2T``: every cell of the chosen marginal's counts
   plus ``Laplace(2T / epsilon)`` (L1 sensitivity 1: one record sits in one cell).
3. *Multiplicative weights* on every cell of the measured marginal,
   ``p(x) <- p(x) exp(eta (m_S(x_S) - n p_S(x_S)) / n)`` renormalised, with the paper's
   ``eta = 1/2`` (``q(x) (m - q(A)) / 2n`` in counts), kept in log space.

Practical improvements (§2.3.2, "at the expense of the theoretical guarantees"), both
pure post-processing of the measurements: after each round's update, ``replays`` more
MW passes over all measurements taken so far (oldest first); and the **last iterate**
is returned by default (§2.3.2: "rather than use the average of the distributions A_i
we use only the final distribution"); ``iterate="average"`` gives Figure 1's average of
the T iterates. The optional noisy-count initialisation of A_0 (§2.3.2's third point)
is not implemented.

Privacy accounting (Thm 2.1): T exponential-mechanism calls and T Laplace
measurements, each ``epsilon / 2T``-DP, compose to ``epsilon``-DP under add/remove-one
neighbours. As in Figure 1 (n is an input) and the rest of this harness (PriView
divides by n), n is public; answers are fractions. Under *replace*-one neighbours a
cuboid measurement moves by 2 in L1, so the same run is ``2 epsilon``-DP.

T defaults to :func:`default_rounds` (data-independent; the paper gives no rule).

Cost: the full domain is held twice in float64 (log-weights and weights), hence
``max_cells`` (default 2^24, 256 MiB). Each round scores all C(d, k) candidates with one
shared sweep (:func:`all_marginals`, about ``2^(k+1) |D|`` additions for binary
attributes) and then runs about ``replays * i`` MW steps of three passes over ``|D|``
each in round i: ``replays * T^2 / 2`` steps in all. NLTCS (d = 16 binary, k = 3) takes
0.4-2 s per run at epsilon 0.2-2; 2^24 cells fit in memory but take hours.

Everything after the measurements is post-processing, and MW keeps every cell
positive: answers are marginals of one strictly positive distribution summing to 1,
so no non-negativity projection is needed, and all answers agree with one another.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import combinations

import numpy as np

from calmkit_client import CalmkitError, Schema, validate_epsilon
from calmkit_client.randomness import RngLike
from calmkit_client.validation import check_int, is_int

from ..population import Population
from .base import Mechanism, NotScalable, Release

__all__ = [
    "ITERATES",
    "MAX_CELLS",
    "SCORE_SENSITIVITY",
    "Mwem",
    "all_marginals",
    "default_rounds",
    "exponential_mechanism",
    "laplace_measure",
    "selection_probabilities",
]

#: Largest full domain MWEM materialises by default (float64 weights: 128 MiB, twice).
MAX_CELLS = 1 << 24

#: Sensitivity of the selection score under add/remove-one neighbours, n public.
#: s(S) = sum_c |n p_S(c) - B_S(c)|: the estimate p comes from earlier (already
#: private) outputs and the public n, so it is the same for neighbours B, B'. Adding
#: or removing one record changes the true counts B_S in exactly one cell c, by 1, so
#: by the reverse triangle inequality |s_B(S) - s_B'(S)| <= |B_S(c) - B'_S(c)| = 1.
#: The §3.3 penalty (- cells(S)) does not depend on the data, so it changes nothing.
SCORE_SENSITIVITY = 1.0

#: Which distribution :class:`Mwem` returns.
ITERATES = ("last", "average")


# -- building blocks ----------------------------------------------------------------------
def all_marginals(table: np.ndarray, k: int) -> dict[tuple[int, ...], np.ndarray]:
    """Every k-way marginal of a d-dimensional ``table``: ``{attrs: table summed over
    the other axes}``, attrs the C(d, k) sorted k-tuples of axes in lexicographic order,
    each value of shape ``table.shape[attrs]`` (the table's dtype).

    Keep-or-drop recursion over the axes in order: dropping axis j sums it out of the
    current partial table, which every marginal below it then shares. For binary axes
    the work is about ``2^(k+1) |D|`` instead of ``C(d, k) |D|`` (one sum per marginal).
    """
    d = table.ndim
    if not is_int(k) or not 0 <= k <= d:
        raise CalmkitError(f"k ({k!r}) must be an int in [0, d={d}]")
    out: dict[tuple[int, ...], np.ndarray] = {}

    def walk(part: np.ndarray, j: int, kept: tuple[int, ...]) -> None:
        # ``part`` has the axes ``kept`` followed by the undecided axes j..d-1
        if len(kept) == k:
            out[kept] = part.sum(axis=tuple(range(k, part.ndim))) if part.ndim > k else part
        elif d - j == k - len(kept):  # every undecided axis must be kept
            out[kept + tuple(range(j, d))] = part
        else:
            walk(part, j + 1, (*kept, j))  # keep axis j (at position len(kept))
            walk(part.sum(axis=len(kept)), j + 1, kept)  # sum it out

    walk(np.asarray(table), 0, ())
    return out


def selection_probabilities(
    scores: np.ndarray, epsilon: float, sensitivity: float = SCORE_SENSITIVITY
) -> np.ndarray:
    """The exponential mechanism's (McSherry-Talwar) distribution over candidates:
    ``Pr[j] = exp(epsilon s_j / (2 sensitivity)) / sum_i exp(epsilon s_i / (2
    sensitivity))``, float64 of shape ``scores.shape`` (1-D), computed with a max shift."""
    logits = _logits(scores, epsilon, sensitivity)
    w: np.ndarray = np.exp(logits - logits.max())
    return w / float(w.sum())


def exponential_mechanism(
    scores: np.ndarray,
    epsilon: float,
    sensitivity: float = SCORE_SENSITIVITY,
    rng: RngLike = None,
) -> int:
    """One draw from :func:`selection_probabilities` (``epsilon``-DP when each score
    has the stated sensitivity): the index of the largest ``epsilon s_j / (2
    sensitivity) + G_j`` with iid standard Gumbel G_j (Gumbel-max: exactly that
    distribution, and no overflow at any epsilon)."""
    logits = _logits(scores, epsilon, sensitivity)
    gen = np.random.default_rng(rng)
    return int(np.argmax(logits + gen.gumbel(size=logits.shape)))


def _logits(scores: np.ndarray, epsilon: float, sensitivity: float) -> np.ndarray:
    eps = validate_epsilon(epsilon, "epsilon")
    if not (math.isfinite(sensitivity) and sensitivity > 0):
        raise CalmkitError(f"sensitivity ({sensitivity!r}) must be finite and > 0")
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim != 1 or s.size == 0 or not np.all(np.isfinite(s)):
        raise CalmkitError(f"scores (shape {s.shape}) must be a non-empty finite 1-D array")
    return eps * s / (2.0 * sensitivity)


def laplace_measure(counts: np.ndarray, epsilon: float, rng: RngLike = None) -> np.ndarray:
    """``counts`` (a marginal's cell counts, any shape) plus iid ``Laplace(1/epsilon)``
    per cell, float64 of the same shape: ``epsilon``-DP, since one record adds to or
    removes from exactly one cell (L1 sensitivity 1). Per-cell variance ``2/epsilon^2``."""
    eps = validate_epsilon(epsilon, "epsilon")
    gen = np.random.default_rng(rng)
    c = np.asarray(counts, dtype=np.float64)
    return c + gen.laplace(0.0, 1.0 / eps, size=c.shape)


def default_rounds(
    n: int, epsilon: float, domain_cells: int, marginal_cells: float, candidates: int
) -> int:
    """T when ``rounds`` is not given: ``round((epsilon n)^(1/3) sqrt(ln|D| / c))``,
    clipped to ``[1, candidates]``, with ``|D| = domain_cells`` and ``c =
    marginal_cells`` the mean cell count of a candidate marginal.

    Data-independent (n is public, the rest is the schema and epsilon). The paper gives
    no rule for T (Thm 2.2's worst-case optimum ``(epsilon n sqrt(ln|D|) / (10
    ln|Q|))^(2/3)`` is 109 rounds for NLTCS at epsilon = 1, far too many in practice);
    this one was fitted on synthetic Bayesian-network populations (not on the
    benchmark datasets): d = 8, 12, 16 binary, k = 2, 3, 4, epsilon n from 2e3 to 1.3e5
    (27 settings), where its mean SSE over all k-way marginals is within 1.4x of the
    best T of the grid 5..64 (replays = 10, eta = 1/2).
    More budget (epsilon n) affords more, less noisy-per-round measurements; a larger
    domain needs more of them; larger marginals carry more per measurement.
    """
    eps = validate_epsilon(epsilon, "epsilon")
    check_int("n", n, 1)
    check_int("candidates", candidates, 1)
    if not is_int(domain_cells) or domain_cells < 1 or not 1 <= marginal_cells <= domain_cells:
        raise CalmkitError(
            f"marginal_cells ({marginal_cells!r}) must be in [1, domain_cells "
            f"({domain_cells!r})], an int >= 1"
        )
    t = (eps * n) ** (1 / 3) * math.sqrt(math.log(domain_cells) / marginal_cells)
    return int(min(max(round(t), 1), candidates))


# -- the distribution and its multiplicative-weights update --------------------------------
# Inner loops of at least this many contiguous cells when adding a cuboid's update.
_MIN_INNER = 1024


class _Cuboid:
    """Fast marginalisation onto, and broadcasting from, one attribute set of the
    full domain. The domain is viewed as the merged shape ``(pre, s_a1, mid, s_a2,
    ..., post)`` (blocks of size 1 dropped): ``other`` are the positions of the
    summed-out blocks. Summing a block out is a BLAS matrix-vector product with a
    vector of ones (numpy's ``sum`` over a long axis with a short inner stride is
    up to 25x slower)."""

    def __init__(self, sizes: tuple[int, ...], attrs: tuple[int, ...]) -> None:
        shape: list[int] = []
        other: list[int] = []
        prev = 0
        for a in (*attrs, len(sizes)):
            block = math.prod(sizes[prev:a])
            if block > 1:
                other.append(len(shape))
                shape.append(block)
            if a < len(sizes):
                shape.append(sizes[a])
            prev = a + 1
        self.shape, self.other = tuple(shape), tuple(other)
        self.out_shape = tuple(sizes[a] for a in attrs)
        # the update: delta materialised over the shortest suffix of >= _MIN_INNER cells,
        # so that the broadcast add runs contiguous inner loops of that length
        t = len(shape)
        while t > 0 and math.prod(shape[t:]) < _MIN_INNER:
            t -= 1
        self.split = t
        self.bshape = tuple(1 if i in other else s for i, s in enumerate(shape))
        self.head = (*self.bshape[:t], math.prod(shape[t:]))
        self.view = (*shape[:t], math.prod(shape[t:]))
        self.index = tuple(
            slice(0, 1) if (i < t and i in other) else slice(None) for i in range(len(shape))
        )

    def marginal(self, p: np.ndarray) -> np.ndarray:
        """``p`` (shape ``sizes``) summed onto the attributes: shape ``out_shape``."""
        shape = list(self.shape)
        x = p.reshape(-1)
        for i, pos in enumerate(self.other):
            pos -= i
            pre, m, post = math.prod(shape[:pos]), shape[pos], math.prod(shape[pos + 1 :])
            ones = np.ones(m)
            if post == 1:
                x = x.reshape(pre, m) @ ones
            elif pre == 1:
                x = ones @ x.reshape(m, post)
            else:
                x = np.matmul(ones, x.reshape(pre, m, post))
            del shape[pos]
        return x.reshape(self.out_shape)

    def add(self, logp: np.ndarray, delta: np.ndarray) -> None:
        """``logp[x] += delta[x_attrs]`` in place (``delta`` of shape ``out_shape``)."""
        full = np.broadcast_to(delta.reshape(self.bshape), self.shape)
        view = logp.reshape(self.view)  # logp is contiguous: a view
        view += full[self.index].reshape(self.head)


class _Weights:
    """The estimate over the full domain: ``logp`` (log-probabilities) and ``p =
    exp(logp)``, both float64 of shape ``sizes``, normalised."""

    def __init__(self, sizes: tuple[int, ...]) -> None:
        self.sizes = tuple(sizes)
        cells = math.prod(sizes)
        self.logp = np.full(sizes, -math.log(cells))
        self.p = np.full(sizes, 1.0 / cells)
        self._cuboids: dict[tuple[int, ...], _Cuboid] = {}

    def cuboid(self, attrs: tuple[int, ...]) -> _Cuboid:
        if attrs not in self._cuboids:
            self._cuboids[attrs] = _Cuboid(self.sizes, attrs)
        return self._cuboids[attrs]

    def update(self, attrs: tuple[int, ...], target: np.ndarray, step: float) -> None:
        """One MW step towards the measured marginal ``target`` (fractions, shape
        ``sizes[attrs]``): Figure 1 step 3, ``A(x) <- A(x) exp(q(x)(m - q(A)) / 2n)``
        for the cell queries q of the cuboid (step = 1/2), in log space. The new
        normaliser ``Z = sum_c p_S(c) exp(delta_c)`` comes from the marginal, so one
        pass adds ``delta - log Z`` and one pass exponentiates."""
        cuboid = self.cuboid(attrs)
        marginal = cuboid.marginal(self.p)
        delta = step * (target - marginal)
        shift = delta.max()  # max shift: log Z without overflow
        log_z = shift + math.log(float((marginal * np.exp(delta - shift)).sum()))
        cuboid.add(self.logp, delta - log_z)
        np.exp(self.logp, out=self.p)

    def renormalise(self) -> None:
        """Exact renormalisation with a max shift (clears rounding drift)."""
        shift = float(self.logp.max())
        np.subtract(self.logp, shift, out=self.logp)
        np.exp(self.logp, out=self.p)
        total = float(self.p.sum())
        self.p /= total
        self.logp -= math.log(total)


# -- the mechanism ------------------------------------------------------------------------
class _MwemRelease(Release):
    def __init__(self, schema: Schema, p: np.ndarray, chosen: dict[str, object]) -> None:
        self.schema, self.p, self.chosen = schema, p, chosen

    def answer(self, attrs: Sequence[int]) -> np.ndarray:
        """The marginal of the released distribution over ``attrs`` (sorted): float64
        of shape ``schema.shape(attrs)``, positive, summing to 1."""
        try:
            query = tuple(sorted(self.schema.resolve(attrs)))
        except CalmkitError as exc:
            raise CalmkitError(f"query ({list(attrs)!r}): {exc}") from None
        out = _Cuboid(self.schema.sizes, query).marginal(self.p)
        return out / float(out.sum())

    def describe(self) -> dict[str, object]:
        return dict(self.chosen)


class Mwem(Mechanism):
    """MWEM over the k-way marginals (see the module docstring).

    ``rounds``: T (None: :func:`default_rounds`); ``replays``: extra MW passes over all
    measurements after each round's update (0: Figure 1's single update);
    ``iterate``: ``"last"`` (§2.3.2, default) or ``"average"`` (Figure 1); ``step``: the
    MW rate eta (Figure 1: 1/2); ``penalize_cells``: subtract the cell count from each
    score (§3.3); ``max_cells``: the largest full domain :meth:`check` accepts.
    """

    name = "MWEM"
    privacy_unit = "central epsilon-DP (add/remove one record); trusted curator"

    def __init__(
        self,
        rounds: int | None = None,
        replays: int = 10,
        iterate: str = "last",
        step: float = 0.5,
        penalize_cells: bool = True,
        max_cells: int = MAX_CELLS,
    ) -> None:
        if rounds is not None and (not is_int(rounds) or rounds < 1):
            raise CalmkitError(f"rounds ({rounds!r}) must be None or an int >= 1")
        check_int("replays", replays, 0)
        if iterate not in ITERATES:
            raise CalmkitError(f"iterate ({iterate!r}) must be one of {ITERATES}")
        if (
            isinstance(step, bool)
            or not isinstance(step, (int, float, np.integer, np.floating))
            or not (math.isfinite(step) and step > 0)
        ):
            raise CalmkitError(f"step ({step!r}) must be finite and > 0")
        if not isinstance(penalize_cells, (bool, np.bool_)):
            raise CalmkitError(f"penalize_cells ({penalize_cells!r}) must be a bool")
        check_int("max_cells", max_cells, 2)
        self.rounds = None if rounds is None else int(rounds)
        self.replays, self.iterate, self.step = int(replays), iterate, float(step)
        self.penalize_cells, self.max_cells = bool(penalize_cells), int(max_cells)

    def check(self, schema: Schema, n: int, epsilon: float, k: int) -> None:
        validate_epsilon(epsilon)
        if not is_int(k) or not 1 <= k <= schema.d:
            raise CalmkitError(f"k ({k!r}) must be an int in [1, d={schema.d}]")
        check_int("n", n, 1)
        cells = math.prod(schema.sizes)  # exact: int64 products overflow past d = 62
        if cells > self.max_cells:
            sizes = "x".join(str(s) for s in schema.sizes)
            raise NotScalable(
                f"MWEM's full-domain distribution ({sizes} = {cells} cells, d={schema.d}) "
                f"must have at most max_cells = {self.max_cells} cells: it holds one weight "
                f"per cell of the whole domain; use e.g. d <= 16 binary attributes (65,536 "
                f"cells), fewer attributes (Population.select) or capped categories "
                f"(Population.cap_categories)"
            )

    def run(self, population: Population, epsilon: float, k: int, rng: RngLike = None) -> Release:
        """T rounds of select / measure / multiplicative weights (module docstring);
        the release holds the final (or averaged) full-domain distribution."""
        schema, n = population.schema, population.n
        self.check(schema, n, epsilon, k)
        eps = validate_epsilon(epsilon)
        gen = np.random.default_rng(rng)
        sizes, d = schema.sizes, schema.d
        full = math.prod(sizes)
        candidates = list(combinations(range(d), k))
        # true counts of every candidate marginal, from the full-domain histogram
        hist = np.bincount(schema.cell_index(population.codes, range(d)), minlength=full)
        truth = all_marginals(hist.reshape(sizes), k)
        true_counts = [truth[c].astype(np.float64) for c in candidates]
        penalty = np.array([truth[c].size if self.penalize_cells else 0 for c in candidates])
        mean_cells = float(np.mean([t.size for t in true_counts]))
        rounds = self.rounds or default_rounds(n, eps, full, mean_cells, len(candidates))
        eps_round = eps / (2 * rounds)  # Thm 2.1: 2T mechanisms, epsilon / 2T each

        weights = _Weights(sizes)
        history: list[tuple[tuple[int, ...], np.ndarray]] = []
        total = np.zeros(sizes) if self.iterate == "average" else None
        for _ in range(rounds):
            est = all_marginals(weights.p, k)
            # Figure 1 step 1 / §3.3: L1 error of the cuboid's counts (minus its cells)
            scores = np.array(
                [np.abs(n * est[c] - t).sum() for c, t in zip(candidates, true_counts)]
            )
            j = exponential_mechanism(scores - penalty, eps_round, SCORE_SENSITIVITY, gen)
            # step 2: Laplace(2T / epsilon) on every cell of the chosen cuboid, as fractions
            measured = laplace_measure(true_counts[j], eps_round, gen) / n
            history.append((candidates[j], measured))
            weights.update(candidates[j], measured, self.step)  # step 3
            for _ in range(self.replays):  # §2.3.2: replay all measurements so far
                for attrs, target in history:
                    weights.update(attrs, target, self.step)
            weights.renormalise()
            if total is not None:
                total += weights.p
        final = weights.p if total is None else total / rounds
        chosen: dict[str, object] = {
            "rounds": rounds,
            "epsilon_select_per_round": eps_round,
            "epsilon_measure_per_round": eps_round,
            "laplace_scale": 1.0 / eps_round,
            "score_sensitivity": SCORE_SENSITIVITY,
            "replays": self.replays,
            "step": self.step,
            "iterate": self.iterate,
            "candidates": len(candidates),
            "selected": [attrs for attrs, _ in history],
        }
        return _MwemRelease(schema, final, chosen)
