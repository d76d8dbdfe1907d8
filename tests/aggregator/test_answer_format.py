"""How ``calmkit query`` prints a marginal (calmkit_aggregator.service.answer_format)."""

from __future__ import annotations

import numpy as np

from calmkit_aggregator.service.answer_format import format_answer
from calmkit_aggregator.service.console_pages import marginal_section
from calmkit_client.wire import MarginalAnswer


def _answer(values: list[list[float]], variance: list[list[float]]) -> MarginalAnswer:
    return MarginalAnswer(
        ("a", "b"), np.array(values), np.array(variance), "maxent", 0.0, 900, "closed", "m"
    )


def test_a_table_says_what_cells_at_zero_with_no_error_mean() -> None:
    # Norm-Sub can set a rare cell to 0 in the answer and in every bootstrap
    # replicate, so its cells are served 0 +- 0: the table says that is a resolution
    # limit, not an empty cell; no such cell, no such line
    zero = _answer([[0.5, 0.0], [0.3, 0.2]], [[1e-4, 0.0], [1e-4, 1e-4]])
    text = format_answer(zero, "table")
    assert "1 cell(s) at 0 with total.err 0: below what the reports can resolve" in text
    fine = _answer([[0.5, 0.0], [0.3, 0.2]], [[1e-4, 1e-6], [1e-4, 1e-4]])
    assert "below what the reports can resolve" not in format_answer(fine, "table")
    exact = _answer([[0.5, 0.1], [0.3, 0.1]], [[0.0, 0.0], [0.0, 0.0]])  # no zero value
    assert "below what the reports can resolve" not in format_answer(exact, "table")


def test_the_console_says_it_too() -> None:
    zero = _answer([[0.5, 0.0], [0.3, 0.2]], [[1e-4, 0.0], [1e-4, 1e-4]])
    labels = [["0", "1"], ["0", "1"]]
    assert "id=unresolved>1 cell(s) at 0" in marginal_section("c", zero, labels, "local")
    fine = _answer([[0.5, 0.0], [0.3, 0.2]], [[1e-4, 1e-6], [1e-4, 1e-4]])
    assert "id=unresolved" not in marginal_section("c", fine, labels, "local")
