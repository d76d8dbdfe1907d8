"""OUE's privacy loss computed exactly over the sampler's own randomness.

The tests drive the real samplers with a source whose bytes and words they choose.
- ``perturb`` (batch) takes, per bit, one head byte and, only when that byte ties the
  threshold's top byte, a 64-bit word whose top 56 bits decide.
- ``perturb_one`` takes one whole word per bit.

Over all 256 bytes and a binary search of the tie word, the tests count exactly how many
of the 2^64 equally likely draws set each bit. For the true cell's bit that must be half
of them; for every other bit, q * 2^64 up to rounding. Then ``log((1-q)/q)`` equals
epsilon. A sampler that set a bit one part in 10^4 more or less often would fail. The
tests do not use the oracle's ``likelihood`` model; they check it against these counts.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from calmkit_client.oracles import OUE
from calmkit_client.randomness import OsEntropy

TWO64 = 1 << 64


class Chosen(OsEntropy):
    """Every byte is ``byte``, every word is ``word``."""

    def __init__(self, byte: int = 0, word: int = 0) -> None:
        self.byte, self.word = byte, word

    def token(self, nbytes: int) -> bytes:
        return bytes([self.byte]) * nbytes

    def words(self, count: int) -> np.ndarray:
        return np.full(count, self.word, dtype=np.uint64)


def _first_zero(bit_at, lo: int = 0, hi: int = TWO64) -> int:  # type: ignore[no-untyped-def]
    """The first word in [lo, hi) whose bit is 0, for a bit that is 1 below it and 0
    from it on (the search checks both sides of what it finds)."""
    start = lo
    while lo < hi:
        mid = (lo + hi) // 2
        if bit_at(mid):
            lo = mid + 1
        else:
            hi = mid
    assert lo == start or bit_at(lo - 1)
    assert lo == TWO64 or not bit_at(lo)
    return lo


def _bits(payload: np.ndarray | bytes, L: int) -> np.ndarray:
    return np.unpackbits(np.frombuffer(bytes(payload), dtype=np.uint8), count=L)


def _batch_ones(oracle: OUE, cell: int) -> tuple[int, int]:
    """(draws of 2^64 that set the true bit, draws that set another bit) for the batch
    sampler: a byte decides unless it ties, then the tie word's top 56 bits do."""
    L, other = oracle.L, (cell + 1) % oracle.L
    per_byte = TWO64 // 256
    true_ones = other_ones = 0
    for byte in range(256):
        bits = _bits(oracle.perturb([cell], rng=Chosen(byte, 0))[0], L)
        bits_high = _bits(oracle.perturb([cell], rng=Chosen(byte, TWO64 - 1))[0], L)
        true_ones += per_byte * int(bits[cell])
        if bits[other] == bits_high[other]:  # the byte alone decides
            other_ones += per_byte * int(bits[other])
        else:  # a tie: words below some point set it; each word is 1/2^64 of this byte

            def bit_at(word: int, byte: int = byte) -> bool:
                return bool(_bits(oracle.perturb([cell], rng=Chosen(byte, word))[0], L)[other])

            other_ones += _first_zero(bit_at) // 256  # 256 words per 56-bit tail
    return true_ones, other_ones


def _one_ones(oracle: OUE, cell: int) -> tuple[int, int]:
    """The same for ``perturb_one``: one whole word per bit."""
    L, other = oracle.L, (cell + 1) % oracle.L

    def bit(position: int):  # type: ignore[no-untyped-def]
        return lambda word: bool(_bits(oracle.perturb_one(cell, rng=Chosen(0, word)), L)[position])

    return _first_zero(bit(cell)), _first_zero(bit(other))


@pytest.mark.parametrize("path", ["batch", "one"])
# At eps = 0.2 the threshold's top byte (115) is odd: its lowest bit is bit 56 of the
# threshold, which the tie comparison of the low 56 bits must leave out. At eps = 9 the
# threshold itself is odd (q < 2^-11 has bits down to 2^-64): its lowest bit counts.
@pytest.mark.parametrize(("L", "eps"), [(2, 0.5), (9, 1.0), (16, 3.0), (5, 0.2), (3, 9.0)])
def test_oue_privacy_loss_is_exact(path: str, L: int, eps: float) -> None:
    oracle = OUE(epsilon=eps, L=L)
    for cell in (0, L - 1):
        true_ones, other_ones = (_batch_ones if path == "batch" else _one_ones)(oracle, cell)
        assert true_ones == TWO64 // 2  # p = 1/2 exactly
        # exactly the nearest whole number of words to q 2^64 (q as its float formula)
        assert abs(other_ones - Fraction(1 / (math.exp(eps) + 1)) * TWO64) <= Fraction(1, 2)
        q = Fraction(other_ones, TWO64)
        ratio = (1 - q) / q  # (p (1-q)) / (q p), the worst output ratio
        # as the oracle computes it, so equal counts give the same float
        realised = math.log(ratio.numerator) - math.log(ratio.denominator)
        assert abs(realised - eps) < 1e-12 + 2.0 / other_ones
        assert realised <= oracle.realised_epsilon + 1e-15
        one_hot = np.zeros(L, dtype=np.uint8)
        one_hot[(cell + 1) % L] = 1
        payload = np.packbits(one_hot).tobytes()  # only the other bit set
        assert oracle.likelihood(payload, cell) == (1 - Fraction(1, 2)) * q * (1 - q) ** (L - 2)
