"""Per-view support counts: the aggregator's sufficient statistics, kept as reports are
ingested.

Support counts are sums over reports, so counts from separate batches, replicas or
files merge by addition.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from calmkit_client import Plan, PlanError, Report, ViewReports

__all__ = ["SupportCounts"]


@dataclass(frozen=True)
class SupportCounts:
    """Report counts ``n`` (m,) int64 and support counts per view (list of (L_j,) int64)
    of one collection under ``plan``.

    ``margins_from``: the counts of an earlier phase whose reports the answers use only
    through the margins of single attributes (a pilot the planner set aside: on
    independent attributes its many small pair tables hold noise in their
    interactions, while every table's margins are unbiased and take all its users);
    see :func:`~.estimate.side_margins`. None: no such phase."""

    plan: Plan
    n: np.ndarray
    counts: tuple[np.ndarray, ...]
    margins_from: SupportCounts | None = None

    def __post_init__(self) -> None:
        side = self.margins_from
        if side is not None and side.plan.schema != self.plan.schema:
            raise PlanError("margins_from must share the schema of plan")
        if side is not None and side.margins_from is not None:
            raise PlanError("margins_from must not itself have margins_from")
        n = np.asarray(self.n, dtype=np.int64)
        if n.shape != (self.plan.m,) or (n < 0).any():
            raise PlanError(f"n (shape {n.shape}) must be {self.plan.m} counts >= 0")
        counts = tuple(np.asarray(c, dtype=np.int64) for c in self.counts)
        if len(counts) != self.plan.m:
            raise PlanError(f"counts ({len(counts)} views) must cover the plan's {self.plan.m}")
        for j, (c, oracle) in enumerate(zip(counts, self.plan.view_oracles)):
            if c.shape != (oracle.L,):
                raise PlanError(f"counts[{j}] (shape {c.shape}) must have shape ({oracle.L},)")
        object.__setattr__(self, "n", n)
        object.__setattr__(self, "counts", counts)

    @classmethod
    def zeros(cls, plan: Plan) -> SupportCounts:
        return cls(
            plan,
            np.zeros(plan.m, np.int64),
            tuple(np.zeros(o.L, np.int64) for o in plan.view_oracles),
        )

    @classmethod
    def from_reports(cls, plan: Plan, reports: Iterable[ViewReports | Report]) -> SupportCounts:
        """Count reports made under ``plan``: :func:`calmkit_client.make_reports`
        batches, single :class:`~calmkit_client.Report` objects (what devices send:
        :func:`calmkit_client.make_report`), or a mix. A report made under another plan
        is a :class:`PlanError` naming its position."""
        n = np.zeros(plan.m, np.int64)
        counts = [np.zeros(o.L, np.int64) for o in plan.view_oracles]
        singles: dict[int, list[int | bytes]] = {}
        for i, item in enumerate(reports):
            if isinstance(item, ViewReports):
                j = plan.check_view(item.view)
                n[j] += item.n
                counts[j] += plan.view_oracles[j].support(item.payloads)
            elif isinstance(item, Report):
                if item.plan_digest != plan.digest:
                    raise PlanError(
                        f"reports[{i}].plan_digest ({item.plan_digest[:12]}...) must be the "
                        f"plan's ({plan.digest[:12]}...)"
                    )
                singles.setdefault(plan.check_view(item.view), []).append(item.payload)
            else:
                raise PlanError(
                    f"reports[{i}] ({type(item).__name__}) must be a Report or ViewReports"
                )
        for j, payloads in singles.items():  # one vectorised count per view
            oracle = plan.view_oracles[j]
            if oracle.name == "OUE":
                arr = np.frombuffer(b"".join(payloads), np.uint8)  # type: ignore[arg-type]
                array = arr.reshape(len(payloads), -1)
            else:
                array = np.asarray(payloads, dtype=np.int64)
            n[j] += len(payloads)
            counts[j] += oracle.support(array)
        return cls(plan, n, tuple(counts))

    def pooled(self) -> SupportCounts:
        """One view per attribute set and oracle: views measured more than once under
        the same oracle (a pilot's view that the main phase measured again) become one,
        at the first one's position, with their reports and support counts summed.
        These are exactly the counts had all those users reported under one view: the
        oracle's estimate is linear in them, so every report weighs alike, and Norm-Sub
        meets one table instead of several sparser ones. ``self`` when no view repeats.
        """
        plan = self.plan
        keys = [(v, o.name) for v, o in zip(plan.views, plan.view_oracles)]
        first: dict[tuple[tuple[int, ...], str], int] = {}
        for j, key in enumerate(keys):
            first.setdefault(key, j)
        if len(first) == len(keys):
            return self
        order = sorted(first.values())
        slot = {keys[j]: i for i, j in enumerate(order)}
        n = np.zeros(len(order), np.int64)
        counts = [np.zeros_like(self.counts[j]) for j in order]
        for j, key in enumerate(keys):
            n[slot[key]] += self.n[j]
            counts[slot[key]] += self.counts[j]
        pooled = Plan(
            plan.schema,
            plan.epsilon,
            tuple(plan.views[j] for j in order),
            oracles=tuple(keys[j][1] for j in order),
            seed=plan.seed,
        )
        return SupportCounts(pooled, n, tuple(counts), self.margins_from)

    def merge(self, other: SupportCounts) -> SupportCounts:
        """Counts of both collections (same plan; neither with ``margins_from``)."""
        if other.plan.digest != self.plan.digest:
            raise PlanError(f"plan ({other.plan.digest[:12]}) must match ({self.plan.digest[:12]})")
        if self.margins_from is not None or other.margins_from is not None:
            raise PlanError("counts with margins_from cannot be merged: merge each phase alone")
        return SupportCounts(
            self.plan, self.n + other.n, tuple(a + b for a, b in zip(self.counts, other.counts))
        )
