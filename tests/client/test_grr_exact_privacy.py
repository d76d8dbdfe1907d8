"""GRR's privacy loss computed exactly over the sampler's own randomness.

Each report draws one uniform 64-bit word and maps it to an output cell. For a fixed
true cell the output's offset is a non-decreasing step function of the word. A binary
search over all 2^64 words, on the real sampler (the batch ``perturb`` and the
one-report ``perturb_one``), finds each step's first word, and so the exact number of
words behind every output. The tests do not use the oracle's ``likelihood`` model.

The checks on those counts:
- every other cell gets the same count;
- log(count kept / count other) equals epsilon, up to the rounding of q * 2^64;
- the counts add up to 2^64.

A sampler that kept the true cell one part in 10^4 more or less often fails.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from calmkit_client.oracles import GRR
from calmkit_client.randomness import OsEntropy

TWO64 = 1 << 64


class FixedWord(OsEntropy):
    """An entropy source that returns one chosen word (to drive ``perturb_one``)."""

    def __init__(self, word: int) -> None:
        self.word = word

    def words(self, count: int) -> np.ndarray:
        return np.full(count, self.word, dtype=np.uint64)


def _offset_batch(oracle: GRR, cell: int):  # type: ignore[no-untyped-def]
    def offset(word: int) -> int:
        out = oracle.perturb([cell], rng=FixedWord(word))
        return (int(out[0]) - cell) % oracle.L

    return offset


def _offset_one(oracle: GRR, cell: int):  # type: ignore[no-untyped-def]
    def offset(word: int) -> int:
        return (oracle.perturb_one(cell, rng=FixedWord(word)) - cell) % oracle.L

    return offset


def _word_counts(offset, L: int) -> list[int]:  # type: ignore[no-untyped-def]
    """Words per offset 0..L-1, from each offset's first word (binary search), checked
    at every boundary and on random words."""
    firsts = [0]
    for k in range(1, L):
        lo, hi = firsts[-1], TWO64  # the first word with offset >= k is in [lo, hi]
        while lo < hi:
            mid = (lo + hi) // 2
            if offset(mid) >= k:
                hi = mid
            else:
                lo = mid + 1
        firsts.append(lo)
    firsts.append(TWO64)
    for k in range(L):
        assert offset(firsts[k]) == k and offset(firsts[k + 1] - 1) == k
    rng = np.random.default_rng(7)
    for word in rng.integers(0, TWO64, 200, dtype=np.uint64, endpoint=False).tolist():
        k = int(np.searchsorted(firsts, word, side="right")) - 1
        assert offset(int(word)) == k  # a step function, as the search assumed
    return [firsts[k + 1] - firsts[k] for k in range(L)]


@pytest.mark.parametrize("path", ["batch", "one"])
@pytest.mark.parametrize(("L", "eps"), [(2, 0.5), (4, 1.0), (7, 3.0), (64, 0.1)])
def test_grr_privacy_loss_is_exact(path: str, L: int, eps: float) -> None:
    oracle = GRR(epsilon=eps, L=L)
    for cell in (0, L - 1):
        make = _offset_batch if path == "batch" else _offset_one
        counts = _word_counts(make(oracle, cell), L)
        kept, others = counts[0], counts[1:]
        assert sum(counts) == TWO64
        assert len(set(others)) == 1  # every other cell equally likely
        realised = math.log(kept) - math.log(others[0])
        # only q * 2^64 is rounded to a whole number of words
        assert abs(realised - eps) < 1e-12 + 2.0 / (others[0])
        assert realised <= oracle.realised_epsilon + 1e-15
        # the model the other privacy tests use agrees with the sampler exactly
        assert oracle.likelihood(cell, cell) == Fraction(kept, TWO64)
        assert oracle.likelihood((cell + 1) % L, cell) == Fraction(others[0], TWO64)
