"""Frequency oracles GRR and OUE (CALM (Zhang et al., "CALM: Consistent Adaptive Local
Marginal for Marginal Release under Local Differential Privacy", CCS 2018), §2.2), used
by both sides.

The client calls :meth:`~FrequencyOracle.perturb` / :meth:`~FrequencyOracle.perturb_one`;
the aggregator calls :meth:`~FrequencyOracle.support`, :meth:`~FrequencyOracle.estimate`
and :meth:`~FrequencyOracle.variance`.

Sampling compares uniform 64-bit words with integer thresholds ``T``: an event of
probability ``T / 2**64`` exactly. :meth:`~FrequencyOracle.likelihood` returns those
exact probabilities, so tests can check the realised privacy loss against epsilon.
Payloads:

- GRR: one cell index (int).
- OUE: L bits packed big-endian into ``ceil(L/8)`` bytes (cell c is bit ``7 - c % 8``
  of byte ``c // 8``, as :func:`numpy.packbits`); padding bits are 0.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from .errors import OracleError
from .randomness import (
    RandomSource,
    SourceLike,
    as_random_source,
    random_byte_array,
    random_words,
)
from .validation import check_int, is_int

__all__ = ["GRR", "OUE", "FrequencyOracle", "choose_oracle", "make_oracle", "validate_epsilon"]

_TWO64 = 1 << 64
# Reports (GRR) or bits / 8 (OUE) per chunk of a batch: keeps temporaries in cache.
_CHUNK_WORDS = 1 << 16
# How closely the realised privacy loss must match the nominal epsilon.
_EPS_RTOL = 1e-12


MAX_EPSILON = 44.0  # ln(2^64) = 44.36: beyond it q < 2^-64 has no 64-bit threshold


def validate_epsilon(epsilon: object, name: str = "epsilon") -> float:
    """``float(epsilon)`` if it is a finite real > 0, else :class:`OracleError`."""
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float, np.integer, np.floating)):
        raise OracleError(f"{name} ({epsilon!r}) must be a finite number > 0")
    value = float(epsilon)
    if not (math.isfinite(value) and value > 0):
        raise OracleError(f"{name} ({value!r}) must be finite and > 0")
    return value


def validate_oracle_epsilon(epsilon: object, name: str = "epsilon") -> float:
    """:func:`validate_epsilon`, and at most :data:`MAX_EPSILON` (what a frequency
    oracle's 64-bit thresholds can realise), else :class:`OracleError`."""
    value = validate_epsilon(epsilon, name)
    if value > MAX_EPSILON:
        raise OracleError(
            f"{name} ({value!r}) must be <= {MAX_EPSILON:g} (a 64-bit threshold cannot "
            "realise a flip probability below 2^-64)"
        )
    return value


def _threshold(prob: float) -> int:
    """Integer T with T / 2**64 nearest to ``prob``."""
    return int(Fraction(prob) * _TWO64 + Fraction(1, 2))


@dataclass(frozen=True)
class FrequencyOracle(ABC):
    """An epsilon-LDP frequency oracle over a domain of ``L`` cells."""

    epsilon: float
    L: int

    name: ClassVar[str]

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", validate_oracle_epsilon(self.epsilon))
        object.__setattr__(self, "L", check_int("L", self.L, 2, OracleError))
        realised = self.realised_epsilon
        if not abs(realised - self.epsilon) <= _EPS_RTOL * max(1.0, self.epsilon):
            raise OracleError(
                f"epsilon ({self.epsilon!r}) must be small enough to realise with 64-bit "
                f"thresholds at L={self.L} (realised {realised!r})"
            )

    # -- parameters ----------------------------------------------------------------
    @property
    @abstractmethod
    def p(self) -> float:
        """Probability that the true cell is reported (GRR) / its bit is 1 (OUE)."""

    @property
    @abstractmethod
    def q(self) -> float:
        """Probability that a given other cell is reported / its bit is 1."""

    @property
    @abstractmethod
    def thresholds(self) -> dict[str, int]:
        """The integers the sampler compares uniform 64-bit words with."""

    @property
    @abstractmethod
    def realised_epsilon(self) -> float:
        """``log`` of the worst-case likelihood ratio of the sampler as implemented."""

    @abstractmethod
    def likelihood(self, payload: int | bytes, cell: int) -> Fraction:
        """Exact probability that input ``cell`` is perturbed into ``payload``."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: name, epsilon and L."""
        return {"name": self.name, "epsilon": self.epsilon, "L": self.L}

    # -- client side -----------------------------------------------------------------
    def _cells(self, cells: npt.ArrayLike) -> np.ndarray:
        arr = np.asarray(cells)
        if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
            raise OracleError(f"cells (shape {arr.shape}, dtype {arr.dtype}) must be 1-D ints")
        if arr.size and (arr.min() < 0 or arr.max() >= self.L):
            bad = arr.min() if arr.min() < 0 else arr.max()
            raise OracleError(f"cell ({int(bad)}) must be in [0, {self.L})")
        return arr.astype(np.int64, copy=False)

    def _cell(self, cell: int) -> int:
        if not is_int(cell):
            raise OracleError(f"cell ({cell!r}) must be an int in [0, {self.L})")
        if not 0 <= int(cell) < self.L:
            raise OracleError(f"cell ({int(cell)}) must be in [0, {self.L})")
        return int(cell)

    @abstractmethod
    def perturb(self, cells: npt.ArrayLike, rng: SourceLike = None) -> np.ndarray:
        """Perturb a batch of true cells (n,) into n payloads.

        ``rng=None`` draws from the OS entropy source; pass a numpy Generator only in
        simulation and tests (integer seeds are refused).
        """

    @abstractmethod
    def perturb_one(self, cell: int, rng: SourceLike = None) -> int | bytes:
        """Perturb one true cell, with the law of :meth:`perturb`.

        The one-report path runs the same operations and draws the same number of
        random bytes whatever the true cell and the outcome (no early return, no
        data-dependent draw), so its running time tells nothing about either.
        """

    # -- aggregator side ---------------------------------------------------------------
    @abstractmethod
    def support(self, payloads: npt.ArrayLike) -> np.ndarray:
        """Support counts C (L,) int64: how many payloads support each cell."""

    @abstractmethod
    def check_payloads(self, payloads: npt.ArrayLike) -> np.ndarray:
        """Validate payloads from the wire; returns them as an array or raises."""

    def estimate(self, support: npt.ArrayLike, n: int) -> np.ndarray:
        """Unbiased frequency estimates (L,) float64: ``(C/n - q) / (p - q)``."""
        counts = np.asarray(support, dtype=np.float64)
        if counts.shape != (self.L,):
            raise OracleError(f"support (shape {counts.shape}) must have shape ({self.L},)")
        if not is_int(n) or n <= 0:
            raise OracleError(f"n ({n!r}) must be an int > 0")
        return (counts / n - self.q) / (self.p - self.q)

    def variance(self, n: int, f: npt.ArrayLike | None = None) -> Any:
        """Variance of :meth:`estimate` with ``n`` reports.

        ``f=None``: the f-independent term the paper uses (eqs. 1, 2), a float:
        ``q (1-q) / (n (p-q)^2)``.
        ``f`` given (the reporting users' true frequencies, shape (L,)): the exact
        per-cell variance for that fixed population, each count being a sum of
        independent Bernoullis: ``(f p (1-p) + (1-f) q (1-q)) / (n (p-q)^2)``.
        """
        if not is_int(n) or n <= 0:
            raise OracleError(f"n ({n!r}) must be an int > 0")
        p, q = self.p, self.q
        if f is None:
            return q * (1 - q) / (n * (p - q) ** 2)
        freq = np.asarray(f, dtype=np.float64)
        return (freq * p * (1 - p) + (1 - freq) * q * (1 - q)) / (n * (p - q) ** 2)

    def sum_variance(self, n: int, total: npt.ArrayLike, cells: int) -> Any:
        """Exact variance of the estimate of a sum of ``cells`` cells (a cell of a
        projection) whose reporting users' true frequency is ``total`` (array-like),
        for a fixed population of ``n`` reports. ``cells=1`` is :meth:`variance`.

        Each report supports the group with probability ``a`` if the user's cell is in
        it and ``b`` otherwise, independently over users: GRR ``a = p + (cells-1) q``,
        ``b = cells q`` (one cell per report); OUE sums independent bits, so
        ``F p (1-p) + (cells - F) q (1-q)``. Divided by ``n (p-q)^2``.
        """
        if not is_int(n) or n <= 0:
            raise OracleError(f"n ({n!r}) must be an int > 0")
        if not is_int(cells):
            raise OracleError(f"cells ({cells!r}) must be an int in [1, {self.L}]")
        if not 1 <= cells <= self.L:
            raise OracleError(f"cells ({cells}) must be in [1, {self.L}]")
        freq = np.asarray(total, dtype=np.float64)
        return self._sum_power(freq, int(cells)) / (n * (self.p - self.q) ** 2)

    @abstractmethod
    def _sum_power(self, total: np.ndarray, cells: int) -> np.ndarray:
        """One report's variance of its support of a group of ``cells`` cells, averaged
        over users whose cell lies in the group with frequency ``total``."""

    def contrast_variance(self, n: int) -> float:
        """Noise power per dimension of the estimate in a space of zero-sum contrasts
        whose orthogonal projector ``P`` has a constant diagonal (the ANOVA interaction
        components of a table are such spaces): ``E ||P (f_hat - f)||^2 = dim * this``,
        exactly, for every population of ``n`` reports.

        With ``Sigma`` the estimate's covariance, this is ``tr(Sigma') / L`` where
        ``Sigma'`` drops the part every zero-sum contrast annihilates. GRR:
        ``(1 - (p-q)^2) / (L n (p-q)^2)`` (one cell per report, so the per-user
        covariance ``diag(P) - P P^T`` leaves ``1 - (p-q)^2`` on such spaces); OUE:
        ``(p (1-p) + (L-1) q (1-q)) / (L n (p-q)^2)`` (independent bits).
        """
        if not is_int(n) or n <= 0:
            raise OracleError(f"n ({n!r}) must be an int > 0")
        return self.contrast_power() / (self.L * n * (self.p - self.q) ** 2)

    @abstractmethod
    def contrast_power(self) -> float:
        """One report's covariance trace as zero-sum contrasts see it: the numerator of
        :meth:`contrast_variance`, for callers that divide by their own report counts."""


@dataclass(frozen=True)
class GRR(FrequencyOracle):
    """Generalized randomized response: report the true cell with probability
    ``p = e^eps / (e^eps + L - 1)``, otherwise one of the other ``L - 1`` cells
    uniformly (each with ``q = 1 / (e^eps + L - 1)``). Variance
    ``(L - 2 + e^eps) / ((e^eps - 1)^2 n)`` (eq. 1).

    One word ``w`` per report: every other cell owns exactly ``Q = round(q 2^64)``
    words and the true cell the remaining ``K = 2^64 - (L-1) Q``; the report is
    ``(v + k) mod L`` with offset ``k = 0`` if ``w < K`` else ``1 + (w - K) // Q``.
    The privacy loss is exactly ``log(K / Q)``.
    """

    name: ClassVar[str] = "GRR"

    @property
    def p(self) -> float:
        e = math.exp(self.epsilon)
        return e / (e + self.L - 1)

    @property
    def q(self) -> float:
        return 1.0 / (math.exp(self.epsilon) + self.L - 1)

    @cached_property
    def _words_other(self) -> int:
        """Q: words mapped to each other cell."""
        return max(1, _threshold(self.q))

    @cached_property
    def _words_keep(self) -> int:
        """K: words that keep the true cell."""
        return _TWO64 - (self.L - 1) * self._words_other

    @property
    def thresholds(self) -> dict[str, int]:
        """The sampling's integers: ``Q`` words per other cell, ``K`` for the true one."""
        return {"Q": self._words_other, "K": self._words_keep}

    def contrast_power(self) -> float:
        return 1.0 - (self.p - self.q) ** 2

    def _sum_power(self, total: np.ndarray, cells: int) -> np.ndarray:
        a = self.p + (cells - 1) * self.q
        b = cells * self.q
        return total * a * (1 - a) + (1 - total) * b * (1 - b)

    def likelihood(self, payload: int | bytes, cell: int) -> Fraction:
        words = self._words_keep if int(payload) == int(cell) else self._words_other
        return Fraction(words, _TWO64)

    @cached_property
    def realised_epsilon(self) -> float:
        return math.log(self._words_keep) - math.log(self._words_other)

    def _apply(self, cells: np.ndarray, words: np.ndarray) -> np.ndarray:
        """cells (n,) int64, words (n,) uint64 -> reported cells (n,) int64 (in place
        on temporaries: ~7 ns per report)."""
        keep = np.uint64(self._words_keep)
        offset = (words - keep) // np.uint64(self._words_other)  # wraps when kept
        offset += np.uint64(1)
        offset *= words >= keep  # offset 0: the true cell
        out = offset.view(np.int64)  # offsets are < L
        out += cells
        np.subtract(out, self.L, out=out, where=out >= self.L)
        return out

    def perturb(self, cells: npt.ArrayLike, rng: SourceLike = None) -> np.ndarray:
        """cells (n,) int -> reported cells (n,) int64."""
        arr = self._cells(cells)
        src = as_random_source(rng)
        out = np.empty(arr.shape[0], dtype=np.int64)
        for lo in range(0, arr.shape[0], _CHUNK_WORDS):
            part = arr[lo : lo + _CHUNK_WORDS]
            out[lo : lo + _CHUNK_WORDS] = self._apply(part, random_words(src, part.size))
        return out

    def perturb_one(self, cell: int, rng: SourceLike = None) -> int:
        # Branch-free form of _apply on one word (equal to perturb([cell]) given the
        # same word): the offset is computed and masked whether the cell is kept or
        # not, and the wrap is an arithmetic correction, not a test.
        v = np.array([self._cell(cell)], dtype=np.int64)
        w = random_words(as_random_source(rng), 1)
        keep = np.uint64(self._words_keep)
        flipped = w >= keep
        offset = ((w - keep) // np.uint64(self._words_other) + np.uint64(1)) * flipped
        y = offset.view(np.int64) + v
        y -= (y >= self.L) * np.int64(self.L)
        return int(y[0])

    def check_payloads(self, payloads: npt.ArrayLike) -> np.ndarray:
        arr = np.asarray(payloads)
        if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
            raise OracleError(
                f"GRR payloads (shape {arr.shape}, dtype {arr.dtype}) must be 1-D cell ints"
            )
        if arr.size and (arr.min() < 0 or arr.max() >= self.L):
            bad = arr.min() if arr.min() < 0 else arr.max()
            raise OracleError(f"GRR payload ({int(bad)}) must be a cell in [0, {self.L})")
        return arr.astype(np.int64, copy=False)

    def support(self, payloads: npt.ArrayLike) -> np.ndarray:
        """Payloads (n,) int -> counts (L,) int64 (how often each cell was reported)."""
        arr = self.check_payloads(payloads)
        return np.bincount(arr, minlength=self.L).astype(np.int64)


# counts of each byte value's bits, big-endian: _BYTE_BITS[v, b] = bit b of v (b=0 is MSB)
_BYTE_BITS = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1).astype(np.int64)
_LOW56 = (1 << 56) - 1


def _bernoulli(head: np.ndarray, source: RandomSource, threshold: int) -> np.ndarray:
    """Booleans shaped like ``head`` (uniform uint8), each exactly ``w < threshold`` for
    a uniform 64-bit ``w`` whose top byte is ``head``: the top byte decides unless it
    equals the threshold's (probability 1/256); only then are ``w``'s other 56 bits
    drawn from ``source``. Same law as comparing whole words, 1/8 of the random bits.
    """
    top = np.uint8(threshold >> 56)
    out = head < top
    ties = np.flatnonzero(head == top)
    if ties.size:
        tails = random_words(source, ties.size) >> np.uint64(8)
        out.reshape(-1)[ties] = tails < np.uint64(threshold & _LOW56)
    return out


@dataclass(frozen=True)
class OUE(FrequencyOracle):
    """Optimized unary encoding: one-hot encode the cell, keep its 1 with probability
    ``p = 1/2``, turn each 0 into 1 with probability ``q = 1 / (e^eps + 1)``.
    Variance ``4 e^eps / ((e^eps - 1)^2 n)`` (eq. 2). Each bit is an exact
    ``Bernoulli(T / 2^64)`` (:func:`_bernoulli`).
    """

    name: ClassVar[str] = "OUE"

    @property
    def p(self) -> float:
        return 0.5

    @property
    def q(self) -> float:
        return 1.0 / (math.exp(self.epsilon) + 1.0)

    @property
    def nbytes(self) -> int:
        """Payload size in bytes, ``ceil(L / 8)``."""
        return (self.L + 7) // 8

    @cached_property
    def _t_flip(self) -> int:
        return _threshold(self.q)

    @property
    def thresholds(self) -> dict[str, int]:
        """The sampling's integers: a 0 bit turns 1 when its word is below ``T``; the
        true cell's bit stays 1 when below ``2^63``."""
        return {"T": self._t_flip, "T_keep": _TWO64 // 2}

    def contrast_power(self) -> float:
        p, q = self.p, self.q
        return p * (1 - p) + (self.L - 1) * q * (1 - q)

    def _sum_power(self, total: np.ndarray, cells: int) -> np.ndarray:
        p, q = self.p, self.q
        return total * p * (1 - p) + (cells - total) * q * (1 - q)

    def likelihood(self, payload: int | bytes, cell: int) -> Fraction:
        if not isinstance(payload, (bytes, bytearray)):
            raise OracleError(f"OUE payload ({payload!r}) must be bytes")
        bits = np.unpackbits(np.frombuffer(payload, dtype=np.uint8), count=self.L)
        q, half = Fraction(self._t_flip, _TWO64), Fraction(1, 2)
        ones = int(bits.sum()) - int(bits[cell])
        zeros = self.L - 1 - ones
        return q**ones * (1 - q) ** zeros * half

    @cached_property
    def realised_epsilon(self) -> float:
        # Worst case over outputs: bits of the two inputs' cells differ, ratio
        # (1/2 (1-q)) / (q 1/2) = (1-q)/q.
        q = Fraction(self._t_flip, _TWO64)
        ratio = (1 - q) / q
        return math.log(ratio.numerator) - math.log(ratio.denominator)

    def _apply(self, cells: np.ndarray, source: RandomSource) -> np.ndarray:
        """cells (n,) int64 -> packed payloads (n, nbytes) uint8.

        Per report L + 1 random bytes: L decide the flips of the 0 bits (exactly
        Bernoulli(q), :func:`_bernoulli`), the last is the coin of the true bit
        (``< 128``: exactly 1/2), which replaces bit ``cell``.
        """
        n, L = cells.shape[0], self.L
        head = random_byte_array(source, n * (L + 1)).reshape(n, L + 1)
        bits = _bernoulli(head[:, :L], source, self._t_flip)
        rows = np.arange(n)
        bits[rows, cells] = head[:, L] < 128
        return np.packbits(bits, axis=1)

    def perturb(self, cells: npt.ArrayLike, rng: SourceLike = None) -> np.ndarray:
        """cells (n,) int -> bit-packed payloads (n, ceil(L/8)) uint8."""
        arr = self._cells(cells)
        src = as_random_source(rng)
        out = np.empty((arr.shape[0], self.nbytes), dtype=np.uint8)
        step = max(1, 8 * _CHUNK_WORDS // self.L)
        for lo in range(0, arr.shape[0], step):
            out[lo : lo + step] = self._apply(arr[lo : lo + step], src)
        return out

    def perturb_one(self, cell: int, rng: SourceLike = None) -> bytes:
        # Unlike _apply (which draws extra words on top-byte ties, a draw count that
        # depends on the outcome), one report draws exactly L + 1 whole words: bit u is
        # ``word_u < T`` and the true bit is ``word_L < 2^63``. Same law, constant work.
        v, L = self._cell(cell), self.L
        words = random_words(as_random_source(rng), L + 1)
        bits = words[:L] < np.uint64(self._t_flip)
        bits[v] = words[L] < np.uint64(1 << 63)
        return np.packbits(bits).tobytes()

    def check_payloads(self, payloads: npt.ArrayLike) -> np.ndarray:
        arr = np.asarray(payloads)
        if arr.ndim != 2 or arr.shape[1] != self.nbytes or arr.dtype != np.uint8:
            raise OracleError(
                f"OUE payloads (shape {arr.shape}, dtype {arr.dtype}) must be uint8 of shape "
                f"(n, {self.nbytes})"
            )
        pad = self.nbytes * 8 - self.L
        if pad and arr.size and (arr[:, -1] & np.uint8((1 << pad) - 1)).any():
            row = int(np.flatnonzero(arr[:, -1] & np.uint8((1 << pad) - 1))[0])
            raise OracleError(
                f"OUE payload (row {row}) must have its {pad} padding bits zero (L={self.L})"
            )
        return arr

    def support(self, payloads: npt.ArrayLike) -> np.ndarray:
        """Payloads (n, nbytes) uint8 -> counts (L,) int64 of 1 bits per cell.

        One ``bincount`` over (byte column, byte value) pairs, then a byte-value-by-bit
        table: 8x fewer operations than unpacking every bit.
        """
        arr = self.check_payloads(payloads)
        cols = self.nbytes
        keys = arr.astype(np.int64) + 256 * np.arange(cols, dtype=np.int64)
        hist = np.bincount(keys.reshape(-1), minlength=256 * cols).reshape(cols, 256)
        return (hist @ _BYTE_BITS).reshape(-1)[: self.L]


_ORACLES: dict[str, type[FrequencyOracle]] = {"GRR": GRR, "OUE": OUE}


def make_oracle(name: str, L: int, epsilon: float) -> FrequencyOracle:
    """The oracle called ``name`` ("GRR" or "OUE") over ``L`` cells."""
    try:
        cls = _ORACLES[name]
    except (KeyError, TypeError):
        raise OracleError(f"oracle ({name!r}) must be one of {sorted(_ORACLES)}") from None
    return cls(epsilon, L)


def choose_oracle(L: int, epsilon: float) -> FrequencyOracle:
    """The oracle with the smaller variance (§2.2.3): GRR iff ``L < 3 e^eps + 2``."""
    eps = validate_oracle_epsilon(epsilon)
    cells = check_int("L", L, 2, OracleError)
    return GRR(eps, cells) if cells < 3 * math.exp(eps) + 2 else OUE(eps, cells)
