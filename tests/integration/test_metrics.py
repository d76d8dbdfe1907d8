"""The Prometheus endpoint of a real server (``create_server(metrics_address=...)``)
while the real client ingests: the counters equal what the client was acknowledged,
a resent batch counts as duplicates, a refused one under its status code and error
class, the rate limit's refusals apart; the per-collection gauges read the store;
two servers in one process count apart; a scrape needs the admin token."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from calmkit_aggregator.service.admin import AdminClient
from calmkit_client import CalmkitError
from calmkit_client import wire as client_wire
from calmkit_client.collector import Collector, RetryPolicy, call_with_retry, open_channel
from calmkit_client.device import DeviceState
from calmkit_client.errors import AccessDenied, PlanMismatch, RateLimited
from tests.integration import servers
from tests.integration.servers import IDS, POP, Samples, Server, sample

TOKEN = "metrics-admin-token-0123456789"


def scrape(port: int, token: str | None = TOKEN) -> Samples:
    return servers.scrape(port, token)


def _create(address: str, token: str | None = TOKEN) -> client_wire.CollectionInfo:
    with AdminClient(address, token) as admin:
        return admin.create_collection(
            POP.schema, 1.0, POP.n, 3, collection_id="c1", seed=7, pilot=0.0
        )


def _raw_submit(address: str, batch: object, token: str) -> object:
    stub = client_wire.aggregator_stub(open_channel(address))
    metadata = [("authorization", f"Bearer {token}")]
    return call_with_retry(stub.SubmitReports, batch, RetryPolicy(attempts=1), metadata)


def test_counters_equal_what_the_client_was_acknowledged(tmp_path: Path) -> None:
    with Server(tmp_path, TOKEN, metrics_address="127.0.0.1:0") as server:
        info = _create(server.address)
        state = DeviceState.in_memory()
        acked = batches = 0
        with Collector(server.address, "c1", info.submit_token, state, batch_size=250) as client:
            for lo, hi in ((0, 1000), (1000, 1600), (1600, 3000)):  # in steps: exact counts
                ack = client.submit_many(POP.codes[lo:hi], IDS[lo:hi])
                acked, batches = acked + ack.accepted, batches + -(-(hi - lo) // 250)
                got = scrape(server.metrics_port)
                assert sample(got, "calmkit_reports_accepted_total") == acked == hi
                assert sample(got, "calmkit_batches_total") == batches
                assert sample(got, "calmkit_ingest_seconds_count") == batches
                assert sample(got, "calmkit_storage_commit_seconds_count") == batches
                assert sample(got, "calmkit_collection_reports", collection="c1") == hi
            # the rest in a background thread, scraped while it runs
            done = threading.Event()

            def ingest() -> None:
                try:
                    client.submit_many(POP.codes[3000:], IDS[3000:])
                finally:
                    done.set()

            worker = threading.Thread(target=ingest)
            worker.start()
            seen = []
            while not done.is_set():
                got = scrape(server.metrics_port)
                counted = sample(got, "calmkit_reports_accepted_total")
                stored = sample(got, "calmkit_collection_reports", collection="c1")
                assert counted <= stored  # counted after the commit, gauges read after
                seen.append(counted)
            worker.join()
            assert seen == sorted(seen) and 3000 <= seen[0]
            # resent reports (the device keeps them): acknowledged as duplicates
            again = client.submit_many(POP.codes[:500], IDS[:500])
        assert (again.accepted, again.duplicates) == (0, 500)
        got = scrape(server.metrics_port)
        assert sample(got, "calmkit_reports_accepted_total") == POP.n
        assert sample(got, "calmkit_reports_duplicate_total") == 500
        assert sample(got, "calmkit_collection_reports", collection="c1") == POP.n
        assert sample(got, "calmkit_collection_open", collection="c1") == 1
        assert sample(got, "calmkit_collection_max_reports", collection="c1") == 2 * POP.n
        # refused batches, by status code and error class
        device = DeviceState.in_memory()
        items = device.reports_for("c1", info.plan, POP.codes[:7], IDS[:7])
        stale = client_wire.batch_to_proto("c1", info.plan.digest, items)
        stale.plan_digest = "0" * 64  # type: ignore[attr-defined]
        with pytest.raises(PlanMismatch):
            _raw_submit(server.address, stale, info.submit_token or "")
        with pytest.raises(AccessDenied):
            _raw_submit(server.address, stale, "wrong-submit-token-000000")
        with AdminClient(server.address, TOKEN) as admin:
            admin.close_collection("c1")
        got = scrape(server.metrics_port)
        refused = ("calmkit_reports_refused_total", "calmkit_refused_total")
        assert sample(got, refused[0], code="FAILED_PRECONDITION", error="PlanMismatch") == 7
        assert sample(got, refused[0], code="UNAUTHENTICATED", error="AccessDenied") == 7
        rpc = "SubmitReports"
        assert (
            sample(got, refused[1], rpc=rpc, code="FAILED_PRECONDITION", error="PlanMismatch") == 1
        )
        assert sample(got, refused[1], rpc=rpc, code="UNAUTHENTICATED", error="AccessDenied") == 1
        assert sample(got, "calmkit_reports_accepted_total") == POP.n  # nothing of them
        assert sample(got, "calmkit_rate_limited_total") == 0
        assert sample(got, "calmkit_collection_open", collection="c1") == 0


def test_rate_limit_refusals_are_counted(tmp_path: Path) -> None:
    with Server(
        tmp_path, TOKEN, metrics_address="127.0.0.1:0", rate_limit=1.0, rate_burst=20
    ) as server:
        info = _create(server.address)
        state = DeviceState.in_memory()
        first = client_wire.batch_to_proto(
            "c1", info.plan.digest, state.reports_for("c1", info.plan, POP.codes[:20], IDS[:20])
        )
        second = client_wire.batch_to_proto(
            "c1", info.plan.digest, state.reports_for("c1", info.plan, POP.codes[20:35], IDS[20:35])
        )
        token = info.submit_token or ""
        assert _raw_submit(server.address, first, token).accepted == 20  # type: ignore[attr-defined]
        with pytest.raises(RateLimited):  # the burst is spent: about 15 s to refill
            _raw_submit(server.address, second, token)
        got = scrape(server.metrics_port)
        assert sample(got, "calmkit_rate_limited_total") == 1
        assert (
            sample(
                got, "calmkit_reports_refused_total", code="RESOURCE_EXHAUSTED", error="RateLimited"
            )
            == 15
        )
        assert sample(got, "calmkit_reports_accepted_total") == 20


def test_each_server_counts_in_its_own_registry(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with (
        Server(tmp_path / "a", None, metrics_address="127.0.0.1:0") as a,
        Server(tmp_path / "b", None, metrics_address="127.0.0.1:0") as b,
    ):
        info = _create(a.address, None)
        with Collector(a.address, "c1", info.submit_token, DeviceState.in_memory()) as client:
            client.submit_many(POP.codes[:300], IDS[:300])
        assert sample(scrape(a.metrics_port, None), "calmkit_reports_accepted_total") == 300
        assert sample(scrape(b.metrics_port, None), "calmkit_reports_accepted_total") == 0
        assert ("calmkit_collection_reports", frozenset({("collection", "c1")})) not in scrape(
            b.metrics_port, None
        )


def test_a_scrape_needs_the_admin_token_when_the_server_has_one(tmp_path: Path) -> None:
    with Server(tmp_path, TOKEN, metrics_address="127.0.0.1:0") as server:
        for token in (None, "not-the-admin-token-at-all"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                scrape(server.metrics_port, token)
            assert refused.value.code == 401
            assert refused.value.headers["WWW-Authenticate"].startswith("Bearer")
        assert "calmkit_batches_total" in {name for name, _ in scrape(server.metrics_port)}
        with pytest.raises(urllib.error.HTTPError) as elsewhere:
            urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/", timeout=10)
        assert elsewhere.value.code == 404
    with pytest.raises(CalmkitError, match=r"metrics_address \('127.0.0.1:70000'\) must be"):
        Server(tmp_path, TOKEN, metrics_address="127.0.0.1:70000")


def test_no_metrics_endpoint_no_port(server: Server) -> None:
    assert server.metrics_port is None and server.console_port is None
