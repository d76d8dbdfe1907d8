"""The aggregator service on port 0 with the real client: counts and answers equal the
in-process pipeline's for the same reports; every status code; validation naming the
field; access control; health and reflection; memoised resubmission."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from calmkit_aggregator import SupportCounts, reconstruct
from calmkit_aggregator.reconstruction import reconstruct_global
from calmkit_aggregator.service.admin import AdminClient
from calmkit_aggregator.service.server import create_server
from calmkit_aggregator.service.storage import Storage
from calmkit_client import CalmkitError, make_reports
from calmkit_client import wire as client_wire
from calmkit_client.collector import Collector, RetryPolicy, call_with_retry, open_channel
from calmkit_client.device import DeviceState
from calmkit_client.errors import (
    AccessDenied,
    CollectionClosed,
    CollectionExists,
    CollectionNotFound,
    PlanMismatch,
    ReportConflict,
)
from tests.integration.servers import IDS, POP, Server, create_collection


def test_counts_and_answers_equal_the_in_process_pipeline(
    server: Server, tmp_path: Path, seeded_entropy: Callable[[int], None]
) -> None:
    info = create_collection(server.address)
    state = DeviceState(tmp_path / "device.db")
    seeded_entropy(11)  # the device's entropy is default_rng(11): reproducible below
    with Collector(server.address, "c1", info.submit_token, state, batch_size=700) as client:
        ack = client.submit_many(POP.codes, IDS)
    assert (ack.accepted, ack.duplicates) == (POP.n, 0)
    # the same reports in process: the device made them with make_reports and this rng,
    # each user on the view of its pseudonym
    keys = b"".join(state.pseudonym("c1", int(u)) for u in IDS)
    pseudonyms = np.frombuffer(keys, dtype=np.uint8).reshape(-1, 16)
    expected = SupportCounts.from_reports(
        info.plan, make_reports(info.plan, POP.codes, pseudonyms, np.random.default_rng(11))
    )
    got = server.storage.support("c1")
    np.testing.assert_array_equal(got.n, expected.n)
    for a, b in zip(got.counts, expected.counts):
        np.testing.assert_array_equal(a, b)
    with AdminClient(server.address) as admin:
        closed = admin.close_collection("c1")
        assert closed.state == "closed" and closed.reports == POP.n
        in_process = reconstruct(expected)
        for attrs in (["a0", "a1"], ["a1", "a3", "a4"], ["a0", "a2", "a4"]):
            answer = admin.query("c1", attrs)
            mine = in_process.answer(attrs)
            assert answer.method == mine.method and answer.state == "closed"
            np.testing.assert_allclose(answer.values, mine.values, rtol=0, atol=1e-12)
            assert answer.values.sum() == pytest.approx(1.0)
            # every answer carries the mean squared total error of its values (noise and
            # estimated bias, from a bootstrap), also max-ent, and says so
            assert np.all(np.isfinite(answer.variance)) and np.all(answer.variance > 0)
            assert answer.replicates == 32 and "bootstrap" in answer.variance_method
            assert "total error (noise + estimated bias)" in answer.variance_method
            # a max-ent answer also says how the interactions it misses were sized
            sized = "sized from those the views show (" in answer.variance_method
            assert sized == (answer.method != "projection"), answer.variance_method
        # the global reconstruction on request, equal to the in-process one
        in_model = reconstruct_global(expected)
        methods = set()
        for attrs in (["a1", "a3", "a4"], ["a0", "a2", "a4"]):
            answer = admin.query("c1", attrs, replicates=4, reconstruction="global")
            mine = in_model.answer(attrs)
            assert answer.method == mine.method
            methods.add(answer.method)
            np.testing.assert_allclose(answer.values, mine.values, rtol=0, atol=1e-12)
            assert np.all(np.isfinite(answer.variance)) and answer.replicates == 4
        assert "maxent+model" in methods  # a pair no view holds, answered from the model
        with pytest.raises(CalmkitError, match=r"reconstruction \('nearest'\) must be one of"):
            admin.query("c1", ["a0"], reconstruction="nearest")
    state.close()


def test_resubmission_is_memoised_and_acknowledged_once(server: Server, tmp_path: Path) -> None:
    info = create_collection(server.address)
    record = {"a0": "0", "a1": "2", "a2": "1", "a3": "0", "a4": "3"}
    with DeviceState(tmp_path / "d.db") as state:
        with Collector(server.address, "c1", info.submit_token, state) as client:
            first = client.submit(record)
            again = client.submit(record)  # same stored report: a duplicate, not a new one
    with DeviceState(tmp_path / "d.db") as state:  # a restarted app
        with Collector(server.address, "c1", info.submit_token, state) as client:
            after_restart = client.submit(record)
    assert (first.accepted, again.accepted, again.duplicates) == (1, 0, 1)
    assert (after_restart.accepted, after_restart.duplicates) == (0, 1)
    assert int(server.storage.support("c1").n.sum()) == 1


def _batch(
    info: client_wire.CollectionInfo, users: slice, state: DeviceState | None = None
) -> object:
    state = state or DeviceState.in_memory()
    items = state.reports_for("c1", info.plan, POP.codes[users], IDS[users])
    return client_wire.batch_to_proto("c1", info.plan.digest, items)


def _submit(address: str, batch: object, token: str | None) -> object:
    stub = client_wire.aggregator_stub(open_channel(address))
    metadata = [("authorization", f"Bearer {token}")] if token else []
    return call_with_retry(stub.SubmitReports, batch, RetryPolicy(attempts=1), metadata)


@pytest.mark.parametrize(
    "field, mutate, message",
    [
        ("view", lambda r, p: setattr(r, "view", p.m + 3), "reports[2].view"),
        ("report_id", lambda r, p: setattr(r, "report_id", b"x" * 15), "reports[2].report_id"),
        ("pseudonym", lambda r, p: setattr(r, "pseudonym", b""), "reports[2].pseudonym"),
        ("payload", lambda r, p: r.ClearField("payload"), "reports[2].payload"),
    ],
)
def test_bad_field_rejects_the_whole_batch_and_names_it(
    server: Server, field: str, mutate: object, message: str
) -> None:
    info = create_collection(server.address)
    batch = _batch(info, slice(0, 10))
    mutate(batch.reports[2], info.plan)  # type: ignore[operator, attr-defined]
    with pytest.raises(CalmkitError, match=message.replace("[", r"\[").replace("]", r"\]")):
        _submit(server.address, batch, info.submit_token)
    assert int(server.storage.support("c1").n.sum()) == 0  # nothing of it counted
    good = _batch(info, slice(10, 20))
    assert _submit(server.address, good, info.submit_token).accepted == 10  # still serving


def test_payload_values_are_checked_against_the_view_oracle(server: Server) -> None:
    info = create_collection(server.address, views=[[0, 1], [0, 1, 2, 3, 4]])
    assert info.plan.oracles == ("GRR", "OUE")  # 6 cells: GRR; 96 cells: OUE
    batch = _batch(info, slice(0, 200))
    grr = next(r for r in batch.reports if r.view == 0)
    oue = next(r for r in batch.reports if r.view == 1)
    saved = grr.cell
    grr.cell = 6
    with pytest.raises(CalmkitError, match=r"cell \(6\) must be < L = 6"):
        _submit(server.address, batch, info.submit_token)
    grr.cell = saved
    oue.bits = oue.bits[:-1]
    with pytest.raises(CalmkitError, match=r"bits \(11 bytes\) must be 12 bytes"):
        _submit(server.address, batch, info.submit_token)
    assert int(server.storage.support("c1").n.sum()) == 0


def test_status_codes(server: Server) -> None:
    info = create_collection(server.address)
    with pytest.raises(CollectionExists, match=r"collection_id \('c1'\) already exists"):
        create_collection(server.address)
    device = DeviceState.in_memory()
    batch = _batch(info, slice(0, 5), device)
    with pytest.raises(AccessDenied, match=r"submit token\) is missing or wrong"):
        _submit(server.address, batch, "wrong-token-wrong-token")
    assert _submit(server.address, batch, info.submit_token).accepted == 5
    assert _submit(server.address, batch, info.submit_token).duplicates == 5  # a retry
    device.forget("c1")  # a device that forgot its reports makes new ones: refused
    other = _batch(info, slice(0, 5), device)
    with pytest.raises(
        ReportConflict, match=r"reports\[0\]\.pseudonym \(b.*already holds a report"
    ):
        _submit(server.address, other, info.submit_token)
    stale = _batch(info, slice(5, 10))
    stale.plan_digest = "0" * 64
    with pytest.raises(PlanMismatch, match=r"plan_digest \('0000.*must be one of the collection"):
        _submit(server.address, stale, info.submit_token)
    missing = _batch(info, slice(5, 10))
    missing.collection_id = "nope"
    with pytest.raises(CollectionNotFound, match=r"collection_id \('nope'\) not found"):
        _submit(server.address, missing, info.submit_token)
    with AdminClient(server.address) as admin:
        admin.close_collection("c1")
        with pytest.raises(CollectionNotFound, match=r"collection_id \('nope'\) not found"):
            admin.query("nope", ["a0"])
        with pytest.raises(CalmkitError, match="a9"):
            admin.query("c1", ["a0", "a9"])
    with pytest.raises(CollectionClosed, match=r"collection_id \('c1'\) is closed: it accepts no"):
        _submit(server.address, _batch(info, slice(5, 10)), info.submit_token)
    assert int(server.storage.support("c1").n.sum()) == 5


def test_admin_token_is_required_when_configured(tmp_path: Path) -> None:
    with Server(tmp_path, admin_token="s3cret-admin-token-123") as srv:
        with (
            AdminClient(srv.address) as anonymous,
            pytest.raises(AccessDenied, match=r"admin bearer token\) is missing or wrong"),
        ):
            anonymous.create_collection(POP.schema, 1.0, POP.n, 3)
        with AdminClient(srv.address, "s3cret-admin-token-123") as admin:
            assert admin.create_collection(POP.schema, 1.0, POP.n, 3).state == "open"


def test_without_a_token_only_loopback_binds(tmp_path: Path) -> None:
    with Storage(tmp_path / "x.db") as storage:
        with pytest.raises(CalmkitError, match=r"address \('0.0.0.0:0'\) must be loopback"):
            create_server("0.0.0.0:0", storage)


def test_health_and_reflection(server: Server) -> None:
    channel = open_channel(server.address)
    health = health_pb2_grpc.HealthStub(channel)
    for name in ("", "calmkit.v1.Aggregator"):
        status = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5).status
        assert status == health_pb2.HealthCheckResponse.SERVING
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    response = next(iter(stub.ServerReflectionInfo(iter([request]), timeout=5)))
    names = {s.name for s in response.list_services_response.service}
    assert {"calmkit.v1.Aggregator", "grpc.health.v1.Health"} <= names


class _Unavailable(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return "test"

    def trailing_metadata(self) -> tuple[()]:
        return ()


def test_retries_back_off_on_unavailable_only() -> None:
    calls, sleeps = [], []

    def flaky(request: object, timeout: float, metadata: object) -> str:
        calls.append(timeout)
        if len(calls) < 3:
            raise _Unavailable(grpc.StatusCode.UNAVAILABLE)
        return "ok"

    policy = RetryPolicy(attempts=5, initial=0.1, maximum=0.15, timeout=3.0, jitter=0.0)
    assert call_with_retry(flaky, None, policy, sleep=sleeps.append) == "ok"
    assert calls == [3.0, 3.0, 3.0] and sleeps == [0.1, 0.15]

    def invalid(request: object, timeout: float, metadata: object) -> str:
        calls.append(timeout)
        raise _Unavailable(grpc.StatusCode.INVALID_ARGUMENT)

    calls.clear()
    with pytest.raises(CalmkitError, match=r"^INVALID_ARGUMENT: test$") as err:
        call_with_retry(invalid, None, policy, sleep=sleeps.append)
    assert type(err.value) is CalmkitError  # the base class: no subclass for this code
    assert len(calls) == 1


def test_cli_collection_and_query_commands(
    server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from calmkit_client.cli import main

    base = ["--address", server.address]
    assert (
        main(
            [
                "collection",
                "create",
                *base,
                "--domain",
                "2,3,2,2,4",
                "--epsilon",
                "1",
                "--n",
                str(POP.n),
                "--k",
                "3",
                "--id",
                "cli",
                "--reconstruct",
                "global",
                "--json",
            ]
        )
        == 0
    )
    created = json.loads(capsys.readouterr().out)
    assert created["collection_id"] == "cli" and created["state"] == "open"
    design = server.storage.get_collection("cli").design  # its phase 1 is planned for global
    assert design is not None and design.reconstruction == "global"
    assert len(created["views"]) == created["m"] and "submit_token" in created
    with Collector(server.address, "cli", created["submit_token"]) as client:
        client.submit_many(POP.codes, IDS)
    assert main(["collection", "close", *base, "--collection", "cli", "--json"]) == 0
    closed = json.loads(capsys.readouterr().out)
    assert closed["state"] == "closed" and closed["reports"] == POP.n
    assert "submit_token" not in closed  # shown once, at creation
    assert (
        main(["query", *base, "--collection", "cli", "--attrs", "a3,a0", "--format", "json"]) == 0
    )
    table = json.loads(capsys.readouterr().out)
    assert table["attributes"] == ["a0", "a3"] and table["shape"] == [2, 2]
    assert sum(table["values"]) == pytest.approx(1.0)
    assert main(["query", *base, "--collection", "cli", "--attrs", "a0,a1", "--format", "csv"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "a0,a1,fraction,total_error" and len(lines) == 1 + 2 * 3
    assert main(["query", *base, "--collection", "nope", "--attrs", "a0"]) == 2
    assert "collection_id ('nope')" in capsys.readouterr().err


def test_oversized_batch_is_refused_whole(server: Server) -> None:
    from calmkit_aggregator.service.wire import MAX_BATCH

    info = create_collection(server.address)
    batch = _batch(info, slice(0, 1))
    one = batch.reports[0]
    batch.reports.extend([one] * MAX_BATCH)  # MAX_BATCH + 1 reports
    with pytest.raises(CalmkitError, match=rf"reports \({MAX_BATCH + 1} in one batch\)"):
        _submit(server.address, batch, info.submit_token)
    assert int(server.storage.support("c1").n.sum()) == 0


def test_a_retried_query_waits_for_the_error_bars_instead_of_recomputing_them(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first answer computes a bootstrap of the whole reconstruction; when that
    outlasts the client's deadline, the retry used to start it again (and again: on a
    slow reconstruction no query ever finished). Now a query that arrives while it is
    computed waits for it: one computation for a deadline-expired call, its retry and
    a concurrent query."""
    import threading
    import time

    from calmkit_aggregator.service import handlers

    info = create_collection(server.address)
    with Collector(server.address, "c1", info.submit_token, DeviceState.in_memory()) as c:
        c.submit_many(POP.codes[:3000], IDS[:3000])
    real, calls = handlers.bootstrap, []

    def slow(*args: object, **kwargs: object) -> object:
        calls.append(1)
        time.sleep(1.5)  # longer than the first call's deadline below
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(handlers, "bootstrap", slow)
    answers: list[object] = []
    policy = RetryPolicy(timeout=0.5, initial=0.1, maximum=0.2, total=30.0)
    with AdminClient(server.address, retry=policy) as admin:
        other = threading.Thread(target=lambda: answers.append(admin.query("c1", ["a0", "a1"])))
        other.start()
        answers.append(admin.query("c1", ["a0", "a1"]))  # expires at least once, retried
        other.join()
    assert len(answers) == 2 and len(calls) == 1
