"""The planner on attributes of many categories: the error model against the SSE the
pipeline measures on small populations of 8-16 categories per attribute, and a
population without dependence planned for as one (each attribute in a view of its own).

Populations are dense joint tables (4 attributes, 13,440 cells); each repetition splits
the users over the views at random and draws the views' support counts from the
oracles' exact law (:func:`~calmkit_aggregator.reconstruction.uncertainty.sample_support`)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from calmkit_aggregator import reconstruct_by
from calmkit_aggregator.phases import PhasedDesign
from calmkit_aggregator.planning.error_model import Workload, predict_error
from calmkit_aggregator.planning.pilot import (
    pilot_plan,
    plan_after_pilot,
    plan_next_phase,
    profile_from_pilot,
    start_pilot,
)
from calmkit_aggregator.planning.profile import DataProfile, pair_dependence
from calmkit_aggregator.reconstruction.uncertainty import sample_support
from calmkit_client import Plan, Schema
from calmkit_simulator import synthetic_population
from calmkit_simulator.mechanisms.calm import collect_pilot

SIZES = (10, 14, 8, 12)
USERS = 30_000
REPS = 24
MARGIN = 4.0  # standard errors


def _joint(dependent: bool, seed: int) -> np.ndarray:
    """A joint table over SIZES: skewed independent margins, or a mixture of three
    such products (latent classes: every pair depends)."""
    gen = np.random.default_rng(seed)
    classes = 3 if dependent else 1
    weights = gen.dirichlet(np.full(classes, 5.0))
    joint = np.zeros(SIZES)
    for c in range(classes):
        term = np.array(weights[c])
        for size in SIZES:
            term = np.multiply.outer(term, gen.dirichlet(np.full(size, 0.7)))
        joint += term
    out: np.ndarray = joint / joint.sum()
    return out


def _population(joint: np.ndarray, seed: int) -> np.ndarray:
    """(USERS,) flat cell codes drawn from the joint."""
    gen = np.random.default_rng(seed)
    return gen.choice(joint.size, size=USERS, p=joint.reshape(-1))


def _marginal(codes: np.ndarray, attrs: tuple[int, ...]) -> np.ndarray:
    full = np.bincount(codes, minlength=math.prod(SIZES)).reshape(SIZES) / codes.size
    drop = tuple(a for a in range(len(SIZES)) if a not in attrs)
    out: np.ndarray = full.sum(axis=drop)
    return out


def _view_counts(plan: Plan, codes: np.ndarray, gen: np.random.Generator):  # type: ignore[no-untyped-def]
    """Users split at random into equal groups, one per view: per view its user count
    and the true cell counts of its users."""
    cells = np.array(np.unravel_index(codes, SIZES)).T  # (USERS, d)
    groups = np.array_split(gen.permutation(codes.size), plan.m)
    n = np.array([g.size for g in groups], dtype=np.int64)
    counts = []
    for view, members in zip(plan.views, groups):
        index = np.ravel_multi_index(
            tuple(cells[members][:, list(view)].T), tuple(SIZES[a] for a in view)
        )
        counts.append(np.bincount(index, minlength=math.prod(SIZES[a] for a in view)))
    return n, counts


def _measured(plan: Plan, codes: np.ndarray, seed: int) -> tuple[float, float]:
    """Mean SSE over every 3-way query and REPS repetitions, and its standard error."""
    gen = np.random.default_rng(seed)
    queries = list(itertools.combinations(range(len(SIZES)), 3))
    truth = {q: _marginal(codes, q) for q in queries}
    runs = []
    for _ in range(REPS):
        n, counts = _view_counts(plan, codes, gen)
        estimator = reconstruct_by(sample_support(plan, n, counts, gen), "local", True)
        runs.append(
            np.mean([((estimator.answer(q).values - truth[q]) ** 2).sum() for q in queries])
        )
    return float(np.mean(runs)), float(np.std(runs, ddof=1) / math.sqrt(REPS))


def _true_profile(codes: np.ndarray) -> DataProfile:
    d = len(SIZES)
    weights = np.zeros((d, d))
    for a, b in itertools.combinations(range(d), 2):
        weights[a, b] = weights[b, a] = pair_dependence(_marginal(codes, (a, b)))
    margs = [_marginal(codes, (a,)) for a in range(d)]
    mean = float(weights[np.triu_indices(d, 1)].mean())
    return DataProfile.from_marginals(margs, mean, pair_weights=weights if mean > 0 else None)


DESIGNS = {
    "one attribute per view": [[0], [1], [2], [3]],
    "every pair": [list(p) for p in itertools.combinations(range(4), 2)],
    "a chain of pairs": [[0, 1], [1, 2], [2, 3]],
    # a pilot's single views beside pair views whose Norm-Sub clips their noise (how
    # consistency pools them: step 3 of the error model's docstring)
    "every attribute alone and every pair": [[0], [1], [2], [3]]
    + [list(p) for p in itertools.combinations(range(4), 2)],
}


@pytest.mark.parametrize("dependent", [False, True], ids=["independent", "dependent"])
@pytest.mark.parametrize("design", list(DESIGNS))
def test_the_error_model_predicts_the_measured_sse_on_large_domains(
    design: str, dependent: bool
) -> None:
    # the prediction from the population's own profile within 2x of the measured mean
    # SSE (the model's documented accuracy), the measured mean taken within 4 of its
    # standard errors; on the independent population the bias part is 0
    codes = _population(_joint(dependent, seed=3), seed=4)
    plan = Plan(Schema.from_sizes(SIZES), 1.0, DESIGNS[design])
    mean, se = _measured(plan, codes, seed=5)
    profile = _true_profile(codes)
    users = [USERS / plan.m] * plan.m
    pred = predict_error(SIZES, plan.views, users, 1.0, Workload(k=3), profile, n=USERS)
    assert mean - MARGIN * se <= 2 * pred.sse and pred.sse <= 2 * (mean + MARGIN * se), (
        pred,
        mean,
        se,
    )
    if not dependent:
        # the sampled population's pairs carry only its finite-sample dependence
        assert pred.bias < 0.2 * pred.sse


def test_a_pilot_on_independent_large_domains_reads_independence_and_plans_for_it() -> None:
    # independent skewed attributes of 8-14 categories: a pilot of 16,000 users pairs
    # them (its pair views can tell a typical dependence from none), puts the mean
    # dependence below the prior's median, and the plan holds one attribute per view,
    # the best design when nothing depends (a view of two attributes splits their users
    # and adds its cells' noise, and holds nothing)
    codes = _population(_joint(False, seed=7), seed=8)
    schema = Schema.from_sizes(SIZES)
    gen = np.random.default_rng(9)
    pilot = pilot_plan(schema, 1.0, seed=1, users=16_000)
    assert all(len(v) == 2 for v in pilot.views)
    sample = gen.choice(codes.size, size=16_000, replace=False)
    n, counts = _view_counts(pilot, codes[sample], gen)
    support = sample_support(pilot, n, counts, gen)
    assert profile_from_pilot(support).dependence < DataProfile.prior(schema).dependence
    main = plan_after_pilot(support, USERS - 16_000, Workload(k=3), seed=2)
    assert main.choice.l == 1 and sorted(main.plan.views) == [(0,), (1,), (2,), (3,)]


def test_a_pilot_too_small_to_see_pairs_measures_every_attribute_alone() -> None:
    # 3,000 users: pair views of 80-168 cells from 1,500 reports each cannot tell the
    # prior's median dependence from none, so each attribute reports alone
    pilot = pilot_plan(Schema.from_sizes(SIZES), 1.0, seed=1, users=3_000)
    assert sorted(pilot.views) == [(0,), (1,), (2,), (3,)]


@pytest.mark.parametrize("pilot_users", [3_000, 16_000], ids=["alone", "pairs"])
def test_a_plan_says_when_its_pilot_measured_no_pair(pilot_users: int) -> None:
    # 3,000 pilot users measure every attribute alone: the plan's prediction rests on
    # the prior's dependence, and its notes say so; 16,000 measure pairs, and no such
    # note is made
    codes = _population(_joint(True, seed=3), seed=4)
    gen = np.random.default_rng(9)
    pilot = pilot_plan(Schema.from_sizes(SIZES), 1.0, seed=1, users=pilot_users)
    sample = gen.choice(codes.size, size=pilot_users, replace=False)
    n, counts = _view_counts(pilot, codes[sample], gen)
    main = plan_after_pilot(
        sample_support(pilot, n, counts, gen), USERS - pilot_users, Workload(k=3), seed=2
    )
    notes = [x for x in main.choice.notes(["a", "b", "c", "d"]) if "no pair" in x]
    assert len(notes) == (pilot_users == 3_000)
    # four attributes at k = 3: a design of triples holds every query
    assert all(
        x.endswith("which the prediction does not hang on (every query is in a view)")
        for x in notes
    )


def test_a_plan_on_a_pilot_without_pairs_gives_the_range_of_its_prediction() -> None:
    # six attributes of 8-14 categories, 6,000 pilot users at eps 1: every attribute
    # alone, one attribute per view planned; its prediction spans the prior's dependence
    pop = synthetic_population(30_000, sizes=(10, 14, 8, 12, 9, 11), rng=3)
    start = start_pilot(pop.schema, 1.0, pop.n, seed=1)
    assert all(len(v) == 1 for v in start.plan.views)
    design = PhasedDesign(pop.n, start.reports, 3, 1, first_round=start.first_round)
    gen = np.random.default_rng(5)
    choice = plan_next_phase(
        design, collect_pilot(pop, start, design, gen.permutation(pop.n), gen)
    ).choice
    low, high = choice.sse_range
    assert high > 10 * low  # the prior's dependence spans every kind of data
    first, *rest = choice.notes(pop.schema.names)
    assert first == (
        "the pilot measured no pair of attributes (at these users and epsilon a pair's "
        "table cannot tell a typical dependence from none): how strongly the attributes "
        f"depend is the prior's assumption, and the predicted SSE ranges from {low:.3g} "
        f"to {high:.3g} over it"
    )
    # the prior's upper quantiles make views of several attributes lower on average
    assert len(rest) == 1 and " is predicted lower on average " in rest[0]
