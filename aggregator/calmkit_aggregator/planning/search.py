"""The default planner: view size l, view count m and the views chosen by predicting the
whole pipeline's error for the workload (:mod:`.error_model`) under a
:class:`~.profile.DataProfile`, instead of Algorithm 1's one-view noise bound (CALM
(Zhang et al., "CALM: Consistent Adaptive Local Marginal for Marginal Release under
Local Differential Privacy", CCS 2018), §4.3, kept as ``planner="paper"``).

Search. Only attributes with >= 2 categories are collected (one category: nothing to
report, the marginal is exact). For each view size l = 1, 2, ... it scores designs of
m = ceil(d/l) (every attribute held once), 4x, 16x, ... views up to
``min(C(d, l), users / cells, 4096)`` (each view expecting at least as many users as
it has cells), plus a covering design for l >= k whenever its size fits
(every k-set then lies in a view), then refines m by factors of 2 and sqrt(2) around
the best. The search over m uses views spread evenly over the attributes and pairs
(:func:`~.designs.spread_views`); when the profile expects some pairs to depend more
than others (a pilot's profile does), views that hold those pairs are scored too:
spread rounds that take the heaviest pairs first (:func:`~.designs.balanced_views`,
every attribute kept at its share of the views) and views grown from the heaviest
pairs whatever the balance (:func:`~.designs.dependent_views`), both at the count
where the spread views of that size did best and the better of them at the second
best; the refinement follows whichever kind won.
Along m (and along l past k) the search stops after two steps that do not improve the
prediction; along m also once a design's noise part alone (at the dependence quantile
where it is least) is past the best prediction of its size: each pair a view holds
keeps about the same share of the users whatever m, so more views add held
components, and noise, without taking any away. Every design is predicted at the
five quantiles of the profile's pair dependence (``DataProfile.dependence_quantiles``,
equally likely values); the chosen
design has the smallest mean log ratio to the best design at each quantile, so an
uncertain profile gives a design that is good across what the data cannot rule out
rather than at one guess.

Safe designs. Two designs are safe: one attribute per view (the best one when nothing
depends; its error never exceeds the dependence) and Algorithm 1's plan (scored too).
Another design is chosen only when it beats both by more than its prediction's own
uncertainty (:func:`convincing`), and still does at both ends of a pilot profile's
``marginal_range`` (how skewed its noisy margins may be: on 100 sparse binary
attributes, 17,000 users at eps 2, margins read from 68 reports a view took two
attributes per view at 1.71x the SSE of one per view). Otherwise the design of
smaller regret among the safe ones and, when a pilot informed the profile, the best
design whose prediction the dependence does not move (every query inside a view: a
covering design, say), unless a design of its view size laid out as evenly is
predicted no worse at every dependence quantile. On uncapped Adult (2-41 categories) a
pilot's few noisy pairs could otherwise pull the choice to views of two attributes
that cost up to 1.36x (measured by the planner benchmark, `calmkit experiment
planner`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from calmkit_client import MAX_VIEW_CELLS, PlanError, validate_epsilon
from calmkit_client.errors import CalmkitError
from calmkit_client.validation import check_int, is_int

from ..reconstruction.methods import check_reconstruction
from .algorithm1 import choose_views, expected_cells
from .covering import construct_cover, cover_lower_bound
from .designs import DependentStream, SpreadStream, spread_views
from .error_model import ErrorPrediction, Workload, predict_errors
from .profile import DataProfile

__all__ = [
    "MAX_VIEWS",
    "MODEL_SD",
    "Candidate",
    "PlannedViews",
    "choose_plan",
    "convincing",
    "expected_gain",
    "fewest_users",
    "score_views",
]

MAX_VIEWS = 4096
_MAX_L = 8
# Stop doubling m (or growing l) after this many steps that do not improve.
_PATIENCE = 2
# A covering design is built only if a spread design of its size is this close to the best.
_RISE = 1.25
# Covering designs are built for at most this many attributes (cost of construction).
_COVER_MAX_D = 64
# The error model's error on one design, as the standard deviation of log(predicted /
# measured SSE) between designs of one setting: 0.081 over the designs within 2x of
# the best at each setting of the planner benchmark, predicted from the data's own
# profile (its section "The error model with the data's own profile" reports it).
MODEL_SD = 0.08
# Standard deviation of the 10/30/50/70/90% quantiles of a normal law, in its sd.
_QUANTILE_SPREAD = float(np.std([-1.2816, -0.5244, 0.0, 0.5244, 1.2816]))


@dataclass(frozen=True)
class Candidate:
    """One design the planner scored: its view size, count, kind (``"spread"``:
    :func:`~.designs.spread_views`; ``"balanced"``: :func:`~.designs.balanced_views`;
    ``"dependent"``: :func:`~.designs.dependent_views`;
    ``"cover"``: a covering design, every k-set in a view; ``"queries"``: the
    workload's own queries) and predicted SSE parts: their expectation over the
    profile's dependence quantiles (``range``: the SSE at each)."""

    l: int  # noqa: E741 (the paper's name)
    m: int
    design: str
    sse: float
    noise: float
    bias: float
    range: tuple[float, ...] = ()  # predicted SSE at each dependence quantile

    @property
    def steady(self) -> bool:
        """Whether the predicted SSE is the same at every dependence quantile: a design
        whose every query lies in a view (no dependence left to miss), whose
        prediction the profile's uncertainty cannot move."""
        return bool(self.range) and max(self.range) <= min(self.range) * (1 + 1e-9)

    @property
    def typical(self) -> float:
        """Geometric mean of the predictions over the dependence range."""
        vals = self.range or (self.sse,)
        return float(np.exp(np.mean(np.log(np.maximum(vals, 1e-300)))))

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form of the candidate and its predicted error."""
        return {
            "l": self.l,
            "m": self.m,
            "design": self.design,
            "predicted_sse": self.sse,
            "noise": self.noise,
            "bias": self.bias,
            "predicted_sse_range": list(self.range),
        }


@dataclass(frozen=True)
class PlannedViews:
    """The planner's choice.

    Attributes:
        views: the chosen views (sorted position tuples), ``fixed_views`` excluded.
        l, m, design: the chosen candidate's view size, count and kind.
        predicted: the predicted error of the whole design (fixed views included),
            expected over what the profile leaves uncertain (its dependence quantiles).
        candidates: every candidate scored, in the order scored.
        fixed_views: views that were part of the design (a pilot's).
        profile: what the prediction assumed about the data.
        single: attributes with one category (nothing to collect).
        set_aside: a design that beat the safe ones at the pilot's estimated margins
            but not at both ends of their range, so was not chosen (None: none).
        restricted: l or m was fixed by the caller (the choice is then the smallest
            regret among the designs they allow, no safe design preferred).
    """

    views: tuple[tuple[int, ...], ...]
    l: int  # noqa: E741
    m: int
    design: str
    predicted: ErrorPrediction
    candidates: tuple[Candidate, ...]
    fixed_views: tuple[tuple[int, ...], ...]
    profile: DataProfile
    single: tuple[int, ...] = field(default=())
    set_aside: Candidate | None = None
    restricted: bool = False

    @property
    def median_sse(self) -> float:
        """The predicted SSE at the profile's median dependence: a point prediction
        (``predicted`` is its expectation over what the profile leaves uncertain, which
        an uninformed profile's upper quantiles dominate)."""
        chosen = self._chosen
        return chosen.range[len(chosen.range) // 2] if chosen.range else chosen.sse

    @property
    def sse_range(self) -> tuple[float, float]:
        """The predicted SSE at the lowest and the highest of the profile's dependence
        quantiles (10% and 90%): how far the prediction may be off where the profile
        cannot tell the dependence (a pilot that measured no pair: the prior's)."""
        chosen = self._chosen
        return (min(chosen.range), max(chosen.range)) if chosen.range else (chosen.sse,) * 2

    def _lower_on_average(self) -> Candidate | None:
        """The candidate of the lowest expected SSE when it is not the chosen one (nor
        the one set aside) and at least 5% lower: what the choice gave up for safety,
        or (l or m fixed) for a design good at every dependence quantile."""
        best = min(self.candidates, key=lambda c: c.sse)
        chosen, aside = self._chosen, self.set_aside
        if best is chosen or best == aside or best.sse >= 0.95 * chosen.sse or not best.range:
            return None
        return best

    @property
    def chosen(self) -> Candidate:
        """The chosen candidate (its predicted SSE at each dependence quantile)."""
        return self._chosen

    @property
    def _chosen(self) -> Candidate:
        return next(
            c for c in self.candidates if (c.l, c.m, c.design) == (self.l, self.m, self.design)
        )

    def notes(self, names: Sequence[str]) -> list[str]:
        """Plain-language notes: a pilot that measured no pair (the prediction is then
        the prior's), a design predicted lower on average than the one chosen, skipped
        and uncollected attributes, a design set aside."""
        out = []
        pilot = self.fixed_views if self.profile.source == "pilot" else ()
        if pilot and all(len(v) < 2 for v in pilot):
            low, high = self.sse_range
            effect = (
                "which the prediction does not hang on (every query is in a view)"
                if self._chosen.steady
                else f"and the predicted SSE ranges from {low:.3g} to {high:.3g} over it"
            )
            out.append(
                "the pilot measured no pair of attributes (at these users and epsilon a "
                "pair's table cannot tell a typical dependence from none): how strongly "
                f"the attributes depend is the prior's assumption, {effect}"
            )
        if self.set_aside is not None:
            c = self.set_aside
            out.append(
                f"l = {c.l}, m = {c.m} ({c.design}) beat the safe designs at the pilot's "
                "estimated margins but not at the most or the least skewed margins its "
                f"reports allow: kept l = {self.l}, m = {self.m} ({self.design})"
            )
        lower = self._lower_on_average()
        if lower is not None:
            rule = (
                "takes the design closest to the best at every quantile alike (the smallest "
                "mean log ratio), not the lowest average"
                if self.restricted
                else "weighs every quantile alike and leaves the safe designs (one attribute "
                "per view, Algorithm 1's plan) only for a design that beats them by more "
                "than the prediction's uncertainty"
            )
            out.append(
                f"l = {lower.l}, m = {lower.m} ({lower.design}) is predicted lower on average "
                f"({_over_quantiles(lower)}, against {_over_quantiles(self._chosen)}); the "
                f"planner {rule}"
            )
        if self.single:
            listed = ", ".join(repr(names[a]) for a in self.single)
            out.append(
                f"{len(self.single)} attribute(s) with one category, not collected (their "
                f"marginal is known exactly): {listed}"
            )
        if self.predicted.uncollected:
            listed = ", ".join(repr(names[a]) for a in self.predicted.uncollected)
            out.append(
                f"{len(self.predicted.uncollected)} attribute(s) in no view (too few users "
                f"to hold them all; answered as uniform): {listed}"
            )
        return out


def _over_quantiles(candidate: Candidate) -> str:
    """A candidate's expected SSE and its spread over the dependence quantiles, in words."""
    if not candidate.range or candidate.steady:
        return f"{candidate.sse:.3g} at every dependence quantile"
    low, high = min(candidate.range), max(candidate.range)
    return f"{candidate.sse:.3g}, from {low:.3g} to {high:.3g} over the dependence quantiles"


@lru_cache(maxsize=64)
def _cover(d: int, k: int, l: int, covering_dir: str | None) -> tuple[tuple[int, ...], ...]:  # noqa: E741
    return tuple(construct_cover(d, k, l, rng=0, covering_dir=covering_dir))


def choose_plan(
    sizes: Sequence[int],
    epsilon: float,
    n: int,
    workload: Workload,
    profile: DataProfile | None = None,
    fixed_views: Sequence[Sequence[int]] = (),
    fixed_users: Sequence[float] = (),
    l: int | None = None,  # noqa: E741
    m: int | None = None,
    rng: int = 0,
    shrink: bool = True,
    covering_dir: Path | str | None = None,
    reconstruction: str = "local",
) -> PlannedViews:
    """The views for ``n`` users (module docstring).

    Args:
        sizes: category count per attribute.
        epsilon: each user's LDP budget.
        n: users who will report on the new views (not counting ``fixed_users``).
        workload: the queries to be answered (:class:`~.error_model.Workload`).
        profile: assumptions about the data (default: :meth:`DataProfile.prior`).
        fixed_views: views already in the design.
        fixed_users: the reports each of ``fixed_views`` has.
        l: restrict the search to this view size (None: any).
        m: restrict the search to this view count (None: any).
        rng: seed of the designs (the choice is deterministic given it).
        shrink: whether reconstruction shrinks interactions.
        covering_dir: optional covering folder for covering designs.
        reconstruction: how the answers will be reconstructed, "local" or "global"
            (the error model predicts that one, :func:`~.error_model.predict_errors`).
    """
    problem = _problem(
        sizes,
        epsilon,
        n,
        workload,
        profile,
        fixed_views,
        fixed_users,
        l,
        m,
        rng,
        shrink,
        covering_dir,
        reconstruction,
    )
    return _Search(problem).run()


def score_views(
    sizes: Sequence[int],
    epsilon: float,
    n: int,
    workload: Workload,
    profile: DataProfile,
    views: Sequence[Sequence[int]],
    design: str,
    fixed_views: Sequence[Sequence[int]] = (),
    fixed_users: Sequence[float] = (),
    rng: int = 0,
    reconstruction: str = "local",
) -> Candidate:
    """``views`` for ``n`` users (beside ``fixed_views``, as in :func:`choose_plan`)
    scored as :func:`choose_plan` scores a design: its predicted SSE at each of
    ``profile``'s dependence quantiles, named ``design``."""
    problem = _problem(
        sizes,
        epsilon,
        n,
        workload,
        profile,
        fixed_views,
        fixed_users,
        None,
        None,
        rng,
        True,
        None,
        reconstruction,
    )
    search = _Search(problem)
    chosen = tuple(tuple(sorted(int(a) for a in v)) for v in views)
    search.score(max(len(v) for v in chosen), chosen, design)
    return search.scored[-1][0]


@dataclass(frozen=True)
class _Problem:
    """What :func:`choose_plan` was asked, checked: the attributes it collects
    (``collect``, >= 2 categories) and those it cannot (``single``)."""

    sizes: tuple[int, ...]
    epsilon: float
    n: int
    workload: Workload
    profile: DataProfile
    fixed: tuple[tuple[int, ...], ...]
    users_fixed: list[float]
    l: int | None  # noqa: E741
    m: int | None
    rng: int
    shrink: bool
    covering_dir: Path | str | None
    reconstruction: str
    collect: list[int]
    single: tuple[int, ...]

    @property
    def arr(self) -> np.ndarray:
        return np.array(self.sizes, dtype=np.int64)

    @property
    def dc(self) -> int:
        return len(self.collect)

    @property
    def restricted(self) -> bool:
        return self.l is not None or self.m is not None


def _problem(
    sizes: Sequence[int],
    epsilon: float,
    n: int,
    workload: Workload,
    profile: DataProfile | None,
    fixed_views: Sequence[Sequence[int]],
    fixed_users: Sequence[float],
    l: int | None,  # noqa: E741
    m: int | None,
    rng: int,
    shrink: bool,
    covering_dir: Path | str | None,
    reconstruction: str,
) -> _Problem:
    """:func:`choose_plan`'s arguments checked, each error naming the argument."""
    sizes_t = tuple(int(s) for s in sizes)
    d = len(sizes_t)
    if d == 0:
        raise PlanError("sizes (()) must name at least one attribute")
    if any(s < 1 for s in sizes_t):
        raise PlanError(f"sizes ({list(sizes_t)}) must be category counts >= 1")
    eps = _epsilon(epsilon)
    check_reconstruction(reconstruction)
    check_int("n", n, 1, PlanError)
    workload.check(d)
    if profile is None:
        from calmkit_client import Schema

        profile = DataProfile.prior(Schema.from_sizes(sizes_t))
    if profile.sizes != sizes_t:
        raise PlanError(f"profile (sizes {list(profile.sizes)}) must match sizes {list(sizes_t)}")
    fixed = tuple(tuple(sorted(int(a) for a in v)) for v in fixed_views)
    users_fixed = [float(u) for u in fixed_users]
    if len(users_fixed) != len(fixed):
        raise PlanError(f"fixed_users ({len(users_fixed)}) must give one count per fixed view")
    collect = [a for a in range(d) if sizes_t[a] > 1]
    if not collect:
        raise PlanError(
            f"every attribute ({d}) has one category: there is nothing to collect "
            "(each marginal is known exactly)"
        )
    dc = len(collect)
    if l is not None and (not is_int(l) or not 1 <= l <= dc):
        raise PlanError(
            f"l ({l!r}) must be an int in [1, {dc}] ({dc} attributes with >= 2 categories)"
        )
    if m is not None:
        check_int("m", m, 1, PlanError)
    single = tuple(a for a in range(d) if sizes_t[a] == 1)
    return _Problem(
        sizes_t,
        eps,
        int(n),
        workload,
        profile,
        fixed,
        users_fixed,
        l,
        m,
        rng,
        shrink,
        covering_dir,
        reconstruction,
        collect,
        single,
    )


Scored = tuple[Candidate, tuple[tuple[int, ...], ...], ErrorPrediction]


class _Search:
    """The search of the module docstring over one :class:`_Problem`: every design it
    scores is kept in ``scored`` (in the order scored); :meth:`run` returns the
    choice."""

    def __init__(self, problem: _Problem) -> None:
        self.p = problem
        self.scored: list[Scored] = []
        self.floors: dict[tuple[int, int, str], float] = {}  # a design's least noise part
        self.streams: dict[tuple[str, int], SpreadStream | DependentStream] = {}
        self.lows: dict[int, int] = {}  # the first view count of each size
        profile = problem.profile
        self.relevance = _pair_relevance(profile, problem.workload) if profile.uneven else None
        self.deps = tuple(profile.dependence_quantiles or (profile.dependence,))
        self.total = float(problem.n) + sum(problem.users_fixed)
        self.kinds: dict[str, Callable[[int, int], float]] = {
            "spread": self.spread,
            "dependent": self.dependent,
            "balanced": self.balanced,
        }

    def run(self) -> PlannedViews:
        p = self.p
        self.view_sizes()
        if not self.scored:
            raise PlanError(f"n ({p.n}) users cannot hold a view of the requested size")
        if p.m is None:
            self.refine()
        if not p.restricted and p.workload.k is not None and p.workload.k <= p.dc:
            paper = _paper_views(
                p.arr, p.collect, p.epsilon, p.n, p.workload.k, p.rng, p.covering_dir, p.fixed
            )
            if paper:
                self.score(max(len(v) for v in paper), paper, "paper")
        informed = p.profile.source == "pilot"
        choice, set_aside = _safe_choice(self.scored, p.restricted, informed), None
        if not self.holds_across_marginals(choice):
            set_aside = choice[0]
            choice = _safe_choice(self.scored, p.restricted, informed, beating=False)
        cand, views, pred = choice
        return PlannedViews(
            views,
            cand.l,
            cand.m,
            cand.design,
            pred,
            tuple(c for c, _, _ in self.scored),
            p.fixed,
            p.profile,
            p.single,
            set_aside,
            p.restricted,
        )

    # -- scoring designs -------------------------------------------------------------------
    def score(self, lv: int, views: tuple[tuple[int, ...], ...], design: str) -> float:
        """Predict a design at every dependence quantile; returns the geometric mean
        of the predictions (what the search follows)."""
        key = (lv, len(views), design)
        if key in self.floors:
            cand = next(c for c, _, _ in self.scored if (c.l, c.m, c.design) == key)
            return cand.typical
        preds = self._predict(views, self.p.profile)
        cand, expected = _candidate(lv, views, design, preds)
        self.scored.append((cand, views, expected))
        self.floors[key] = min(x.noise for x in preds)
        return cand.typical

    def _predict(
        self, views: tuple[tuple[int, ...], ...], profile: DataProfile
    ) -> list[ErrorPrediction]:
        """``views``' predicted error (the fixed views' counted) at each dependence
        quantile, under ``profile``."""
        p = self.p
        users = p.users_fixed + [p.n / len(views)] * len(views)
        return predict_errors(
            p.arr,
            p.fixed + views,
            users,
            p.epsilon,
            p.workload,
            profile,
            self.deps,
            n=self.total,
            shrink=p.shrink,
            seed=p.rng,
            reconstruction=p.reconstruction,
        )

    def holds_across_marginals(self, choice: Scored) -> bool:
        """Whether a design chosen for beating the safe ones convincingly still does at
        both ends of the profile's ``marginal_range`` (a pilot's margins, few reports
        per view: how skewed an attribute is changes what Norm-Sub clips, and so each
        design's noise, and the median alone may favour the wrong one). True for a
        safe or steady choice, a restricted search, or known marginals."""
        cand, views, _ = choice
        ends = self.p.profile.marginal_range
        if ends is None or self.p.restricted or _is_safe(cand) or cand.steady:
            return True
        safe = _safe_designs(self.scored, _regret(self.scored))
        if not all(convincing(cand, s[0]) for s in safe):
            return True  # not chosen for beating them (:func:`_dominating`)
        for marginals in ends:
            profile = self.p.profile.with_marginals(marginals)
            alt = _candidate(cand.l, views, cand.design, self._predict(views, profile))[0]
            for s_cand, s_views, _ in safe:
                preds = self._predict(s_views, profile)
                if not convincing(alt, _candidate(s_cand.l, s_views, s_cand.design, preds)[0]):
                    return False
        return True

    def spread(self, lv: int, mv: int) -> float:
        p = self.p
        if lv == 1 and any(len(v) == 1 for v in p.fixed):
            # a pilot that measured attributes alone: the main phase measures them again
            return self.score(1, tuple((a,) for a in p.collect[:mv]), "spread")
        stream = self._stream("spread", lv)
        return self.score(lv, stream.first(mv), "spread")

    def dependent(self, lv: int, mv: int) -> float:
        return self.score(lv, self._stream("dependent", lv).first(mv), "dependent")

    def balanced(self, lv: int, mv: int) -> float:
        return self.score(lv, self._stream("balanced", lv).first(mv), "balanced")

    def _stream(self, kind: str, lv: int) -> SpreadStream | DependentStream:
        p = self.p
        if (kind, lv) not in self.streams:
            rng = [p.rng, lv]
            if kind == "spread":
                made: SpreadStream | DependentStream = SpreadStream(
                    p.collect, lv, rng=rng, start=p.fixed, again=p.fixed
                )
            elif kind == "balanced":
                made = SpreadStream(
                    p.collect, lv, rng=rng, start=p.fixed, weights=self.relevance, again=p.fixed
                )
            else:
                assert self.relevance is not None  # only asked for with an uneven profile
                made = DependentStream(
                    p.collect, lv, self.relevance, rng=rng, start=p.fixed, again=p.fixed
                )
            self.streams[kind, lv] = made
        return self.streams[kind, lv]

    def dependent_near_best(self, lv: int) -> float:
        """The designs that hold the pairs the profile expects to depend most (when it
        knows which): dependent and balanced at the view count where the spread designs
        of size ``lv`` did best, and the better of the two at the second best count."""
        if self.relevance is None or lv < 2:
            return math.inf
        tried = sorted(
            (c.typical, c.m) for c, _, _ in self.scored if c.l == lv and c.design == "spread"
        )
        if not tried:
            return math.inf
        values = {
            "dependent": self.dependent(lv, tried[0][1]),
            "balanced": self.balanced(lv, tried[0][1]),
        }
        better = min(values, key=values.__getitem__)
        if len(tried) > 1:
            values[better] = min(values[better], self.kinds[better](lv, tried[1][1]))
        return min(values.values())

    # -- the search ------------------------------------------------------------------------
    def room(self, lv: int) -> int:
        """Distinct views of size ``lv``: a fixed (pilot) view may be measured again,
        after the views no fixed one holds (the designs' ``again``): a pilot that
        measured every pair left no new pair view, and Adult's first 8 attributes
        at eps 4 then took 3 views of 3 for pairs, 2.0x the SSE of Algorithm 1's 28
        pairs."""
        return math.comb(self.p.dc, lv)

    def most_views(self, lv: int) -> int:
        """The most views of size ``lv`` the search scores (:func:`_most_views`)."""
        cells = expected_cells(self.p.arr[self.p.collect].tolist(), lv)
        return _most_views(self.room(lv), self.p.n, cells)

    def view_sizes(self) -> None:
        """Every view size l = 1, 2, ... (or the fixed one) until two sizes past the
        workload's order did not improve."""
        p = self.p
        lmax = min(p.dc, _MAX_L) if p.l is None else int(p.l)
        lmin = 1 if p.l is None else int(p.l)
        best_overall = math.inf
        worse = 0
        for lv in range(lmin, lmax + 1):
            if _smallest_cells(p.arr[p.collect], lv) > MAX_VIEW_CELLS:
                break
            hi = self.most_views(lv)
            if hi < 1:
                continue
            best_l = self.one_size(lv, hi, best_overall)
            worse = worse + 1 if best_l > best_overall else 0
            best_overall = min(best_overall, best_l)
            if p.l is None and lv >= p.workload.order and worse >= _PATIENCE:
                break
        if not self.scored and p.m is not None:
            most = max(self.room(lv) for lv in range(lmin, lmax + 1))
            raise PlanError(f"m ({p.m}) must be <= {most} distinct views of any size")

    def one_size(self, lv: int, hi: int, best_overall: float) -> float:
        """Every design of size ``lv``; returns the best prediction among them."""
        p = self.p
        if p.m is not None:
            if p.m > self.room(lv):
                if p.l is not None:
                    raise PlanError(
                        f"m ({p.m}) must be <= {self.room(lv)} distinct views of size {lv}"
                    )
                return math.inf  # l is the planner's: this size cannot hold m views
            best_l = min(self.spread(lv, int(p.m)), self.dependent_near_best(lv))
        else:
            best_l = min(self.sweep(lv, hi), self.dependent_near_best(lv))
        best_l = min(best_l, self.cover(lv, hi, min(best_l, best_overall)))
        return min(best_l, self.queries_design(lv))

    def sweep(self, lv: int, hi: int) -> float:
        """Spread designs of ``ceil(d / lv)`` views, then 4x as many, until two steps
        do not improve or a design's noise alone is past the best."""
        mv = self.lows[lv] = min(hi, math.ceil(self.p.dc / lv))
        best_l = last = self.spread(lv, mv)
        rises = 0
        while mv < hi and rises < _PATIENCE:
            mv = min(hi, 4 * mv)
            value = self.spread(lv, mv)
            rises = rises + 1 if value > last else 0
            best_l, last = min(best_l, value), value
            if self.floors[lv, mv, "spread"] > best_l:
                break  # its noise alone is past the best: more views only add noise
        return best_l

    def cover(self, lv: int, hi: int, near: float) -> float:
        """A covering design of size ``lv`` (every k-set in a view), for l in [k, k + 2]
        and when a spread design of its size is within _RISE of ``near``."""
        p = self.p
        order = p.workload.order
        if p.workload.k is None or not order <= lv <= order + 2 or p.dc > _COVER_MAX_D:
            return math.inf
        need = cover_lower_bound(p.dc, order, lv)
        limit = hi if p.m is None else int(p.m)
        if need > limit or (p.m is None and self.spread(lv, need) > _RISE * near):
            return math.inf
        cover_dir = None if p.covering_dir is None else str(p.covering_dir)
        whole = tuple(tuple(p.collect[i] for i in b) for b in _cover(p.dc, order, lv, cover_dir))
        # the views the design lacks; all of them again when it holds every one
        base = tuple(v for v in whole if v not in set(p.fixed)) or whole
        size = len(base) if p.m is None else int(p.m)
        if not len(base) <= size <= self.room(lv):
            return math.inf
        extra = spread_views(
            p.collect,
            lv,
            size - len(base),
            rng=[p.rng, lv, size],
            start=p.fixed + base,
            again=[v for v in p.fixed if v not in set(base)],
        )
        return self.score(lv, base + extra, "cover")

    def queries_design(self, lv: int) -> float:
        """The workload's own queries as views, when they all have ``lv`` attributes."""
        p = self.p
        if p.workload.queries is None or p.restricted:
            return math.inf
        qs = tuple(
            sorted({tuple(a for a in q if p.sizes[a] > 1) for q in p.workload.queries} - {()})
        )
        if qs and len(qs) <= p.n and len({len(q) for q in qs}) == 1 and len(qs[0]) == lv:
            return self.score(lv, tuple(q for q in qs if q not in set(p.fixed)), "queries")
        return math.inf

    def refine(self) -> None:
        """View counts 0.5x, 0.7x, 1.4x and 2x the best stream design's, never below
        full coverage."""
        streamed = [c for c, _, _ in self.scored if c.design in self.kinds]
        if not streamed:
            return
        top = min(streamed, key=_regret(self.scored))
        hi = self.most_views(top.l)
        for factor in (0.5, 2**-0.5, 2**0.5, 2.0):
            mv = round(top.m * factor)
            if self.lows.get(top.l, 1) <= mv <= hi:
                self.kinds[top.design](top.l, mv)


def _paper_views(
    sizes: np.ndarray,
    collect: list[int],
    epsilon: float,
    n: int,
    k: int,
    rng: int,
    covering_dir: Path | str | None,
    fixed: tuple[tuple[int, ...], ...],
) -> tuple[tuple[int, ...], ...]:
    """Algorithm 1's views over the collected attributes (a safe candidate), those not
    already in the design; all of them when the design holds every one (a pilot
    that measured every pair: Algorithm 1's plan then measures them again)."""
    chosen = choose_views(
        sizes[collect].tolist(), epsilon, n, k, rng=rng, covering_dir=covering_dir
    ).views
    views = tuple(tuple(collect[i] for i in v) for v in chosen)
    return tuple(v for v in views if v not in set(fixed)) or views


def fewest_users(sizes: Sequence[int], l: int = 1) -> int:  # noqa: E741
    """The fewest users :func:`choose_plan` plans views of size ``l`` for: as many as
    such a view has cells on average (:func:`_most_views`), over the attributes with
    >= 2 categories."""
    return max(1, math.ceil(expected_cells([s for s in sizes if s > 1], l)))


def _most_views(room: int, n: int, cells: float) -> int:
    """The most views of one size the search scores: distinct ones (``room``), at
    most :data:`MAX_VIEWS`, and each expecting at least as many users as it has
    cells. A view with fewer users than cells is mostly empty cells: Norm-Sub then
    moves most of its mass and its alternation with consistency, which the error
    model treats as separate steps, stops converging (NLTCS, eps 1, 4,096 views of
    5 attributes, 5 users each: 1,000 rounds without converging and 4x the SSE of
    140 views of 4)."""
    return int(min(room, n // max(1, math.ceil(cells)), MAX_VIEWS))


def _pair_relevance(profile: DataProfile, workload: Workload) -> np.ndarray:
    """(d, d): the dependence each pair is expected to carry into the workload's
    answers when no view holds it, up to a common factor: its weight times
    ``dim_ab / L_ab``, times how many queries hold the pair for an explicit list."""
    frac = np.array([(s - 1) / s for s in profile.sizes])
    out: np.ndarray = profile.weights * np.outer(frac, frac)
    if workload.queries is not None:
        counts = np.zeros_like(out)
        for q in workload.queries:
            idx = np.array(q, dtype=np.int64)
            counts[idx[:, None], idx] += 1
        out = out * counts
    return out


def _candidate(
    lv: int, views: tuple[tuple[int, ...], ...], design: str, preds: Sequence[ErrorPrediction]
) -> tuple[Candidate, ErrorPrediction]:
    """A design's candidate from its predictions at the dependence quantiles (equally
    likely values), and its expected error."""
    expected = ErrorPrediction(
        float(np.mean([x.sse for x in preds])),
        float(np.mean([x.noise for x in preds])),
        float(np.mean([x.bias for x in preds])),
        preds[0].uncollected,
    )
    sses = tuple(x.sse for x in preds)
    cand = Candidate(lv, len(views), design, expected.sse, expected.noise, expected.bias, sses)
    return cand, expected


def _is_safe(candidate: Candidate) -> bool:
    return candidate.design == "paper" or candidate.l == 1


def _safe_designs(scored: Sequence[Scored], regret: Callable[[Candidate], float]) -> list[Scored]:
    """The safe designs among ``scored``: the one attribute per view design of least
    ``regret`` and Algorithm 1's plan."""
    ones = [x for x in scored if x[0].l == 1 and x[0].design != "paper"]
    first = [min(ones, key=_by_regret(regret))] if ones else []
    return first + [x for x in scored if x[0].design == "paper"]


def _by_regret(
    regret: Callable[[Candidate], float],
) -> Callable[[Scored], tuple[float, float, int]]:
    """Sort key: the smallest regret, then the smaller mean SSE, then fewer views."""
    return lambda x: (regret(x[0]), x[0].sse, x[0].m)


def _safe_choice(
    scored: Sequence[Scored],
    restricted: bool = False,
    informed: bool = True,
    beating: bool = True,
) -> Scored:
    """The design the planner returns. The safe designs are one attribute per view (the
    best one when nothing depends; its error never exceeds the dependence) and
    Algorithm 1's plan. Another design is chosen only if it beats both by more than
    the prediction's own uncertainty (:func:`convincing`): the smallest regret
    (:func:`_regret`) among those that do. Else the smallest regret among the safe
    designs and, for a profile a pilot ``informed``, the best steady one
    (:attr:`Candidate.steady`: every query inside a view, so its prediction does not hang on the
    uncertain dependence; where the pilot cannot tell a weak dependence from a strong
    one, it is the design that is right either way). From the prior alone, whose
    dependence spans every kind of data, the steady design is not weighed: planned
    without a pilot, a population of 8 independent binary attributes measured 1.9x the
    SSE of the safe designs' with it. That choice gives way to a design of its view
    size laid out as evenly that is predicted no worse at any quantile
    (:func:`_dominating`): on 20 attributes of 8-40 categories the fallback took
    Algorithm 1's 80 pairs where 138 were predicted better throughout (1.16 to 1.09 of
    the best grid point). With ``l`` or ``m`` fixed (``restricted``), or
    without safe designs, simply the smallest regret. Without ``beating``, no design
    is chosen for beating the safe ones (it did not hold across the marginals,
    :meth:`_Search.holds_across_marginals`)."""
    regret = _regret(scored)
    key = _by_regret(regret)
    safe = _safe_designs(scored, regret)
    if restricted or not safe:
        return min(scored, key=key)
    others = [x for x in scored if not _is_safe(x[0])]
    winners = [x for x in others if beating and all(convincing(x[0], s[0]) for s in safe)]
    if winners:
        return min(winners, key=key)
    steady = [x for x in others if informed and x[0].steady]
    choice = min(safe + ([min(steady, key=key)] if steady else []), key=key)
    return min([choice, *_dominating(scored, choice[0])], key=key)


def _dominating(scored: Sequence[Scored], chosen: Candidate) -> list[Scored]:
    """Designs of ``chosen``'s view size laid out as evenly (spread or balanced) whose
    predicted SSE is no larger at any dependence quantile: what the pilot leaves
    uncertain cannot make them worse than ``chosen``, and the model's error between
    view counts of two attributes is small (0.056 in log over the planner
    benchmark's grid, against 0.10 between any two designs)."""
    return [
        x
        for x in scored
        if x[0] is not chosen
        and x[0].l == chosen.l
        and x[0].design in ("spread", "balanced")
        and all(a <= b for a, b in zip(x[0].range, chosen.range))
    ]


def convincing(candidate: Candidate, safe: Candidate) -> bool:
    """Whether ``candidate``'s predicted SSE beats ``safe``'s by more than the
    prediction's own uncertainty: the mean over the profile's dependence quantiles of
    ``log(candidate / safe)`` plus its standard deviation is below 0.

    The standard deviation has two parts: how the log ratio varies over what the
    profile leaves uncertain (the spread over its five equally likely quantiles, which
    is 0.88 of the posterior's standard deviation for a normal law), and the error
    model's own error on each of the two designs, :data:`MODEL_SD` each."""
    diff = np.log(np.array(candidate.range) / np.array(safe.range))
    spread = float(diff.std()) / _QUANTILE_SPREAD if diff.size > 1 else 0.0
    return float(diff.mean()) + math.sqrt(spread**2 + 2 * MODEL_SD**2) < 0


def expected_gain(candidate: Candidate, other: Candidate) -> float:
    """How much lower ``candidate``'s predicted SSE is than ``other``'s on average: the
    mean over the profile's dependence quantiles of ``log(other / candidate)``, with no
    margin for the prediction's uncertainty (for a choice between two designs neither
    of which is the safe one; :func:`convincing` is for leaving a safe design)."""
    return float(np.mean(np.log(np.array(other.range) / np.array(candidate.range))))


def _regret(scored: Sequence[tuple[Candidate, object, object]]) -> Callable[[Candidate], float]:
    """A candidate's mean log ratio to the best candidate at each dependence quantile."""
    best = np.min(np.array([c.range for c, _, _ in scored]), axis=0)
    return lambda c: float(np.mean(np.log(np.array(c.range) / best)))


def _epsilon(epsilon: object) -> float:
    try:
        return validate_epsilon(epsilon)
    except CalmkitError as exc:
        raise PlanError(str(exc)) from None


def _smallest_cells(sizes: np.ndarray, l: int) -> int:  # noqa: E741
    """Cells of the smallest l-way view over ``sizes``."""
    return int(np.prod(np.sort(sizes)[:l], dtype=np.int64))
