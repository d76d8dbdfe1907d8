"""Uni: every marginal is uniform (the reference point of CALM (Zhang et al., "CALM:
Consistent Adaptive Local Marginal for Marginal Release under Local Differential
Privacy", CCS 2018), §5.1)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from calmkit_client import Schema
from calmkit_client.randomness import RngLike

from ..population import Population
from .base import Mechanism, Release

__all__ = ["Uniform"]


class _UniformRelease(Release):
    def __init__(self, schema: Schema) -> None:
        self.schema = schema

    def answer(self, attrs: Sequence[int]) -> np.ndarray:
        shape = self.schema.shape(tuple(sorted(attrs)))
        return np.full(shape, 1.0 / float(np.prod(shape)))


class Uniform(Mechanism):
    """Answers every query with the uniform table; reads nothing from users."""

    name = "Uni"
    privacy_unit = "no data used"

    def run(self, population: Population, epsilon: float, k: int, rng: RngLike = None) -> Release:
        return _UniformRelease(population.schema)
