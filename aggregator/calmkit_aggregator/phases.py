"""A collection in phases: what storage keeps of the design, and how the phases' counts
combine into one estimate.

A phased collection first asks a pilot share of the users for attribute pairs (in
one round, or two: the second round's pairs chosen from the first round's reports),
then plans the other users' views from what the pilot showed (:mod:`.planning.pilot`
does the planning). Storage keeps the :class:`PhasedDesign`
beside the collection and each phase's support counts under that phase's own plan;
:func:`combine_phases` joins them for the reconstruction, so no pilot report is
wasted, unless the pilot is left out of the answers (:func:`pilot_left_out`: its
check failed, or the planner predicted the answers better without its
small pair tables; its reports then count in the attributes' margins only,
:func:`pilot_set_aside`). This module loads neither the planner nor the
reconstruction: the storage backends import it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

import numpy as np

from calmkit_client import CalmkitError, Plan, PlanError

from .reconstruction.methods import check_reconstruction
from .reconstruction.support import SupportCounts

__all__ = [
    "PILOT_SET_ASIDE",
    "PhasedDesign",
    "answer_support",
    "combine_phases",
    "pilot_failed",
    "pilot_left_out",
    "pilot_set_aside",
]

# Appended to a collection's stored pilot check when the planner left the pilot's
# tables out of the answers (:class:`~.planning.pilot.MainPlan`).
PILOT_SET_ASIDE = (
    "left out of the answers but for the attributes' margins: the planner predicted "
    "them more accurate without the pilot's small pair tables"
)
# What collections stored before the set-aside pilot counted in the margins (read
# alike: their answers now count it in the margins too).
_PILOT_SET_ASIDE_BEFORE = (
    "left out of the answers: the planner predicted them more accurate without the "
    "pilot's small pair tables"
)


def pilot_failed(pilot_check: str) -> bool:
    """Whether a collection's pilot failed its feasibility check, read from its stored
    pilot check: its reports may be fakes, so they count nowhere, and once the next
    phase is stored no new report is taken under a pilot phase's plan
    (:func:`~.service.store.check_pilot_phase`)."""
    return pilot_check.startswith("failed")


def pilot_left_out(pilot_check: str) -> bool:
    """Whether a collection's answers leave its pilot phases out, read from its stored
    pilot check: a failed check (its reports may be fakes, and the next phase was
    planned without them) or a pilot the planner set aside (:data:`PILOT_SET_ASIDE`).
    The answers then rest on the last phase's views alone (a set-aside pilot still
    counts in the margins: :func:`pilot_set_aside`)."""
    return pilot_failed(pilot_check) or _set_aside(pilot_check)


def pilot_set_aside(pilot_check: str) -> bool:
    """Whether the planner set the collection's pilot aside (:data:`PILOT_SET_ASIDE`)
    after it passed its check: its reports then still count in the attributes'
    margins (:attr:`~.reconstruction.support.SupportCounts.margins_from`). A pilot
    that failed its check counts nowhere: its reports may be fakes."""
    return pilot_check.startswith("passed") and _set_aside(pilot_check)


def _set_aside(pilot_check: str) -> bool:
    return pilot_check.endswith((PILOT_SET_ASIDE, _PILOT_SET_ASIDE_BEFORE))


def combine_phases(parts: Sequence[SupportCounts]) -> SupportCounts:
    """The support counts of every phase under one reconstruction plan: the views of
    all phases in order, each with its own oracle and reports (the plans must share
    schema and epsilon). Shares and seed of the combined plan mean nothing: no client
    reports under it. A view two phases measured appears twice; the reconstruction
    pools it (:meth:`~.reconstruction.support.SupportCounts.pooled`)."""
    if not parts:
        raise PlanError("parts ([]) must hold at least one phase")
    first = parts[0].plan
    for i, part in enumerate(parts[1:], start=1):
        if part.plan.schema != first.schema or part.plan.epsilon != first.epsilon:
            raise PlanError(f"parts[{i}] must share the schema and epsilon of parts[0]")
    if len(parts) == 1:
        return parts[0]
    views = tuple(v for part in parts for v in part.plan.views)
    oracles = tuple(o for part in parts for o in part.plan.oracles or ())
    plan = Plan(first.schema, first.epsilon, views, oracles=oracles)
    n = np.concatenate([part.n for part in parts])
    counts = tuple(c for part in parts for c in part.counts)
    return SupportCounts(plan, n, counts)


def answer_support(pilot: SupportCounts, main: SupportCounts, keeps_pilot: bool) -> SupportCounts:
    """The counts a phased collection's answers rest on: every phase's views
    (:func:`combine_phases`) where the pilot is kept, else the main phase's views
    with the pilot's reports counted in the attributes' margins only
    (:attr:`~.reconstruction.support.SupportCounts.margins_from`)."""
    if keeps_pilot:
        return combine_phases([pilot, main])
    return replace(main, margins_from=pilot)


@dataclass(frozen=True)
class PhasedDesign:
    """How a collection's phases after the first are planned. With ``first_round``
    (> 0) the pilot reports in two rounds: once that many reports arrived under the
    first plan, :func:`~.planning.pilot.plan_pilot_round` chooses the second round's
    pairs from them (seed ``seed + 2``). Once ``pilot_reports`` reports arrived in the
    whole pilot, :func:`~.planning.pilot.plan_next_phase` chooses the views of the
    remaining ``expected_n`` users for the ``k``-way workload (``l``/``m`` fixed if
    given), with seed ``seed + 1``, for answers reconstructed by ``reconstruction``
    ("local" or "global"; designs stored without it were planned for "local", and
    without ``first_round`` had a pilot of one round)."""

    expected_n: int
    pilot_reports: int
    k: int
    seed: int = 0
    l: int | None = None  # noqa: E741
    m: int | None = None
    reconstruction: str = "local"
    first_round: int = 0

    def __post_init__(self) -> None:
        for name in ("expected_n", "pilot_reports", "k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise CalmkitError(f"{name} ({value!r}) must be an int >= 1")
        first = self.first_round
        if isinstance(first, bool) or not isinstance(first, int) or first < 0:
            raise CalmkitError(f"first_round ({first!r}) must be an int >= 0")
        if first >= self.pilot_reports:
            raise CalmkitError(
                f"first_round ({first}) must be below pilot_reports ({self.pilot_reports})"
            )
        check_reconstruction(self.reconstruction)

    @property
    def pilot_phases(self) -> int:
        """How many phases the pilot takes: 2 with a first round, else 1."""
        return 2 if self.first_round else 1

    def phase_target(self, phase: int) -> int | None:
        """The reports (over every phase so far) that end pilot phase ``phase``; None
        past the pilot."""
        if phase >= self.pilot_phases:
            return None
        return self.first_round if phase < self.pilot_phases - 1 else self.pilot_reports

    def to_json(self) -> str:
        """The design as canonical JSON (sorted keys), as storage keeps it."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> PhasedDesign:
        """A design read back from :meth:`to_json`'s text, checked as when made."""
        try:
            data = json.loads(text)
            return cls(**data)
        except (TypeError, ValueError) as exc:
            raise CalmkitError(f"design_json ({text[:80]!r}) is invalid: {exc}") from None
