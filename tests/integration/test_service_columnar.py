"""Columnar batches over gRPC: the Collector sends them (and the counts equal the
in-process ones), falls back to per-report messages on a server without
``SubmitColumnar``, and a malformed columnar batch is INVALID_ARGUMENT naming the field,
with nothing counted."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest

from calmkit_aggregator.service import wire as agg_wire
from calmkit_aggregator.service.handlers import AggregatorService
from calmkit_aggregator.service.storage import Storage
from calmkit_client import CalmkitError
from calmkit_client import wire as client_wire
from calmkit_client.collector import Collector, RetryPolicy, call_with_retry, open_channel
from calmkit_client.device import DeviceState
from calmkit_proto.v1 import calmkit_pb2 as pb
from tests.integration.servers import IDS, POP, Server, create_collection


def _old_server(storage: Storage) -> tuple[grpc.Server, int]:
    """A server that predates ``SubmitColumnar``: every other call, the same handlers."""
    service = AggregatorService(storage)
    methods = pb.DESCRIPTOR.services_by_name["Aggregator"].methods
    handlers = {
        m.name: grpc.unary_unary_rpc_method_handler(
            agg_wire._parsing(getattr(service, m.name), getattr(pb, m.input_type.name)),
            response_serializer=getattr(pb, m.output_type.name).SerializeToString,
        )
        for m in methods
        if m.name != "SubmitColumnar"
    }
    server = grpc.server(ThreadPoolExecutor(4))
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(agg_wire.SERVICE_NAME, handlers),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


def _upload(address: str, info: client_wire.CollectionInfo, tmp: Path) -> Collector:
    state = DeviceState(tmp / "device.db")
    with Collector(
        address, info.collection_id, info.submit_token, state, batch_size=500
    ) as collector:
        ack = collector.submit_many(POP.codes, IDS)
        again = collector.submit_many(POP.codes[:700], IDS[:700])  # memoised: duplicates
    state.close()
    assert (ack.accepted, ack.duplicates) == (POP.n, 0)
    assert (again.accepted, again.duplicates) == (0, 700)
    return collector


def test_collector_sends_columns_and_counts_match(server: Server, tmp_path: Path) -> None:
    info = create_collection(server.address)
    collector = _upload(server.address, info, tmp_path)
    assert collector._columnar  # the server took columns
    assert int(server.storage.support("c1").n.sum()) == POP.n
    recount = server.storage.recount("c1")
    np.testing.assert_array_equal(recount.n, server.storage.support("c1").n)


def test_collector_falls_back_on_an_older_server(tmp_path: Path) -> None:
    storage = Storage(tmp_path / "old.db")
    old, port = _old_server(storage)
    try:
        info = create_collection(f"127.0.0.1:{port}")
        collector = _upload(f"127.0.0.1:{port}", info, tmp_path)
        assert not collector._columnar  # UNIMPLEMENTED once, then per-report messages
        assert int(storage.support("c1").n.sum()) == POP.n
    finally:
        old.stop(None)
        storage.close()


def test_malformed_columnar_batch_is_refused_whole(server: Server, tmp_path: Path) -> None:
    info = create_collection(server.address)
    state = DeviceState(tmp_path / "device.db")
    items = state.reports_for("c1", info.plan, POP.codes[:50], IDS[:50])
    state.close()
    batch = client_wire.columnar_batch_to_proto("c1", info.plan.digest, items)
    views = np.frombuffer(batch.views, "<u4").copy()
    views[9] = info.plan.m  # out of range
    batch.views = views.tobytes()
    channel = open_channel(server.address)
    stub = client_wire.aggregator_stub(channel)
    metadata = [("authorization", f"Bearer {info.submit_token}")]
    with pytest.raises(CalmkitError, match=rf"reports\[9\]\.view \({info.plan.m}\) must be in"):
        call_with_retry(stub.SubmitColumnar, batch, RetryPolicy(attempts=1), metadata)
    batch.count = 10_001
    with pytest.raises(CalmkitError, match=r"count \(10001 reports in one batch\) must be at most"):
        call_with_retry(stub.SubmitColumnar, batch, RetryPolicy(attempts=1), metadata)
    channel.close()
    assert server.storage.get_collection("c1").reports == 0
