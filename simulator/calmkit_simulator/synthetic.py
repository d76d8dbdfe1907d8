"""Synthetic populations from a random Bayesian network (the default data set).

Attribute i draws up to ``max_parents`` parents among attributes 0..i-1; each row of
its conditional probability table is ``softmax(strength * z)``, ``z`` standard normal.
``strength = 0`` gives independent uniform attributes; larger values give sharper,
more strongly correlated ones. Sampling is ancestral and vectorised over users.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from calmkit_client import CalmkitError, Schema
from calmkit_client.randomness import RngLike

from .population import Population, cells_of

__all__ = ["DEMO_SIZES", "BayesianNetwork", "demo_population", "synthetic_population"]

# The demo's attributes: 8, of 2-4 categories (`calmkit demo`, dataset "demo").
DEMO_SIZES = (2, 3, 2, 2, 4, 2, 3, 2)

_BLOCK = 1 << 18  # users per block when sampling


@dataclass(frozen=True)
class BayesianNetwork:
    """A discrete Bayesian network in topological order.

    ``parents[i]`` are attribute positions < i; ``cpts[i]`` has shape
    ``(prod(sizes of parents), sizes[i])``, rows summing to 1, parent configurations
    in C order (first parent most significant).
    """

    schema: Schema
    parents: tuple[tuple[int, ...], ...]
    cpts: tuple[np.ndarray, ...]

    @classmethod
    def random(
        cls,
        sizes: Sequence[int],
        strength: float = 1.5,
        max_parents: int = 2,
        rng: RngLike = None,
    ) -> BayesianNetwork:
        """A random network over attributes with ``sizes`` categories (seeded by ``rng``)."""
        if not (np.isfinite(strength) and strength >= 0):
            raise CalmkitError(f"strength ({strength!r}) must be finite and >= 0")
        if isinstance(max_parents, bool) or not isinstance(max_parents, int) or max_parents < 0:
            raise CalmkitError(f"max_parents ({max_parents!r}) must be an int >= 0")
        gen = np.random.default_rng(rng)
        schema = Schema.from_sizes(sizes)
        parents, cpts = [], []
        for i, size in enumerate(schema.sizes):
            k = min(i, max_parents)
            pa = tuple(sorted(gen.choice(i, size=k, replace=False).tolist())) if k else ()
            rows = int(np.prod([schema.sizes[p] for p in pa], dtype=np.int64))
            logits = strength * gen.standard_normal((rows, size))
            logits -= logits.max(axis=1, keepdims=True)
            table = np.exp(logits)
            parents.append(pa)
            cpts.append(table / table.sum(axis=1, keepdims=True))
        return cls(schema, tuple(parents), tuple(cpts))

    def sample(self, n: int, rng: RngLike = None) -> np.ndarray:
        """Codes (n, d) of n independent records (inverse-CDF per attribute), in
        ``schema.code_dtype``."""
        gen = np.random.default_rng(rng)
        # the schema's smallest code dtype: an (n, d) int64 array would be 8x the codes
        codes = np.zeros((n, self.schema.d), dtype=self.schema.code_dtype)
        for i, (pa, cpt) in enumerate(zip(self.parents, self.cpts)):
            cum = np.cumsum(cpt, axis=1)
            for lo in range(0, n, _BLOCK):  # in blocks: O(block) temporaries
                block = codes[lo : lo + _BLOCK]
                # one draw per user and attribute, in this order (block draws continue
                # the generator's stream: the same values as one draw of n)
                u = gen.random((block.shape[0],))
                config = cells_of(self.schema, block, pa)  # columns < i, in range
                below = u[:, None] >= cum[config]  # (block, size_i)
                block[:, i] = np.minimum(below.sum(axis=1), cpt.shape[1] - 1)
        return codes

    def joint(self) -> np.ndarray:
        """The exact joint distribution, shape ``schema.sizes`` (small domains only)."""
        cells = self.schema.cells(range(self.schema.d))
        if cells > 1 << 22:
            raise CalmkitError(f"joint ({cells} cells) must have at most {1 << 22} cells")
        allcodes = self.schema.cell_codes(np.arange(cells), range(self.schema.d))
        prob = np.ones(cells)
        for i, (pa, cpt) in enumerate(zip(self.parents, self.cpts)):
            config = self.schema.cell_index(allcodes, pa) if pa else np.zeros(cells, np.int64)
            prob *= cpt[config, allcodes[:, i]]
        return prob.reshape(self.schema.sizes)


def synthetic_population(
    n: int = 1 << 16,
    sizes: Sequence[int] = (2,) * 8,
    strength: float = 1.5,
    max_parents: int = 2,
    rng: RngLike = 0,
) -> Population:
    """n users sampled from :meth:`BayesianNetwork.random` (network and users seeded
    from ``rng``)."""
    gen = np.random.default_rng(rng)
    net = BayesianNetwork.random(sizes, strength, max_parents, gen)
    note = (
        f"synthetic Bayesian network: strength {strength}, max {max_parents} parents, seed {rng!r}"
    )
    return Population(net.schema, net.sample(n, gen), "synthetic", (note,))


def demo_population(n: int = 100_000, rng: RngLike = 0) -> Population:
    """The population ``calmkit demo --users n --seed rng`` collects from: n users of a
    random Bayesian network over :data:`DEMO_SIZES` (strength 1.5)."""
    return synthetic_population(n=n, sizes=DEMO_SIZES, strength=1.5, rng=rng)
