"""Nothing large is read before authentication: a flood of token-less 16 MiB calls
leaves the server's memory and health checks alone, per-method body limits refuse
oversized requests naming the limit, and the largest valid submit still passes."""

from __future__ import annotations

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

from calmkit_aggregator.service.limits import PUBLIC_BODY_BYTES, SUBMIT_BODY_BYTES
from calmkit_client import DeviceState
from calmkit_client import wire as client_wire
from calmkit_client.collector import MAX_MESSAGE_BYTES, open_channel
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
