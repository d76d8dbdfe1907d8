"""One point of an experiment grid: a :class:`Task` (one mechanism at one setting, run
for ``reps`` repetitions of the evaluation protocol, CALM, ACM CCS 2018, §5.1: 50 random
k-way queries, SSE against the truth) and :func:`run_task`, which runs it. Its result
depends only on the task itself:

* the population: ``load_dataset(dataset, d, max_categories)`` resampled to ``n`` users
  with replacement, seed ``seed``;
* the queries of repetition r: :func:`random_queries` seeded ``[seed, d, query_k, r]``,
  shared by every mechanism and epsilon of the same population (paired comparisons;
  the truth is computed once per repetition);
* the test/training split of classification repetition r: ``stream(seed, SPLIT, r)``
  (:mod:`.seeds`), shared by every mechanism, as are NoNoise and Majority;
* the mechanism's randomness in repetition r: seeded ``[seed, task hash, r]`` (with
  ``shared_seed``: ``[seed, r]``); for classification it also samples the synthetic
  records and seeds their SVM.

(``calmkit simulate`` derives its queries from :mod:`.seeds` instead; the grid keeps
its scheme for the SSE tasks so that their cached results stay valid.)

So results are reproducible whatever the order, the number of worker processes
(:mod:`.grid`) or machines (:mod:`.cluster`) that run the tasks.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from calmkit_client import CalmkitError

from .datasets import DatasetError, DatasetMissing, load_dataset
from .experiment import random_queries, sse
from .mechanisms import MECHANISMS, NotScalable, task_mechanism
from .population import Population
from .seeds import METHOD, SPLIT, stream

__all__ = ["Task", "load_population", "run_task"]


@dataclass(frozen=True)
class Task:
    """One mechanism at one setting; ``k`` is the workload size the mechanism plans
    for (CALM's k'), ``query_k`` the size of the queries it is scored on.

    ``kind``: ``"sse"`` (the §5 protocol) or ``"classify"`` (§5.4: misclassification
    of an SVM trained on records sampled from the released marginal; then
    ``classify`` names the :data:`~calmkit_simulator.classify` preset and
    ``duplicate`` how many copies of the training records report).

    ``shared_seed``: the mechanism's randomness in repetition r is the method stream
    of ``seed`` (:mod:`.seeds`) instead of a task's own, so every mechanism and plan of
    a setting draws from the same seeds (the planner benchmark's paired comparison)."""

    dataset: str
    mechanism: str
    epsilon: float
    k: int
    query_k: int
    d: int | None = None
    n: int | None = None
    max_categories: int | None = None
    options: tuple[tuple[str, Any], ...] = ()
    reps: int = 20
    queries: int = 50
    seed: int = 0
    kind: str = "sse"
    classify: str = ""
    duplicate: int = 1
    shared_seed: bool = False

    def key(self) -> str:
        """Stable identity: the SHA-256 of the task's fields (hex, 24 chars). Fields
        added later count only when set, so earlier caches keep their keys; a kind
        whose seeds changed meaning counts its seeding version (:data:`_SEEDING`), and a
        task asking for new views per repetition :data:`_REPLAN_VERSION`, and a
        shared-seed CALM task :data:`_MARGIN_LAW_VERSION`, so results cached under the
        old meaning are not reused."""
        fields = asdict(self)
        for name, default in _LATER_FIELDS.items():
            if fields[name] == default:
                del fields[name]
        version = max(_SEEDING.get(self.kind, 1), _SHARED_SEEDING if self.shared_seed else 1)
        if version > 1:
            fields["seeding"] = version
        if dict(self.options).get("replan"):
            fields["replan"] = _REPLAN_VERSION
        if self.shared_seed and self.mechanism == "calm":
            fields["margins"] = _MARGIN_LAW_VERSION
        blob = json.dumps(fields, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:24]

    def population_key(self) -> tuple[Any, ...]:
        return (self.dataset, self.d, self.n, self.max_categories, self.seed)

    def mechanism_seed(self) -> int:
        """The task's own seed for the mechanism's randomness (recorded in results)."""
        return int(self.key()[:15], 16)

    def rep_seed(self, rep: int) -> list[int] | np.random.SeedSequence:
        """The seed of the mechanism's randomness in repetition ``rep``: with
        ``shared_seed`` the method stream ``stream(seed, METHOD, rep)``
        (:mod:`.seeds`; the earlier ``[seed, rep]`` was, at rep 0, the very sequence
        of the population's resample, ``numpy`` dropping trailing zero words)."""
        if self.shared_seed:
            return stream(self.seed, METHOD, rep)
        return [self.seed, self.mechanism_seed(), rep]


# Task fields added after results were cached, with the default they are left out at.
_LATER_FIELDS: dict[str, Any] = {"shared_seed": False}
# What a task's seed means, per kind, counted in the key from version 2 on. classify 2:
# the split of repetition r is drawn from its own stream, no longer from the mechanism's
# (which made every mechanism test on other records).
_SEEDING: dict[str, int] = {"classify": 2}
# Shared-seed tasks (the planner benchmark) from version 2: the method stream per rep.
_SHARED_SEEDING = 2
# Tasks asking CALM for new views in every repetition (``replan``), counted in the key
# from version 2 on: before, the mechanisms' registry dropped the option, and every
# repetition measured the views of seed 0.
_REPLAN_VERSION = 2
# CALM's margins' shrinkage, in the key of shared-seed (planner benchmark) tasks from
# version 2 on: the margins of 4+ categories are shrunk by the law of their signal fitted
# over all of them, no longer each by James-Stein's factor alone. (The key does not seed
# those tasks, so their repetitions draw as before.)
_MARGIN_LAW_VERSION = 2


# -- running one task (in this process or a worker) -----------------------------------
@dataclass
class _Memo:
    """Per-process caches: populations, and each repetition's queries and truths."""

    populations: dict[tuple[Any, ...], Population] = field(default_factory=dict)
    truths: dict[tuple[Any, ...], tuple[Population, list[tuple[int, ...]], list[np.ndarray]]] = (
        field(default_factory=dict)
    )
    settings: dict[tuple[Any, ...], Any] = field(default_factory=dict)


_MEMO = _Memo()


def load_population(task: Task, data_dir: str | None) -> Population:
    """The task's population (memoised per process, at most 4 at a time)."""
    key = task.population_key()
    if key not in _MEMO.populations:
        if len(_MEMO.populations) >= 4:  # keep memory bounded on long grids
            _MEMO.populations.clear()
            _MEMO.truths.clear()
        pop = load_dataset(task.dataset, data_dir, task.d, task.max_categories, rng=task.seed)
        if task.n is not None and task.n != pop.n:
            pop = pop.resample(task.n, rng=task.seed)
        _MEMO.populations[key] = pop
    return _MEMO.populations[key]


def _queries(
    task: Task, pop: Population, rep: int
) -> tuple[list[tuple[int, ...]], list[np.ndarray]]:
    key = (task.population_key(), task.query_k, task.queries, rep)
    held = _MEMO.truths.get(key)
    # the truths of this very population: a caller may pass another one under the same
    # task (a permuted copy), whose queries are the same and whose truths are not
    if held is None or held[0] is not pop:
        if len(_MEMO.truths) >= 4096:  # populations shipped by a cluster bypass the clear
            _MEMO.truths.clear()
        qs = random_queries(
            pop.d,
            task.query_k,
            task.queries,
            np.random.SeedSequence([task.seed, pop.d, task.query_k, rep]),
        )
        held = _MEMO.truths[key] = (pop, qs, [pop.marginal(q) for q in qs])
    return held[1], held[2]


UNFIT = "the dataset does not fit the task"  # how an invalid task's message starts


def dataset_failure(exc: DatasetError) -> dict[str, Any]:
    """A task's result when its population could not be loaded: ``missing_data`` when
    the dataset is not on this machine, else ``invalid``: it is there and does not fit
    the task (fewer attributes than the task's d, a malformed file)."""
    if isinstance(exc, DatasetMissing):
        return {"status": "missing_data", "message": str(exc)}
    return {"status": "invalid", "message": f"{UNFIT}: {exc}"}


def run_task(
    task: Task, data_dir: str | None = None, population: Population | None = None
) -> dict[str, Any]:
    """Run ``task``: ``{"status": "ok", "sse": [...], ...}`` per repetition, or
    ``{"status": "not_scalable" | "invalid" | "missing_data", "message": ...}``.
    ``population``: the task's population when the caller has it (a cluster ships it
    to the workers once), else loaded from ``data_dir``."""
    options = dict(task.options)
    # The figures reproduce the paper: CALM plans with Algorithm 1 unless a task names
    # another planner (the planner benchmark does).
    if "planner" in MECHANISMS.get(task.mechanism, (None, ()))[1]:
        options.setdefault("planner", "paper")
    mechanism = task_mechanism(task.mechanism, options)
    try:
        if task.kind == "classify":  # checked on the training attributes, inside
            return _run_classify(task, data_dir, mechanism)
        pop = population if population is not None else load_population(task, data_dir)
    except DatasetError as exc:
        return dataset_failure(exc)
    try:
        mechanism.check(pop.schema, pop.n, task.epsilon, task.k)
    except NotScalable as exc:
        return {"status": "not_scalable", "message": str(exc), "mechanism": mechanism.name}
    out: dict[str, Any] = {
        "status": "ok",
        "mechanism": mechanism.name,
        "sse": [],
        "uniform": [],
        "seconds": [],
        "chosen": {},
        "privacy_unit": mechanism.privacy_unit,
        "mechanism_seed": task.mechanism_seed(),
    }
    for rep in range(task.reps):
        queries, truths = _queries(task, pop, rep)
        rng = np.random.default_rng(task.rep_seed(rep))
        t0 = time.perf_counter()
        try:
            release = mechanism.run(pop, task.epsilon, task.k, rng)
        except NotScalable as exc:
            return {"status": "not_scalable", "message": str(exc), "mechanism": mechanism.name}
        except CalmkitError as exc:  # a setting the mechanism refuses (e.g. m > C(d, l))
            return {"status": "invalid", "message": str(exc), "mechanism": mechanism.name}
        answers = release.answer_many(queries)
        out["seconds"].append(time.perf_counter() - t0)
        out["sse"].append(float(np.mean([sse(t, a) for t, a in zip(truths, answers)])))
        out["uniform"].append(
            float(np.mean([sse(t, np.full(t.shape, 1.0 / t.size)) for t in truths]))
        )
        out["chosen"] = release.describe()
        if "predicted_sse" in out["chosen"]:  # the planner's own prediction, per rep
            out.setdefault("predicted", []).append(float(out["chosen"]["predicted_sse"]))
        if "median_sse" in out["chosen"]:  # the same at the profile's median dependence
            out.setdefault("median", []).append(float(out["chosen"]["median_sse"]))
        if "sse_range" in out["chosen"]:  # ... at its 10% and 90% dependence quantiles
            low, high = out["chosen"]["sse_range"]
            out.setdefault("range_low", []).append(float(low))
            out.setdefault("range_high", []).append(float(high))
    out["chosen"] = json.loads(json.dumps(out["chosen"], default=str))
    return out


def _run_classify(task: Task, data_dir: str | None, mechanism: Any) -> dict[str, Any]:
    from .classify import load_setting, run_classification

    key = ("classify", task.classify, data_dir)
    if key not in _MEMO.settings:
        _MEMO.settings[key] = load_setting(task.classify, data_dir)
    setting = _MEMO.settings[key]
    pop = setting.population
    out: dict[str, Any] = {
        "status": "ok",
        "mechanism": mechanism.name,
        "error": [],
        "nonoise": [],
        "majority": [],
        "seconds": [],
        "chosen": {},
        "privacy_unit": mechanism.privacy_unit,
        "mechanism_seed": task.mechanism_seed(),
    }
    for rep in range(task.reps):
        rng = np.random.default_rng(task.rep_seed(rep))
        try:
            r = run_classification(
                pop,
                setting,
                mechanism,
                task.epsilon,
                stream(task.seed, SPLIT, rep),
                task.duplicate,
                method_rng=rng,
            )
        except NotScalable as exc:
            return {"status": "not_scalable", "message": str(exc), "mechanism": mechanism.name}
        out["error"].append(r.error)
        out["nonoise"].append(r.nonoise)
        out["majority"].append(r.majority)
        out["seconds"].append(r.seconds)
        out["chosen"] = json.loads(json.dumps(r.chosen, default=str))
    return out
