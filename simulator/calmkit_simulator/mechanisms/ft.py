"""FT: the Fourier transformation method (CALM (Zhang et al., "CALM: Consistent Adaptive
Local Marginal for Marginal Release under Local Differential Privacy", CCS 2018), §3.5;
Kulkarni et al.).

Attributes are binary (a ``c``-category attribute is binary-encoded into
``ceil(log2 c)`` bits, most significant first, as the paper does for Adult and US).
For a user with bits ``x`` and a set ``S`` of bits, the parity function is
``chi_S(x) = (-1)^(sum of x_i, i in S)`` and the Fourier coefficient of the population
is its mean ``f_S``. The marginal over a set ``B`` of ``K`` bits is

    T_B(v) = 2^-K  sum_{S subset of B} (-1)^(sum of v_i, i in S) f_S

i.e. ``T_B = 2^-K H_K f_B`` with ``H_K`` the Kronecker product of ``K`` 2x2 Hadamard
matrices; ``f_{} = 1`` is known. The mechanism estimates every ``f_S`` with
``1 <= |S| <= k`` (``k`` in bits: the ``k`` widest attributes' bits together for a
binary-encoded schema, the paper's "d and k become 16 and 6"): users are split equally
over the coefficients, and each reports the bit ``(1 - chi_S(x)) / 2`` of their
coefficient through binary randomized response (GRR, L = 2) at the full epsilon.

The aggregator estimates ``P(bit = 0)`` of each coefficient with GRR's unbiased
estimator and sets ``f_S = 2 P - 1``; a query reuses the coefficients of all its
subsets, inverts the transform and, with ``nonnegative`` (the default), applies
Norm-Sub. Bit patterns that encode no category (code >= c) hold no users: they are
dropped and the remaining table is projected onto the distributions -- Norm-Sub over
the valid cells (the Euclidean projection of the whole bit table onto distributions
supported on valid patterns), or without ``nonnegative`` the least-squares projection
onto ``sum = 1`` (a constant shift; a binary schema needs none: the sum is ``f_{} = 1``).

Variance (formula (6), made exact): with ``N = sum_{s=1..k} C(d, s)`` coefficients,
``n / N`` users each, every coefficient estimate has variance ``N Var0`` where
``Var0 = 4 e^eps / ((e^eps - 1)^2 n)`` is the variance of one coefficient estimated
from all n users. The SSE of a k-way table is ``2^-k sum_{S != {}} Var(f_S)``
(``H_K`` is ``2^(K/2)`` times orthogonal), so

    E[SSE] = (1 - 2^-k) * N * Var0.

The paper writes ``sum_{s=0..k} C(d, s) * Var0``: it counts the exactly known
``f_{}`` both in the user split and in the noise; ``ft_variance(..., literal=True)``
returns that number (at d = 8, k = 3 it is 93 Var0 against the exact 80.5 Var0).
Both model only the randomized response: the random split of users adds
``(1 - f_S^2)(N - 1) / (n - 1)`` per coefficient, small against ``N Var0`` for small eps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cached_property
from itertools import combinations

import numpy as np

from calmkit_aggregator.reconstruction import norm_sub
from calmkit_client import GRR, CalmkitError, Schema, validate_epsilon
from calmkit_client.randomness import RngLike
from calmkit_client.validation import check_int, is_int

from ..population import Population
from .base import Mechanism, NotScalable, Release

__all__ = ["Fourier", "FourierBasis", "FourierRelease", "ft_variance", "hadamard_inverse"]

# Bytes of temporaries per chunk when computing exact coefficients.
_CHUNK_BYTES = 1 << 26


def _check_k(k: object, d: int) -> int:
    if not is_int(k) or not 1 <= int(k) <= d:
        raise CalmkitError(f"k ({k!r}) must be an int in [1, {d}]")
    return int(k)


def _bits(size: int) -> int:
    """Bits of the binary encoding of a ``size``-category attribute: ceil(log2 size)."""
    return (int(size) - 1).bit_length()


def ft_variance(
    d: int, k: int, n: int, epsilon: float, *, literal: bool = False, split: bool = False
) -> float:
    """Expected SSE of one k-way marginal of FT over d binary attributes, n users.

    ``(1 - 2^-k) * sum_{s=1..k} C(d, s) * Var0`` with ``Var0 = 4 e^eps / ((e^eps-1)^2 n)``
    (formula (6) with the known order-0 coefficient left out; see the module doc).
    ``literal=True``: the paper's ``sum_{s=0..k} C(d, s) * Var0`` as printed.
    For a binary-encoded schema pass the bit counts (the paper's d = 16, k = 6 for
    eight 3-category attributes at k = 3); the result is then the SSE of the bit table.

    Like the paper, this models the randomized response only. ``split=True`` (not with
    ``literal``) adds the random split of users over the coefficients at its largest
    (every ``f_S = 0``): ``(n - m) / (m (n - 1))`` per coefficient, ``m = n / N`` users
    each, at most ``(e^eps - 1)^2 / (4 e^eps)`` times the randomized-response term
    (1.6% at eps = 0.25, 27% at eps = 1, equal at eps = 1.76).
    """
    eps = validate_epsilon(epsilon)
    check_int("n", n, 1)
    check_int("d", d, 1)
    k = _check_k(k, int(d))
    var0 = 4.0 * GRR(eps, 2).variance(int(n))  # one +-1 coefficient from all n users
    coefficients = sum(math.comb(int(d), s) for s in range(1, k + 1))
    if literal:
        return float((coefficients + 1) * var0)
    per_coefficient = coefficients * var0  # n / N users each
    if split and n > 1:
        m = n / coefficients
        per_coefficient += (n - m) / (m * (n - 1))
    # 2^k cells, each 2^-2k times the 2^k - 1 noisy coefficients' variances
    return float((1.0 - 2.0**-k) * per_coefficient)


def hadamard_inverse(coefficients: np.ndarray) -> np.ndarray:
    """``2^-K H_K f`` for ``f`` of length ``2^K`` indexed by subsets in C order (bit j of
    the index, most significant first, is the j-th bit): the marginal over the K bits,
    flat in C order. ``H_K = H_1 (x) ... (x) H_1`` is applied one Kronecker factor per
    axis of the ``(2,) * K`` tensor (O(K 2^K), never the 2^K x 2^K matrix)."""
    f = np.asarray(coefficients, dtype=np.float64)
    size = f.shape[0]
    K = size.bit_length() - 1
    if f.ndim != 1 or size != 1 << K:
        raise CalmkitError(f"coefficients (shape {f.shape}) must have length 2^K")
    t = f.reshape((2,) * K) if K else f.copy()
    for axis in range(K):
        a = t.take(0, axis=axis)
        b = t.take(1, axis=axis)
        t = np.stack((a + b, a - b), axis=axis)
    return t.reshape(-1) / float(size)


class FourierBasis:
    """The coefficients FT estimates for ``schema`` and ``k``, and the transforms.

    Bits: attribute ``i`` occupies bits ``offset[i] .. offset[i] + bits[i] - 1``, most
    significant first. Coefficients: every bit set ``S`` with ``1 <= |S| <= k_bits``,
    indexed by size, then in colexicographic order (rank ``sum_j C(g_j, j)`` over its
    sorted bits ``g_1 < g_2 < ...``), so any set's index is computed, not looked up.
    """

    def __init__(self, schema: Schema, k: int) -> None:
        self.schema = schema
        self.k = _check_k(k, schema.d)
        self.bits = tuple(_bits(s) for s in schema.sizes)
        self.offsets = tuple(int(x) for x in np.cumsum((0, *self.bits))[:-1])
        self.D = sum(self.bits)
        self.k_bits = min(self.D, sum(sorted(self.bits, reverse=True)[: self.k]))
        self.words = max(1, (self.D + 63) // 64)
        per_size = [math.comb(self.D, s) for s in range(1, self.k_bits + 1)]
        self.size = int(sum(per_size))  # N, the number of coefficients
        # first index of each coefficient size s (1-based sizes; _start[0] unused)
        self._start = np.cumsum([0, 0, *per_size]).astype(np.int64)
        self._masks: np.ndarray | None = None

    @staticmethod
    def count(schema: Schema, k: int) -> int:
        """N for ``schema`` and ``k`` without building anything (Python ints)."""
        bits = sorted((_bits(s) for s in schema.sizes), reverse=True)
        D, k_bits = sum(bits), min(sum(bits), sum(bits[: _check_k(k, schema.d)]))
        return sum(math.comb(D, s) for s in range(1, k_bits + 1))

    # -- bit sets ----------------------------------------------------------------------
    @cached_property
    def _binom(self) -> np.ndarray:
        """C(g, r) for g < D, r <= k_bits as int64 (each <= N, so no overflow)."""
        return np.array(
            [[math.comb(g, r) for r in range(self.k_bits + 1)] for g in range(max(1, self.D))],
            dtype=np.int64,
        )

    @property
    def masks(self) -> np.ndarray:
        """Bit masks of all coefficients, (N, words) uint64, in index order."""
        if self._masks is None:
            binom = self._binom
            masks = np.zeros((self.size, self.words), dtype=np.uint64)
            for s in range(1, self.k_bits + 1):
                combos = np.array(list(combinations(range(self.D), s)), dtype=np.int64)
                rank = self._start[s] + binom[combos, np.arange(1, s + 1)].sum(axis=1)
                rows = masks[rank]
                for j in range(s):  # one pass per member, not per coefficient
                    g = combos[:, j]
                    rows[np.arange(rows.shape[0]), g // 64] |= np.left_shift(
                        np.uint64(1), (g % 64).astype(np.uint64)
                    )
                masks[rank] = rows
            self._masks = masks
        return self._masks

    def query_bits(self, attrs: Sequence[int]) -> np.ndarray:
        """Global bit positions of sorted ``attrs``, ascending (attribute order, MSB first)."""
        return np.array(
            [self.offsets[a] + j for a in attrs for j in range(self.bits[a])], dtype=np.int64
        )

    def subset_index(self, bits: np.ndarray) -> np.ndarray:
        """Coefficient index of every subset of the ascending bit positions ``bits``
        (K of them), in C order of the subset pattern; -1 for the empty set."""
        K = int(bits.shape[0])
        if K > self.k_bits:
            raise CalmkitError(
                f"query ({K} bits) must span at most k_bits = {self.k_bits} bits: FT "
                f"estimated coefficients up to that order only"
            )
        pattern = np.arange(1 << K, dtype=np.int64)
        member = (pattern[:, None] >> np.arange(K - 1, -1, -1, dtype=np.int64)) & 1
        order = np.cumsum(member, axis=1)  # rank of each member among the set, 1-based
        size = order[:, -1] if K else np.zeros(1, dtype=np.int64)
        binom = self._binom
        rank = (member * binom[bits[None, :], order]).sum(axis=1) if K else size
        index = self._start[size] + rank
        index[size == 0] = -1
        return index

    # -- users -------------------------------------------------------------------------
    def pack(self, codes: np.ndarray) -> np.ndarray:
        """Records (n, d) -> their bits packed into (n, words) uint64."""
        codes = np.asarray(codes).astype(np.uint64)
        packed = np.zeros((codes.shape[0], self.words), dtype=np.uint64)
        for a, (off, nb) in enumerate(zip(self.offsets, self.bits)):
            for j in range(nb):  # loop over bits, vectorised over users
                g = off + j
                bit = (codes[:, a] >> np.uint64(nb - 1 - j)) & np.uint64(1)
                packed[:, g // 64] |= bit << np.uint64(g % 64)
        return packed

    def parity(self, packed: np.ndarray, coefficient: np.ndarray) -> np.ndarray:
        """Bit ``(1 - chi_S(x)) / 2`` (0: even, +1; 1: odd, -1) of each user's packed
        bits (n, words) for their coefficient index (n,): int64 (n,)."""
        ones: np.ndarray = np.bitwise_count(packed & self.masks[coefficient]).sum(
            axis=1, dtype=np.int64
        )
        return ones & 1

    def exact(self, population: Population) -> np.ndarray:
        """The population's coefficients ``f_S`` (N,) float64 (tests; chunked)."""
        if population.schema != self.schema:
            raise CalmkitError("population schema must be the basis schema")
        packed = self.pack(population.codes)
        n, out = population.n, np.empty(self.size)
        step = max(1, _CHUNK_BYTES // (8 * self.words * max(1, n)))
        for lo in range(0, self.size, step):
            masks = self.masks[lo : lo + step]
            ones = np.bitwise_count(packed[:, None, :] & masks[None, :, :]).sum(axis=2)
            out[lo : lo + step] = 1.0 - 2.0 * (ones & 1).mean(axis=0)
        return out

    # -- queries -----------------------------------------------------------------------
    def marginal(
        self, attrs: Sequence[int], coefficients: np.ndarray, nonnegative: bool = True
    ) -> np.ndarray:
        """The marginal over sorted ``attrs`` from coefficients (N,): inverse transform
        of the query's subsets, unused bit patterns dropped, then the projection onto
        distributions (Norm-Sub with ``nonnegative``, else a constant shift to sum 1)."""
        attrs = tuple(sorted(self.schema.resolve(attrs)))
        index = self.subset_index(self.query_bits(attrs))
        f = np.append(np.asarray(coefficients, dtype=np.float64), 1.0)[index]  # -1: f_{} = 1
        table = hadamard_inverse(f).reshape(tuple(1 << self.bits[a] for a in attrs))
        table = table[tuple(slice(0, self.schema.sizes[a]) for a in attrs)]
        if nonnegative:
            out: np.ndarray = norm_sub(np.ascontiguousarray(table))
        else:
            out = table + (1.0 - table.sum()) / table.size
        return out


class FourierRelease(Release):
    """FT's estimated coefficients; each query is reconstructed on demand."""

    def __init__(
        self,
        basis: FourierBasis,
        coefficients: np.ndarray,
        group_sizes: np.ndarray,
        nonnegative: bool = True,
    ) -> None:
        self.basis, self.coefficients = basis, coefficients
        self.group_sizes, self.nonnegative = group_sizes, nonnegative

    def answer(self, attrs: Sequence[int]) -> np.ndarray:
        return self.basis.marginal(attrs, self.coefficients, self.nonnegative)

    def describe(self) -> dict[str, object]:
        return {
            "coefficients": self.basis.size,
            "bits": self.basis.D,
            "k_bits": self.basis.k_bits,
            "users_per_coefficient": float(self.group_sizes.mean()),
        }


class Fourier(Mechanism):
    """FT: users split equally over the Fourier coefficients of order 1..k; each
    reports one parity bit by binary randomized response at the full epsilon."""

    name = "FT"

    def __init__(self, nonnegative: bool = True) -> None:
        self.nonnegative = nonnegative

    def check(self, schema: Schema, n: int, epsilon: float, k: int) -> None:
        validate_epsilon(epsilon)
        coefficients = FourierBasis.count(schema, k)
        if coefficients > n:
            raise NotScalable(
                f"FT needs {coefficients} Fourier coefficients (orders 1..k over the "
                f"binary-encoded attributes) but has only n ({n}) users: fewer than one "
                f"user per coefficient"
            )

    def run(
        self, population: Population, epsilon: float, k: int, rng: RngLike = None
    ) -> FourierRelease:
        eps = validate_epsilon(epsilon)
        self.check(population.schema, population.n, eps, k)
        gen = np.random.default_rng(rng)
        basis = FourierBasis(population.schema, k)
        n, N = population.n, basis.size
        if N == 0:  # every attribute has one category: nothing to report
            return FourierRelease(basis, np.zeros(0), np.zeros(0, np.int64), self.nonnegative)
        # equal split: the i-th user of a random permutation takes coefficient i mod N
        coefficient = np.empty(n, dtype=np.int64)
        coefficient[gen.permutation(n)] = np.arange(n, dtype=np.int64) % N
        group_sizes = np.bincount(coefficient, minlength=N)
        bits = basis.parity(basis.pack(population.codes), coefficient)
        oracle = GRR(eps, 2)
        reports = oracle.perturb(bits, gen)
        zeros = np.bincount(coefficient[reports == 0], minlength=N)
        # GRR's estimator (C/n - q)/(p - q) of P(bit = 0), per coefficient at once
        even = (zeros / group_sizes - oracle.q) / (oracle.p - oracle.q)
        return FourierRelease(basis, 2.0 * even - 1.0, group_sizes, self.nonnegative)
