"""A batch of reports in columns: what the columnar wire message carries, what the
batch log stores, and what storage validates, deduplicates and counts with numpy.

Layout (all little-endian, ``n`` reports, the plan's ``m`` views):

- ``report_ids``, ``pseudonyms``: ``16 n`` bytes each (report i at ``[16 i, 16 i + 16)``);
- ``views``: ``n`` uint32;
- ``cells``: one uint32 per report on a GRR view, in batch order;
- ``bits``: the payloads of the reports on OUE views, in batch order, each
  ``ceil(L_view / 8)`` bytes (bit c of a payload is bit ``7 - c % 8`` of byte ``c // 8``,
  zero padding), concatenated.

:func:`decode_columns` checks every field against a plan in whole-array operations and
names the first bad report (``reports[i].field (value) must be ...``), so a batch is
refused whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from calmkit_client import CalmkitError, Plan
from calmkit_client.echo import show as _show
from calmkit_client.report import REPORT_ID_BYTES
from calmkit_client.validation import is_int

__all__ = [
    "KEY_BYTES",
    "ReportColumns",
    "columns_from_reports",
    "decode_columns",
]

KEY_BYTES = REPORT_ID_BYTES  # report ids and pseudonyms: 16 bytes each
_U32 = np.dtype("<u4")


@dataclass(frozen=True)
class ViewPayloads:
    """Batch positions ``rows`` (n_j,) int64 of the reports on one view and their
    payloads (GRR: (n_j,) int64 cells; OUE: (n_j, ceil(L/8)) uint8)."""

    rows: np.ndarray
    payloads: np.ndarray


@dataclass(frozen=True)
class ReportColumns:
    """A batch validated against ``plan`` (see the module docstring for the layout).

    ``report_ids``, ``pseudonyms``: (n, 16) uint8; ``views``: (n,) int64; ``per_view``:
    one :class:`ViewPayloads` per view of the plan."""

    plan: Plan
    report_ids: np.ndarray
    pseudonyms: np.ndarray
    views: np.ndarray
    per_view: tuple[ViewPayloads, ...]

    def __len__(self) -> int:
        return int(self.views.shape[0])

    def take(self, positions: np.ndarray) -> ReportColumns:
        """The reports at sorted batch ``positions`` (int array), in that order."""
        positions = np.asarray(positions, dtype=np.int64)
        keep = np.zeros(len(self), dtype=bool)
        keep[positions] = True
        new_index = np.cumsum(keep) - 1
        per_view = []
        for vp in self.per_view:
            mask = keep[vp.rows]
            per_view.append(ViewPayloads(new_index[vp.rows[mask]], vp.payloads[mask]))
        return ReportColumns(
            self.plan,
            self.report_ids[positions],
            self.pseudonyms[positions],
            self.views[positions],
            tuple(per_view),
        )

    def support_deltas(self) -> tuple[np.ndarray, list[np.ndarray]]:
        """(reports per view (m,) int64, support counts per view [(L_j,) int64])."""
        n = np.bincount(self.views, minlength=self.plan.m).astype(np.int64)
        counts = [o.support(vp.payloads) for o, vp in zip(self.plan.view_oracles, self.per_view)]
        return n, counts

    def encode(self) -> dict[str, bytes]:
        """The column blobs (``report_ids``, ``pseudonyms``, ``views``, ``cells``,
        ``bits``): the wire message's and the batch log's layout."""
        n = len(self)
        grr = _is_grr(self.plan)[self.views]
        cells = np.zeros(n, dtype=_U32)
        nbytes = _nbytes(self.plan)[self.views]
        starts = np.concatenate(([0], np.cumsum(np.where(grr, 0, nbytes))))
        bits = np.zeros(int(starts[-1]), dtype=np.uint8)
        for oracle, vp in zip(self.plan.view_oracles, self.per_view):
            if oracle.name == "GRR":
                cells[vp.rows] = vp.payloads
            elif vp.rows.size:
                width = vp.payloads.shape[1]
                bits[starts[vp.rows][:, None] + np.arange(width)] = vp.payloads
        return {
            "report_ids": self.report_ids.tobytes(),
            "pseudonyms": self.pseudonyms.tobytes(),
            "views": self.views.astype(_U32).tobytes(),
            "cells": cells[grr].tobytes(),
            "bits": bits.tobytes(),
        }


def _is_grr(plan: Plan) -> np.ndarray:
    return np.array([o.name == "GRR" for o in plan.view_oracles], dtype=bool)


def _nbytes(plan: Plan) -> np.ndarray:
    return np.array([(o.L + 7) // 8 for o in plan.view_oracles], dtype=np.int64)


def _fail(i: int, field: str, value: Any, rule: str) -> CalmkitError:
    return CalmkitError(f"reports[{i}].{field} ({_show(value)}) {rule}")


def decode_columns(
    plan: Plan,
    count: int,
    *,
    report_ids: bytes,
    pseudonyms: bytes,
    views: bytes,
    cells: bytes,
    bits: bytes,
) -> ReportColumns:
    """Validate and split column blobs (see the module docstring) against ``plan``.

    Raises :class:`CalmkitError` naming the first bad field: blob lengths, a view out of
    range, a GRR cell >= L, an OUE payload with nonzero padding bits."""
    if not is_int(count) or count < 0:
        raise CalmkitError(f"count ({_show(count)}) must be an int >= 0")
    n = int(count)
    for name, blob, size in (
        ("report_ids", report_ids, KEY_BYTES),
        ("pseudonyms", pseudonyms, KEY_BYTES),
        ("views", views, 4),
    ):
        if len(blob) != n * size:
            raise CalmkitError(
                f"{name} ({len(blob)} bytes) must be {size} bytes per report ({n * size})"
            )
    v = np.frombuffer(views, dtype=_U32).astype(np.int64)
    bad = np.flatnonzero(v >= plan.m)
    if bad.size:
        raise _fail(int(bad[0]), "view", int(v[bad[0]]), f"must be in [0, {plan.m})")
    grr = _is_grr(plan)[v]
    n_grr = int(grr.sum())
    if len(cells) != 4 * n_grr:
        raise CalmkitError(
            f"cells ({len(cells)} bytes) must be 4 bytes per GRR report ({4 * n_grr})"
        )
    nbytes = np.where(grr, 0, _nbytes(plan)[v])
    starts = np.concatenate(([0], np.cumsum(nbytes)))
    if len(bits) != int(starts[-1]):
        raise CalmkitError(
            f"bits ({len(bits)} bytes) must be the OUE reports' payloads ({int(starts[-1])} "
            "bytes: ceil(L/8) per report)"
        )
    cell = np.zeros(n, dtype=np.int64)
    cell[grr] = np.frombuffer(cells, dtype=_U32)
    bit_arr = np.frombuffer(bits, dtype=np.uint8)
    limits = np.array([o.L for o in plan.view_oracles], dtype=np.int64)
    bad = np.flatnonzero(grr & (cell >= limits[v]))
    if bad.size:
        i = int(bad[0])
        raise _fail(i, "cell", int(cell[i]), f"must be < L = {int(limits[v[i]])} (view {v[i]})")
    order = np.argsort(v, kind="stable")
    bounds = np.searchsorted(v[order], np.arange(plan.m + 1))
    per_view = []
    for j, oracle in enumerate(plan.view_oracles):
        rows = order[bounds[j] : bounds[j + 1]]
        payloads: np.ndarray
        if oracle.name == "GRR":
            payloads = cell[rows]
        else:
            width = (oracle.L + 7) // 8
            payloads = bit_arr[starts[rows][:, None] + np.arange(width)].reshape(-1, width)
            pad = width * 8 - oracle.L
            if pad and rows.size:
                wrong = np.flatnonzero(payloads[:, -1] & np.uint8((1 << pad) - 1))
                if wrong.size:
                    i = int(rows[wrong[0]])
                    last = int(payloads[wrong[0], -1])
                    raise CalmkitError(
                        f"reports[{i}].bits (last byte {last:#04x}) must have its {pad} "
                        f"padding bits zero (view {j} is OUE, L = {oracle.L})"
                    )
        per_view.append(ViewPayloads(rows, payloads))
    return ReportColumns(
        plan,
        np.frombuffer(report_ids, dtype=np.uint8).reshape(n, KEY_BYTES),
        np.frombuffer(pseudonyms, dtype=np.uint8).reshape(n, KEY_BYTES),
        v,
        tuple(per_view),
    )


def columns_from_reports(plan: Plan, reports: Sequence[Any]) -> ReportColumns:
    """Columns of :class:`~.storage.StoredReport`-like objects (``report_id``,
    ``pseudonym``, ``view``, ``payload``), each field type-checked, the first bad one
    named (``reports[i].field``)."""
    for i, r in enumerate(reports):
        for name, size in (("report_id", KEY_BYTES), ("pseudonym", KEY_BYTES)):
            value = getattr(r, name, None)
            if not isinstance(value, bytes) or len(value) != size:
                raise _fail(i, name, value, f"must be {size} bytes")
        view = getattr(r, "view", None)
        if not is_int(view) or not 0 <= view < plan.m:
            raise _fail(i, "view", view, f"must be in [0, {plan.m})")
        oracle = plan.view_oracles[int(view)]
        payload = getattr(r, "payload", None)
        if oracle.name == "GRR":
            if not is_int(payload) or not 0 <= payload < oracle.L:
                raise _fail(
                    i,
                    "payload",
                    payload,
                    f"must be an int cell in [0, {oracle.L}) (view {view} is GRR)",
                )
        else:
            width = (oracle.L + 7) // 8
            if not isinstance(payload, bytes) or len(payload) != width:
                raise _fail(
                    i,
                    "payload",
                    payload,
                    f"must be {width} bytes (view {view} is OUE, L={oracle.L})",
                )
    grr = [plan.view_oracles[int(r.view)].name == "GRR" for r in reports]
    return decode_columns(
        plan,
        len(reports),
        report_ids=b"".join(r.report_id for r in reports),
        pseudonyms=b"".join(r.pseudonym for r in reports),
        views=np.array([int(r.view) for r in reports], dtype=_U32).tobytes(),
        cells=np.array([int(r.payload) for r, g in zip(reports, grr) if g], _U32).tobytes(),
        bits=b"".join(r.payload for r, g in zip(reports, grr) if not g),
    )
