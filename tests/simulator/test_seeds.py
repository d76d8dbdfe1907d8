"""One seed, independent streams: runs that differ only in the method, the planner or
(l, m) answer the same queries on the same users, in every repetition."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from calmkit_client import cli
from calmkit_simulator import classify as classify_module
from calmkit_simulator import synthetic_population, tasks
from calmkit_simulator.classify import ClassificationSetting
from calmkit_simulator.experiment import run_calm, run_mechanism
from calmkit_simulator.mechanisms import Calm, FullContingency, Uniform
from calmkit_simulator.seeds import METHOD, stream
from calmkit_simulator.tasks import Task, run_task

POP = synthetic_population(n=6000, sizes=(2, 3, 2, 2, 2), strength=1.5, rng=4)


class Draws(Uniform):
    """Uniform's answers after drawing ``count`` numbers; records its first draw."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.first: list[float] = []

    def run(self, population, epsilon, k, rng=None):  # type: ignore[no-untyped-def]
        draws = np.random.default_rng(rng).random(self.count)
        self.first.append(float(draws[0]))
        return super().run(population, epsilon, k, rng)


def _queries(reps: list[Any]) -> list[tuple[tuple[int, ...], ...]]:
    return [rep.queries for rep in reps]


def test_methods_and_plans_answer_the_same_queries_in_every_repetition() -> None:
    mechanisms = [
        Calm(planner="paper", l=1, m=5),
        Calm(planner="paper", l=2, m=8),
        Calm(),
        FullContingency(),
        Uniform(),
    ]
    runs = [run_mechanism(POP, m, 1.0, 3, queries=4, reps=3, rng=7) for m in mechanisms]
    uniform = [[r.uniform_sse for r in run] for run in runs]
    assert all(u == uniform[0] for u in uniform)
    assert len(set(uniform[0])) == 3  # the repetitions' queries differ
    assert all(_queries(run) == _queries(runs[0]) for run in runs)
    assert all(len(qs) == 4 and all(len(q) == 3 for q in qs) for qs in _queries(runs[0]))
    other = run_mechanism(POP, mechanisms[0], 1.0, 3, queries=4, reps=3, rng=8)
    assert _queries(other) != _queries(runs[0])


def test_a_task_run_on_another_population_scores_against_that_populations_truths() -> None:
    # the truths are memoised per task and repetition; a caller passing another
    # population under the same task (a copy with its columns permuted) was scored
    # against the first population's truths
    from calmkit_simulator.population import Population

    gen = np.random.default_rng(5)
    shuffled = np.column_stack([gen.permutation(c) for c in POP.codes.T])
    other = Population(POP.schema, shuffled)
    task = Task("csv:pop", "uni", 1.0, 3, 3, reps=2, queries=4, seed=7)
    a, b = run_task(task, population=POP), run_task(task, population=other)
    again = run_task(task, population=POP)
    queries = tasks._queries(task, other, 0)[0]
    truths = [other.marginal(q) for q in queries]
    expected = np.mean([float(((t - 1 / t.size) ** 2).sum()) for t in truths])
    assert b["uniform"][0] == pytest.approx(expected, rel=1e-12)
    assert a["uniform"] != b["uniform"] and again["uniform"] == a["uniform"]


def test_the_queries_do_not_depend_on_how_much_randomness_the_method_draws() -> None:
    few, many = Draws(1), Draws(100_000)
    a = run_mechanism(POP, few, 1.0, 2, queries=3, reps=4, rng=3)
    b = run_mechanism(POP, many, 1.0, 2, queries=3, reps=4, rng=3)
    assert [r.uniform_sse for r in a] == [r.uniform_sse for r in b]
    assert _queries(a) == _queries(b)
    # the method's own stream is the method's in no way: the same per repetition,
    # fresh in each
    assert few.first == many.first and len(set(few.first)) == 4


def test_the_streams_are_the_documented_keyed_seed_sequences() -> None:
    from calmkit_simulator.seeds import METHOD, POPULATION, QUERIES, stream

    mech = Draws(1)
    reps = run_mechanism(POP, mech, 1.0, 2, queries=3, reps=2, rng=11)
    for r, rep in enumerate(reps):
        expected = np.random.default_rng(stream(11, METHOD, r)).random()
        assert mech.first[r] == expected
        first = np.random.default_rng(stream(11, QUERIES, r)).choice(POP.d, 2, replace=False)
        assert rep.queries[0] == tuple(sorted(first.tolist()))
    # independent of each other and of the root seed (no stream is another's prefix)
    states = {
        tuple(s.generate_state(4))
        for s in (
            np.random.SeedSequence(11),
            stream(11, POPULATION),
            stream(11, QUERIES, 0),
            stream(11, METHOD, 0),
        )
    }
    assert len(states) == 4


def test_run_calm_reports_and_queries_are_separate_streams() -> None:
    from calmkit_client import Plan

    plans = [Plan(POP.schema, 1.0, [[0, 1], [2, 3], [1, 4]]), Plan(POP.schema, 1.0, [[0, 1, 2]])]
    runs = [run_calm(POP, p, 2, queries=4, reps=3, rng=5) for p in plans]
    assert [r.uniform_sse for r in runs[0]] == [r.uniform_sse for r in runs[1]]
    assert len({r.uniform_sse for r in runs[0]}) == 3


SIMULATE = [
    "simulate",
    "--dataset",
    "synthetic",
    "--d",
    "6",
    "--n",
    "3000",
    "--k",
    "3",
    "--epsilon",
    "1",
    "--queries",
    "4",
    "--reps",
    "3",
    "--json",
]


def _simulate(extra: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert cli.main([*SIMULATE, *extra]) == 0
    return dict(json.loads(capsys.readouterr().out))


def test_simulate_runs_that_differ_in_the_method_share_queries_and_users(
    capsys: pytest.CaptureFixture[str],
) -> None:
    variants = [
        [],
        ["--planner", "paper"],
        ["--planner", "paper", "--l", "1", "--m", "6"],
        ["--planner", "paper", "--l", "2", "--m", "12"],
        ["--mechanism", "fc"],
        ["--mechanism", "uni"],
    ]
    outs = [_simulate(v, capsys) for v in variants]
    assert len({o["uniform_sse_mean"] for o in outs}) == 1
    assert len({o["sse_mean"] for o in outs}) == len(outs)  # the methods did differ
    reps = [o["reps"] for o in outs]
    for rep in reps:
        assert [r["uniform_sse"] for r in rep] == [r["uniform_sse"] for r in reps[0]]
        assert [r["queries"] for r in rep] == [r["queries"] for r in reps[0]]
    assert all(o["seed"] == 0 for o in outs)
    other = _simulate(["--seed", "1"], capsys)
    assert [r["queries"] for r in other["reps"]] != [r["queries"] for r in reps[0]]
    assert other["seed"] == 1


def _toy_setting() -> ClassificationSetting:
    pop = synthetic_population(n=3000, sizes=(2, 3, 2, 2), strength=2.0, rng=6)
    return ClassificationSetting(pop, (0, 1, 2), 3, "toy", ())


def test_grid_classification_splits_the_same_users_for_every_mechanism(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("sklearn")
    monkeypatch.setitem(classify_module.SETTINGS, "toy", lambda data_dir: _toy_setting())
    monkeypatch.setattr(tasks, "_MEMO", tasks._Memo())
    results = []
    for mechanism, options in (("uni", ()), ("calm", (("l", 2), ("m", 3))), ("fc", ())):
        task = Task(
            "toy", mechanism, 1.0, 4, 4, options=options, reps=3, kind="classify", classify="toy"
        )
        results.append(run_task(task))
    assert all(r["status"] == "ok" for r in results)
    for key in ("majority", "nonoise"):
        assert all(r[key] == results[0][key] for r in results), key
    assert len(set(results[0]["majority"])) > 1  # the repetitions' splits differ


def test_only_classification_and_shared_seed_tasks_changed_their_cache_keys() -> None:
    """Keys computed before the split got its own stream: SSE tasks (whose seeds mean
    what they meant) keep theirs, so their cached results stay valid; classification
    tasks get new ones, so results of the old splits are not reused; so do shared-seed
    tasks, whose repetition 0 drew from the population's own stream."""
    assert Task("nltcs", "calm", 1.0, 3, 3).key() == "a63fc8db916a39d729b9a304"
    planner = Task(
        "kosarak",
        "calm",
        1.0,
        3,
        3,
        d=16,
        n=65536,
        shared_seed=True,
        options=(("planner", "pipeline"),),
    )
    assert planner.key() != "46c53ab6bbd6e85447047808"
    from calmkit_simulator.seeds import METHOD, POPULATION, stream

    first = np.random.default_rng(planner.rep_seed(0)).random()
    assert first == np.random.default_rng(stream(0, METHOD, 0)).random()
    assert first != np.random.default_rng(stream(0, POPULATION)).random()
    assert first != np.random.default_rng(0).random()  # the resample's seed
    fig6 = Task("adult", "calm", 1.0, 6, 6, kind="classify", classify="adult", reps=3)
    assert fig6.key() != "d168d420fb302ae293686acd"


def test_tasks_asking_for_new_views_per_repetition_changed_their_cache_keys() -> None:
    """The planner benchmark's Algorithm 1 and grid tasks ask for new views in every
    repetition (``replan``), an option the mechanisms' registry once dropped: their
    results cached before measured one draw of the views, so their keys changed (the
    keys below are those before); the default planner's tasks keep theirs."""
    common = dict(d=16, n=65536, shared_seed=True)
    default = Task("kosarak", "calm", 1.0, 3, 3, options=(("planner", "pipeline"),), **common)
    paper = (("planner", "paper"), ("replan", True))
    grid = Task("kosarak", "calm", 1.0, 3, 3, options=paper, **common)
    assert default.key() != "785406d34726e87dfc1c3cb9"  # margins' law (test below)
    assert grid.key() != "3d6c0889edf348b1c4909c95"


def test_planner_benchmark_calm_tasks_changed_their_cache_keys_with_the_margins_law() -> None:
    """Shared-seed CALM tasks (the planner benchmark's) count the margins' shrinkage
    version: results cached under James-Stein's factor per margin are not reused (the
    keys below are those before). The key does not seed them, so their repetitions
    draw as before; a seeded task's key (which seeds it) is unchanged."""
    common = dict(d=16, n=65536, shared_seed=True)
    default = Task("kosarak", "calm", 1.0, 3, 3, options=(("planner", "pipeline"),), **common)
    assert default.key() != "785406d34726e87dfc1c3cb9"
    before = np.random.default_rng(stream(0, METHOD, 3)).random()
    assert np.random.default_rng(default.rep_seed(3)).random() == before
    seeded = Task("kosarak", "calm", 1.0, 3, 3, d=16, n=65536)
    assert seeded.key() == "b25aab749a265abf999cea69"
