"""Submit rate limits per submitter (docs/security.md "Rate limits").

The submit token ships inside every app, so a bucket per token is one bucket shared by
every genuine user and any flooder: the flood drains it and the genuine reports are
the ones refused. A bucket here belongs to one *submitter*: a collection and the
client's network address (:func:`submitter_of`), an IPv4 address or an IPv6 /64 (what
one subscriber is typically given, so a flooder cannot take a fresh bucket per address
of its own prefix). Each bucket holds ``burst`` reports and refills at ``rate`` per
second. A batch is admitted whole when the bucket holds it, and refused otherwise:

- larger than ``burst``: it could never pass, so it is refused at once with
  :class:`~calmkit_client.errors.BatchTooLarge` naming the largest batch that can
  (the :class:`~calmkit_client.collector.Collector` splits its batch and sends again);
- otherwise :class:`~calmkit_client.errors.RateLimited` with the wait until it fits,
  which clients retry with backoff.

A bucket never goes into debt, so no batch passes beyond the rate. Idle full buckets
are dropped once there are more than ``max_buckets``, so many addresses cost bounded
memory. Clients behind one proxy or NAT share its address and so its bucket.
"""

from __future__ import annotations

import ipaddress
import math
import threading
import time
from collections.abc import Callable
from urllib.parse import unquote

from calmkit_client.errors import BatchTooLarge, CalmkitError, RateLimited
from calmkit_client.validation import is_int

__all__ = ["RateLimit", "address_key", "network_of", "submitter_of"]

_MAX_BUCKETS = 100_000


def submitter_of(peer: str) -> str:
    """The submitter a gRPC peer string counts as: ``ipv4:1.2.3.4:5678`` ->
    ``1.2.3.4``; ``ipv6:[2001:db8::1]:5678`` -> ``2001:db8::/64`` (IPv4-mapped IPv6
    addresses count as their IPv4 address); anything else (a Unix socket) as itself."""
    kind, _, rest = unquote(peer).partition(":")
    if kind not in ("ipv4", "ipv6"):
        return peer
    return address_key(rest.rpartition(":")[0])


def address_key(host: str) -> str:
    """What one client address counts as: an IPv4 address itself, an IPv6 address its
    /64 (one subscriber's allocation; an IPv4-mapped one its IPv4 address), anything
    that is not an address (``[::1]`` brackets allowed) as itself."""
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


def network_of(key: str) -> str:
    """The network an :func:`address_key` belongs to, for the server's reserve of slots:
    an IPv6 key's /48 (a site's allocation: one subscriber may hold 65,536 /64s), any
    other key itself."""
    try:
        net = ipaddress.ip_network(key, strict=False)
    except ValueError:
        return key
    if isinstance(net, ipaddress.IPv6Network):
        return str(net.supernet(new_prefix=48)) if net.prefixlen > 48 else str(net)
    return key


class RateLimit:
    """``rate`` reports per second per key, ``burst`` at once (default: one second's
    worth, at least 1)."""

    def __init__(
        self,
        rate: float,
        clock: Callable[[], float] = time.monotonic,
        burst: int | None = None,
        max_buckets: int = _MAX_BUCKETS,
    ) -> None:
        if not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0):
            raise CalmkitError(f"rate_limit ({rate!r}) must be finite and > 0 reports per second")
        if burst is not None and not (is_int(burst) and burst >= 1):
            raise CalmkitError(f"rate_burst ({burst!r}) must be an int >= 1 reports")
        self.rate = float(rate)
        self.burst = float(burst) if burst is not None else max(self.rate, 1.0)
        self._clock = clock
        self._max_buckets = max_buckets
        self._buckets: dict[object, tuple[float, float]] = {}  # key -> (level, time)
        self._lock = threading.Lock()

    def charge(self, key: object, reports: int) -> None:
        """Admit ``reports`` for ``key`` or raise :class:`BatchTooLarge` /
        :class:`RateLimited` (nothing is drawn from the bucket then)."""
        if reports > self.burst:
            raise BatchTooLarge(
                f"batch ({reports} reports) must be at most the rate limit's burst "
                f"({self.burst:g} reports); send smaller batches"
            )
        now = self._clock()
        with self._lock:
            level, then = self._buckets.get(key, (self.burst, now))
            level = min(self.burst, level + (now - then) * self.rate)
            if level < reports:
                self._buckets[key] = (level, now)
                raise RateLimited(
                    f"rate limit ({self.rate:g} reports per second per client address) "
                    f"exceeded; retry in {(reports - level) / self.rate:.2f} s"
                )
            self._buckets[key] = (level - reports, now)
            if len(self._buckets) > self._max_buckets:
                self._drop_full(now)

    def _drop_full(self, now: float) -> None:
        """Forget buckets that have refilled (they would start full anyway)."""
        full = [
            k
            for k, (level, then) in self._buckets.items()
            if level + (now - then) * self.rate >= self.burst
        ]
        for k in full:
            del self._buckets[k]

    @property
    def buckets(self) -> int:
        """How many buckets are held (for tests and monitoring)."""
        return len(self._buckets)
