"""What the service does with hostile input (issue 12 items 9-11): bounded echo of
client strings, conflict answers that reveal nothing stored, collection-id rules,
private files, status codes."""

from __future__ import annotations

import logging
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from calmkit_aggregator.service.admin import AdminClient
from calmkit_aggregator.service.server import create_server, graceful_stop
from calmkit_aggregator.service.storage import Storage
from calmkit_client import CalmkitError, Plan, Report
from calmkit_client import wire as client_wire
from calmkit_client.cli import main
from calmkit_client.collector import ERROR_KEY, Collector, open_channel
from calmkit_client.device import DeviceState
from calmkit_client.echo import MAX_DETAIL_CHARS, show
from calmkit_client.ids import check_collection_id
from calmkit_simulator import synthetic_population
from tests.integration.servers import Server

POP = synthetic_population(n=3000, sizes=(2, 3, 2, 2, 4), strength=1.5, rng=9)
IDS = np.arange(POP.n, dtype=np.uint64)
RULE = "must be 1-64 characters from A-Z a-z 0-9 . _ - starting with a letter or digit"


class Served(Server):
    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp)
        self.stub = client_wire.aggregator_stub(open_channel(self.address))

    def create(self, collection_id: str = "c1") -> client_wire.CollectionInfo:
        with AdminClient(self.address) as admin:
            return admin.create_collection(
                POP.schema, 1.0, POP.n, 3, seed=7, pilot=0.0, collection_id=collection_id
            )


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    with Served(tmp_path) as srv:
        yield srv


def _fail(call: object, request: object, **kw: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        call(request, timeout=10, **kw)  # type: ignore[operator]
    return err.value


# -- bounded echo (item 9) -----------------------------------------------------------------
def test_huge_client_strings_are_echoed_bounded(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    info = served.create()
    token = [("authorization", f"Bearer {info.submit_token}")]
    huge = "\u202e" + "x" * (1 << 20)  # 1 MB with a bidi override up front
    caplog.set_level(logging.INFO, logger="calmkit.aggregator")
    pb = client_wire.pb
    items = DeviceState.in_memory().reports_for("c1", info.plan, POP.codes[:3], IDS[:3])
    batch = client_wire.batch_to_proto("c1", info.plan.digest, items)
    assert served.stub.SubmitReports(batch, metadata=token, timeout=10).accepted == 3
    batch.plan_digest = huge
    wrong_cid = client_wire.batch_to_proto("c1", info.plan.digest, items)
    wrong_cid.collection_id = huge
    too_large = [  # bodies over their method's limit: refused before parsing
        _fail(served.stub.GetPlan, pb.CollectionRef(collection_id=huge)),
        _fail(served.stub.GetCollection, pb.CollectionRef(collection_id=huge)),
        _fail(served.stub.Query, pb.QueryRequest(collection_id="c1", attributes=["a0", huge])),
    ]
    for err in too_large:
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.details()[:200]
        assert "must be at most" in err.details() and "\u202e" not in err.details()
    failures = [
        _fail(served.stub.CreateCollection, pb.CreateCollectionRequest(collection_id=huge)),
        _fail(served.stub.SubmitReports, wrong_cid, metadata=token),
        _fail(served.stub.SubmitReports, batch, metadata=token),
    ]
    for err in failures:
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT or err.code() in (
            grpc.StatusCode.FAILED_PRECONDITION,  # the digest: PlanMismatch
        ), err.details()[:200]
        assert len(err.details()) <= MAX_DETAIL_CHARS + 32
        assert "\u202e" not in err.details() and "\\u202e" in err.details()
    assert "(1048577 chars)" in failures[0].details()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) >= len(failures)
    assert max(len(line) for line in lines) < 2 * MAX_DETAIL_CHARS
    assert not any("\u202e" in line for line in lines)


def test_show_escapes_and_cuts() -> None:
    assert show("abc") == "'abc'"
    assert show("a\0b\u202e") == "'a\\x00b\\u202e'"
    assert show("y" * 100) == f"'{'y' * 64}'... (100 chars)"
    assert show(b"\xff" * 70).endswith("... (70 bytes)")


# -- conflicts reveal nothing stored (item 10) ---------------------------------------------
def test_probing_a_victims_pseudonym_learns_nothing_of_the_report(
    served: Served, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A submit-token holder who knows the victim's pseudonym (and even the report id)
    probes every (view, cell): every probe gets the same answer, and nothing stored
    appears in any answer or log line."""
    info = served.create()
    caplog.set_level(logging.INFO, logger="calmkit.aggregator")
    victim = DeviceState(tmp_path / "victim.db")
    record = {"a0": "1", "a1": "2", "a2": "0", "a3": "1", "a4": "3"}
    with Collector(served.address, "c1", info.submit_token, victim) as client:
        assert client.submit(record).accepted == 1
    pseudonym, stored = victim.report_for("c1", info.plan, record)
    token = [("authorization", f"Bearer {info.submit_token}")]
    rng = np.random.default_rng(0)

    def probes(report_id: bytes) -> Iterator[Report]:
        for view, oracle in enumerate(info.plan.view_oracles):
            if oracle.name == "GRR":
                payloads: list[int | bytes] = list(range(oracle.L))
            else:  # one-hot vectors of every cell
                payloads = [
                    np.packbits(np.eye(oracle.L, dtype=np.uint8)[c]).tobytes()
                    for c in range(oracle.L)
                ]
            for payload in payloads:
                yield Report(info.plan.digest, view, payload, report_id)

    answers = set()
    n_probes = 0
    for report_id in (rng.bytes(16), stored.report_id):
        for probe in probes(report_id):
            batch = client_wire.batch_to_proto("c1", info.plan.digest, [(pseudonym, probe)])
            try:
                ack = served.stub.SubmitReports(batch, metadata=token, timeout=10)
                answers.add(("ok", report_id == stored.report_id, ack.accepted, ack.duplicates))
            except grpc.RpcError as err:
                answers.add((err.code().name, report_id == stored.report_id, err.details(), ""))
            n_probes += 1
    assert n_probes == 2 * sum(o.L for o in info.plan.view_oracles) and n_probes > 2 * 10
    # one answer per attacker mode, whatever the (view, cell) probed
    assert len(answers) == 2, answers
    assert ("ok", True, 0, 1) in answers  # the pair is a retry: the stored report stands
    texts = [str(a) for a in answers] + [r.getMessage() for r in caplog.records]
    for secret in (stored.report_id.hex(), repr(stored.report_id)[2:-1]):
        assert not any(secret in t for t in texts)
    assert int(served.storage.support("c1").n.sum()) == 1
    victim.close()


# -- collection ids (item 11) --------------------------------------------------------------
@pytest.mark.parametrize("bad", ["", "a b", "x" * 65, "-lead", "a\0b", "caf\u00e9", "a\u202eb"])
def test_collection_id_rules_everywhere(served: Served, bad: str) -> None:
    with pytest.raises(CalmkitError, match=RULE):
        check_collection_id(bad)
    with pytest.raises(CalmkitError, match=RULE):
        Collector(served.address, bad, "t" * 20, DeviceState.in_memory())
    if bad:  # (an empty id on create asks the server to pick one)
        with AdminClient(served.address) as admin, pytest.raises(CalmkitError, match=RULE):
            admin.create_collection(POP.schema, 1.0, POP.n, 3, collection_id=bad, pilot=0.0)
    err = _fail(served.stub.GetPlan, client_wire.pb.CollectionRef(collection_id=bad))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and RULE in err.details()


def test_good_ids_pass_and_stored_legacy_ids_stay_addressable(tmp_path: Path) -> None:
    for good in ("c1", "survey-2026.v1_b", "A" * 64):
        assert check_collection_id(good) == good
    with Storage(tmp_path / "old.db") as storage:
        storage.create_collection("legacy", Plan(POP.schema, 1.0, [(0, 1)]), 2, b"\0" * 32)
    with sqlite3.connect(tmp_path / "old.db") as conn:  # an id from before the rules
        conn.execute("PRAGMA foreign_keys=OFF")
        conn.execute("UPDATE collections SET id = 'legacy survey #1'")
        conn.execute("UPDATE phases SET collection_id = 'legacy survey #1'")
    with Storage(tmp_path / "old.db") as storage:
        server, port = create_server("127.0.0.1:0", storage)
        try:
            with AdminClient(f"127.0.0.1:{port}") as admin:
                assert admin.get_collection("legacy survey #1").state == "open"
                assert admin.close_collection("legacy survey #1").state == "closed"
        finally:
            graceful_stop(server, 1.0)


# -- files (item 11) -----------------------------------------------------------------------
def test_database_files_are_private(tmp_path: Path) -> None:
    path = tmp_path / "agg.db"
    with Storage(path) as storage:
        storage.create_collection("c1", Plan(POP.schema, 1.0, [(0, 1)]), 2, b"\0" * 32)
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.glob("agg.db*")}
    assert {"agg.db", "agg.db-wal", "agg.db-shm"} <= set(modes)
    assert set(modes.values()) == {0o600}, modes


def test_token_files_readable_by_others_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    token = tmp_path / "admin.token"
    token.write_text("s3cret-admin-token-123\n")
    token.chmod(0o644)
    args = ["collection", "list", "--address", "127.0.0.1:1", "--token-file", str(token)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"token_file ('{token}') must not be readable by other users (mode 0644)" in err
    assert "chmod 600" in err


def test_unwritable_db_is_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    db = blocker / "x.db"  # a folder that is a file: no one can create it
    assert main(["serve", "--address", "127.0.0.1:0", "--db", str(db)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"calmkit: error: db ('{db}') cannot be created: Not a directory"]


# -- status codes (item 11) ----------------------------------------------------------------
def test_huge_epsilon_and_undecodable_bytes_are_invalid_argument(served: Served) -> None:
    with AdminClient(served.address) as admin:
        for eps in (710.0, 1e6, 45.0):
            with pytest.raises(CalmkitError, match=rf"epsilon \({eps!r}\) must be <= 44"):
                admin.create_collection(POP.schema, eps, POP.n, 3, pilot=0.0)
    raw = open_channel(served.address).unary_unary(
        "/calmkit.v1.Aggregator/SubmitReports",
        request_serializer=None,
        response_deserializer=None,
    )
    token = (("authorization", "Bearer " + "t" * 32),)  # well formed: the body is read
    err = _fail(raw, b"\xff\xff\xff\xff", metadata=token)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == "request (4 bytes) is not a valid calmkit.v1.ReportBatch message"
    assert (ERROR_KEY, "CalmkitError") in tuple(err.trailing_metadata())
