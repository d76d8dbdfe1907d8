"""Populations, the synthetic Bayesian network, and their marginals."""

from __future__ import annotations

import numpy as np
import pytest

from calmkit_client import Attribute, CalmkitError, Schema
from calmkit_simulator import BayesianNetwork, Population, synthetic, synthetic_population
from calmkit_simulator import population as population_module
from tests.stats import assert_chisquare


def test_synthetic_is_seeded_and_correlated() -> None:
    a = synthetic_population(n=20_000, sizes=(2, 3, 2, 4), strength=2.0, rng=5)
    b = synthetic_population(n=20_000, sizes=(2, 3, 2, 4), strength=2.0, rng=5)
    np.testing.assert_array_equal(a.codes, b.codes)
    c = synthetic_population(n=20_000, sizes=(2, 3, 2, 4), strength=2.0, rng=6)
    assert not np.array_equal(a.codes, c.codes)
    assert a.schema.sizes == (2, 3, 2, 4)


def test_samples_follow_the_exact_joint() -> None:
    net = BayesianNetwork.random((2, 3, 2, 3), strength=2.0, max_parents=2, rng=1)
    joint = net.joint()
    assert joint.shape == (2, 3, 2, 3) and joint.sum() == pytest.approx(1.0, rel=1e-12)
    n = 200_000
    codes = net.sample(n, rng=2)
    observed = np.bincount(net.schema.cell_index(codes, range(4)), minlength=36)
    assert_chisquare(observed, n * joint.reshape(-1))


def test_strength_zero_means_independent_uniform() -> None:
    net = BayesianNetwork.random((2, 2, 3), strength=0.0, rng=1)
    np.testing.assert_allclose(net.joint(), np.full((2, 2, 3), 1 / 12), rtol=1e-12)
    strong = BayesianNetwork.random((2, 2, 3), strength=3.0, rng=1).joint()
    # dependence: the joint is not the product of its 1-way marginals
    prod = np.einsum("i,j,k->ijk", strong.sum((1, 2)), strong.sum((0, 2)), strong.sum((0, 1)))
    assert np.abs(strong - prod).max() > 0.01


def test_marginal_resample_select() -> None:
    schema = Schema((Attribute("x", ("a", "b")), Attribute("y", ("p", "q", "r"))))
    pop = Population(schema, np.array([[0, 0], [0, 2], [1, 2], [1, 2]]))
    np.testing.assert_allclose(pop.marginal(["y"]), [0.25, 0, 0.75])
    np.testing.assert_array_equal(pop.counts(["y", "x"]), [[1, 0], [0, 0], [1, 2]])
    big = pop.resample(40_000, rng=3)
    assert big.n == 40_000 and "with replacement from 4" in big.notes[-1]
    assert_chisquare(big.counts(["x", "y"]).reshape(-1)[[0, 2, 5]], [10_000, 10_000, 20_000])
    assert pop.select(["y"]).schema.names == ("y",)
    with pytest.raises(CalmkitError, match=r"n \(0\) must be an int >= 1"):
        pop.resample(0)


def test_cap_categories_ordered_and_nominal() -> None:
    schema = Schema(
        (Attribute("age", tuple("abcdef"), ordered=True), Attribute("color", tuple("uvwxyz")))
    )
    codes = np.array([[i % 6, (i * 7) % 6 if i % 3 else 0] for i in range(600)])
    pop = Population(schema, codes)
    capped = pop.cap_categories(3)
    assert capped.schema.sizes == (3, 3)
    assert capped.schema.attributes[0].categories == ("a..b", "c..d", "e..f")
    assert capped.schema.attributes[1].categories[-1] == "other"
    # merging preserves users: group totals are sums of the merged categories
    np.testing.assert_array_equal(capped.counts(["age"]), [200, 200, 200])
    kept = capped.schema.attributes[1].categories[:2]
    top = pop.counts(["color"])
    assert sorted(top[[schema.attributes[1].categories.index(k) for k in kept]]) == sorted(
        np.sort(top)[-2:]
    )


def test_synthetic_codes_in_the_schemas_smallest_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sampled straight into ``code_dtype`` (uint8 here) and in blocks of users (700
    here): an int64 (n, d) working array would be 8x the population, and the sampled
    records are unchanged by either."""
    monkeypatch.setattr(synthetic, "_BLOCK", 700)
    net = BayesianNetwork.random((2, 3, 2, 4), strength=1.0, rng=5)
    codes = net.sample(4000, rng=6)
    assert codes.dtype == np.uint8
    # the same draws through the validated (int64) cell index
    gen = np.random.default_rng(6)
    wide = np.zeros(codes.shape, dtype=np.int64)
    for i, (pa, cpt) in enumerate(zip(net.parents, net.cpts)):
        config = net.schema.cell_index(wide, pa) if pa else np.zeros(len(wide), np.int64)
        cum = np.cumsum(cpt, axis=1)[config]
        wide[:, i] = np.minimum(
            (gen.random(len(wide))[:, None] >= cum).sum(axis=1), cpt.shape[1] - 1
        )
    assert np.array_equal(codes, wide)


def test_counts_in_blocks_equal_one_bincount(monkeypatch: pytest.MonkeyPatch) -> None:
    pop = synthetic_population(n=3001, sizes=(2, 3, 4), strength=1.0, rng=4)
    expected = np.bincount(pop.schema.cell_index(pop.codes, (0, 2)), minlength=8).reshape(2, 4)
    monkeypatch.setattr(population_module, "_BLOCK", 1000)
    assert np.array_equal(pop.counts((0, 2)), expected)
