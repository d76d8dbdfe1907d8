"""CALM as a harness mechanism (Zhang et al., "CALM: Consistent Adaptive Local Marginal
for Marginal Release under Local Differential Privacy", CCS 2018, §4): the plan, the
fast (or faithful) population path, consistency, shrinkage (unless off) and maximum
entropy.

Planners (:mod:`calmkit_aggregator.planning.collection`): ``"pipeline"`` (the default) runs a
pilot first unless ``pilot=0`` or both ``l`` and ``m`` are fixed: a random
``pilot`` fraction of the users reports on attribute pairs (in two rounds, the second
on pairs chosen from the first's reports, where half the pilot can measure pairs:
:func:`~calmkit_aggregator.planning.pilot.start_pilot`), the profile estimated from
their reports picks the views of the others, and the estimate uses every phase (the
main phase's views alone where the planner predicts the pilot's pair tables would add
more noise than they hold: ``chosen["pilot_kept"]``; the pilot's reports then count in
the attributes' margins only).
``"paper"`` is Algorithm 1 in one phase.

One-phase plans are made once per setting (schema, n, k, epsilon, planner, theta,
l, m) and reused by every repetition, as one deployment plans once: the views are a
deterministic function of the setting (view randomness seeded 0), memoised per
process; each repetition still draws its own assignment seed and reports.
``replan=True`` draws new views from every repetition's seed instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Literal

import numpy as np

from calmkit_aggregator import Estimator, plan_collection, reconstruct_by
from calmkit_aggregator.phases import PhasedDesign, answer_support, combine_phases
from calmkit_aggregator.planning.collection import PLANNERS, workload_of
from calmkit_aggregator.planning.pilot import (
    PILOT_FRACTION,
    Pilot,
    plan_after_pilot,
    plan_pilot_round,
    start_pilot,
)
from calmkit_aggregator.reconstruction.methods import check_reconstruction
from calmkit_aggregator.reconstruction.support import SupportCounts
from calmkit_client import CalmkitError, Plan, Schema
from calmkit_client.randomness import RngLike

from ..collect import collect_support
from ..population import Population
from .base import Mechanism, Release

__all__ = ["MOSTLY_NOISE", "Calm", "collect_pilot", "margin_notes"]

# A margin's James-Stein factor below this: the noise is more than half of the spread
# its reports show (the factor is 1 - noise / observed spread), so it is "mostly noise".
MOSTLY_NOISE = 0.5


def margin_notes(estimator: Estimator, names: Sequence[str]) -> list[str]:
    """A note (or none) naming the attributes whose margins the reconstruction pulled
    towards uniform by a factor below :data:`MOSTLY_NOISE`
    (:func:`~calmkit_aggregator.reconstruction.shrinkage.shrink_margins`): what their
    reports told was mostly noise. A factor just below 1 (the noise a small part of the
    margin's spread) is the shrinkage's routine work and gets no note."""
    factors = estimator.margins or {}
    shrunk = sorted(a for a, f in factors.items() if f < MOSTLY_NOISE)
    if not shrunk:
        return []
    listed = ", ".join(names[a] for a in shrunk[:6]) + (", ..." if len(shrunk) > 6 else "")
    low, high = min(factors[a] for a in shrunk), max(factors[a] for a in shrunk)
    spread = (
        f"factor {low:.2g}" if f"{low:.2g}" == f"{high:.2g}" else f"factors {low:.2g}-{high:.2g}"
    )
    return [
        f"the margins of {len(shrunk)} of {len(names)} attributes ({listed}) were mostly "
        f"noise at these users and epsilon and were pulled towards uniform ({spread}, "
        "1 = kept): answers over them lean on the uniform table"
    ]


class _CalmRelease(Release):
    def __init__(self, estimator: Estimator, chosen: dict[str, object]) -> None:
        self.estimator, self.chosen = estimator, chosen

    def answer(self, attrs: Sequence[int]) -> np.ndarray:
        return self.estimator.answer(tuple(sorted(attrs))).values

    def describe(self) -> dict[str, object]:
        return dict(self.chosen)


@lru_cache(maxsize=32)
def _setting_views(
    schema: Schema,
    epsilon: float,
    n: int,
    k: int,
    theta: float,
    l: int | None,  # noqa: E741 (the paper's name)
    m: int | None,
    planner: str,
    reconstruction: str = "local",
) -> tuple[tuple[int, ...], ...]:
    """The views of one setting, planned once per process (view randomness seeded 0)."""
    plan = plan_collection(
        schema,
        epsilon,
        n,
        k,
        theta=theta,
        l=l,
        m=m,
        rng=0,
        seed=0,
        planner=planner,
        reconstruction=reconstruction,
    )
    return plan.views


def repetition_seed(gen: np.random.Generator) -> int:
    """The seed of one run's plan (its views when it plans them, and the users'
    assignment): the first draw of the run's generator."""
    return int(gen.integers(2**31))


class Calm(Mechanism):
    """CALM with a planner (``"pipeline"`` with a pilot of ``pilot`` of the users, or
    ``"paper"``: Algorithm 1 with ``theta``), optionally fixed ``m``/``l``, the
    collection path, shrinkage and the ``reconstruction`` (``"local"``: per-query
    max-ent; ``"global"``: one model of all views); ``replan``: new views every
    repetition instead of one plan per setting (see the module docstring)."""

    name = "CALM"

    def __init__(
        self,
        theta: float = 0.001,
        m: int | None = None,
        l: int | None = None,  # noqa: E741 (the paper's name)
        path: Literal["fast", "faithful"] = "fast",
        shrink: bool = True,
        planner: str = "pipeline",
        pilot: float = PILOT_FRACTION,
        replan: bool = False,
        reconstruction: str = "local",
    ) -> None:
        check_reconstruction(reconstruction)
        if planner not in PLANNERS:
            raise CalmkitError(f"planner ({planner!r}) must be one of {list(PLANNERS)}")
        if not (isinstance(pilot, (int, float)) and 0 <= pilot < 1):
            raise CalmkitError(f"pilot ({pilot!r}) must be a fraction in [0, 1)")
        self.theta, self.m, self.l, self.path, self.shrink = theta, m, l, path, shrink
        self.planner, self.pilot, self.replan = planner, float(pilot), bool(replan)
        self.reconstruction = reconstruction

    def run(self, population: Population, epsilon: float, k: int, rng: RngLike = None) -> Release:
        gen = np.random.default_rng(rng)
        seed = repetition_seed(gen)
        phased = (
            self.planner == "pipeline"
            and self.pilot > 0
            and population.n >= 2
            and (self.l is None or self.m is None)
        )
        if not phased:
            if self.replan:
                plan = plan_collection(
                    population.schema,
                    epsilon,
                    population.n,
                    k,
                    theta=self.theta,
                    l=self.l,
                    m=self.m,
                    rng=seed,
                    seed=seed,
                    planner=self.planner,
                    reconstruction=self.reconstruction,
                )
            else:
                views = _setting_views(
                    population.schema,
                    float(epsilon),
                    population.n,
                    k,
                    self.theta,
                    self.l,
                    self.m,
                    self.planner,
                    self.reconstruction,
                )
                plan = Plan(population.schema, epsilon, views, seed=seed)
            support = collect_support(population, plan, gen, path=self.path)
            chosen: dict[str, object] = {"m": plan.m, "l": max(len(v) for v in plan.views)}
            estimator = reconstruct_by(support, self.reconstruction, self.shrink)
            noted = margin_notes(estimator, population.schema.names)
            if noted:
                chosen["notes"] = noted
            return _CalmRelease(estimator, chosen)
        pilot = start_pilot(population.schema, epsilon, population.n, self.pilot, seed=seed)
        cut = pilot.reports
        order = gen.permutation(population.n)
        rest = np.ones(population.n, dtype=bool)  # a mask: no copy of the codes
        rest[order[:cut]] = False
        design = PhasedDesign(population.n, pilot.reports, k, seed, first_round=pilot.first_round)
        pilot_support = collect_pilot(population, pilot, design, order, gen, self.path)
        main = plan_after_pilot(
            pilot_support,
            population.n - cut,
            workload_of(population.schema, k, None),
            seed=seed + 1,
            l=self.l,
            m=self.m,
            reconstruction=self.reconstruction,
        )
        main_support = collect_support(population, main.plan, gen, path=self.path, rows=rest)
        support = answer_support(pilot_support, main_support, main.keeps_pilot)
        estimator = reconstruct_by(support, self.reconstruction, self.shrink)
        chosen_main: dict[str, object] = {
            "m": main.plan.m,
            "l": main.choice.l,
            "design": main.choice.design,
            "pilot_m": pilot_support.plan.m,
            "pilot_users": int(cut),
            "pilot_kept": main.keeps_pilot,
            "predicted_sse": float(main.choice.predicted.sse),
            "median_sse": float(main.choice.median_sse),
            "sse_range": [float(x) for x in main.choice.sse_range],
        }
        skipped = (*main.choice.single, *main.choice.predicted.uncollected)
        if skipped:  # attributes in no view: one category, or too few users
            chosen_main["not_collected"] = [population.schema.names[a] for a in skipped]
        notes = [
            *main.notes(population.schema.names),
            *margin_notes(estimator, population.schema.names),
        ]
        if notes:  # what the plan rests on (a pilot without pairs, a design set aside)
            chosen_main["notes"] = notes
        return _CalmRelease(estimator, chosen_main)


def collect_pilot(
    population: Population,
    pilot: Pilot,
    design: PhasedDesign,
    order: np.ndarray,
    rng: RngLike = None,
    path: Literal["fast", "faithful"] = "fast",
) -> SupportCounts:
    """The pilot's counts, gathered as a collection's phases gather them: the first
    users of ``order`` (a permutation of the users) under ``pilot.plan``; with two
    rounds (``pilot.first_round``), the next ones under the pairs the first round's
    counts choose (:func:`~calmkit_aggregator.planning.pilot.plan_pilot_round` with
    ``design``). Both rounds' views, in order; the main phase takes the users after
    ``pilot.reports``."""
    gen = np.random.default_rng(rng)
    first_users = pilot.first_round or pilot.reports
    rows = np.sort(order[:first_users])
    first = collect_support(population, pilot.plan, gen, path=path, rows=rows)
    if not pilot.first_round:
        return first
    second = plan_pilot_round(design, first)
    rows = np.sort(order[first_users : pilot.reports])
    return combine_phases([first, collect_support(population, second, gen, path=path, rows=rows)])
