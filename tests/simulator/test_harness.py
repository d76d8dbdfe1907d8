"""The mechanism interface: the harness checks feasibility first, runs any mechanism
the same way, and records runtime and the mechanism's choices."""

from __future__ import annotations

import pytest

from calmkit_client import CalmkitError
from calmkit_simulator import synthetic_population
from calmkit_simulator.experiment import run_mechanism
from calmkit_simulator.mechanisms import (
    Calm,
    NotScalable,
    Uniform,
    make_mechanism,
    task_mechanism,
)
from calmkit_simulator.tasks import Task, run_task
from tests.simulator.mechs import Refuses

POP = synthetic_population(n=8000, sizes=(2, 3, 2, 2), strength=1.5, rng=1)


def test_infeasible_setting_fails_before_any_work() -> None:
    mech = Refuses()
    with pytest.raises(NotScalable, match=r"n \(8000\)"):
        run_mechanism(POP, mech, 1.0, 2, queries=3, reps=1)
    assert not mech.ran


def test_uniform_through_the_harness_is_the_uniform_reference() -> None:
    for rep in run_mechanism(POP, Uniform(), 1.0, 2, queries=5, reps=2, rng=0):
        assert rep.sse == pytest.approx(rep.uniform_sse, rel=1e-12)


def test_calm_records_its_choice_and_time() -> None:
    reps = run_mechanism(POP, Calm(), 1.0, 2, queries=5, reps=2, rng=0)
    keys = {"m", "l", "pilot_m", "predicted_sse"}
    assert all(r.seconds > 0 and keys <= set(r.chosen) for r in reps)
    paper = run_mechanism(POP, Calm(planner="paper"), 1.0, 2, queries=5, reps=1, rng=0)
    assert set(paper[0].chosen) == {"m", "l"}
    assert all(r.sse < r.uniform_sse for r in reps)


def test_make_mechanism_passes_only_understood_options() -> None:
    calm = make_mechanism("calm", theta=0.01, m=3, l=2, path="fast", shrink=False)
    assert isinstance(calm, Calm) and (calm.m, calm.l, calm.shrink) == (3, 2, False)
    assert isinstance(make_mechanism("uni", theta=0.01), Uniform)


def test_a_task_option_its_mechanism_does_not_take_is_an_error() -> None:
    # calmkit simulate passes every flag to every mechanism, which ignores the others;
    # an experiment's task names its mechanism's own options, and one dropped in
    # silence would measure another experiment than the one reported
    assert isinstance(make_mechanism("uni", theta=0.01), Uniform)
    with pytest.raises(CalmkitError, match=r"options \['replans'\] are not options of"):
        task_mechanism("calm", {"replans": True})
    assert task_mechanism("calm", {"replan": True, "l": 2}).replan
    task = Task("synthetic", "uni", 1.0, 2, 2, options=(("rounds", 3),), reps=1, queries=2)
    with pytest.raises(CalmkitError, match=r"\['rounds'\]"):
        run_task(task)
