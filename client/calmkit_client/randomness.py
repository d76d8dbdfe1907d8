"""Sources of random 64-bit words for perturbation.

Production reports draw every random bit from the operating system's CSPRNG
(``os.urandom``, i.e. getrandom(2) on Linux): :class:`OsEntropy`. The device API
(``make_report``, ``DeviceState``, ``Collector``) takes no randomness argument at all.
Simulation and tests pass a ``numpy.random.Generator`` to the batch primitives
(``FrequencyOracle.perturb``, ``make_reports``) instead; integer seeds are refused
there, so a seed can only enter through the simulator, which builds its generators
with ``numpy.random.default_rng(seed)``. Both sources are used through
:func:`random_words`, so the perturbation code is identical on both paths.

Perturbation compares uniform 64-bit words with integer thresholds, which makes the
realised output probabilities exact rationals ``T / 2**64`` that the privacy tests
can check against epsilon.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from .errors import CalmkitError

__all__ = [
    "OsEntropy",
    "RandomSource",
    "RngLike",
    "SourceLike",
    "as_random_source",
    "random_byte_array",
    "random_bytes",
    "random_word",
    "random_words",
]

_U64 = np.dtype("<u8")


class OsEntropy:
    """Random words read from the OS entropy source (``os.urandom``).

    Holds no state: there is nothing to seed, snapshot or predict.
    """

    __slots__ = ()

    def words(self, count: int) -> npt.NDArray[np.uint64]:
        """``count`` independent uniform uint64 words, shape (count,)."""
        return np.frombuffer(os.urandom(8 * count), dtype=_U64).astype(np.uint64, copy=False)

    def token(self, nbytes: int) -> bytes:
        return os.urandom(nbytes)

    def __repr__(self) -> str:
        return "OsEntropy()"


RandomSource = OsEntropy | np.random.Generator
# What the client's batch primitives accept (never a seed).
SourceLike = OsEntropy | np.random.Generator | None
# What simulation and planning functions accept (they call numpy.random.default_rng on
# it): a generator, a seed sequence, an int seed or a sequence of them.
RngLike = np.random.Generator | np.random.SeedSequence | int | Sequence[int] | None


def as_random_source(rng: object) -> RandomSource:
    """Normalise ``rng``: ``None`` -> :class:`OsEntropy` (the production default);
    an :class:`OsEntropy` or ``Generator`` as is. Anything else, seeds included, is a
    :class:`~calmkit_client.errors.CalmkitError`: a seed is a simulation device and
    must be turned into a generator explicitly (``numpy.random.default_rng(seed)``).

    Note the default differs from numpy's: ``None`` never means "a PRNG seeded once";
    it means every word comes from the OS CSPRNG.
    """
    if rng is None:
        return OsEntropy()
    if isinstance(rng, (OsEntropy, np.random.Generator)):
        return rng
    raise CalmkitError(  # the value is not echoed: a seed is as secret as the data
        f"rng (a {type(rng).__name__}) must be None (OS entropy) or a numpy Generator; "
        "seeds are for simulation: pass numpy.random.default_rng(seed)"
    )


def random_words(source: RandomSource, count: int) -> npt.NDArray[np.uint64]:
    """``count`` uniform uint64 words from ``source``, shape (count,)."""
    if isinstance(source, OsEntropy):
        return source.words(count)
    return np.asarray(source.bit_generator.random_raw(count), dtype=np.uint64)


def random_word(source: RandomSource) -> int:
    """One uniform word as an int in [0, 2**64) (the first of :func:`random_words`)."""
    if isinstance(source, OsEntropy):
        return int.from_bytes(source.token(8), "little")
    return int(source.bit_generator.random_raw())


def random_byte_array(source: RandomSource, count: int) -> npt.NDArray[np.uint8]:
    """``count`` uniform bytes as uint8 (count,) (raw words viewed as bytes)."""
    if isinstance(source, OsEntropy):
        return np.frombuffer(source.token(count), dtype=np.uint8)
    words = np.asarray(source.bit_generator.random_raw((count + 7) // 8), dtype=np.uint64)
    return words.view(np.uint8)[:count]


def random_bytes(source: RandomSource, nbytes: int) -> bytes:
    """``nbytes`` uniform bytes (report ids)."""
    if isinstance(source, OsEntropy):
        return source.token(nbytes)
    return source.bytes(nbytes)
