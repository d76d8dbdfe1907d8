"""PostgreSQL storage as replicas: several ``PgStorage`` on one database (as separate
aggregator processes would be) keep exactly-once and one report per pseudonym under
concurrency, see each other's commits, and agree with a recount of the batch log. The
single-store contract runs against both backends in test_storage.py (``store``)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from calmkit_aggregator import SupportCounts
from calmkit_aggregator.service.pg_storage import PgStorage, is_postgres_url
from calmkit_aggregator.service.storage import BatchOutcome, StoredReport
from calmkit_client import CalmkitError, Plan
from calmkit_client.errors import CollectionClosed, ReportConflict

from .test_storage import TOKEN_HASH, assert_counts_equal, make_plan, simulate

PLAN = make_plan()


def _run_all(jobs: list[threading.Thread]) -> None:
    for job in jobs:
        job.start()
    for job in jobs:
        job.join()


def test_replicas_count_each_report_once(pg_dsn: str) -> None:
    batches, reports = simulate(PLAN, 4000, seed=21)
    chunks = [reports[i : i + 200] for i in range(0, 4000, 200)]
    replicas = [PgStorage(pg_dsn) for _ in range(3)]
    replicas[0].create_collection("r", PLAN, 2, TOKEN_HASH)
    outcomes: list[BatchOutcome] = []
    errors: list[BaseException] = []
    start = threading.Barrier(3)

    def send(store: PgStorage, order: list[int]) -> None:
        start.wait()
        for k in order:  # every replica sends every batch, in its own order
            for attempt in range(20):
                try:
                    outcomes.append(store.add_reports("r", PLAN.digest, chunks[k]))
                    break
                except CalmkitError as exc:  # a deadlock between replicas: retried
                    if "retry" not in str(exc) or attempt == 19:
                        errors.append(exc)
                        return

    rng = np.random.default_rng(3)
    _run_all([threading.Thread(target=send, args=(s, list(rng.permutation(len(chunks)))))
              for s in replicas])  # fmt: skip
    assert not errors
    assert sum(o.accepted for o in outcomes) == 4000  # each report counted exactly once
    assert sum(o.duplicates for o in outcomes) == 2 * 4000
    expected = SupportCounts.from_reports(PLAN, batches)
    for store in replicas:  # each replica sees every replica's commits
        assert_counts_equal(store.support("r"), expected)
        assert store.get_collection("r").reports == 4000
    assert_counts_equal(replicas[1].recount("r"), expected)
    for store in replicas:
        store.close()
    with PgStorage(pg_dsn) as again:  # a restarted replica: same counts, retries known
        assert_counts_equal(again.support("r"), expected)
        assert again.add_reports("r", PLAN.digest, chunks[0]) == BatchOutcome(0, 200)


def test_one_pseudonym_two_replicas_one_report(pg_dsn: str) -> None:
    _, reports = simulate(PLAN, 40, seed=22)
    a, b = PgStorage(pg_dsn), PgStorage(pg_dsn)
    a.create_collection("p", PLAN, 2, TOKEN_HASH)
    pseudonyms = [r.pseudonym for r in reports[:20]]
    # replica b gets the same 20 devices' pseudonyms under other report ids
    other = [StoredReport(r.report_id, p, r.view, r.payload)
             for r, p in zip(reports[20:], pseudonyms)]  # fmt: skip
    results: dict[str, object] = {}
    start = threading.Barrier(2)

    def send(name: str, store: PgStorage, batch: list[StoredReport]) -> None:
        start.wait()
        try:
            results[name] = store.add_reports("p", PLAN.digest, batch)
        except CalmkitError as exc:
            results[name] = exc

    _run_all([threading.Thread(target=send, args=("a", a, reports[:20])),
              threading.Thread(target=send, args=("b", b, other))])  # fmt: skip
    won = [k for k, v in results.items() if v == BatchOutcome(20, 0)]
    lost = [v for v in results.values() if isinstance(v, CalmkitError)]
    assert len(won) == 1 and len(lost) == 1
    assert isinstance(lost[0], ReportConflict) or "retry" in str(lost[0])
    assert a.get_collection("p").reports == b.get_collection("p").reports == 20
    a.close()
    b.close()


def test_close_and_phases_are_shared(pg_dsn: str) -> None:
    a, b = PgStorage(pg_dsn), PgStorage(pg_dsn)
    a.create_collection("s", PLAN, 2, TOKEN_HASH)
    first = Plan(PLAN.schema, PLAN.epsilon, [(0, 2), (1, 3)], seed=5)
    second = Plan(PLAN.schema, PLAN.epsilon, [(0, 3), (1, 2)], seed=6)
    assert b.add_phase("s", 1, first).plans[1] == first
    assert a.add_phase("s", 1, second).plans[1] == first  # the first stored phase stays
    _, reports = simulate(first, 10, seed=23)
    assert a.add_reports("s", first.digest, reports) == BatchOutcome(10, 0)
    assert b.get_collection("s").phase_reports == (0, 10)
    b.close_collection("s")
    with pytest.raises(CollectionClosed):
        a.add_reports("s", first.digest, simulate(first, 5, seed=24)[1])
    a.close()
    b.close()


def test_urls_and_errors(pg_server: object) -> None:
    assert is_postgres_url("postgresql://u@h/db") and is_postgres_url("postgres://h/db")
    assert not is_postgres_url("agg.db") and not is_postgres_url("/tmp/postgresql://x")
    port = pg_server.port  # type: ignore[attr-defined]
    with pytest.raises(CalmkitError) as err:
        PgStorage(f"postgresql://calmkit:s3cret@127.0.0.1:{port}/no_such_db")
    message = str(err.value)
    assert "s3cret" not in message and "no_such_db" in message and "\n" not in message
    with PgStorage(pg_server.dsn()) as store:  # type: ignore[attr-defined]
        store.close()
        with pytest.raises(CalmkitError, match="storage is closed"):
            store.get_collection("x")
