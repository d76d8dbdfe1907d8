"""Reports: the only thing that leaves a user's device. Each user reports the projection
of her record onto her view through the view's frequency oracle (CALM (Zhang et al.,
"CALM: Consistent Adaptive Local Marginal for Marginal Release under Local Differential
Privacy", CCS 2018), §4.2).

:func:`make_report` projects one record onto the user's view, perturbs the cell with
the view's oracle and returns ``Report(plan_digest, view, payload, report_id)``. The
payload is exactly the oracle's output; the view is a public function of the user id;
the report id is fresh randomness. Nothing else about the record is sent.

:func:`make_reports` does the same for many users at once, vectorised per view (used
by batch uploads and by the simulator's faithful path).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from .assignment import UserId
from .errors import CalmkitError, PlanError
from .plan import Plan
from .randomness import OsEntropy, SourceLike, as_random_source, random_bytes, random_words
from .schema import Label
from .validation import check_int

__all__ = ["REPORT_ID_BYTES", "Report", "ViewReports", "make_report", "make_reports"]

REPORT_ID_BYTES = 16
_DIGEST = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class Report:
    """One user's perturbed report.

    ``payload`` is a cell index (int) for a GRR view and ``ceil(L/8)`` packed bytes for
    an OUE view. ``report_id`` (16 random bytes) makes retries idempotent.
    """

    plan_digest: str
    view: int
    payload: int | bytes
    report_id: bytes

    def __post_init__(self) -> None:
        if not isinstance(self.plan_digest, str) or not _DIGEST.match(self.plan_digest):
            raise PlanError(f"plan_digest ({self.plan_digest!r}) must be 64 lowercase hex digits")
        object.__setattr__(self, "view", check_int("view", self.view, 0, PlanError))
        payload = self.payload
        if isinstance(payload, (bytearray, memoryview)):
            payload = bytes(payload)
        elif isinstance(payload, np.integer):
            payload = int(payload)
        if isinstance(payload, bool) or not isinstance(payload, (int, bytes)):
            raise PlanError(f"payload ({self.payload!r}) must be an int (GRR) or bytes (OUE)")
        object.__setattr__(self, "payload", payload)
        if not isinstance(self.report_id, bytes) or len(self.report_id) != REPORT_ID_BYTES:
            raise PlanError(f"report_id ({self.report_id!r}) must be {REPORT_ID_BYTES} bytes")

    def check(self, plan: Plan) -> None:
        """Raise :class:`PlanError` unless this report can have come from ``plan``."""
        if self.plan_digest != plan.digest:
            raise PlanError(
                f"plan_digest ({self.plan_digest!r}) must be the collection's ({plan.digest!r})"
            )
        oracle = plan.oracle(self.view)
        if oracle.name == "GRR":
            value = np.array([self.payload if isinstance(self.payload, int) else -1])
        else:
            raw = self.payload if isinstance(self.payload, bytes) else b""
            value = np.frombuffer(raw, dtype=np.uint8).reshape(1, -1)
        try:
            oracle.check_payloads(value)
        except CalmkitError as exc:
            raise PlanError(f"payload of view {self.view} ({self.payload!r}): {exc}") from None


def make_report(
    plan: Plan,
    record: Mapping[str, Label] | Sequence[Label],
    user_id: UserId,
) -> Report:
    """One user's report under ``plan``, from the OS entropy source.

    There is deliberately no randomness argument: a report made from a seed can be
    re-derived by whoever guesses the seed. Simulations use :func:`make_reports` with
    a numpy Generator.

    Args:
        record: ``{attribute name: label}`` (every schema attribute, nothing else) or
            labels in schema order.
        user_id: the user's pseudonymous id (int, str or bytes); it picks the view.
    """
    codes = plan.schema.encode_record(record)
    view = plan.assign(user_id)
    cell = sum(codes[a] * s for a, s in zip(plan.views[view], plan.view_strides[view]))
    source = OsEntropy()
    payload = plan.view_oracles[view].perturb_one(cell, source)
    return Report(plan.digest, view, payload, random_bytes(source, REPORT_ID_BYTES))


@dataclass(frozen=True)
class ViewReports:
    """The reports of the users assigned to one view.

    ``rows`` (n_j,) int64 are the users' positions in the input batch; ``payloads`` is
    (n_j,) int64 (GRR) or (n_j, ceil(L/8)) uint8 (OUE); ``report_ids`` (n_j, 16) uint8.
    """

    view: int
    rows: np.ndarray
    payloads: np.ndarray
    report_ids: np.ndarray

    @property
    def n(self) -> int:
        """Number of reports (users) on this view."""
        return int(self.rows.shape[0])


def make_reports(
    plan: Plan,
    codes: npt.ArrayLike,
    user_ids: Sequence[UserId] | np.ndarray,
    rng: SourceLike = None,
) -> list[ViewReports]:
    """Reports of n users: codes (n, d) ints, user ids (n,). Vectorised per view.

    ``rng=None`` draws from the OS entropy source (bulk uploads); simulations pass a
    numpy Generator. Integer seeds are refused (:func:`~.randomness.as_random_source`).
    Returns one :class:`ViewReports` per view (empty views included), in view order.
    """
    arr = plan.schema.validate_codes(codes)
    if len(user_ids) != arr.shape[0]:
        raise PlanError(f"user_ids ({len(user_ids)} given) must match the records ({arr.shape[0]})")
    views = plan.assign_many(user_ids)
    source = as_random_source(rng)
    order = np.argsort(views, kind="stable")
    starts = np.searchsorted(views[order], np.arange(plan.m + 1))
    out = []
    for j in range(plan.m):
        rows = order[starts[j] : starts[j + 1]]
        cells = plan.schema.cell_index(arr[rows], plan.views[j])
        payloads = plan.view_oracles[j].perturb(cells, source)
        ids_j = random_words(source, 2 * rows.size).view(np.uint8).reshape(rows.size, 16)
        out.append(ViewReports(j, rows, payloads, ids_j))
    return out
