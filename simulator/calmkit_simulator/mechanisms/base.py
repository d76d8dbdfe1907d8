"""The mechanism interface of the evaluation harness (CALM, CCS 2018, §3, §5).

A :class:`Mechanism` takes a population (LDP: each user reports once through the
oracle classes; central: the dataset itself), epsilon, the workload size k and an
``rng``, and returns a :class:`Release` that answers marginal queries. The harness
never special-cases a mechanism: CALM is one of them. A mechanism that cannot run a
setting raises :class:`NotScalable` from :meth:`Mechanism.check`, before any work.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import numpy as np

from calmkit_client import CalmkitError, Schema
from calmkit_client.randomness import RngLike

from ..population import Population

__all__ = ["Mechanism", "NotScalable", "Release"]


class NotScalable(CalmkitError):
    """The mechanism cannot run this setting (memory, users per group, ...); the
    message says why, and the harness reports the method as not scalable."""


class Release(ABC):
    """What a mechanism publishes: answers to marginal queries."""

    @abstractmethod
    def answer(self, attrs: Sequence[int]) -> np.ndarray:
        """The marginal over sorted attribute positions ``attrs`` as fractions,
        shape ``schema.shape(attrs)``, float64, summing to 1."""

    def answer_many(self, queries: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """:meth:`answer` for each query; mechanisms override it where answering a
        batch together is faster (e.g. EM's iterations over all queries at once)."""
        return [self.answer(q) for q in queries]

    def describe(self) -> dict[str, object]:
        """Parameters the mechanism chose (e.g. CALM's m and l), for reports."""
        return {}


class Mechanism(ABC):
    """One way to release k-way marginals under epsilon.

    ``name`` is the short label of the paper's figures (``CALM``, ``FC``, ...);
    ``privacy_unit`` says what epsilon protects (one user's record, locally or
    centrally).
    """

    name: str = ""
    privacy_unit: str = "epsilon-LDP: each user's record, on the device"

    def check(self, schema: Schema, n: int, epsilon: float, k: int) -> None:
        """Raise :class:`NotScalable` if this setting cannot run; default: it can."""
        return None

    @abstractmethod
    def run(self, population: Population, epsilon: float, k: int, rng: RngLike = None) -> Release:
        """Collect (or compute) under ``epsilon`` and return the release."""
