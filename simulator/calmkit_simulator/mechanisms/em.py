"""EM: every attribute reported separately, marginals by expectation maximization (CALM
(Zhang et al., "CALM: Consistent Adaptive Local Marginal for Marginal Release under
Local Differential Privacy", CCS 2018), §3.6; Fanti et al., Ren et al.).

Each user reports every attribute ``i`` with ``epsilon / d`` through the adaptive
oracle for its domain (GRR or OUE, §2.2.3; an attribute with one category needs no
report). The reports are kept: GRR cells as the smallest unsigned ints, OUE bit
vectors packed (``ceil(L/8)`` bytes).

A query over attributes A fits the joint ``T_A`` by maximum likelihood with EM. The
perturbations of different attributes are independent, so the probability of a
user's reports on A given a true cell ``v`` is ``prod_i P_i(y_i | v_i)``: GRR ``p`` if
``y_i = v_i`` else ``q``; OUE ``q^ones (1-q)^(L-ones)`` times ``p/q`` if bit ``v_i`` is
set, else ``(1-p)/(1-q)``. Users are grouped by their report pattern on A
(``np.unique`` over the reports' bytes); the (patterns x cells) likelihood matrix is
the row-wise Kronecker product of the per-attribute (patterns x L_i) factors. One EM
step is ``T <- T * (lik^T (w / lik T)) / n`` with ``w`` the pattern counts; it never
decreases the log-likelihood ``sum_u w_u log (lik T)_u``.

Initialisation as the paper says (§3.6, the appendix of its [38]): the unbiased
estimate built up from single attributes to pairs and so on, which for independent
per-attribute reports is ``T_hat(v) = 1/n sum_j prod_i (b_ij(v_i) - q_i) / (p_i - q_i)``
(``b_ij(c) = 1`` iff user j's report on i supports cell c): expanding the product is
the inclusion-exclusion over the sub-marginals. It is projected onto the simplex
(Norm-Sub) and every cell floored at ``1/n`` (one user's mass) before renormalising,
because EM never moves a cell away from 0. For GRR attributes the unbiased estimate,
when it is a distribution, is already the maximum-likelihood estimate. EM stops when
the L1 change of ``T`` in one step is below ``tol`` or after ``max_iter`` steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from calmkit_aggregator.reconstruction import norm_sub
from calmkit_client import (
    OUE,
    CalmkitError,
    FrequencyOracle,
    Schema,
    choose_oracle,
    validate_epsilon,
)
from calmkit_client.randomness import RngLike
from calmkit_client.validation import is_int

from ..population import Population
from .base import Mechanism, NotScalable, Release

__all__ = [
    "EMRelease",
    "EMResult",
    "ExpectationMaximization",
    "expectation_maximization",
    "expectation_maximization_batch",
]

# Memory cap for the kept reports and for one query's pattern matrix.
MAX_BYTES = 2 << 30


@dataclass(frozen=True)
class EMResult:
    """One EM fit: the table (flat, C order), the log-likelihood after the
    initialisation and after every step, the steps taken, and whether ``tol`` was met."""

    table: np.ndarray
    loglik: np.ndarray
    iterations: int
    converged: bool


def expectation_maximization(
    lik: np.ndarray,
    counts: np.ndarray,
    init: np.ndarray,
    tol: float = 1e-9,
    max_iter: int = 10_000,
    log_scale: np.ndarray | None = None,
) -> EMResult:
    """Maximise ``sum_u counts_u log(lik T)_u`` over distributions T by EM.

    ``lik`` (patterns, cells): probability of each pattern given each cell, possibly
    divided by a per-pattern constant whose log is ``log_scale`` (added back to the
    reported log-likelihood; EM itself does not depend on it). ``init`` must be
    positive where the maximum may be.
    """
    w = np.asarray(counts, dtype=np.float64)
    n = float(w.sum())
    extra = 0.0 if log_scale is None else float(w @ log_scale)
    T = np.asarray(init, dtype=np.float64) / float(np.sum(init))
    denom = lik @ T
    loglik = [float(w @ np.log(denom)) + extra]
    converged, it = False, 0
    while it < max_iter:
        it += 1
        new = T * (lik.T @ (w / denom)) / n
        new /= new.sum()
        change = float(np.abs(new - T).sum())
        T = new
        denom = lik @ T
        loglik.append(float(w @ np.log(denom)) + extra)
        if change < tol:
            converged = True
            break
    return EMResult(T, np.array(loglik), it, converged)


def expectation_maximization_batch(
    lik: np.ndarray,
    counts: np.ndarray,
    init: np.ndarray,
    tol: float = 1e-9,
    max_iter: int = 10_000,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`expectation_maximization` for Q independent problems of one shape at
    once: ``lik`` (Q, U, C), ``counts`` (Q, U) (zero-padded patterns are inert),
    ``init`` (Q, C). Each problem stops updating once its own L1 step change is below
    ``tol``, so every table equals the one-at-a-time fit. Returns the tables (Q, C)
    and the steps each took (Q,) int."""
    w = np.asarray(counts, dtype=np.float64)
    n = w.sum(axis=1, keepdims=True)
    T = np.asarray(init, dtype=np.float64)
    T = T / T.sum(axis=1, keepdims=True)
    steps = np.zeros(T.shape[0], dtype=np.int64)
    active = np.ones(T.shape[0], dtype=bool)
    safe = np.where(w > 0, 1.0, 0.0)  # padded rows: no division by a zero denominator
    for _ in range(max_iter):
        if not active.any():
            break
        denom = (lik @ T[:, :, None])[:, :, 0]
        ratio = w / np.where(safe > 0, denom, 1.0)
        new = T * (ratio[:, None, :] @ lik)[:, 0, :] / n
        new /= new.sum(axis=1, keepdims=True)
        change = np.abs(new - T).sum(axis=1)
        T = np.where(active[:, None], new, T)
        steps += active
        active &= change >= tol
    return T, steps


def _kron_rows(factors: Sequence[np.ndarray]) -> np.ndarray:
    """Row-wise Kronecker product of (U, L_i) matrices -> (U, prod L_i), C order."""
    out = np.ones((factors[0].shape[0] if factors else 1, 1))
    for f in factors:
        out = (out[:, :, None] * f[:, None, :]).reshape(out.shape[0], -1)
    return out


def _batches(members: list[Any], cells: int) -> list[list[Any]]:
    """Consecutive groups of ``members`` (each ``(..., counts)``) whose stacked
    (group x patterns x cells) float64 likelihood matrix stays within
    :data:`MAX_BYTES` (one member per group at least: :meth:`check` bounds one)."""
    groups: list[list[Any]] = []
    group: list[Any] = []
    widest = 0
    for member in members:
        patterns = max(widest, member[-1].shape[0])
        if group and 8 * (len(group) + 1) * patterns * cells > MAX_BYTES:
            groups.append(group)
            group, patterns = [], member[-1].shape[0]
        group.append(member)
        widest = patterns
    if group:
        groups.append(group)
    return groups


def _report_bytes(oracle: FrequencyOracle | None, n: int) -> int:
    if oracle is None:
        return 0
    if isinstance(oracle, OUE):
        return n * oracle.nbytes
    return n * np.min_scalar_type(oracle.L - 1).itemsize


def _patterns(oracle: FrequencyOracle | None) -> int:
    """Distinct reports an attribute's oracle can produce (Python int)."""
    if oracle is None:
        return 1
    return 1 << oracle.L if isinstance(oracle, OUE) else oracle.L


class EMRelease(Release):
    """The kept reports; each query is fitted by EM on demand."""

    def __init__(
        self,
        schema: Schema,
        oracles: Sequence[FrequencyOracle | None],
        reports: Sequence[np.ndarray | None],
        n: int,
        init: str = "unbiased",
        tol: float = 1e-9,
        max_iter: int = 10_000,
    ) -> None:
        if init not in ("unbiased", "uniform"):
            raise CalmkitError(f"init ({init!r}) must be 'unbiased' or 'uniform'")
        self.schema, self.oracles, self.reports, self.n = schema, tuple(oracles), reports, n
        self.init, self.tol, self.max_iter = init, tol, max_iter

    def _grouped(self, attrs: tuple[int, ...]) -> tuple[list[np.ndarray], np.ndarray]:
        """Unique report patterns on ``attrs``: per attribute its part of the unique
        rows (GRR: (U,) cells; OUE: (U, nbytes) bytes; None: no report), and counts."""
        cols, widths = [], []
        for a in attrs:
            rep = self.reports[a]
            if rep is None:
                widths.append(0)
                continue
            raw = np.ascontiguousarray(rep).view(np.uint8).reshape(self.n, -1)
            cols.append(raw)
            widths.append(raw.shape[1])
        if not cols:
            return [np.zeros((1, 0), dtype=np.uint8) for _ in attrs], np.array([self.n])
        raw = np.ascontiguousarray(np.concatenate(cols, axis=1))
        keys = raw.view(np.dtype((np.void, raw.shape[1]))).reshape(-1)
        uniq, counts = np.unique(keys, return_counts=True)
        rows = uniq.view(np.uint8).reshape(uniq.shape[0], raw.shape[1])
        parts, at = [], 0
        for a, width in zip(attrs, widths):
            part = rows[:, at : at + width]
            at += width
            rep = self.reports[a]
            if rep is not None and not isinstance(self.oracles[a], OUE):
                part = np.ascontiguousarray(part).view(rep.dtype).reshape(-1)
            parts.append(part)
        return parts, counts

    def _factors(
        self, attrs: tuple[int, ...], parts: list[np.ndarray]
    ) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray]:
        """Per attribute: likelihood ratios (U, L) (probability / a per-row constant),
        support indicators (U, L); and the summed log constants (U,)."""
        U = parts[0].shape[0] if parts else 1
        lik, support, log_scale = [], [], np.zeros(U)
        for a, part in zip(attrs, parts):
            oracle, L = self.oracles[a], self.schema.sizes[a]
            if oracle is None:  # one category: no report, probability 1
                lik.append(np.ones((U, 1)))
                support.append(np.ones((U, 1)))
                continue
            p, q = oracle.p, oracle.q
            if isinstance(oracle, OUE):
                bits = np.unpackbits(part, axis=1, count=L).astype(np.float64)
                ones = bits.sum(axis=1)
                log_scale += ones * np.log(q) + (L - ones) * np.log1p(-q)
                ratio = np.where(bits > 0, p / q, (1 - p) / (1 - q))
            else:
                bits = (part.astype(np.int64)[:, None] == np.arange(L)).astype(np.float64)
                log_scale += np.log(q)
                ratio = np.where(bits > 0, p / q, 1.0)
            lik.append(ratio)
            support.append(bits)
        return lik, support, log_scale

    def unbiased(self, attrs: Sequence[int]) -> np.ndarray:
        """The paper's initial estimate (unbiased, may be negative), shape of the query."""
        attrs = tuple(sorted(self.schema.resolve(attrs)))
        parts, counts = self._grouped(attrs)
        _, support, _ = self._factors(attrs, parts)
        return self._unbiased(attrs, support, counts).reshape(self.schema.shape(attrs))

    def _unbiased(
        self, attrs: tuple[int, ...], support: list[np.ndarray], counts: np.ndarray
    ) -> np.ndarray:
        z = []
        for a, b in zip(attrs, support):
            oracle = self.oracles[a]
            z.append(b if oracle is None else (b - oracle.q) / (oracle.p - oracle.q))
        out: np.ndarray = (counts @ _kron_rows(z)) / self.n
        return out

    def fit(self, attrs: Sequence[int]) -> EMResult:
        """EM for the marginal over ``attrs`` (sorted), with its log-likelihood trace."""
        attrs = tuple(sorted(self.schema.resolve(attrs)))
        parts, counts = self._grouped(attrs)
        lik, support, log_scale = self._factors(attrs, parts)
        start = self._start(attrs, support, counts)
        return expectation_maximization(
            _kron_rows(lik), counts, start, self.tol, self.max_iter, log_scale
        )

    def answer_many(self, queries: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """Every query fitted in batches of one cell count
        (:func:`expectation_maximization_batch`), each batch's stacked likelihood
        matrices within :data:`MAX_BYTES` (built only when its batch runs); the same
        tables as :meth:`answer` one at a time."""
        by_cells: dict[int, list[tuple[int, tuple[int, ...], Any, np.ndarray]]] = {}
        for i, q in enumerate(queries):
            attrs = tuple(sorted(self.schema.resolve(q)))
            parts, counts = self._grouped(attrs)
            by_cells.setdefault(self.schema.cells(attrs), []).append((i, attrs, parts, counts))
        out: list[np.ndarray | None] = [None] * len(queries)
        for cells, members in by_cells.items():
            for batch in _batches(members, cells):
                for i, table in self._fit_batch(batch, cells):
                    out[i] = table
        return [t for t in out if t is not None]

    def _fit_batch(
        self, batch: list[tuple[int, tuple[int, ...], Any, np.ndarray]], cells: int
    ) -> list[tuple[int, np.ndarray]]:
        """One batch of queries with ``cells`` cells: (query index, table) each."""
        U = max(counts.shape[0] for _, _, _, counts in batch)
        stacked = np.zeros((len(batch), U, cells))
        w = np.zeros((len(batch), U))
        starts = []
        for j, (_, attrs, parts, counts) in enumerate(batch):
            lik, support, _ = self._factors(attrs, parts)
            stacked[j, : counts.shape[0]] = _kron_rows(lik)
            w[j, : counts.shape[0]] = counts
            starts.append(self._start(attrs, support, counts))
        tables, _ = expectation_maximization_batch(
            stacked, w, np.stack(starts), self.tol, self.max_iter
        )
        return [
            (i, tables[j].reshape(self.schema.shape(attrs)))
            for j, (i, attrs, _, _) in enumerate(batch)
        ]

    def _start(
        self, attrs: tuple[int, ...], support: list[np.ndarray], counts: np.ndarray
    ) -> np.ndarray:
        """EM's starting table (flat): uniform, or the paper's unbiased estimate
        Norm-Sub'd and floored at one user's mass ``1/n``."""
        cells = self.schema.cells(attrs)
        if self.init == "uniform":
            return np.full(cells, 1.0 / cells)
        floored: np.ndarray = np.maximum(
            norm_sub(self._unbiased(attrs, support, counts)), 1.0 / self.n
        )
        return floored

    def log_likelihood(self, attrs: Sequence[int], table: np.ndarray) -> float:
        """Log-likelihood of the reports on ``attrs`` under the marginal ``table``
        (what EM maximises; e.g. at the truth, to compare with the fit)."""
        attrs = tuple(sorted(self.schema.resolve(attrs)))
        parts, counts = self._grouped(attrs)
        lik, _, log_scale = self._factors(attrs, parts)
        flat = np.asarray(table, dtype=np.float64).reshape(-1)
        fit = expectation_maximization(
            _kron_rows(lik), counts, flat, max_iter=0, log_scale=log_scale
        )
        return float(fit.loglik[0])

    def answer(self, attrs: Sequence[int]) -> np.ndarray:
        shape = self.schema.shape(tuple(sorted(self.schema.resolve(attrs))))
        return self.fit(attrs).table.reshape(shape)

    def describe(self) -> dict[str, object]:
        used = [o for o in self.oracles if o is not None]
        return {
            "epsilon_per_attribute": used[0].epsilon if used else None,
            "oracles": [o.name if o is not None else None for o in self.oracles],
        }


class ExpectationMaximization(Mechanism):
    """EM: every attribute with epsilon/d by its adaptive oracle; queries by EM."""

    name = "EM"

    def __init__(self, init: str = "unbiased", tol: float = 1e-9, max_iter: int = 10_000) -> None:
        if init not in ("unbiased", "uniform"):
            raise CalmkitError(f"init ({init!r}) must be 'unbiased' or 'uniform'")
        self.init, self.tol, self.max_iter = init, tol, max_iter

    @staticmethod
    def oracles(schema: Schema, epsilon: float) -> list[FrequencyOracle | None]:
        """Each attribute's oracle at ``epsilon / d`` (None: one category, no report)."""
        eps = validate_epsilon(epsilon) / schema.d
        return [choose_oracle(s, eps) if s > 1 else None for s in schema.sizes]

    def check(self, schema: Schema, n: int, epsilon: float, k: int) -> None:
        oracles = self.oracles(schema, epsilon)
        if not is_int(k) or not 1 <= k <= schema.d:
            raise CalmkitError(f"k ({k!r}) must be an int in [1, {schema.d}]")
        kept = sum(_report_bytes(o, n) for o in oracles)
        if kept > MAX_BYTES:
            raise NotScalable(
                f"EM keeps every user's {schema.d} reports: {kept} bytes for n ({n}) users, "
                f"more than {MAX_BYTES}"
            )
        # the largest k-way query: most cells, and at most min(n, patterns) patterns
        order = sorted(range(schema.d), key=lambda i: schema.sizes[i], reverse=True)[:k]
        cells = int(np.prod([schema.sizes[i] for i in order], dtype=object))
        patterns = min(n, int(np.prod([_patterns(oracles[i]) for i in order], dtype=object)))
        matrix = 8 * cells * patterns
        if matrix > MAX_BYTES:
            raise NotScalable(
                f"EM's likelihood matrix for a {k}-way query is {patterns} report patterns x "
                f"{cells} cells x 8 bytes = {matrix} bytes, more than {MAX_BYTES}"
            )

    def run(self, population: Population, epsilon: float, k: int, rng: RngLike = None) -> EMRelease:
        eps = validate_epsilon(epsilon)
        self.check(population.schema, population.n, eps, k)
        gen = np.random.default_rng(rng)
        oracles = self.oracles(population.schema, eps)
        reports: list[np.ndarray | None] = []
        for j, oracle in enumerate(oracles):
            if oracle is None:
                reports.append(None)
                continue
            out = oracle.perturb(population.codes[:, j].astype(np.int64), gen)
            if not isinstance(oracle, OUE):  # GRR cells in the smallest dtype
                out = out.astype(np.min_scalar_type(oracle.L - 1))
            reports.append(out)
        return EMRelease(
            population.schema, oracles, reports, population.n, self.init, self.tol, self.max_iter
        )
