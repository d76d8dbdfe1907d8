"""CALM in the harness plans once per setting: repetitions reuse the views (each with
its own assignment seed and reports); ``replan=True`` plans every repetition."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from calmkit_aggregator import plan_collection
from calmkit_simulator import synthetic_population
from calmkit_simulator.mechanisms import calm as calm_module
from calmkit_simulator.mechanisms.calm import Calm

POP = synthetic_population(n=4000, sizes=(2,) * 7, strength=1.0, rng=3)


@pytest.fixture
def planned(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """Every call of the planner, by keyword arguments; the memo starts empty."""
    calls: list[dict[str, Any]] = []

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        return plan_collection(*args, **kwargs)

    calm_module._setting_views.cache_clear()
    monkeypatch.setattr(calm_module, "plan_collection", counting)
    yield calls
    calm_module._setting_views.cache_clear()


def test_repetitions_share_one_plan(planned: list[dict[str, Any]]) -> None:
    mech = Calm(planner="paper")
    gen = np.random.default_rng(0)
    answers = [mech.run(POP, 1.0, 3, gen).answer((0, 1, 2)) for _ in range(3)]
    other_eps = Calm(planner="paper").run(POP, 2.0, 3, gen)
    assert len(planned) == 2  # one per setting: eps 1 once for three reps, eps 2 once
    assert planned[0]["rng"] == 0
    # the reps are not copies of each other: fresh reports every time
    assert not np.array_equal(answers[0], answers[1])
    assert other_eps.describe()["m"] >= 1
    views = calm_module._setting_views(POP.schema, 1.0, POP.n, 3, mech.theta, None, None, "paper")
    expected = plan_collection(POP.schema, 1.0, POP.n, 3, planner="paper", rng=0).views
    assert views == expected


def test_replan_plans_every_repetition_from_its_seed(planned: list[dict[str, Any]]) -> None:
    mech = Calm(planner="paper", replan=True)
    gen = np.random.default_rng(0)
    for _ in range(3):
        mech.run(POP, 1.0, 3, gen)
    assert len(planned) == 3
    assert len({c["rng"] for c in planned}) == 3


def test_the_planner_benchmarks_grid_tasks_plan_every_repetition(
    planned: list[dict[str, Any]],
) -> None:
    # the planner benchmark's Algorithm 1 and grid tasks ask for new views in every
    # repetition through the task's options; the registry once dropped that option in
    # silence, and every repetition measured one draw of the views (seed 0)
    from calmkit_simulator.planner_bench import planner_tasks
    from calmkit_simulator.tasks import Task, run_task

    grid = [t.task for t in planner_tasks(reps=1, quick=True) if t.role != "default"]
    assert grid and all(dict(t.options).get("replan") is True for t in grid)
    options = dict(grid[0].options) | {"l": 2, "m": 5}
    task = Task("csv:pop", "calm", 1.0, 3, 3, options=tuple(options.items()), reps=3, queries=5)
    result = run_task(task, population=POP)
    assert result["status"] == "ok"
    assert len(planned) == 3 and len({c["rng"] for c in planned}) == 3


def test_the_model_check_scores_the_views_each_repetition_measured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the planner benchmark's model column averages the error model over the views of
    # its first repetitions: they must be the very views those repetitions measured
    from calmkit_simulator import planner_bench
    from calmkit_simulator.tasks import Task, run_task

    measured: list[tuple[tuple[int, ...], ...]] = []
    real = calm_module.collect_support

    def recording(population: Any, plan: Any, *args: Any, **kwargs: Any) -> Any:
        measured.append(plan.views)
        return real(population, plan, *args, **kwargs)

    monkeypatch.setattr(calm_module, "collect_support", recording)
    setting = planner_bench.Setting("csv:pop", "pop", 3, (1.0,))
    options = (("planner", "paper"), ("replan", True), ("l", 2), ("m", 6))
    task = Task("csv:pop", "calm", 1.0, 3, 3, options=options, reps=3, queries=5, shared_seed=True)
    run_task(task, population=POP)
    grid = planner_bench.PlannerTask(setting, 1.0, "grid", task, 2, 6)
    planned = [planner_bench.repetition_plan(grid, POP.schema, POP.n, r).views for r in range(3)]
    assert planned == measured
    assert len(set(planned)) == 3  # fresh views in every repetition
