"""The service as an attacker and a careless operator meet it (issue 12 items 6-8): slow
streams, a port already in use, TLS and the non-loopback rule, health under ingest
load, the per-address rate limit."""

from __future__ import annotations

import socket
import struct
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from calmkit_aggregator.service.admin import AdminClient
from calmkit_aggregator.service.server import ServerTls, create_server, graceful_stop
from calmkit_aggregator.service.storage import Storage
from calmkit_client import CalmkitError
from calmkit_client import wire as client_wire
from calmkit_client.cli import main
from calmkit_client.collector import (
    ERROR_KEY,
    Collector,
    RetryPolicy,
    call_with_retry,
    open_channel,
)
from calmkit_client.device import DeviceState
from calmkit_simulator import synthetic_population
from tests.certs import self_signed
from tests.integration.servers import Server

SIZES = (2, 3, 2, 2, 4)
POP = synthetic_population(n=40_000, sizes=SIZES, strength=1.5, rng=5)
IDS = np.arange(POP.n, dtype=np.uint64)
SUBMIT = "/calmkit.v1.Aggregator/SubmitReports"
GET_PLAN = "/calmkit.v1.Aggregator/GetPlan"
FORGED = ("authorization", "Bearer " + "f" * 32)  # well formed: the server reads the body


def _create(address: str, root: bytes | None = None, collection_id: str = "c1") -> object:
    with AdminClient(address, root_certificates=root) as admin:
        return admin.create_collection(
            POP.schema, 1.0, POP.n, 3, collection_id=collection_id, seed=7, pilot=0.0
        )


def _health(address: str, timeout: float = 2.0) -> int:
    stub = health_pb2_grpc.HealthStub(open_channel(address))
    return int(stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout).status)


# -- slow streams (item 6) ---------------------------------------------------------------
def _stalled_streams(
    port: int, count: int, path: str = SUBMIT, extra: tuple[tuple[str, str], ...] = ()
) -> list[socket.socket]:
    """``count`` connections, each opening a ``path`` stream (headers plus ``extra``)
    whose message says 1000 bytes follow and then never sends them (nor ends the
    stream)."""
    h2_connection = pytest.importorskip("h2.connection")
    h2_config = pytest.importorskip("h2.config")
    sockets = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port))
        conn = h2_connection.H2Connection(h2_config.H2Configuration(client_side=True))
        conn.initiate_connection()
        conn.send_headers(
            1,
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", path),
                (":authority", f"127.0.0.1:{port}"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
                *extra,
            ],
        )
        conn.send_data(1, b"\x00" + struct.pack(">I", 1000) + b"\x0a\x02c1")
        sock.sendall(conn.data_to_send())
        sockets.append(sock)
    return sockets


@pytest.mark.parametrize(
    ("path", "extra"), [(SUBMIT, ()), (SUBMIT, (FORGED,)), (GET_PLAN, ())], ids=str
)
def test_stalled_streams_do_not_starve_health_or_plans(
    server: Server, path: str, extra: tuple[tuple[str, str], ...]
) -> None:
    """16 streams stall mid-message (twice the old server's 8 workers): submits with no
    token (refused on their headers), with a forged well-formed token, and GetPlan
    calls (both read); health checks, GetPlan and submits still answer at once."""
    address = server.address
    info = _create(address)
    port = int(address.rsplit(":", 1)[1])
    sockets = _stalled_streams(port, 16, path, extra)
    try:
        time.sleep(0.3)  # let the server take every stream
        assert _health(address) == health_pb2.HealthCheckResponse.SERVING
        stub = client_wire.aggregator_stub(open_channel(address))
        plan = stub.GetPlan(client_wire.pb.CollectionRef(collection_id="c1"), timeout=2.0)
        assert plan.digest == info.plan.digest  # type: ignore[attr-defined]
        # and reports still go in while the streams hang
        with Collector(
            address,
            "c1",
            info.submit_token,  # type: ignore[attr-defined]
            DeviceState.in_memory(),
        ) as client:
            assert client.submit_many(POP.codes[:500], IDS[:500]).accepted == 500
    finally:
        for sock in sockets:
            sock.close()


# -- port in use (item 7) ------------------------------------------------------------------
def test_a_second_server_on_a_bound_port_is_refused(tmp_path: Path) -> None:
    with Storage(tmp_path / "a.db") as first_db, Storage(tmp_path / "b.db") as second_db:
        server, port = create_server("127.0.0.1:0", first_db)
        try:
            with pytest.raises(
                CalmkitError,
                match=rf"address \('127.0.0.1:{port}'\) could not "
                "be bound: the port is in use",
            ):
                create_server(f"127.0.0.1:{port}", second_db)
            assert _health(f"127.0.0.1:{port}") == health_pb2.HealthCheckResponse.SERVING
        finally:
            graceful_stop(server, 1.0)


def test_serve_on_a_bound_port_exits_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with Storage(tmp_path / "a.db") as storage:
        server, port = create_server("127.0.0.1:0", storage)
        try:
            code = main(["serve", "--address", f"127.0.0.1:{port}", "--db", str(tmp_path / "b.db")])
        finally:
            graceful_stop(server, 1.0)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err == [
        f"calmkit: error: address ('127.0.0.1:{port}') could not be bound: the port is in use "
        "or the host is not an address of this machine"
    ]


# -- TLS and the non-loopback rule (item 8) -------------------------------------------------
def test_tls_round_trip_and_plaintext_refused(tmp_path: Path) -> None:
    cert_file, key_file, root = self_signed(tmp_path)
    tls = ServerTls.from_files(cert_file, key_file)
    assert "hidden" in repr(tls) and "PRIVATE" not in repr(tls)
    with Storage(tmp_path / "agg.db") as storage:
        server, port = create_server("127.0.0.1:0", storage, tls=tls)
        address = f"localhost:{port}"
        try:
            info = _create(address, root)
            with Collector(
                address,
                "c1",
                info.submit_token,  # type: ignore[attr-defined]
                DeviceState.in_memory(),
                root_certificates=root,
            ) as client:
                assert client.submit_many(POP.codes[:2000], IDS[:2000]).accepted == 2000
            with AdminClient(address, root_certificates=root) as admin:
                answer = admin.query("c1", ["a0", "a1"])
            assert answer.values.shape == (2, 3) and answer.reports == 2000
            # a plaintext client gets no answer from a TLS server
            stub = health_pb2_grpc.HealthStub(open_channel(address))
            with pytest.raises(grpc.RpcError) as err:
                stub.Check(health_pb2.HealthCheckRequest(), timeout=2.0)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            # nor does a TLS client that does not trust the certificate
            _, _, stranger = self_signed(tmp_path / "other")
            stub = health_pb2_grpc.HealthStub(open_channel(address, stranger))
            with pytest.raises(grpc.RpcError) as err:
                stub.Check(health_pb2.HealthCheckRequest(), timeout=2.0)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        finally:
            graceful_stop(server, 1.0)


def test_serve_with_tls_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cert_file, key_file, _ = self_signed(tmp_path)
    key_file.chmod(0o644)  # a private key others can read is refused
    code = main(
        [
            "serve",
            "--address",
            "127.0.0.1:0",
            "--db",
            str(tmp_path / "a.db"),
            "--tls-cert",
            str(cert_file),
            "--tls-key",
            str(key_file),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert f"tls_key ('{key_file}') must not be readable by other users (mode 0644)" in err
    assert "chmod 600" in err and len(err.strip().splitlines()) == 1
    code = main(
        [
            "serve",
            "--address",
            "127.0.0.1:0",
            "--db",
            str(tmp_path / "a.db"),
            "--tls-cert",
            str(cert_file),
        ]
    )
    assert code == 2
    assert "tls_cert and tls_key must be given together" in capsys.readouterr().err


def test_non_loopback_needs_tls_or_insecure(tmp_path: Path) -> None:
    token = "s3cret-admin-token-123"
    with Storage(tmp_path / "a.db") as storage:
        with pytest.raises(
            CalmkitError,
            match=r"address \('0.0.0.0:0'\) is not loopback.*"
            r"--tls-cert/--tls-key.*--insecure",
        ):
            create_server("0.0.0.0:0", storage, admin_token=token)
        server, port = create_server("0.0.0.0:0", storage, admin_token=token, insecure=True)
        try:
            assert _health(f"127.0.0.1:{port}") == health_pb2.HealthCheckResponse.SERVING
        finally:
            graceful_stop(server, 1.0)
        cert_file, key_file, _ = self_signed(tmp_path)
        tls = ServerTls.from_files(cert_file, key_file)
        server, port = create_server("0.0.0.0:0", storage, admin_token=token, tls=tls)
        graceful_stop(server, 1.0)


def test_tls_inputs_are_checked(tmp_path: Path) -> None:
    with pytest.raises(CalmkitError, match=r"tls_cert \('.*nope.crt'\) must be readable"):
        ServerTls.from_files(tmp_path / "nope.crt", tmp_path / "nope.key")
    (tmp_path / "x.crt").write_text("not a certificate")
    (tmp_path / "x.key").write_text("not a key")
    with pytest.raises(CalmkitError, match="certificate_chain must be PEM"):
        ServerTls.from_files(tmp_path / "x.crt", tmp_path / "x.key")
    with pytest.raises(CalmkitError, match="root_certificates must be PEM"):
        open_channel("localhost:1", b"junk")


# -- health under ingest load --------------------------------------------------------------
def test_health_answers_promptly_under_ingest_load(server: Server) -> None:
    """Two clients submit 2,000-report batches back to back; every health check made
    meanwhile answers within 1 s (the old server took up to 3.6 s; the benchmark
    benchmarks/health_under_load.py measures p50/p99)."""
    address, storage = server.address, server.storage
    info = _create(address)
    device = DeviceState.in_memory()
    items = device.reports_for("c1", info.plan, POP.codes, IDS)  # type: ignore[attr-defined]
    batches = [
        client_wire.batch_to_proto("c1", info.plan.digest, items[i : i + 2000])  # type: ignore[attr-defined]
        for i in range(0, POP.n, 2000)
    ]
    token = [("authorization", f"Bearer {info.submit_token}")]  # type: ignore[attr-defined]

    def ingest(part: list[object]) -> None:
        stub = client_wire.aggregator_stub(open_channel(address))
        for batch in part:
            stub.SubmitReports(batch, metadata=token, timeout=30)

    workers = [threading.Thread(target=ingest, args=(batches[i::2],)) for i in range(2)]
    for w in workers:
        w.start()
    stub = health_pb2_grpc.HealthStub(open_channel(address))
    answered = 0  # every check must answer SERVING within its deadline (latency: the
    while any(w.is_alive() for w in workers):  # benchmark service_under_attack.py)
        reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=5.0)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        answered += 1
        time.sleep(0.01)
    for w in workers:
        w.join()
    assert int(storage.support("c1").n.sum()) == POP.n
    assert answered >= 5


# -- rate limit (issue 36 item 4) -------------------------------------------------------------
def test_rate_limit_refuses_then_the_client_backs_off(tmp_path: Path) -> None:
    with Storage(tmp_path / "a.db") as storage:
        server, port = create_server("127.0.0.1:0", storage, rate_limit=200.0)
        address = f"127.0.0.1:{port}"
        try:
            info = _create(address)
            device = DeviceState.in_memory()
            items = device.reports_for("c1", info.plan, POP.codes[:400], IDS[:400])  # type: ignore[attr-defined]
            first = client_wire.batch_to_proto("c1", info.plan.digest, items[:150])  # type: ignore[attr-defined]
            second = client_wire.batch_to_proto("c1", info.plan.digest, items[150:300])  # type: ignore[attr-defined]
            token = [("authorization", f"Bearer {info.submit_token}")]  # type: ignore[attr-defined]
            stub = client_wire.aggregator_stub(open_channel(address))
            assert stub.SubmitReports(first, metadata=token, timeout=5).accepted == 150
            with pytest.raises(grpc.RpcError) as err:  # 150 more than the 50 left: refused
                stub.SubmitReports(second, metadata=token, timeout=5)
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert (ERROR_KEY, "RateLimited") in tuple(err.value.trailing_metadata())
            assert "rate limit (200 reports per second per client address)" in err.value.details()
            # the client's retry waits it out: nothing is lost
            policy = RetryPolicy(attempts=8, initial=0.1, maximum=1.0)
            ack = call_with_retry(stub.SubmitReports, second, policy, token)
            assert ack.accepted == 150
            assert int(storage.support("c1").n.sum()) == 300
            time.sleep(1.1)  # a full bucket still does not let a batch over the burst in
            with pytest.raises(grpc.RpcError) as err:
                stub.SubmitReports(
                    client_wire.batch_to_proto("c1", info.plan.digest, items[:201]),  # type: ignore[attr-defined]
                    metadata=token,
                    timeout=5,
                )
            assert (ERROR_KEY, "BatchTooLarge") in tuple(err.value.trailing_metadata())
            assert int(storage.support("c1").n.sum()) == 300
        finally:
            graceful_stop(server, 1.0)


def _flood(address: str, plan: object, token: str, stop: threading.Event) -> list[int]:
    """Fake batches of 10 fresh reports from one address until ``stop``; returns
    [accepted, refused] batch counts."""
    device = DeviceState.in_memory()
    stub = client_wire.aggregator_stub(open_channel(address))
    meta = [("authorization", f"Bearer {token}")]
    counts = [0, 0]
    start = 10_000
    while not stop.is_set():
        ids = np.arange(start, start + 10, dtype=np.uint64)
        start += 10
        items = device.reports_for("c1", plan, POP.codes[:10], ids)  # type: ignore[arg-type]
        batch = client_wire.batch_to_proto("c1", plan.digest, items)  # type: ignore[attr-defined]
        try:
            stub.SubmitReports(batch, metadata=meta, timeout=5)
            counts[0] += 1
        except grpc.RpcError:
            counts[1] += 1
    return counts


def test_a_flood_from_one_address_does_not_refuse_another_address(tmp_path: Path) -> None:
    """Today's shared per-token bucket let a flood refuse genuine apps; with a bucket
    per address, the flooder (127.0.0.1) is throttled and a genuine client on another
    address (::1) gets in at its first try, its oversized batch split to the burst."""
    admin_token = "a" * 32
    with Storage(tmp_path / "a.db") as storage:
        server, port = create_server(
            "[::]:0", storage, admin_token, insecure=True, rate_limit=200.0, rate_burst=100
        )
        try:
            with AdminClient(f"127.0.0.1:{port}", admin_token) as admin:
                info = admin.create_collection(
                    POP.schema, 1.0, POP.n, 3, collection_id="c1", seed=7, pilot=0.0
                )
            stop = threading.Event()
            result: list[list[int]] = []
            flooder = threading.Thread(
                target=lambda: result.append(
                    _flood(f"127.0.0.1:{port}", info.plan, info.submit_token, stop)
                )
            )
            flooder.start()
            try:
                time.sleep(0.5)  # the flooder has drained its own bucket by now
                genuine = Collector(
                    f"[::1]:{port}",
                    "c1",
                    info.submit_token,
                    DeviceState.in_memory(),
                    RetryPolicy(attempts=1),
                )
                with genuine:  # a full burst at its first try: the flooder never lets a
                    # shared bucket refill that far
                    ack = genuine.submit_many(POP.codes[:100], np.arange(100, dtype=np.uint64))
                    assert ack.accepted == 100
            finally:
                stop.set()
                flooder.join()
            accepted, refused = result[0]
            assert refused > 0 and accepted <= (100 + 200 * 3) / 10  # burst + rate x time
            # a batch of 300 from a fresh address is split to the burst of 100 and lands whole
            with Collector(
                f"[::1]:{port}",
                "c1",
                info.submit_token,
                DeviceState.in_memory(),
                RetryPolicy(initial=0.1, maximum=0.5),
                batch_size=1000,
            ) as bulk:
                ack = bulk.submit_many(POP.codes[:300], np.arange(50_000, 50_300, dtype=np.uint64))
                assert ack.accepted == 300 and bulk.batch_size <= 100
        finally:
            graceful_stop(server, 1.0)


def test_shutdown_answers_unavailable_and_the_client_may_retry(tmp_path: Path) -> None:
    storage = Storage(tmp_path / "a.db")
    server, port = create_server("127.0.0.1:0", storage)
    address = f"127.0.0.1:{port}"
    try:
        info = _create(address)
        items = DeviceState.in_memory().reports_for("c1", info.plan, POP.codes[:5], IDS[:5])  # type: ignore[attr-defined]
        batch = client_wire.batch_to_proto("c1", info.plan.digest, items)  # type: ignore[attr-defined]
        storage.close()  # what a shutdown does under the in-flight calls
        stub = client_wire.aggregator_stub(open_channel(address))
        token = [("authorization", f"Bearer {info.submit_token}")]  # type: ignore[attr-defined]
        with pytest.raises(grpc.RpcError) as err:
            stub.SubmitReports(batch, metadata=token, timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert (ERROR_KEY, "ServiceUnavailable") in tuple(err.value.trailing_metadata())
        assert "storage is closed" in err.value.details()
    finally:
        graceful_stop(server, 1.0)
