"""The device's privacy budget: how much epsilon one user may spend.

Each report a user makes is epsilon-LDP for the collection's epsilon; reports in
different collections compose, so the privacy loss of a user grows with every
collection they answer. :class:`PrivacyBudget` caps both, and the device's ledger
(:class:`~calmkit_client.device.DeviceState`) enforces it before any randomness is
drawn: a report that would exceed a cap is never made, so it can never be sent.

Defaults (``per_collection=4.0``, ``total=10.0``): epsilon 4 bounds a single answer's
likelihood ratio by e^4 ~ 55, the top of the range used in practice for one
local-DP release (CALM's evaluation goes up to 2; deployed systems use 1-8), and
leaves room for any collection calmkit's planner handles well. A total of 10 lets a
user answer e.g. ten collections at epsilon 1 or five at 2, after which the device
refuses more: the point where the composed guarantee stops meaning much. Apps that
need another policy pass their own budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import CalmkitError

__all__ = ["DEFAULT_BUDGET", "PrivacyBudget"]


@dataclass(frozen=True)
class PrivacyBudget:
    """Caps on one user's spending: ``per_collection`` (the epsilon a collection may
    take, summed if the user reports there again after
    :meth:`~calmkit_client.device.DeviceState.forget`) and ``total`` (over all
    collections). Both finite and > 0, and ``per_collection <= total``."""

    per_collection: float = 4.0
    total: float = 10.0

    def __post_init__(self) -> None:
        for name in ("per_collection", "total"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise CalmkitError(f"{name} ({value!r}) must be a finite number > 0")
            if not (math.isfinite(value) and value > 0):
                raise CalmkitError(f"{name} ({value!r}) must be finite and > 0")
            object.__setattr__(self, name, float(value))
        if self.per_collection > self.total:
            raise CalmkitError(
                f"per_collection ({self.per_collection!r}) must be <= total ({self.total!r})"
            )


DEFAULT_BUDGET = PrivacyBudget()
