"""The guard's reserve of slots for small callers (``service/limits.py``), on the event
loop with stand-in call contexts: which calls get in, and the counts afterwards. The
same rule runs against a real server in ``tests/integration/test_service_limits.py``
(two client addresses); here a third network and IPv6 /48s can be tried."""

from __future__ import annotations

import asyncio
from concurrent import futures
from typing import Any

import grpc
import pytest

from calmkit_aggregator.service.limits import SMALL_CALLER_CALLS, Guard


class Refused(Exception):
    pass


class Context:
    """What the guard reads of a call: its peer; an abort raises."""

    def __init__(self, peer: str) -> None:
        self._peer = peer

    def peer(self) -> str:
        return self._peer

    def set_trailing_metadata(self, metadata: Any) -> None:
        pass

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise Refused(details)


def _guard(max_calls: int, per_address: int) -> Guard:
    return Guard(futures.ThreadPoolExecutor(1), None, per_address, 30.0, max_calls)


async def _hold(guard: Guard, peers: list[str]) -> tuple[list[Any], list[str]]:
    """Enter a slot for each peer in turn: the held slots and the refusals."""
    held, refused = [], []
    for peer in peers:
        slot = guard._slot(Context(peer))
        try:
            await slot.__aenter__()
            held.append(slot)
        except Refused as exc:
            refused.append(str(exc))
    return held, refused


async def _release(held: list[Any]) -> None:
    for slot in held:
        await slot.__aexit__(None, None, None)


def test_a_new_network_gets_in_when_the_others_filled_all_but_the_reserve() -> None:
    async def run() -> None:
        guard = _guard(64, 16)  # crowded from 56 calls on: the last 8 are the reserve
        big = [f"ipv4:10.0.0.{a}:1" for a in range(4) for _ in range(16)]
        held, refused = await _hold(guard, big[:56])
        assert not refused
        # a big caller under its own cap is refused now; a fresh network is not
        _, more = await _hold(guard, ["ipv4:10.0.0.3:1"])
        assert more and "while the server is nearly full (56 calls in flight" in more[0]
        small, none = await _hold(guard, ["ipv4:10.9.9.9:1"] * SMALL_CALLER_CALLS)
        assert not none
        _, over = await _hold(guard, ["ipv4:10.9.9.9:1"])
        assert over == [
            f"calls in flight from 10.9.9.9 ({SMALL_CALLER_CALLS + 1} with this one) must "
            f"be at most {SMALL_CALLER_CALLS} while the server is nearly full "
            f"({56 + SMALL_CALLER_CALLS} calls in flight; its last slots are kept for "
            "callers with few calls)"
        ]
        await _release(held + small)
        assert guard._total == 0 and not guard._in_flight and not guard._per_network

    asyncio.run(run())


def test_the_64s_of_one_48_share_the_reserve() -> None:
    async def run() -> None:
        guard = _guard(64, 56)
        held, _ = await _hold(guard, ["ipv4:10.0.0.1:1"] * 56)
        peers = [f"ipv6:[2001:db8:7:{s:x}::1]:1" for s in range(SMALL_CALLER_CALLS + 1)]
        inside, refused = await _hold(guard, peers)
        assert len(inside) == SMALL_CALLER_CALLS and len(refused) == 1
        assert refused[0].startswith("calls in flight from 2001:db8:7::/48")
        await _release(held + inside)

    asyncio.run(run())


@pytest.mark.parametrize("max_calls", [0, 64])
def test_below_the_reserve_only_the_address_cap_holds(max_calls: int) -> None:
    async def run() -> None:
        guard = _guard(max_calls, 8)
        held, refused = await _hold(guard, [f"ipv4:10.0.0.{a}:1" for a in range(6)] * 9)
        assert len(held) == 48 and len(refused) == 6
        assert all("(max_calls_per_address)" in r for r in refused)
        await _release(held)

    asyncio.run(run())
