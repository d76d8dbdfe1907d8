"""Nothing large is read before authentication: a flood of token-less 16 MiB calls
leaves the server's memory and health checks alone, per-method body limits refuse
oversized requests naming the limit, and the largest valid submit still passes."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from calmkit_aggregator.service.admin import AdminClient
from calmkit_aggregator.service.limits import PUBLIC_BODY_BYTES, SUBMIT_BODY_BYTES
from calmkit_aggregator.service.server import (
    BODY_TIMEOUT_S,
    MAX_CALLS_PER_ADDRESS,
    create_server,
    graceful_stop,
)
from calmkit_aggregator.service.storage import Storage
from calmkit_client import CalmkitError, DeviceState
from calmkit_client import wire as client_wire
from calmkit_client.cli import main
from calmkit_client.collector import ERROR_KEY, MAX_MESSAGE_BYTES, open_channel
from tests.integration.servers import IDS, POP, Server, create_collection

FLOOD_BYTES = 16 * 1024 * 1024 - 64  # just under the server's receive limit
SERVE = """
import sys, time
from calmkit_aggregator.service.server import create_server
from calmkit_aggregator.service.storage import Storage
server, port = create_server("127.0.0.1:0", Storage(sys.argv[1]))
print(port, flush=True)
sys.stdin.read()
"""


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _flood(address: str, calls: int, connections: int = 8) -> list[grpc.StatusCode]:
    """``calls`` concurrent token-less GetPlan calls of FLOOD_BYTES each, spread over
    ``connections`` HTTP/2 connections (one connection would deliver them in turn)."""
    body = client_wire.pb.CollectionRef(collection_id="x" * FLOOD_BYTES)
    options = [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.use_local_subchannel_pool", 1),  # a connection of its own per channel
    ]
    channels = [grpc.insecure_channel(address, options=options) for _ in range(connections)]
    try:
        stubs = [client_wire.pb_grpc.AggregatorStub(c) for c in channels]
        pending = [stubs[i % connections].GetPlan.future(body, timeout=60) for i in range(calls)]
        return [call.exception().code() for call in pending]
    finally:
        for channel in channels:
            channel.close()


@pytest.fixture
def served_process(tmp_path: Path):  # type: ignore[no-untyped-def]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE, str(tmp_path / "agg.db")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    assert proc.stdout is not None
    port = int(proc.stdout.readline())
    yield proc, f"127.0.0.1:{port}"
    proc.kill()
    proc.wait()


def test_token_less_flood_keeps_memory_flat(served_process) -> None:  # type: ignore[no-untyped-def]
    proc, address = served_process
    _flood(address, 2)  # warm up the channel machinery
    start = _rss_mb(proc.pid)
    codes = _flood(address, 64)
    assert set(codes) <= {grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAUTHENTICATED}
    time.sleep(2.0)  # the server trims freed memory within a second of the last body
    grown = _rss_mb(proc.pid) - start
    # the target: back within 100 MB of the start (calmkit before the limits: +2 GB)
    assert grown < 100, f"server RSS grew {grown:.0f} MB over 64 token-less 16 MiB calls"


def test_health_answers_during_a_flood(served_process) -> None:  # type: ignore[no-untyped-def]
    _, address = served_process
    latencies = []
    with open_channel(address) as channel:
        check = health_pb2_grpc.HealthStub(channel).Check
        check(health_pb2.HealthCheckRequest(), timeout=5)
        for _ in range(2):  # two floods in turn: ~50 checks
            with futures.ThreadPoolExecutor(1) as pool:
                flood = pool.submit(_flood, address, 64)
                while not flood.done():
                    t0 = time.perf_counter()
                    check(health_pb2.HealthCheckRequest(), timeout=5)
                    latencies.append(time.perf_counter() - t0)
                    time.sleep(0.01)
                flood.result()
    assert len(latencies) >= 20
    # The 90th percentile, not the 99th: with ~50 checks the 99th is the single slowest,
    # which one scheduler stall on a shared 2-core machine sets (a CI run once saw
    # 390 ms). Measured on 6 runs of one flood each: 31-58 ms with the limits,
    # 162-342 ms in calmkit before them (their largest: 48-81 ms and 250-580 ms).
    p90 = float(np.quantile(latencies, 0.9))
    assert p90 < 0.12, f"health p90 {1e3 * p90:.0f} ms during the flood (target 100 ms)"


def _never_sent(stop: threading.Event) -> Iterator[bytes]:
    """A request whose body never comes (the call's headers do)."""
    stop.wait(20)
    yield from ()


@pytest.mark.parametrize(
    ("method", "metadata"),
    [
        ("SubmitColumnar", ()),
        ("SubmitReports", (("authorization", "Bearer x"),)),
        ("CloseCollection", (("authorization", "Bearer " + "w" * 32),)),
    ],
)
def test_calls_without_a_valid_token_are_refused_before_the_body(
    tmp_path: Path, method: str, metadata: tuple[tuple[str, str], ...]
) -> None:
    stop = threading.Event()
    with Server(tmp_path, admin_token="a" * 32) as server, open_channel(server.address) as channel:
        call = channel.stream_unary(f"/calmkit.v1.Aggregator/{method}")
        t0 = time.perf_counter()
        with pytest.raises(grpc.RpcError) as err:
            call(_never_sent(stop), metadata=metadata, timeout=10)
        stop.set()
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, err.value.details()
    assert "authorization" in err.value.details()
    assert time.perf_counter() - t0 < 5  # answered on the headers, not after the deadline


def test_small_methods_refuse_bodies_over_their_limit(tmp_path: Path) -> None:
    with Server(tmp_path) as server:
        pb = client_wire.pb
        with open_channel(server.address) as channel:
            stub = client_wire.pb_grpc.AggregatorStub(channel)
            with pytest.raises(grpc.RpcError) as err:
                stub.GetPlan(pb.CollectionRef(collection_id="x" * PUBLIC_BODY_BYTES), timeout=10)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"must be at most {PUBLIC_BODY_BYTES} bytes for GetPlan" in err.value.details()


def test_largest_submit_passes_and_one_over_is_refused(tmp_path: Path) -> None:
    """A valid batch padded (an unknown field, which parsing skips) to exactly the submit
    limit is accepted; one byte more is refused naming the limit."""
    with Server(tmp_path) as server:
        info = create_collection(server.address)
        token = (("authorization", f"Bearer {info.submit_token}"),)
        state = DeviceState.in_memory()
        options = [("grpc.max_send_message_length", 2 * MAX_MESSAGE_BYTES)]
        with grpc.insecure_channel(server.address, options=options) as channel:
            submit = channel.unary_unary("/calmkit.v1.Aggregator/SubmitReports")
            ack = submit(_padded(state, info, 0, SUBMIT_BODY_BYTES), metadata=token, timeout=30)
            assert client_wire.pb.Ack.FromString(ack).accepted == 50
            with pytest.raises(grpc.RpcError) as err:
                submit(_padded(state, info, 50, SUBMIT_BODY_BYTES + 1), metadata=token, timeout=30)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert str(SUBMIT_BODY_BYTES) in err.value.details()


def _padded(state: DeviceState, info: Any, first: int, size: int) -> bytes:
    """50 fresh reports from user ``first`` on, serialised and padded to ``size`` bytes."""
    users = slice(first, first + 50)
    items = state.reports_for("c1", info.plan, POP.codes[users], IDS[users])
    raw = client_wire.batch_to_proto("c1", info.plan.digest, items).SerializeToString()
    return raw + _unknown_field(size - len(raw))


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _unknown_field(size: int) -> bytes:
    """Field 99 (length-delimited) taking exactly ``size`` bytes."""
    for width in range(1, 6):
        payload = size - 2 - width
        if len(_varint(payload)) == width:
            return bytes([0x9A, 0x06]) + _varint(payload) + b"\0" * payload
    raise AssertionError(f"no field of {size} bytes")


# -- stalled streams: a cap per client address, a deadline on the body -------------------
GET_PLAN = "/calmkit.v1.Aggregator/GetPlan"
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
ADMIN = "a" * 32
STALLS = {"max_concurrent_rpcs": 32, "max_calls_per_address": 8}  # small, for speed


@contextlib.contextmanager
def _dual_stack(tmp_path: Path, **options: Any) -> Iterator[int]:
    """A server on every address (port returned) with collection c1, so a test can
    stall streams from 127.0.0.1 and probe from ::1, another client address."""
    with Storage(tmp_path / "agg.db") as storage:
        server, port = create_server("[::]:0", storage, ADMIN, insecure=True, **options)
        try:
            _create_c1(f"127.0.0.1:{port}")
            yield port
        finally:
            graceful_stop(server, 1.0)


def _create_c1(address: str) -> None:
    with AdminClient(address, ADMIN) as admin:
        admin.create_collection(POP.schema, 1.0, POP.n, 3, collection_id="c1", pilot=0.0)


def _stall(channel: grpc.Channel, path: str, count: int, stop: threading.Event) -> list[Any]:
    """``count`` calls of ``path`` on ``channel`` that send their headers and then
    nothing until ``stop`` (then they end the request stream without a message)."""
    call = channel.stream_unary(path)
    return [call.future(_never_sent(stop), timeout=30) for _ in range(count)]


def _ended(calls: list[Any], within: float, count: int | None = None) -> list[Any]:
    """The calls that ended within ``within`` seconds from now, or as soon as
    ``count`` of them did (the rest stay open)."""
    deadline = time.monotonic() + within
    want = len(calls) if count is None else count
    while time.monotonic() < deadline and sum(c.done() for c in calls) < want:
        time.sleep(0.02)
    return [c for c in calls if c.done()]


def _health_from(address: str) -> int:
    with open_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return int(stub.Check(health_pb2.HealthCheckRequest(), timeout=3).status)


def _plan_from(address: str) -> str:
    with open_channel(address) as channel:
        stub = client_wire.pb_grpc.AggregatorStub(channel)
        plan = stub.GetPlan(client_wire.pb.CollectionRef(collection_id="c1"), timeout=3)
        return str(plan.digest)


@pytest.mark.parametrize("path", [GET_PLAN, HEALTH_CHECK])
def test_stalled_streams_beyond_the_per_address_cap_are_refused_at_once(
    tmp_path: Path, path: str
) -> None:
    """40 token-less streams from 127.0.0.1 stall (the audit's attack, scaled to a
    global cap of 32): the 8 the address may hold stay open, the other 32 are refused
    on their headers naming the cap, so the server keeps slots free: health checks and
    GetPlan from ::1 answer while the stalls are held. Before the cap, the stalls took
    all 32 slots and every call was refused "Concurrent RPC limit exceeded!"."""
    stop = threading.Event()
    with _dual_stack(tmp_path, **STALLS) as port, open_channel(f"127.0.0.1:{port}") as channel:
        calls = _stall(channel, path, 40, stop)
        try:
            refused = _ended(calls, within=3.0)
            assert len(refused) == 32
            for call in refused:
                err = call.exception()
                assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.details()
                assert err.details() == (
                    "calls in flight from 127.0.0.1 (9 with this one) must be at most 8 "
                    "(max_calls_per_address)"
                )
                assert (ERROR_KEY, "RateLimited") in tuple(err.trailing_metadata())
            assert _health_from(f"[::1]:{port}") == health_pb2.HealthCheckResponse.SERVING
            assert _plan_from(f"[::1]:{port}")
            assert len(_ended(calls, within=0.1)) == 32  # the 8 stalls are still held
        finally:
            stop.set()
        _ended(calls, within=5.0)
        assert _plan_from(f"127.0.0.1:{port}")  # the address's slots are free again


def test_the_last_slots_are_kept_for_callers_with_few_calls(tmp_path: Path) -> None:
    """32 slots, 16 per address, the last 4 kept for small callers: 127.0.0.1 stalls
    its 16, ::1 stalls 12 more (28 in flight: the reserve begins), and ::1's next call
    is refused naming the reserve though ::1 holds fewer than its cap. Without the
    reserve two addresses took all 32 slots and every call was refused. Once the first
    address's stalls end, ::1 gets its slots again."""
    first, second = threading.Event(), threading.Event()
    options = {"max_concurrent_rpcs": 32, "max_calls_per_address": 16}
    with (
        _dual_stack(tmp_path, **options) as port,
        open_channel(f"127.0.0.1:{port}") as ipv4,
        open_channel(f"[::1]:{port}") as ipv6,
    ):
        held = _stall(ipv4, GET_PLAN, 16, first)
        try:
            more = _stall(ipv6, GET_PLAN, 12, second)
            assert not _ended(held + more, within=1.0)  # 28 held: below the reserve
            (extra,) = _stall(ipv6, GET_PLAN, 1, second)
            err = extra.exception(timeout=3)
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert err.details() == (
                "calls in flight from ::/48 (13 with this one) must be at most 4 while "
                "the server is nearly full (28 calls in flight; its last slots are kept "
                "for callers with few calls)"
            )
            first.set()
            _ended(held, within=5.0)
            assert not _ended(_stall(ipv6, GET_PLAN, 4, second), within=1.0)
        finally:
            first.set()
            second.set()


@pytest.mark.parametrize("path", [GET_PLAN, HEALTH_CHECK])
def test_a_stalled_stream_is_aborted_after_the_body_timeout(tmp_path: Path, path: str) -> None:
    """A stream whose message never comes ends DEADLINE_EXCEEDED naming the body
    timeout (0.5 s here), which frees its slot; before, it stayed until the client
    left or its connection was recycled (5 minutes and more)."""
    stop = threading.Event()
    with Server(tmp_path, body_timeout=0.5) as server, open_channel(server.address) as channel:
        t0 = time.monotonic()
        calls = _stall(channel, path, 4, stop)
        try:
            ended = _ended(calls, within=5.0)
            took = time.monotonic() - t0
        finally:
            stop.set()
    assert len(ended) == 4 and took < 5.0
    for call in calls:
        err = call.exception()
        assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED, err.details()
        assert err.details() == (
            "request (not complete after 0.5 s) must arrive within 0.5 s (body_timeout)"
        )


def test_the_per_address_count_returns_to_zero(tmp_path: Path) -> None:
    """Calls that end every way (refused by the cap, cancelled by the client, timed out
    reading the body, ended without a message, refused unauthenticated, answered) all
    give their slot back: afterwards the address again holds exactly the cap of
    stalled streams, and one more is refused."""
    with Server(tmp_path, ADMIN, body_timeout=2.0, **STALLS) as server:
        _create_c1(server.address)
        with open_channel(server.address) as channel:
            for _ in range(2):
                _every_ending(channel, server.address)
            stop = threading.Event()
            calls = _stall(channel, GET_PLAN, 8, stop)
            try:
                assert not _ended(calls, within=0.5)  # the whole cap is open again
                (extra,) = _stall(channel, GET_PLAN, 1, stop)
                assert extra.exception(timeout=3).code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            finally:
                stop.set()


def _every_ending(channel: grpc.Channel, address: str) -> None:
    """Calls from one address ending in each way a call can end."""
    stop = threading.Event()
    stalled = _stall(channel, GET_PLAN, 12, stop)  # 4 refused by the cap
    refused = _ended(stalled, within=1.5, count=4)
    assert {c.exception().code() for c in refused} == {grpc.StatusCode.RESOURCE_EXHAUSTED}
    open_now = [c for c in stalled if not c.done()]
    assert len(open_now) == 8
    for call in open_now[:4]:
        call.cancel()  # the client leaves
    time.sleep(2.5)  # the other 4 time out reading their body
    stop.set()
    _ended(stalled, within=5.0)
    codes = {c.exception().code() for c in open_now[4:]}
    assert codes == {grpc.StatusCode.DEADLINE_EXCEEDED}
    unauthenticated = _stall(channel, "/calmkit.v1.Aggregator/ListCollections", 4, stop)
    assert all(
        c.exception(timeout=3).code() == grpc.StatusCode.UNAUTHENTICATED for c in unauthenticated
    )
    no_message = _stall(channel, GET_PLAN, 4, stop)  # stop is set: they end at once
    assert all(
        c.exception(timeout=3).code() == grpc.StatusCode.INVALID_ARGUMENT for c in no_message
    )
    assert _plan_from(address) and _health_from(address) == health_pb2.HealthCheckResponse.SERVING


def test_stream_limits_are_checked_and_their_help_states_the_defaults(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for options, message in (
        ({"max_calls_per_address": -1}, r"max_calls_per_address \(-1\) must be an int >= 0"),
        ({"body_timeout": 0.0}, r"body_timeout \(0.0\) must be a number of seconds > 0"),
    ):
        with pytest.raises(CalmkitError, match=message), Storage(tmp_path / "x.db") as storage:
            create_server("127.0.0.1:0", storage, **options)
    assert main(["serve", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert f"(default: {MAX_CALLS_PER_ADDRESS})" in text
    assert f"(default: {BODY_TIMEOUT_S:g}," in text
