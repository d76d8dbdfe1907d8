"""Pilot views drawn as the oracle draws reports (shared by the profile, dependence and
planner tests)."""

from __future__ import annotations

import numpy as np

from calmkit_aggregator.reconstruction.marginal import MarginalTable
from calmkit_client import FrequencyOracle, choose_oracle


def pair_tables(
    truth: np.ndarray, n: int, eps: float, count: int, seed: int, attrs: tuple[int, int] = (0, 1)
) -> tuple[list[MarginalTable], FrequencyOracle]:
    """``count`` estimated views of the pair ``attrs`` whose true table is ``truth``
    (la, lb), each from ``n`` reports, with the oracle a plan would choose."""
    oracle = choose_oracle(truth.size, eps)
    gen = np.random.default_rng(seed)
    p, q = oracle.p, oracle.q
    flat = truth.reshape(-1) / truth.sum()
    if oracle.name == "GRR":
        counts = gen.multinomial(n, (p - q) * flat + q, size=count)
    else:
        cells = gen.multinomial(n, flat, size=count)
        counts = gen.binomial(cells, p) + gen.binomial(n - cells, q)
    estimates = ((counts / n - q) / (p - q)).reshape(count, *truth.shape)
    tables = [MarginalTable(attrs, est, oracle.variance(n), n) for est in estimates]
    return tables, oracle
