"""BE: CALM on binary-encoded attributes (Zhang et al., "CALM: Consistent Adaptive Local
Marginal for Marginal Release under Local Differential Privacy", CCS 2018, §5.3). Each
attribute of c categories becomes ceil(log2 c) bits; CALM runs on the bits with k' = the
bits of the widest k-way query; a query over original attributes is answered over its
bits and the bit patterns are folded back into categories (patterns >= c are not
categories and are dropped, then the table is renormalised)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from calmkit_client import Schema
from calmkit_client.randomness import RngLike

from ..population import Population
from .base import Mechanism, Release
from .calm import Calm

__all__ = ["BinaryEncoded", "binary_encode"]


def binary_encode(population: Population) -> tuple[Population, tuple[tuple[int, ...], ...]]:
    """The population over bits (most significant first) and, per original attribute,
    the positions of its bits."""
    sizes = population.schema.sizes
    widths = [max(1, int(np.ceil(np.log2(c)))) for c in sizes]
    groups, names = [], []
    columns: list[np.ndarray] = []
    for a, (attr, width) in enumerate(zip(population.schema.attributes, widths)):
        start = len(columns)
        codes = population.codes[:, a].astype(np.int64)
        for b in range(width):
            columns.append((codes >> (width - 1 - b)) & 1)
            names.append(f"{attr.name}.b{b}")
        groups.append(tuple(range(start, start + width)))
    bits = np.stack(columns, axis=1).astype(np.uint8)
    schema = Schema.from_domains({name: ("0", "1") for name in names})
    encoded = Population(
        schema, bits, name=f"{population.name} (binary-encoded)", notes=population.notes
    )
    return encoded, tuple(groups)


class _BinaryRelease(Release):
    def __init__(self, inner: Release, groups: Sequence[tuple[int, ...]], sizes: Sequence[int]):
        self.inner, self.groups, self.sizes = inner, tuple(groups), tuple(sizes)

    def answer(self, attrs: Sequence[int]) -> np.ndarray:
        query = tuple(sorted(attrs))
        bits = tuple(b for a in query for b in self.groups[a])
        table = self.inner.answer(bits)  # bits of each attribute are adjacent, in order
        table = table.reshape([2 ** len(self.groups[a]) for a in query])
        table = table[tuple(slice(0, self.sizes[a]) for a in query)]  # valid codes only
        total = table.sum()
        return table / total if total > 0 else np.full(table.shape, 1.0 / table.size)

    def describe(self) -> dict[str, object]:
        return self.inner.describe()


class BinaryEncoded(Mechanism):
    """CALM over the binary encoding (same options as :class:`Calm`)."""

    name = "BE"

    def __init__(self, **calm_options: object) -> None:
        self.calm = Calm(**calm_options)  # type: ignore[arg-type]

    def run(self, population: Population, epsilon: float, k: int, rng: RngLike = None) -> Release:
        encoded, groups = binary_encode(population)
        widths = sorted((len(g) for g in groups), reverse=True)
        k_bits = sum(widths[:k])  # the widest k-way query, in bits
        inner = self.calm.run(encoded, epsilon, k_bits, rng)
        return _BinaryRelease(inner, groups, population.schema.sizes)
