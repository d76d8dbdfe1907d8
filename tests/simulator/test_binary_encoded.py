"""BE (CALM on binary-encoded attributes): the encoding round-trips and folding the
bit patterns back recovers every marginal exactly when the bit marginals are exact."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from calmkit_simulator import Population, synthetic_population
from calmkit_simulator.experiment import run_mechanism
from calmkit_simulator.mechanisms import Release
from calmkit_simulator.mechanisms.binary import BinaryEncoded, _BinaryRelease, binary_encode

POP = synthetic_population(n=30_000, sizes=(3, 2, 5, 4), strength=1.5, rng=6)


def test_encoding_round_trips() -> None:
    encoded, groups = binary_encode(POP)
    assert [len(g) for g in groups] == [2, 1, 3, 2] and encoded.d == 8
    for a, group in enumerate(groups):
        weights = 2 ** np.arange(len(group))[::-1]
        np.testing.assert_array_equal(encoded.codes[:, list(group)] @ weights, POP.codes[:, a])


class _Exact(Release):
    def __init__(self, population: Population) -> None:
        self.population = population

    def answer(self, attrs: Sequence[int]) -> np.ndarray:
        return self.population.marginal(tuple(attrs))


def test_folding_exact_bit_marginals_recovers_the_marginals() -> None:
    encoded, groups = binary_encode(POP)
    release = _BinaryRelease(_Exact(encoded), groups, POP.schema.sizes)
    for query in [(0,), (2,), (0, 2), (1, 2, 3), (0, 1, 2, 3)]:
        np.testing.assert_allclose(release.answer(query), POP.marginal(query), atol=1e-12)


def test_be_through_the_harness_beats_uniform() -> None:
    reps = run_mechanism(POP, BinaryEncoded(), 1.0, 2, queries=6, reps=2, rng=3)
    assert all(r.sse < r.uniform_sse for r in reps) and reps[0].chosen
