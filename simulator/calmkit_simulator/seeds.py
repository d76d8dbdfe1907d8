"""How one experiment seed fixes every random draw of a simulation.

A seed ``S`` (``calmkit simulate --seed S``; the ``rng`` of :func:`.run_mechanism`
and :func:`.run_calm`) is the root ``numpy.random.SeedSequence(S)``. Each kind of draw
has its own stream, the child of the root with a fixed key::

    stream(S, POPULATION)      the resample of the dataset to n users
    stream(S, QUERIES, r)      the random k-way queries of repetition r
    stream(S, METHOD, r)       the method's own randomness in repetition r (its
                               reports, plan seeds, noise, ...)
    stream(S, SPLIT, r)        the test/training split of repetition r (classification)

``stream(S, *key)`` is ``SeedSequence(S, spawn_key=key)``, the very sequence that
``SeedSequence(S).spawn(...)`` hands out at that key (e.g. ``stream(S, QUERIES, r)`` is
``SeedSequence(S).spawn(2)[QUERIES].spawn(r + 1)[r]``), so the streams are
statistically independent of each other and of the root (which generates the
synthetic dataset itself). None of them depends on the method, the planner or (l, m):
runs that differ only in those answer the same queries on the same users in every
repetition, and a method's randomness never shifts the queries, however much of it
the method draws. Methods that consume their stream alike also share their
randomness (e.g. CALM with and without shrinkage answers from the same reports).
"""

from __future__ import annotations

import numpy as np

from calmkit_client.randomness import RngLike

__all__ = ["METHOD", "POPULATION", "QUERIES", "SPLIT", "root", "stream"]

POPULATION = 0
QUERIES = 1
METHOD = 2
SPLIT = 3


def root(rng: RngLike) -> np.random.SeedSequence:
    """The root sequence of an experiment: ``SeedSequence(rng)`` for an int (``None``:
    fresh entropy from the OS), ``rng`` itself for a ``SeedSequence``; from a
    ``Generator``, a root seeded by 128 bits drawn from it (so each call differs)."""
    if isinstance(rng, np.random.SeedSequence):
        return rng
    if isinstance(rng, np.random.Generator):
        return np.random.SeedSequence(rng.integers(1 << 32, size=4, dtype=np.uint64).tolist())
    return np.random.SeedSequence(rng)


def stream(seed: int | np.random.SeedSequence, *key: int) -> np.random.SeedSequence:
    """The child of the root ``seed`` (an int, or a :func:`root`) at ``key``, e.g.
    ``(QUERIES, r)``; pass it to ``numpy.random.default_rng``. Stateless: the root's own
    spawn counter is untouched, so the same key always gives the same stream."""
    base = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)
    return np.random.SeedSequence(
        base.entropy, spawn_key=(*base.spawn_key, *key), pool_size=base.pool_size
    )
