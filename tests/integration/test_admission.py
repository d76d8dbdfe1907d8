"""Admission tickets against a real server, on both storage backends: a collection
created with admission takes only reports carrying a valid ticket for their own
pseudonym, on the view that pseudonym is assigned to; anything else refuses the whole
batch and stores nothing. A collection without admission behaves as before."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from calmkit_aggregator.service.admin import AdminClient
from calmkit_aggregator.service.server import create_server, graceful_stop
from calmkit_aggregator.service.storage import Storage
from calmkit_client import AdmissionRefused, Collector, DeviceState, ReportConflict
from calmkit_client import wire as client_wire
from calmkit_client.collector import RetryPolicy, call_with_retry
from calmkit_client.report import Report, make_report
from calmkit_client.tickets import TicketIssuer, generate_ed25519_key, generate_hmac_key
from tests.integration.servers import POP

N = 300  # users per test batch


class Running:
    """A server on a free loopback port over ``store``."""

    def __init__(self, store: Any) -> None:
        self.storage = store
        self.server, port = create_server("127.0.0.1:0", store)
        self.address = f"127.0.0.1:{port}"

    def stop(self) -> None:
        graceful_stop(self.server, 2.0)
        self.storage.close()


@pytest.fixture(params=["sqlite", "postgres"])
def running(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Running]:
    if request.param == "sqlite":
        store: Any = Storage(tmp_path / "agg.db")
    else:
        from calmkit_aggregator.service.pg_storage import PgStorage

        store = PgStorage(request.getfixturevalue("pg_dsn"))
    srv = Running(store)
    yield srv
    srv.stop()


def _issuer(scheme: str) -> TicketIssuer:
    if scheme == "ed25519":
        return TicketIssuer.ed25519(generate_ed25519_key()[0])
    if scheme == "aes256-prf":
        return TicketIssuer.aes(generate_hmac_key())
    return TicketIssuer.hmac(generate_hmac_key())


def _create(address: str, issuer: TicketIssuer | None, cid: str = "adm") -> Any:
    admission = None if issuer is None else (issuer.scheme, issuer.aggregator_key)
    with AdminClient(address) as admin:
        return admin.create_collection(
            POP.schema, 1.0, POP.n, 3, collection_id=cid, seed=7, pilot=0.0, admission=admission
        )


def _send(
    srv: Running,
    info: Any,
    items: list[tuple[bytes, Report]],
    tickets: list[bytes] | None,
    columnar: bool = True,
) -> client_wire.Acknowledgement:
    """One batch, in columns or as ``SubmitReports``, no retries."""
    make = client_wire.columnar_batch_to_proto if columnar else client_wire.batch_to_proto
    batch = make(info.collection_id, info.plan.digest, items, tickets)
    with grpc.insecure_channel(srv.address) as channel:
        stub = client_wire.aggregator_stub(channel)
        call = stub.SubmitColumnar if columnar else stub.SubmitReports
        token = [("authorization", f"Bearer {info.submit_token}")]
        ack = call_with_retry(call, batch, RetryPolicy(attempts=1), token)
    return client_wire.ack_from_proto(ack)


def _reports(srv: Running, collection_id: str) -> int:
    with AdminClient(srv.address) as admin:
        return admin.get_collection(collection_id).reports


def _users(info: Any, n: int = N) -> list[tuple[bytes, Report]]:
    state = DeviceState.in_memory()
    return state.reports_for(info.collection_id, info.plan, POP.codes[:n], np.arange(n))


@pytest.mark.parametrize("scheme", ["ed25519", "hmac-sha256", "aes256-prf"])
@pytest.mark.parametrize("columnar", [True, False], ids=["columnar", "reports"])
def test_only_valid_tickets_are_admitted(running: Running, scheme: str, columnar: bool) -> None:
    issuer = _issuer(scheme)
    info = _create(running.address, issuer)
    assert info.admission == issuer.verifier().fingerprint and info.admission.startswith(scheme)
    items = _users(info)
    good = [issuer.issue("adm", p) for p, _ in items]
    swapped = [good[1], good[0], *good[2:]]  # tickets of other pseudonyms
    other_collection = [issuer.issue("other", p) for p, _ in items]
    other_key = [_issuer(scheme).issue("adm", p) for p, _ in items]
    one_forged = [*good[:-1], bytes(len(good[0]))]
    one_missing = [*good[:7], b"", *good[8:]]
    cases = {
        "no tickets": (None, r"tickets \(0 bytes\) must be one"),
        "swapped": (swapped, r"reports\[0\]\.ticket is not a valid"),
        "other collection": (other_collection, r"reports\[0\]\.ticket is not a valid"),
        "other key": (other_key, r"reports\[0\]\.ticket is not a valid"),
        "last forged": (one_forged, rf"reports\[{N - 1}\]\.ticket is not a valid"),
        "one missing": (one_missing, "tickets" if columnar else r"reports\[7\]\.ticket"),
    }
    for name, (tickets, message) in cases.items():
        with pytest.raises(AdmissionRefused, match=message) as refused:
            _send(running, info, items, tickets, columnar)
        for t in tickets or []:  # never echoes a ticket
            assert t.hex() not in str(refused.value) or not t, name
        assert _reports(running, "adm") == 0, name  # nothing of the batch stored
    assert _send(running, info, items, good, columnar) == client_wire.Acknowledgement(N, 0)
    assert _reports(running, "adm") == N
    # retries are duplicates; a second report under an admitted ticket is a conflict
    assert _send(running, info, items, good, columnar) == client_wire.Acknowledgement(0, N)
    pseudonym, first = items[3]
    again = make_report(info.plan, POP.schema.decode_record(POP.codes[3]), pseudonym)
    assert again.report_id != first.report_id
    with pytest.raises(ReportConflict, match="already holds a report"):
        _send(running, info, [(pseudonym, again)], [good[3]], columnar)
    assert _reports(running, "adm") == N


def test_a_ticket_cannot_choose_the_view(running: Running) -> None:
    issuer = _issuer("ed25519")
    info = _create(running.address, issuer)
    plan = info.plan
    items = _users(info, 40)
    tickets = [issuer.issue("adm", p) for p, _ in items]
    # a fake on another view than its pseudonym's, with a valid ticket and payload
    k = 5
    pseudonym, honest = items[k]
    target = (honest.view + 1) % plan.m
    user = next(u for u in range(10_000) if plan.assign(u) == target)
    fake = make_report(plan, POP.schema.decode_record(POP.codes[0]), user)
    assert fake.view == target != plan.assign(pseudonym)
    forged = [*items[:k], (pseudonym, fake), *items[k + 1 :]]
    for columnar in (True, False):
        with pytest.raises(
            AdmissionRefused,
            match=rf"reports\[{k}\]\.view \({target}\) must be the view its pseudonym is "
            rf"assigned to \({honest.view}\)",
        ):
            _send(running, info, forged, tickets, columnar)
    assert _reports(running, "adm") == 0
    assert _send(running, info, items, tickets).accepted == 40


def test_collector_carries_tickets(running: Running) -> None:
    issuer = _issuer("hmac-sha256")
    info = _create(running.address, issuer)
    state = DeviceState.in_memory()
    with Collector(running.address, "adm", info.submit_token, state=state) as c:
        record = POP.schema.decode_record(POP.codes[0])
        with pytest.raises(AdmissionRefused):
            c.submit(record)  # no ticket
        ticket = issuer.issue("adm", c.pseudonym())
        assert c.submit(record, ticket=ticket).accepted == 1
        assert c.submit(record, ticket=ticket).duplicates == 1  # the memoised report again
        ids = np.arange(10, 60)
        tickets = [issuer.issue("adm", c.pseudonym(int(u))) for u in ids]
        with pytest.raises(AdmissionRefused):
            c.submit_many(POP.codes[10:60], ids, tickets=tickets[::-1])
        assert c.submit_many(POP.codes[10:60], ids, tickets=tickets).accepted == 50
        c._columnar = False  # the old SubmitReports path
        assert c.submit_many(POP.codes[10:60], ids, tickets=tickets).duplicates == 50
    assert _reports(running, "adm") == 51


def test_without_admission_nothing_changes(running: Running) -> None:
    info = _create(running.address, None, "open-door")
    assert info.admission == ""
    state = DeviceState.in_memory()
    items = state.reports_for("open-door", info.plan, POP.codes[:50], np.arange(50))
    # a report assigned by its user id (as devices memoised them before) is still taken
    pseudonym = state.pseudonym("open-door", 999)
    user = next(u for u in range(10_000) if info.plan.assign(u) != info.plan.assign(pseudonym))
    old = make_report(info.plan, POP.schema.decode_record(POP.codes[0]), user)
    assert _send(running, info, [*items, (pseudonym, old)], None).accepted == 51
    stray = [b"x" * 64] * 51  # tickets sent to a collection that needs none are ignored
    assert _send(running, info, [*items, (pseudonym, old)], stray).duplicates == 51


def test_the_hmac_key_is_never_shown(running: Running) -> None:
    issuer = _issuer("hmac-sha256")
    _create(running.address, issuer)
    with AdminClient(running.address) as admin:
        listed = admin.list_collections()[0]
        fetched = admin.get_collection("adm")
    key = issuer.aggregator_key
    for info in (listed, fetched):
        assert info.admission == issuer.verifier().fingerprint
        assert key.hex() not in repr(info) and key.hex()[:16] not in info.admission


@pytest.mark.parametrize(
    ("scheme", "key", "message"),
    [
        ("rsa", bytes(32), r"admission\.scheme \('rsa'\) must be one of"),
        ("ed25519", bytes(31), r"admission\.key \(31\) must be 32 bytes"),
        ("hmac-sha256", b"", r"admission\.key \(0\) must be 32 bytes"),
    ],
)
def test_bad_admission_is_refused_at_creation(
    running: Running, scheme: str, key: bytes, message: str
) -> None:
    from calmkit_client import CalmkitError

    with AdminClient(running.address) as admin, pytest.raises(CalmkitError, match=message):
        admin.create_collection(
            POP.schema, 1.0, POP.n, 3, collection_id="bad", pilot=0.0, admission=(scheme, key)
        )
    with AdminClient(running.address) as admin:
        assert admin.list_collections() == []


def test_the_issuer_example_in_the_docs_runs() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    section = text.split("## Admission tickets", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert "TicketIssuer.ed25519" in code and "issuer.issue(" in code
    namespace: dict[str, Any] = {}
    exec(compile(code, "docs/security.md", "exec"), namespace)
    assert len(namespace["ticket"]) == 64 and len(namespace["public_key"]) == 32
