"""Per-view estimation: ``(C/n_j - q)/(p - q)`` with the oracle's variance, and a view
nobody reported on is uniform with infinite variance (and does not stop the others)."""

from __future__ import annotations

import numpy as np

from calmkit_aggregator import SupportCounts, estimate_views
from calmkit_client import Plan, Schema

SCHEMA = Schema.from_sizes((2, 3, 2))
# eps 1, oracles fixed: GRR on 6 cells, OUE on 6, GRR on 4
PLAN = Plan(SCHEMA, 1.0, [[0, 1], [1, 2], [0, 2]], oracles=("GRR", "OUE", "GRR"), seed=1)


def test_views_without_reports_are_uniform_and_the_rest_are_estimated() -> None:
    counts = (np.array([5, 0, 1, 2, 0, 3]), np.zeros(6, dtype=np.int64), np.array([1, 0, 0, 0]))
    support = SupportCounts(PLAN, np.array([11, 0, 1]), counts)
    first, empty, single = estimate_views(support)
    assert empty.attrs == (1, 2) and empty.n == 0 and empty.variance == np.inf
    assert np.array_equal(empty.values, np.full((3, 2), 1 / 6))
    for table, j, n in ((first, 0, 11), (single, 2, 1)):  # one report is not zero
        oracle = PLAN.view_oracles[j]
        expected = (counts[j] / n - oracle.q) / (oracle.p - oracle.q)
        assert table.n == n and table.variance == oracle.variance(n)
        np.testing.assert_array_equal(table.values.reshape(-1), expected)
        assert table.values.shape == SCHEMA.shape(PLAN.views[j])
