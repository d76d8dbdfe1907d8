"""The service's guards against fake reports (docs/security.md "Manipulation"): the
feasibility checks of :mod:`..integrity` run on a collection's counts, on each
submitted batch and on the pilot, the report cap's default, and the per-answer bound
on what fakes can shift.

- A collection's counts are checked whenever its status or an answer is served (one
  vectorised test over every cell of every phase: milliseconds). A flag is logged once
  per newly flagged state (``manipulation`` events), not per query.
- Each batch (one submitter's call) is checked on its own counts after it is stored;
  an infeasible batch is accepted (a test never refuses genuine reports), logged with
  the peer's address and stored as a flag, so ``collection status`` shows it after a
  restart.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from calmkit_client import Plan
from calmkit_client.oracles import FrequencyOracle

from ..integrity import DEFAULT_ALPHA, Feasibility, check_feasible, max_shift_per_share
from ..reconstruction.support import SupportCounts
from .columns import ReportColumns

__all__ = [
    "DEFAULT_CAP",
    "FlagLog",
    "answer_shift",
    "batch_flag",
    "check_parts",
    "default_cap",
    "pilot_result",
]

DEFAULT_CAP = 2  # the report cap's default: DEFAULT_CAP x the expected number of users


def default_cap(expected_n: int, max_reports: int) -> int:
    """The cap a new collection gets: ``max_reports`` when given (> 0), else
    :data:`DEFAULT_CAP` x ``expected_n`` (0, no cap, when no ``expected_n`` was given:
    a collection of explicit views)."""
    return int(max_reports) if max_reports > 0 else DEFAULT_CAP * max(int(expected_n), 0)


def _view_names(plan: Plan, prefix: str) -> list[str]:
    names = plan.schema.names
    return [prefix + " x ".join(names[a] for a in view) for view in plan.views]


def check_parts(parts: Sequence[SupportCounts], alpha: float = DEFAULT_ALPHA) -> Feasibility:
    """One feasibility check over every phase's counts (Bonferroni over all of them);
    the reasons name ``phase i: a x b``."""
    oracles: list[FrequencyOracle] = []
    n: list[int] = []
    counts: list[np.ndarray] = []
    names: list[str] = []
    for i, part in enumerate(parts):
        oracles.extend(part.plan.view_oracles)
        n.extend(int(x) for x in part.n)
        counts.extend(part.counts)
        names.extend(_view_names(part.plan, f"phase {i}: " if len(parts) > 1 else ""))
    return check_feasible(oracles, np.asarray(n, np.int64), counts, alpha, names)


def batch_flag(batch: ReportColumns, peer: str, alpha: float = DEFAULT_ALPHA) -> str | None:
    """The flag of one submitter's batch whose own counts no honest population
    explains (None when they could be honest). ``peer``: the submitter's address."""
    n, counts = batch.support_deltas()
    result = check_feasible(batch.plan.view_oracles, n, counts, alpha, _view_names(batch.plan, ""))
    if result.passed:
        return None
    return f"batch of {len(batch)} reports from {peer}: {result.reason}"


def pilot_result(
    pilot: Sequence[SupportCounts], phase: int = 1, alpha: float = DEFAULT_ALPHA
) -> tuple[bool, str]:
    """The pilot check over the pilot's phases so far, before ``phase`` is planned:
    (passed, what ``collection status`` shows)."""
    result = check_parts(pilot, alpha)
    if result.passed:
        return True, "passed"
    return False, (
        f"failed: {result.reason}; phase {phase} planned by Algorithm 1 without the pilot"
    )


def answer_shift(plan: Plan, attrs: Sequence[int]) -> float:
    """The largest :func:`~..integrity.max_shift_per_share` over the views of
    ``plan`` (all phases combined) that hold an attribute of the answer: the views an
    answer over ``attrs`` is reconstructed from."""
    wanted = set(attrs)
    shifts = [
        max_shift_per_share(o)
        for v, o in zip(plan.views, plan.view_oracles)
        if wanted.intersection(v)
    ]
    return max(shifts, default=0.0)


class FlagLog:
    """What was last logged per collection, so a flagged state is logged once when it
    first appears (or changes: other views or cells), not on every query."""

    def __init__(self) -> None:
        self._seen: dict[str, frozenset[tuple[object, ...]]] = {}
        self._lock = threading.Lock()

    def is_new(self, collection_id: str, result: Feasibility) -> bool:
        """Whether ``result``'s flagged views and cells differ from the last state seen
        (remembered either way)."""
        state = frozenset((f.view, f.high, f.low, f.total) for f in result.flagged)
        with self._lock:
            new = bool(state) and self._seen.get(collection_id) != state
            self._seen[collection_id] = state
        return new
