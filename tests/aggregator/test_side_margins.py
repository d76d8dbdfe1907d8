"""A set-aside phase's reports counted in the attributes' margins only
(``SupportCounts.margins_from``, :func:`calmkit_aggregator.reconstruction.estimate.
side_margins`): its views' estimates summed onto each attribute, pooled by inverse
variance with the views' own margins in the consistency step, and nothing else of
the phase (its tables' interactions) reaching the answers; the bootstrap draws the
phase's noise too."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from calmkit_aggregator import reconstruct
from calmkit_aggregator.phases import (
    PILOT_SET_ASIDE,
    answer_support,
    pilot_left_out,
    pilot_set_aside,
)
from calmkit_aggregator.reconstruction.global_model import reconstruct_global
from calmkit_aggregator.reconstruction.support import SupportCounts
from calmkit_aggregator.reconstruction.uncertainty import bootstrap
from calmkit_client import Plan, PlanError
from calmkit_simulator import synthetic_population
from calmkit_simulator.collect import collect_support

EPSILON = 1.0
POP = synthetic_population(n=60_000, sizes=(2,) * 6, max_parents=0, rng=5)
MAIN = Plan(POP.schema, EPSILON, ((0, 1), (2, 3), (4, 5)))
# every attribute in two of the side's pair views; (0, 2) in no main view
SIDE = Plan(POP.schema, EPSILON, ((0, 2), (1, 3), (0, 4), (3, 5), (1, 4), (2, 5)))


def _supports(seed: int, side_share: float = 0.5) -> tuple[SupportCounts, SupportCounts]:
    """The main phase's and the side phase's counts, on disjoint users."""
    gen = np.random.default_rng(seed)
    side_rows = gen.random(POP.n) < side_share
    main = collect_support(POP, MAIN, gen, rows=~side_rows)
    return main, collect_support(POP, SIDE, gen, rows=side_rows)


def _projected(support: SupportCounts, j: int, attr: int) -> tuple[np.ndarray, float]:
    """View j's unbiased estimate summed onto ``attr``, and its variance per cell."""
    plan, n = support.plan, int(support.n[j])
    oracle = plan.view_oracles[j]
    values = oracle.estimate(support.counts[j], n).reshape(plan.schema.shape(plan.views[j]))
    axis = 1 - plan.views[j].index(attr)
    return values.sum(axis=axis), float(oracle.variance(n)) * values.shape[axis]


def _pooled(parts: list[tuple[np.ndarray, float]]) -> np.ndarray:
    precision = np.array([1.0 / var for _, var in parts])
    weights = precision / precision.sum()
    return np.asarray(sum(w * values for w, (values, _) in zip(weights, parts)))


@pytest.mark.parametrize("attr", range(6))
def test_a_margin_pools_the_side_phase_by_inverse_variance(attr: int) -> None:
    # noiseless arithmetic: without shrinkage and with no negative cell to clip, the
    # consistent margin is the inverse-variance mean of the main view's projection and
    # of every side view's that holds the attribute
    main, side = _supports(1)
    estimator = reconstruct(replace(main, margins_from=side), shrink=False)
    assert estimator.views.negativity == 0 and len(estimator.views.tables) == MAIN.m
    j = next(i for i, v in enumerate(MAIN.views) if attr in v)
    parts = [_projected(main, j, attr)]
    parts += [_projected(side, i, attr) for i, v in enumerate(SIDE.views) if attr in v]
    expected = _pooled(parts)
    np.testing.assert_allclose(estimator.answer([attr]).values, expected, rtol=0, atol=1e-9)
    # and not what the main phase alone gives
    alone = reconstruct(main, shrink=False).answer([attr]).values
    assert np.abs(alone - expected).max() > 1e-4


@pytest.mark.parametrize("method", [reconstruct, reconstruct_global])
def test_the_side_phase_tables_interactions_do_not_reach_the_answers(method: object) -> None:
    # (0, 2): one side view holds it, no main view does: its answer is max-ent of the
    # two margins (independence), however the side's table couples them
    main, side = _supports(2)
    estimator = method(replace(main, margins_from=side))  # type: ignore[operator]
    assert len(estimator.views.tables) == MAIN.m
    pair = estimator.answer([0, 2]).values
    m0, m2 = estimator.answer([0]).values, estimator.answer([2]).values
    np.testing.assert_allclose(pair, np.outer(m0, m2), rtol=0, atol=1e-7)
    # the margins did move: the side phase's reports are in them
    alone = method(main)  # type: ignore[operator]
    assert np.abs(alone.answer([0]).values - m0).max() > 1e-4


def test_the_bootstrap_draws_the_side_phase_noise() -> None:
    # a replicate's margin of attribute 0 varies as the pooled estimate does: sum of
    # w_i^2 Var_i over the main view's projection and the side views' (each Var_i the
    # oracle's exact variance of a sum of cells at the replicates' population). A
    # bootstrap that held the side fixed would give w_main^2 Var_main: half of it here,
    # where both phases measure the margin about equally precisely (w_main near 1/2)
    main, side = _supports(3)
    support = replace(main, margins_from=side)
    boot = bootstrap(support, replicates=300, rng=4, shrink=False, plug_in="served")
    est = reconstruct(support, shrink=False)
    m0 = est.answer([0]).values
    parts = []
    for sup, plan in ((main, MAIN), (side, SIDE)):
        for j, view in enumerate(plan.views):
            if 0 in view:
                oracle, n = plan.view_oracles[j], int(sup.n[j])
                other = plan.schema.sizes[view[1 - view.index(0)]]
                exact = oracle.sum_variance(n, m0, other)  # a margin cell sums `other`
                parts.append((np.asarray(exact), float(oracle.variance(n)) * other))
    precision = np.array([1.0 / v for _, v in parts])
    w = precision / precision.sum()
    expected = sum(wi**2 * exact for wi, (exact, _) in zip(w, parts))
    measured = boot.variance([0])
    bound = 4 * np.sqrt(2 / (300 - 1))  # the relative standard error of a variance
    assert np.all(np.abs(measured / expected - 1) < bound), (measured, expected)


def test_margins_from_is_checked() -> None:
    main, side = _supports(4)
    other = synthetic_population(n=100, sizes=(3,) * 6, max_parents=0, rng=1)
    foreign = collect_support(other, Plan(other.schema, EPSILON, ((0, 1),)), 1)
    with pytest.raises(PlanError, match="margins_from must share the schema"):
        replace(main, margins_from=foreign)
    with pytest.raises(PlanError, match="must not itself have margins_from"):
        replace(main, margins_from=replace(side, margins_from=main))
    with pytest.raises(PlanError, match="cannot be merged"):
        replace(main, margins_from=side).merge(main)
    assert replace(main, margins_from=side).pooled().margins_from is side


def test_only_a_pilot_that_passed_its_check_counts_in_the_margins() -> None:
    # a failed pilot's reports may be fakes: they count nowhere
    assert pilot_set_aside(f"passed; {PILOT_SET_ASIDE}")
    assert pilot_left_out(f"passed; {PILOT_SET_ASIDE}")
    assert not pilot_set_aside("passed") and not pilot_left_out("passed")
    failed = "failed: view 0 (phase 0: 0 of 9 reports); phase 1 planned by Algorithm 1"
    assert pilot_left_out(failed) and not pilot_set_aside(failed)
    assert not pilot_set_aside(f"failed: view 0; {PILOT_SET_ASIDE}")
    # what collections stored before (their answers now count the pilot's margins too)
    before = (
        "passed; left out of the answers: the planner predicted them more accurate "
        "without the pilot's small pair tables"
    )
    assert pilot_set_aside(before) and pilot_left_out(before)
    assert "but for the attributes' margins" in PILOT_SET_ASIDE


def test_the_answers_rest_on_both_phases_or_on_the_main_one_with_the_pilot_margins() -> None:
    main, side = _supports(5)
    kept = answer_support(side, main, keeps_pilot=True)
    assert kept.plan.views == SIDE.views + MAIN.views and kept.margins_from is None
    set_aside = answer_support(side, main, keeps_pilot=False)
    assert set_aside.plan == MAIN and set_aside.margins_from is side


# attributes of 2-6 categories, uniform and independent (a view's sampling noise per
# contrast dimension is then exactly the error model's 1 / (L s)); attribute 0 in three
# views, the others in two
