"""Slow streams and health under ingest load: the served design against the old one
(docs/security.md "Slow streams", "Health under load").

    python benchmarks/service_under_attack.py [--reps 5] [--users 60000]

Three servers run the same ``AggregatorService`` over a fresh SQLite file:

- ``sync-8`` (baseline, calmkit before the hardening): ``grpc.server`` with 8 worker
  threads, the sync health servicer;
- ``sync-limits`` (the alternative considered): 64 worker threads,
  ``maximum_concurrent_rpcs=48``, at most 8 streams per connection;
- ``aio`` (served today): :func:`calmkit_aggregator.service.server.create_server`.

Part 1 opens N unauthenticated HTTP/2 streams that send headers and half a message,
then stall, and times one health check (deadline 2 s): median latency over ``--reps``
and how many checks failed. Part 2 has two client threads submit 2,000-report
batches back to back while a prober checks health every 10 ms: p50 / p99 / max
latency of the checks (all reps pooled) and the ingest rate (median). Needs ``h2``
(the dev extra).
"""

from __future__ import annotations

import argparse
import socket
import statistics
import struct
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent import futures
from pathlib import Path

import grpc
import h2.config
import h2.connection
import numpy as np
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from calmkit_aggregator.service import wire
from calmkit_aggregator.service.admin import AdminClient
from calmkit_aggregator.service.handlers import AggregatorService
from calmkit_aggregator.service.server import create_server, graceful_stop
from calmkit_aggregator.service.storage import Storage
from calmkit_client import DeviceState
from calmkit_client import wire as client_wire
from calmkit_client.collector import MAX_MESSAGE_BYTES, open_channel
from calmkit_simulator import synthetic_population

SIZES = (2, 3, 2, 2, 4, 2, 3, 2)
STALLED = (0, 8, 16, 64, 256)


def _sync_server(storage: Storage, threads: int, limits: bool) -> tuple[Callable[[], None], int]:
    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
    if limits:
        options.append(("grpc.max_concurrent_streams", 8))
    server = grpc.server(
        futures.ThreadPoolExecutor(threads),
        options=options,
        maximum_concurrent_rpcs=48 if limits else None,
    )
    wire.add_servicer(AggregatorService(storage), server)
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return lambda: server.stop(0.5).wait(), port


def _aio_server(storage: Storage) -> tuple[Callable[[], None], int]:
    server, port = create_server("127.0.0.1:0", storage)
    return lambda: graceful_stop(server, 0.5), port


SERVERS: dict[str, Callable[[Storage], tuple[Callable[[], None], int]]] = {
    "sync-8 (baseline)": lambda s: _sync_server(s, 8, False),
    "sync-limits": lambda s: _sync_server(s, 64, True),
    "aio (served)": _aio_server,
}


def _stall(port: int, count: int) -> list[socket.socket]:
    sockets = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port))
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        conn.initiate_connection()
        conn.send_headers(
            1,
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", "/calmkit.v1.Aggregator/SubmitReports"),
                (":authority", f"127.0.0.1:{port}"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
            ],
        )
        conn.send_data(1, b"\x00" + struct.pack(">I", 1000) + b"\x0a\x02c1")
        sock.sendall(conn.data_to_send())
        sockets.append(sock)
    return sockets


def _check(address: str, timeout: float) -> float | None:
    """Seconds one health check took, None if it failed."""
    stub = health_pb2_grpc.HealthStub(open_channel(address))
    t0 = time.perf_counter()
    try:
        stub.Check(health_pb2.HealthCheckRequest(), timeout=timeout)
    except grpc.RpcError:
        return None
    return time.perf_counter() - t0


def slow_streams(reps: int) -> None:
    print("Part 1: one health check while N streams stall (median ms over reps; failed)")
    print(f"{'server':20s}" + "".join(f"{f'N={n}':>16s}" for n in STALLED))
    for name, make in SERVERS.items():
        cells = []
        for count in STALLED:
            times, failed = [], 0
            for _ in range(reps):
                with tempfile.TemporaryDirectory() as tmp, Storage(Path(tmp) / "a.db") as st:
                    stop, port = make(st)
                    sockets = _stall(port, count)
                    time.sleep(0.2)
                    took = _check(f"127.0.0.1:{port}", 2.0)
                    for sock in sockets:
                        sock.close()
                    stop()
                failed += took is None
                if took is not None:
                    times.append(1e3 * took)
            med = f"{statistics.median(times):.1f}" if times else "-"
            cells.append(f"{med} ms; {failed}/{reps}")
        print(f"{name:20s}" + "".join(f"{c:>16s}" for c in cells))


def health_under_load(reps: int, users: int) -> None:
    print(f"\nPart 2: health checks while 2 clients ingest {users:,} reports (batches of 2,000)")
    pop = synthetic_population(n=users, sizes=SIZES, rng=0)
    ids = np.arange(users, dtype=np.uint64)
    print(
        f"{'server':20s}{'p50 ms':>10s}{'p99 ms':>10s}{'max ms':>10s}{'failed':>8s}"
        f"{'reports/s':>12s}"
    )
    rows = {}
    for name, make in SERVERS.items():
        if name == "sync-limits":
            continue  # same request path as the baseline under load
        lat: list[float] = []
        failed, rates = 0, []
        for _ in range(reps):
            with tempfile.TemporaryDirectory() as tmp, Storage(Path(tmp) / "a.db") as st:
                stop, port = make(st)
                address = f"127.0.0.1:{port}"
                with AdminClient(address) as admin:
                    info = admin.create_collection(
                        pop.schema, 1.0, users, 3, collection_id="b", pilot=0.0
                    )
                items = DeviceState.in_memory().reports_for("b", info.plan, pop.codes, ids)
                batches = [
                    client_wire.batch_to_proto("b", info.plan.digest, items[i : i + 2000])
                    for i in range(0, users, 2000)
                ]
                token = [("authorization", f"Bearer {info.submit_token}")]

                def ingest(
                    part: list[object], address: str = address, token: list[tuple[str, str]] = token
                ) -> None:
                    stub = client_wire.aggregator_stub(open_channel(address))
                    for batch in part:
                        stub.SubmitReports(batch, metadata=token, timeout=60)

                workers = [threading.Thread(target=ingest, args=(batches[i::2],)) for i in range(2)]
                t0 = time.perf_counter()
                for w in workers:
                    w.start()
                while any(w.is_alive() for w in workers):
                    took = _check(address, 5.0)
                    failed += took is None
                    if took is not None:
                        lat.append(1e3 * took)
                    time.sleep(0.01)
                for w in workers:
                    w.join()
                rates.append(users / (time.perf_counter() - t0))
                assert int(st.support("b").n.sum()) == users
                stop()
        p50, p99 = np.percentile(lat, [50, 99])
        rows[name] = (p99, statistics.median(rates))
        print(
            f"{name:20s}{p50:10.1f}{p99:10.1f}{max(lat):10.1f}{failed:8d}"
            f"{statistics.median(rates):12,.0f}"
        )
    (base_p99, base_rate), (new_p99, new_rate) = rows.values()
    print(f"aio / baseline: p99 {new_p99 / base_p99:.2f}x, ingest rate {new_rate / base_rate:.2f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--users", type=int, default=60_000)
    args = parser.parse_args()
    slow_streams(args.reps)
    health_under_load(args.reps, args.users)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
