"""A phased collection: a pilot, then views chosen from what it showed.

The pipeline planner's error model needs to know how skewed the attributes are and
how strongly they depend on each other (:mod:`.profile`). Before any report it can
only assume; so a fraction of the users (default :data:`PILOT_FRACTION`) reports
first on pairs of attributes, the aggregator estimates the profile from their
tables, and the remaining users report on the views the planner then chooses
(:func:`plan_next_phase`, for a collection's :class:`~..phases.PhasedDesign`).

The pilot reports in two rounds of equal size (:func:`start_pilot`): the first on
random matchings (every attribute once per matching, as many matchings as its
reports keep every pair informative), the second on the pairs whose attributes the
first round found most dependent (:func:`plan_pilot_round`). Where dependence sits in
a few pairs or a few attributes, random matchings see a few of them at best; the
second round looks where the first found some. Where half the pilot cannot measure
any pair (large domains, few users, low epsilon), the pilot is one round of random
matchings (or single attributes) over all of its users, as before.

Each user still reports exactly once, under one of the plans. The pilot's views are
part of the final estimate (:func:`~..phases.combine_phases`) unless the planner
predicts the answers better without them (:func:`plan_after_pilot`):
a two-round pilot spreads its users over a hundred or more pair views, and the
consistency step's non-negativity holds each of those small, noisy tables as firmly
as a large one. On 24 independent binary attributes (n = 47,000, eps 2) one attribute
per view measured 4.5e-4 alone and 2.5e-3 with the pilot's 125 views of about 60
reports each beside it; where the pilot's pairs hold real dependence they help
instead (dropping them cost 6-38% on the planner benchmark's datasets), and the
error model tells the two apart (docs/planner-notes.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from calmkit_client import Plan, PlanError, Schema, choose_oracle
from calmkit_client.validation import is_int

from ..phases import PhasedDesign
from ..reconstruction.estimate import estimate_views
from ..reconstruction.support import SupportCounts
from .designs import pilot_views
from .error_model import Workload
from .profile import CONTINGENCY_PRIOR, DataProfile, estimate_profile
from .search import PlannedViews, choose_plan, expected_gain, fewest_users

__all__ = [
    "MAX_MATCHINGS",
    "PILOT_FRACTION",
    "MainPlan",
    "Pilot",
    "informative_pair",
    "pilot_plan",
    "pilot_size",
    "plan_after_pilot",
    "plan_next_phase",
    "plan_pilot_round",
    "profile_from_pilot",
    "round_two_pairs",
    "start_pilot",
]

PILOT_FRACTION = 0.2
# Random matchings a pilot measures at most (each adds d/2 pairs, and splits the
# pilot's reports over them).
MAX_MATCHINGS = 4


def pilot_size(n: int, fraction: float = PILOT_FRACTION) -> int:
    """How many of ``n`` expected users report in the pilot (at least 1, at most n-1)."""
    if not is_int(n) or n < 2:
        raise PlanError(f"n ({n!r}) must be an int >= 2 for a pilot")
    if not (isinstance(fraction, (int, float)) and 0 < fraction < 1):
        raise PlanError(f"pilot fraction ({fraction!r}) must be in (0, 1)")
    return int(min(n - 1, max(1, round(fraction * n))))


@dataclass(frozen=True)
class Pilot:
    """A collection's pilot: the first round's ``plan``, the whole pilot's
    ``reports`` and the first round's (``first_round``; 0: the pilot is one round)."""

    plan: Plan
    reports: int
    first_round: int


def start_pilot(
    schema: Schema, epsilon: float, n: int, fraction: float = PILOT_FRACTION, seed: int = 0
) -> Pilot:
    """The pilot of a collection of ``n`` expected users (module docstring): two rounds
    of half the pilot's reports each when the first half's random matchings hold a
    pair (:func:`pilot_plan`), else one round of all of them."""
    reports = pilot_size(n, fraction)
    first_round = pilot_size(n, fraction / 2)
    if first_round < reports:
        plan = pilot_plan(schema, epsilon, seed=seed, users=first_round)
        if any(len(view) == 2 for view in plan.views):
            return Pilot(plan, reports, first_round)
    return Pilot(pilot_plan(schema, epsilon, seed=seed, users=reports), reports, 0)


def plan_pilot_round(design: PhasedDesign, first: SupportCounts) -> Plan:
    """The second round of a collection's pilot, from the first round's counts: the
    pairs of :func:`round_two_pairs` for the rest of the pilot's reports (seed
    ``design.seed + 2``); more random matchings where no unmeasured pair could be
    informative."""
    plan = first.plan
    users = max(1, design.pilot_reports - int(first.n.sum()))
    seed = design.seed + 2
    pairs = round_two_pairs(profile_from_pilot(first), plan.views, plan.epsilon, users, seed)
    if not pairs:
        return pilot_plan(plan.schema, plan.epsilon, seed=seed, users=users)
    return Plan(plan.schema, plan.epsilon, pairs, seed=seed)


def round_two_pairs(
    profile: DataProfile,
    measured: tuple[tuple[int, ...], ...],
    epsilon: float,
    users: int,
    seed: int = 0,
) -> tuple[tuple[int, int], ...]:
    """The pairs a pilot's second round measures: pairs not in ``measured``, ranked by
    the sum over their two attributes of each one's strongest measured pair (its
    posterior mean dependence in ``profile``; ties in random order): the highest ranked
    ``c`` of those informative (:func:`informative_pair`) at ``users / c`` reports each,
    for the largest ``c`` there are. A pair of two attributes each in a heavy measured
    pair comes first, then pairs with one of them: where dependence clusters, the rest
    of the cluster."""
    sizes = np.array(profile.sizes)
    pairs = np.array([v for v in measured if len(v) == 2], dtype=np.int64).reshape(-1, 2)
    taken = np.zeros((sizes.size, sizes.size), dtype=bool)
    taken[pairs[:, 0], pairs[:, 1]] = taken[pairs[:, 1], pairs[:, 0]] = True
    heavy = (profile.weights * profile.dependence)[pairs[:, 0], pairs[:, 1]]
    strength = np.zeros(sizes.size)
    np.maximum.at(strength, pairs[:, 0], heavy)
    np.maximum.at(strength, pairs[:, 1], heavy)
    a, b = np.triu_indices(sizes.size, 1)
    keep = (sizes[a] > 1) & (sizes[b] > 1) & ~taken[a, b]
    a, b = a[keep], b[keep]
    tie = np.random.default_rng(seed).random(a.size)
    order = np.lexsort((tie, -(strength[a] + strength[b])))
    a, b = a[order], b[order]
    need = _reports_needed(sizes[a], sizes[b], epsilon, users)
    # the most pairs c such that c of them are informative at users // c reports each
    counts = np.arange(1, a.size + 1)
    able = np.searchsorted(np.sort(need), users // counts, side="right")
    fits = np.nonzero(able >= counts)[0]
    if not fits.size:
        return ()
    count = int(fits[-1]) + 1
    first = np.nonzero(need <= users // count)[0][:count]  # the highest ranked of them
    return tuple((int(x), int(y)) for x, y in zip(a[first], b[first]))


def _reports_needed(
    size_a: np.ndarray, size_b: np.ndarray, epsilon: float, users: int
) -> np.ndarray:
    """(P,) the fewest reports that make each pair's view informative
    (:func:`informative_pair`); ``users + 1`` where even ``users`` do not."""
    out = np.full(size_a.size, users + 1, dtype=np.int64)
    for la, lb in {(int(x), int(y)) for x, y in zip(size_a, size_b)}:
        lo, hi = 1, users + 1  # informative at hi (or hi = users + 1: never)
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if informative_pair(la, lb, epsilon, mid) else (mid + 1, hi)
        out[(size_a == la) & (size_b == lb)] = hi
    return out


def pilot_plan(schema: Schema, epsilon: float, seed: int = 0, users: int | None = None) -> Plan:
    """The pilot: a random matching of the attributes with >= 2 categories into pairs
    (:func:`~.designs.pilot_views`), equal shares.

    With ``users`` (the pilot's expected reports):

    - as many random matchings (up to :data:`MAX_MATCHINGS`, each pair once) as keep
      every pair of every matching informative (:func:`informative_pair`) at the
      reports split over all of them. One matching sees d/2 of the d(d-1)/2 pairs;
      where dependence sits on a few pairs, or a few attributes, more pairs show more
      of where (measured in the planner notes: "How many pairs the pilot measures");
    - else one matching, in which two attributes are paired only if their pair view
      can tell a typical dependence from none; the others are measured alone, which
      also gives their margins in full (a margin read from a pair view of
      ``L_a x L_b`` cells carries ``L_b`` cells' noise per category)."""
    collect = [a for a, size in enumerate(schema.sizes) if size > 1]
    if not collect:
        raise PlanError(
            f"every attribute ({schema.d}) has one category: there is nothing to collect"
        )
    if users is not None and len(collect) >= 4:
        for count in range(MAX_MATCHINGS, 1, -1):
            views = _matchings(schema.sizes, collect, epsilon, seed, int(users), count)
            if views:
                return Plan(schema, epsilon, views, seed=seed)
    pairable = None
    if users is not None:
        per_view = max(1, int(users) // max(1, len(collect) // 2))
        sizes = schema.sizes

        def pairable(a: int, b: int) -> bool:
            return informative_pair(sizes[a], sizes[b], epsilon, per_view)

    return Plan(schema, epsilon, pilot_views(collect, rng=seed, pairable=pairable), seed=seed)


def _matchings(
    sizes: tuple[int, ...], collect: list[int], epsilon: float, seed: int, users: int, count: int
) -> tuple[tuple[int, ...], ...]:
    """``count`` random perfect matchings of ``collect`` (seeded ``[seed, r]``), each pair
    once, if every pair is informative at ``users`` split over ``count`` matchings'
    views; else ``()``."""
    per_view = max(1, users // (count * (len(collect) // 2)))
    views: dict[tuple[int, ...], None] = {}
    for r in range(count):
        for view in pilot_views(collect, rng=[seed, r]):
            a, b = view
            if not informative_pair(sizes[a], sizes[b], epsilon, per_view):
                return ()
            views[view] = None
    return tuple(views)


def informative_pair(size_a: int, size_b: int, epsilon: float, users: int) -> bool:
    """Whether a pair view of ``size_a x size_b`` cells from ``users`` reports can tell
    the prior's median dependence from none: the standard deviation of its dependence
    statistic's noise, ``sqrt(2 / dim) L var`` in the profile's unit for uniform margins
    (``var`` the oracle's per-cell variance, ``dim = (L_a - 1)(L_b - 1)``), is at most
    the median of :data:`~.profile.CONTINGENCY_PRIOR` (which a pair of uniform margins
    holds as is). Binary pairs from a thousand reports at epsilon 1 can (0.017 against
    0.022); a 16 x 7 table cannot (0.055), nor a binary pair at epsilon 0.5 (0.09)."""
    cells = size_a * size_b
    dim = (size_a - 1) * (size_b - 1)
    if dim == 0:
        return False
    var = float(choose_oracle(cells, epsilon).variance(max(1, int(users))))
    lo, hi = CONTINGENCY_PRIOR
    return math.sqrt(2.0 / dim) * cells * var <= math.sqrt(lo * hi)


def profile_from_pilot(support: SupportCounts, prior: DataProfile | None = None) -> DataProfile:
    """The data profile the pilot's reports support (:func:`~.profile.estimate_profile`)."""
    plan = support.plan
    return estimate_profile(plan.schema, estimate_views(support), plan.view_oracles, prior)


@dataclass(frozen=True)
class MainPlan:
    """The main phase (after the pilot's one or two rounds): its ``plan`` and the
    planner's ``choice``. ``with_pilot`` is None when the pilot's reports are part of
    the answers (``choice``'s prediction then covers the pilot's views too); else the
    best choice with them, which ``choice`` (the main phase's views alone) beat on
    average: the answers are then reconstructed from the main phase alone."""

    plan: Plan
    choice: PlannedViews
    with_pilot: PlannedViews | None = None

    @property
    def keeps_pilot(self) -> bool:
        """Whether the pilot's reports are part of the answers."""
        return self.with_pilot is None

    def notes(self, names: Sequence[str]) -> list[str]:
        """The choice's notes (:meth:`~.search.PlannedViews.notes`) and, where the
        pilot is left out of the answers, why."""
        out = self.choice.notes(names)
        if self.with_pilot is not None:
            out.append(
                "the pilot's reports are left out of the answers but for the attributes' "
                "margins: its many small pair tables were predicted to add noise (SSE "
                f"{self.choice.predicted.sse:.3g} without them against "
                f"{self.with_pilot.predicted.sse:.3g} with them)"
            )
        return out


def plan_after_pilot(
    pilot: SupportCounts,
    n: int,
    workload: Workload,
    seed: int = 0,
    l: int | None = None,  # noqa: E741
    m: int | None = None,
    prior: DataProfile | None = None,
    covering_dir: Path | str | None = None,
    reconstruction: str = "local",
) -> MainPlan:
    """Views for the ``n`` users after the pilot, chosen with the pilot's profile and
    with the pilot's views (and their reports) counted in the design, for answers
    reconstructed by ``reconstruction`` ("local" or "global").

    The pilot is left out of the answers where it is predicted to add noise: wherever
    the pilot measured pairs, the views are also chosen for the ``n`` users alone
    (scored without the pilot's margins, which errs towards the plan with the pilot),
    and the plan whose predicted SSE is lower on average over the dependence quantiles
    is taken (:func:`~.search.expected_gain`). Neither plan is the safe one: the
    pilot's many small pair tables cost noise where the attributes barely depend and
    hold dependence where they do, so neither has to beat the other by the margin a
    design needs to leave one attribute per view or Algorithm 1's plan. (Until
    2026-11-28 the plan alone had to beat the plan with the pilot convincingly; with a
    calibrated dependence posterior, whose upper quantiles stay high where a pilot
    cannot rule dependence out, that kept the small tables on independent data:
    docs/planner-notes.md.)

    The two plans are compared whole, not through one attribute per view with and
    without the pilot's tables (the test before 2026-11-28): where one of the pilot's
    pairs reads its noise as strong dependence, one attribute per view without that
    table looks risky, yet the plan with the pilot is then a design that measures
    every pair again to drown the small tables' noise, which a plan without the pilot
    beats at every dependence the pilot allows (12 independent binary attributes,
    eps 2: 2.85e-3 with the pilot against 1.25e-3 without it in that repetition;
    docs/planner-notes.md)."""
    profile = profile_from_pilot(pilot, prior)
    schema = pilot.plan.schema
    users = tuple(np.maximum(pilot.n, 1).astype(float))
    args = (schema.sizes, pilot.plan.epsilon, n, workload, profile)

    def plan(
        fixed: Sequence[tuple[int, ...]] = (), fixed_users: Sequence[float] = ()
    ) -> PlannedViews:
        return choose_plan(
            *args,
            fixed_views=fixed,
            fixed_users=fixed_users,
            l=l,
            m=m,
            rng=seed,
            covering_dir=covering_dir,
            reconstruction=reconstruction,
        )

    choice, with_pilot = plan(pilot.plan.views, users), None
    if any(len(v) > 1 for v in pilot.plan.views):
        alone = plan()
        if expected_gain(alone.chosen, choice.chosen) > 0:
            choice, with_pilot = alone, choice
    return MainPlan(Plan(schema, pilot.plan.epsilon, choice.views, seed=seed), choice, with_pilot)


def plan_next_phase(design: PhasedDesign, pilot: SupportCounts) -> MainPlan:
    """The main phase's plan of a collection made with ``design``, from its pilot's
    support counts (every pilot round's). When fewer users are left than the planner plans views for
    (:func:`~.search.fewest_users`: the pilot took nearly everyone), it is planned for
    that many: the last users still need a plan to report under."""
    fewest = fewest_users(pilot.plan.schema.sizes, design.l or 1)
    remaining = max(fewest, design.expected_n - int(pilot.n.sum()))
    return plan_after_pilot(
        pilot,
        remaining,
        Workload(k=design.k),
        seed=design.seed + 1,
        l=design.l,
        m=design.m,
        reconstruction=design.reconstruction,
    )
