"""The one-report path leaks nothing through how it runs: the same Python lines in the
same order and the same random draws, whatever the true cell and the outcome. (Wall-
clock timing is measured in benchmarks/timing_channel.py, not here.)"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import pytest

import calmkit_client
from calmkit_client import GRR, OUE, Attribute, FrequencyOracle, Plan, Schema, make_report
from tests.stats import assert_chisquare, z_bound

SCHEMA = Schema(
    (
        Attribute("a", ("x", "y", "z", "w")),  # 4 x 2 = 8 cells: GRR
        Attribute("b", ("p", "q")),
        Attribute("c", tuple(f"c{i}" for i in range(40))),  # 4 x 40 = 160 cells: OUE
    )
)
PLAN = Plan(SCHEMA, 1.0, [["a", "b"], ["a", "c"]], seed=2)


CLIENT = str(Path(calmkit_client.__file__).parent)


def _trace(call: Callable[..., Any], *args: Any) -> tuple[Any, list[tuple[str, int]]]:
    """(result, every line of calmkit_client executed by ``call(*args)``, in order; other
    code, e.g. a garbage collector's finaliser that happens to run, is left out)."""
    lines: list[tuple[str, int]] = []

    def tracer(frame: FrameType, event: str, arg: object) -> Any:
        if event == "line" and frame.f_code.co_filename.startswith(CLIENT):
            lines.append((frame.f_code.co_filename, frame.f_lineno))
        return tracer

    sys.settrace(tracer)
    try:
        result = call(*args)
    finally:
        sys.settrace(None)
    return result, lines


@pytest.mark.parametrize("oracle", [GRR(1.0, 4), GRR(3.0, 7), OUE(1.0, 9), OUE(0.5, 64)], ids=repr)
def test_perturb_one_runs_the_same_lines_for_every_cell_and_outcome(
    oracle: FrequencyOracle,
) -> None:
    oracle.perturb_one(0)  # warm the cached thresholds
    traces: dict[tuple[int, bool], list[tuple[str, int]]] = {}
    for seed in range(60):
        cell = seed % oracle.L
        out, lines = _trace(oracle.perturb_one, cell, np.random.default_rng(seed))
        kept = (
            out == cell
            if oracle.name == "GRR"
            else bool(np.unpackbits(np.frombuffer(out, dtype=np.uint8))[cell])
        )
        traces[(cell, kept)] = lines
    # GRR: both kept and flipped for several cells, and wraps (output below the input)
    assert {k for _, k in traces} == {True, False}
    first = next(iter(traces.values()))
    assert first and all(lines == first for lines in traces.values())


@pytest.mark.parametrize("view", [0, 1])  # GRR (12 cells), OUE (160 cells)
def test_make_report_runs_the_same_lines_and_draws_for_every_record(
    view: int, entropy_draws: list[int]
) -> None:
    user = next(u for u in range(1000) if PLAN.assign(u) == view)
    oracle = PLAN.oracle(view)
    make_report(PLAN, {"a": "x", "b": "p", "c": "c0"}, user)  # warm cached properties
    traces, draws, outcomes = [], [], set()
    for i in range(80):
        record = {"a": "xyzw"[i % 4], "b": "pq"[i % 2], "c": f"c{(7 * i) % 40}"}
        entropy_draws.clear()
        report, lines = _trace(make_report, PLAN, record, user)
        traces.append(lines)
        draws.append(list(entropy_draws))
        cell = sum(
            SCHEMA.encode_record(record)[a] * s
            for a, s in zip(PLAN.views[view], PLAN.view_strides[view])
        )
        if oracle.name == "GRR":
            outcomes.add(report.payload == cell)
    assert all(t == traces[0] for t in traces)
    assert all(d == draws[0] for d in draws) and sum(draws[0]) > 0
    if oracle.name == "GRR":
        assert outcomes == {True, False}


def test_oue_one_report_draws_do_not_depend_on_the_outcome(entropy_draws: list[int]) -> None:
    # the batch sampler draws extra words on top-byte ties; one report must not
    oracle = OUE(1.0, 200)
    seen = set()
    for cell in range(200):
        entropy_draws.clear()
        oracle.perturb_one(cell)
        seen.add(tuple(entropy_draws))
    assert seen == {(8 * 201,)}


@pytest.mark.parametrize(("epsilon", "L"), [(0.5, 4), (2.0, 9)])
def test_grr_one_report_realises_its_likelihoods(epsilon: float, L: int) -> None:
    oracle = GRR(epsilon, L)
    n, cell = 20_000, L - 2
    rng = np.random.default_rng(5)
    out = np.array([oracle.perturb_one(cell, rng) for _ in range(n)])
    expected = n * np.array([float(oracle.likelihood(y, cell)) for y in range(L)])
    assert_chisquare(np.bincount(out, minlength=L), expected)


@pytest.mark.parametrize(("epsilon", "L"), [(0.5, 4), (2.0, 13)])
def test_oue_one_report_realises_its_bit_probabilities(epsilon: float, L: int) -> None:
    oracle = OUE(epsilon, L)
    n, cell = 20_000, 1
    rng = np.random.default_rng(6)
    payloads = np.frombuffer(b"".join(oracle.perturb_one(cell, rng) for _ in range(n)), np.uint8)
    counts = oracle.support(payloads.reshape(n, -1))
    probs = np.full(L, oracle.q)
    probs[cell] = 0.5
    z = (counts - n * probs) / np.sqrt(n * probs * (1 - probs))
    assert np.all(np.abs(z) <= z_bound(L))
