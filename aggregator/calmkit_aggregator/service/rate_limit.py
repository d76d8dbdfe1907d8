"""A per-token submit rate limit (docs/security.md "Rate limits").

A token bucket per submit token, refilled at ``rate`` reports per second up to one
second's worth. A batch is admitted while the bucket is
not empty and then drawn from it (the level may go negative, so a batch larger than
the bucket still passes once and the average rate holds); otherwise it is refused
with :class:`~calmkit_client.errors.RateLimited`, which clients retry with backoff.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from calmkit_client.errors import CalmkitError, RateLimited

__all__ = ["RateLimit"]


class RateLimit:
    """``rate`` reports per second per key (a submit token's hash)."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        if not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0):
            raise CalmkitError(f"rate_limit ({rate!r}) must be finite and > 0 reports per second")
        self.rate = float(rate)
        self.burst = max(self.rate, 1.0)
        self._clock = clock
        self._buckets: dict[bytes, tuple[float, float]] = {}  # key -> (level, time)
        self._lock = threading.Lock()

    def charge(self, key: bytes, reports: int) -> None:
        """Admit ``reports`` for ``key`` or raise :class:`RateLimited`."""
        now = self._clock()
        with self._lock:
            level, then = self._buckets.get(key, (self.burst, now))
            level = min(self.burst, level + (now - then) * self.rate)
            if level <= 0:
                self._buckets[key] = (level, now)
                wait = -level / self.rate
                raise RateLimited(
                    f"rate limit ({self.rate:g} reports per second per submit token) "
                    f"exceeded; retry in {wait:.2f} s"
                )
            self._buckets[key] = (level - reports, now)
