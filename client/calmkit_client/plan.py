"""The collection plan: what every client needs to make its one report.

A :class:`Plan` fixes the schema, epsilon, the m views (attribute subsets), the
frequency oracle of each view, the users' shares per view and the public hash seed of
the assignment (what the aggregator specifies before any user reports: CALM (Zhang et
al., "CALM: Consistent Adaptive Local Marginal for Marginal Release under Local
Differential Privacy", CCS 2018), §4.2). It is immutable, validated on construction, and
identified by :attr:`Plan.digest`, a SHA-256 of its canonical form that every report
carries.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

from .assignment import (
    UserId,
    hash_user_id,
    hash_user_ids,
    share_bounds,
    views_of_hashes,
    xxh64_u128,
)
from .errors import CalmkitError, PlanError
from .oracles import FrequencyOracle, choose_oracle, make_oracle, validate_oracle_epsilon
from .schema import AttrRef, Schema
from .validation import is_int

__all__ = ["MAX_VIEW_CELLS", "PLAN_FORMAT", "Plan"]

PLAN_FORMAT = 1
# Largest view a client is asked to encode (an OUE payload of 128 KiB).
MAX_VIEW_CELLS = 1 << 20


@dataclass(frozen=True)
class Plan:
    """An immutable collection plan.

    Args:
        schema: the attributes of a record.
        epsilon: the LDP budget of each user's single report.
        views: m attribute subsets (names or positions); stored as sorted position
            tuples.
        oracles: "GRR"/"OUE" per view; ``None`` chooses per view by the smaller
            variance (§2.2.3).
        shares: relative share of users per view (positive); ``None`` = equal. Stored
            normalised to sum 1.
        seed: public hash seed of the assignment, an int in [0, 2**64).
    """

    schema: Schema
    epsilon: float
    views: tuple[tuple[int, ...], ...]
    oracles: tuple[str, ...] | None = None
    shares: tuple[float, ...] | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.schema, Schema):
            raise PlanError(f"schema ({self.schema!r}) must be a Schema")
        try:
            eps = validate_oracle_epsilon(self.epsilon)
        except CalmkitError as exc:
            raise PlanError(str(exc)) from None
        object.__setattr__(self, "epsilon", eps)
        views = self._normalise_views(self.views)
        object.__setattr__(self, "views", views)
        m = len(views)
        if self.oracles is None:
            names = tuple(choose_oracle(self.schema.cells(v), eps).name for v in views)
        else:
            names = tuple(self.oracles)
            if len(names) != m:
                raise PlanError(f"oracles ({len(names)} given) must name one oracle per view ({m})")
            for j, name in enumerate(names):
                try:
                    make_oracle(name, self.schema.cells(views[j]), eps)
                except CalmkitError as exc:
                    raise PlanError(f"oracles[{j}]: {exc}") from None
        object.__setattr__(self, "oracles", names)
        if self.shares is None:
            shares = tuple([1.0 / m] * m)
        else:
            raw = tuple(self.shares)
            if len(raw) != m:
                raise PlanError(f"shares ({len(raw)} given) must give one share per view ({m})")
            for j, s in enumerate(raw):
                if isinstance(s, bool) or not isinstance(s, (int, float, np.integer, np.floating)):
                    raise PlanError(f"shares[{j}] ({s!r}) must be a finite number > 0")
                if not (math.isfinite(float(s)) and float(s) > 0):
                    raise PlanError(f"shares[{j}] ({float(s)!r}) must be finite and > 0")
            total = math.fsum(float(s) for s in raw)
            shares = tuple(float(s) / total for s in raw)
        object.__setattr__(self, "shares", shares)
        seed = self.seed
        if not is_int(seed) or not 0 <= int(seed) < 1 << 64:
            raise PlanError(f"seed ({seed!r}) must be an int in [0, 2**64)")
        object.__setattr__(self, "seed", int(seed))

    def _normalise_views(self, views: Iterable[Iterable[AttrRef]]) -> tuple[tuple[int, ...], ...]:
        if isinstance(views, (str, bytes)) or not isinstance(views, Iterable):
            raise PlanError(f"views ({views!r}) must be a sequence of attribute sets")
        out = []
        for j, view in enumerate(views):
            if isinstance(view, (str, bytes)) or not isinstance(view, Iterable):
                raise PlanError(f"views[{j}] ({view!r}) must be a sequence of attributes")
            try:
                idx = tuple(sorted(self.schema.resolve(view)))
            except CalmkitError as exc:
                raise PlanError(f"views[{j}]: {exc}") from None
            if not idx:
                raise PlanError(f"views[{j}] (()) must not be empty")
            cells = self.schema.cells(idx)
            if cells < 2:
                raise PlanError(f"views[{j}] ({list(idx)}) must have >= 2 cells (has {cells})")
            if cells > MAX_VIEW_CELLS:
                raise PlanError(
                    f"views[{j}] ({list(idx)}) must have <= {MAX_VIEW_CELLS} cells (has {cells})"
                )
            out.append(idx)
        if not out:
            raise PlanError("views ([]) must hold at least one view")
        return tuple(out)

    # -- derived -------------------------------------------------------------------
    @property
    def m(self) -> int:
        """Number of views."""
        return len(self.views)

    @cached_property
    def view_oracles(self) -> tuple[FrequencyOracle, ...]:
        """The oracle instance of each view."""
        assert self.oracles is not None
        return tuple(
            make_oracle(name, self.schema.cells(v), self.epsilon)
            for name, v in zip(self.oracles, self.views)
        )

    def oracle(self, view: int) -> FrequencyOracle:
        """The oracle of view ``view``."""
        return self.view_oracles[self.check_view(view)]

    def check_view(self, view: int) -> int:
        """``view`` as an int if it is one of the plan's views, else :class:`PlanError`."""
        if not is_int(view) or not 0 <= int(view) < self.m:
            raise PlanError(f"view ({view!r}) must be an int in [0, {self.m})")
        return int(view)

    @cached_property
    def view_strides(self) -> tuple[tuple[int, ...], ...]:
        """Mixed-radix place values of each view's attributes (Python ints)."""
        return tuple(tuple(int(s) for s in self.schema.strides(v)) for v in self.views)

    @cached_property
    def _bounds(self) -> np.ndarray:
        assert self.shares is not None
        return share_bounds(self.shares)

    @cached_property
    def _bound_list(self) -> list[int]:
        return [int(b) for b in self._bounds]

    def assign(self, user_id: UserId) -> int:
        """The view of one user (deterministic, public; same rule as assign_many)."""
        return bisect.bisect_right(self._bound_list, hash_user_id(user_id, self.seed))

    def assign_many(self, user_ids: Sequence[UserId] | np.ndarray) -> np.ndarray:
        """Views (n,) int64 of many users; integer id arrays are hashed vectorised."""
        return views_of_hashes(hash_user_ids(user_ids, self.seed), self._bounds)

    def assign_pseudonyms(self, pseudonyms: npt.ArrayLike) -> np.ndarray:
        """Views (n,) int64 of pseudonyms (n, 16) uint8, hashed vectorised: the same
        views as :meth:`assign` of each pseudonym as bytes (what a device does, and
        what the aggregator checks for a collection with admission tickets)."""
        return views_of_hashes(xxh64_u128(pseudonyms, self.seed), self._bounds)

    # -- identity and serialisation ---------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, including the digest."""
        return {**self._canonical(hex_floats=False), "digest": self.digest}

    def _canonical(self, hex_floats: bool) -> dict[str, Any]:
        assert self.shares is not None and self.oracles is not None
        fmt = float.hex if hex_floats else float
        return {
            "format": PLAN_FORMAT,
            "schema": self.schema.to_dict(),
            "epsilon": fmt(self.epsilon),
            "views": [list(v) for v in self.views],
            "oracles": list(self.oracles),
            "shares": [fmt(s) for s in self.shares],
            "seed": self.seed,
        }

    @cached_property
    def canonical_json(self) -> str:
        """The text the digest hashes: ``to_dict()`` without the digest, floats as
        exact hex strings (``float.hex``), keys sorted, no spaces, non-ASCII as
        ``\\uXXXX`` escapes (docs/wire-protocol.md)."""
        return json.dumps(self._canonical(hex_floats=True), sort_keys=True, separators=(",", ":"))

    @cached_property
    def digest(self) -> str:
        """SHA-256 (hex) of :attr:`canonical_json` (UTF-8)."""
        return hashlib.sha256(self.canonical_json.encode("utf-8")).hexdigest()

    def to_json(self) -> str:
        """:meth:`to_dict` as JSON text (keys sorted)."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        """Inverse of :meth:`to_dict`; a stated digest must match the rebuilt plan."""
        if data.get("format", PLAN_FORMAT) != PLAN_FORMAT:
            raise PlanError(f"plan format ({data.get('format')!r}) must be {PLAN_FORMAT}")
        try:
            plan = cls(
                schema=Schema.from_dict(data["schema"]),
                epsilon=data["epsilon"],
                views=tuple(tuple(v) for v in data["views"]),
                oracles=tuple(data["oracles"]) if data.get("oracles") is not None else None,
                shares=tuple(data["shares"]) if data.get("shares") is not None else None,
                seed=data.get("seed", 0),
            )
        except KeyError as exc:
            raise PlanError(f"plan field ({exc.args[0]!r}) is missing") from None
        stated = data.get("digest")
        if stated is not None and stated != plan.digest:
            raise PlanError(f"digest ({stated!r}) must match the plan's content ({plan.digest!r})")
        return plan

    @classmethod
    def from_json(cls, text: str) -> Plan:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PlanError(f"plan JSON ({exc.msg} at {exc.pos}) must parse") from None
        if not isinstance(data, dict):
            raise PlanError(f"plan JSON ({type(data).__name__}) must be an object")
        return cls.from_dict(data)
