"""PostgreSQL storage as replicas: several ``PgStorage`` on one database (as separate
aggregator processes would be) keep exactly-once and one report per pseudonym under
concurrency, see each other's commits, and agree with a recount of the batch log. The
single-store contract runs against both backends in test_storage.py (``store``)."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from calmkit_aggregator import SupportCounts
from calmkit_aggregator.service.pg_storage import PgStorage, is_postgres_url
from calmkit_aggregator.service.storage import Storage
from calmkit_aggregator.service.store import BatchOutcome, StoredReport, dedupe_batch
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
    _run_all(
        [
            threading.Thread(target=send, args=(s, list(rng.permutation(len(chunks)))))
            for s in replicas
        ]
    )
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
    other = [
        StoredReport(r.report_id, p, r.view, r.payload) for r, p in zip(reports[20:], pseudonyms)
    ]
    results: dict[str, object] = {}
    start = threading.Barrier(2)

    def send(name: str, store: PgStorage, batch: list[StoredReport]) -> None:
        start.wait()
        try:
            results[name] = store.add_reports("p", PLAN.digest, batch)
        except CalmkitError as exc:
            results[name] = exc

    _run_all(
        [
            threading.Thread(target=send, args=("a", a, reports[:20])),
            threading.Thread(target=send, args=("b", b, other)),
        ]
    )
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
    assert "s" not in a._keys  # a dropped its tables and knows the collection is closed:
    with pytest.raises(CollectionClosed):  # the next batch is refused before any reading
        a.add_reports("s", first.digest, simulate(first, 5, seed=24)[1])
    assert "s" not in a._keys and a.submit_record("s", first.digest).state == "closed"
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


def test_a_replica_reads_the_others_commits_before_deciding(pg_dsn: str) -> None:
    """Replica b filled its tables before a stored anything: b's batch is checked
    against a's commits (read from the log under the collection's lock), so a retry
    of a's report is a duplicate and another device's use of its id or pseudonym a
    conflict, naming only what b's client sent."""
    _, reports = simulate(PLAN, 30, seed=25)
    a, b = PgStorage(pg_dsn), PgStorage(pg_dsn)
    a.create_collection("t", PLAN, 2, TOKEN_HASH)
    assert b.add_reports("t", PLAN.digest, reports[:10]) == BatchOutcome(10, 0)  # b's tables
    assert a.add_reports("t", PLAN.digest, reports[10:20]) == BatchOutcome(10, 0)
    x = reports[15]
    assert b.add_reports("t", PLAN.digest, [x, *reports[20:25]]) == BatchOutcome(5, 1)
    other_id = StoredReport(b"\x07" * 16, x.pseudonym, x.view, x.payload)
    with pytest.raises(ReportConflict, match=r"reports\[1\]\.pseudonym .* already holds"):
        b.add_reports("t", PLAN.digest, [reports[25], other_id])
    other_device = StoredReport(x.report_id, b"\x08" * 16, x.view, x.payload)
    with pytest.raises(ReportConflict, match=r"reports\[0\]\.report_id .* is already used"):
        b.add_reports("t", PLAN.digest, [other_device])
    assert a.add_reports("t", PLAN.digest, reports[20:]) == BatchOutcome(5, 5)
    assert a.get_collection("t").reports == b.get_collection("t").reports == 30
    a.close()
    b.close()


def test_one_transaction_commits_waiting_batches_each_whole(pg_dsn: str, tmp_path: Path) -> None:
    """Group commit: batches queued in one replica go into one transaction, and each
    is still accepted or refused whole against the stored reports and the batches
    before it in the group."""
    from calmkit_aggregator.service.keyset import as_words
    from calmkit_aggregator.service.pg_storage import _Pending

    _, reports = simulate(PLAN, 400, seed=26)
    store = PgStorage(pg_dsn)
    store.create_collection("g", PLAN, 2, TOKEN_HASH)
    store.add_reports("g", PLAN.digest, reports[:100])

    def pending(items: list[StoredReport]) -> _Pending:
        from calmkit_aggregator.service.columns import columns_from_reports

        cols = columns_from_reports(PLAN, items)
        return _Pending(
            PLAN.digest,
            cols,
            dedupe_batch(cols),
            as_words(cols.report_ids),
            as_words(cols.pseudonyms),
        )

    y = reports[150]
    group = [
        pending(reports[100:200]),  # new
        pending([*reports[300:310], StoredReport(b"\x09" * 16, y.pseudonym, y.view, y.payload)]),
        pending(reports[90:160]),  # 10 stored, 60 in the first batch of the group
        pending([*reports[200:300], reports[0]]),  # new, and one stored
        pending([reports[350], StoredReport(y.report_id, b"\x0a" * 16, y.view, y.payload)]),
    ]
    keys = store._keys_of("g")
    with keys.lock:
        store._commit("g", keys, group)
    assert [p.outcome for p in group] == [
        BatchOutcome(100, 0),
        None,
        BatchOutcome(0, 70),
        BatchOutcome(100, 1),
        None,
    ]
    assert isinstance(group[1].error, ReportConflict) and "reports[10].pseudonym" in str(
        group[1].error
    )
    assert isinstance(group[4].error, ReportConflict) and "reports[1].report_id" in str(
        group[4].error
    )
    assert store.get_collection("g").reports == 300
    assert_counts_equal(store.support("g"), store.recount("g"))
    with Storage(tmp_path / "reference.db") as reference:  # the accepted reports, counted
        reference.create_collection("g", PLAN, 2, TOKEN_HASH)
        reference.add_reports("g", PLAN.digest, reports[:300])
        assert_counts_equal(store.support("g"), reference.support("g"))
    # the refused batches stored nothing: sent again without their conflict, all new
    assert store.add_reports("g", PLAN.digest, reports[300:310]) == BatchOutcome(10, 0)
    store.close()


_KILL_IN_TRANSACTION = """
import os, signal, sys
from calmkit_aggregator.service import pg_storage
from tests.aggregator.test_storage import simulate
from tests.aggregator.test_pg_storage import PLAN

def append_then_die(self, cur, rows):
    seq = APPEND(self, cur, rows)  # the batch is in the log, uncommitted, the lock held
    print("locked", flush=True)
    sys.stdin.readline()  # wait for the parent, then die mid-transaction
    os.kill(os.getpid(), signal.SIGKILL)

APPEND = pg_storage.PgStorage._append
pg_storage.PgStorage._append = append_then_die
store = pg_storage.PgStorage(sys.argv[1])
store.add_reports("k", PLAN.digest, simulate(PLAN, 50, seed=27)[1])
"""


def test_a_replica_killed_mid_transaction_stores_nothing_and_frees_the_lock(
    pg_dsn: str,
) -> None:
    """SIGKILL while holding the collection's lock, its batch appended but not
    committed: the other replica's batch, waiting for the lock, goes through; the
    dead replica's batch is not stored, so its retry is all new."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    store = PgStorage(pg_dsn)
    store.create_collection("k", PLAN, 2, TOKEN_HASH)
    child = subprocess.Popen(
        [sys.executable, "-c", _KILL_IN_TRANSACTION, pg_dsn],
        cwd=root,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdin is not None
    assert child.stdout.readline().strip() == "locked"
    _, mine = simulate(PLAN, 40, seed=28)
    result: list[object] = []
    waiter = threading.Thread(
        target=lambda: result.append(store.add_reports("k", PLAN.digest, mine))
    )
    waiter.start()
    waiter.join(0.5)
    assert waiter.is_alive()  # waits for the dead-to-be replica's lock
    child.stdin.write("\n")
    child.stdin.flush()
    assert child.wait(timeout=30) == -9
    waiter.join(30)
    assert result == [BatchOutcome(40, 0)]
    assert store.get_collection("k").reports == 40
    theirs = simulate(PLAN, 50, seed=27)[1]
    assert store.add_reports("k", PLAN.digest, theirs) == BatchOutcome(50, 0)
    assert_counts_equal(store.support("k"), store.recount("k"))
    store.close()


_V1_SCHEMA = """
CREATE TABLE calmkit_schema (version INTEGER NOT NULL);
INSERT INTO calmkit_schema VALUES (1);
CREATE TABLE collections (
    id TEXT PRIMARY KEY, plan_json TEXT NOT NULL, digest TEXT NOT NULL, k INTEGER NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('open', 'closed')), submit_token_hash BYTEA NOT NULL,
    created_at DOUBLE PRECISION NOT NULL, closed_at DOUBLE PRECISION, design_json TEXT
);
CREATE TABLE phases (
    collection_id TEXT NOT NULL REFERENCES collections (id),
    phase INTEGER NOT NULL CHECK (phase >= 1), plan_json TEXT NOT NULL, digest TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (collection_id, phase)
);
CREATE TABLE reports (
    collection_id TEXT NOT NULL, report_id BYTEA NOT NULL, pseudonym BYTEA NOT NULL,
    PRIMARY KEY (collection_id, report_id), UNIQUE (collection_id, pseudonym)
);
CREATE TABLE batches (
    seq BIGSERIAL PRIMARY KEY, collection_id TEXT NOT NULL, phase INTEGER NOT NULL,
    count INTEGER NOT NULL, report_ids BYTEA NOT NULL, pseudonyms BYTEA NOT NULL,
    views BYTEA NOT NULL, cells BYTEA NOT NULL, bits BYTEA NOT NULL
);
CREATE TABLE support (
    collection_id TEXT NOT NULL REFERENCES collections (id), phase INTEGER NOT NULL,
    writer UUID NOT NULL, n BYTEA NOT NULL, counts BYTEA NOT NULL,
    PRIMARY KEY (collection_id, phase, writer)
);
"""


def _v1_database(dsn: str, reports: list[StoredReport], extra_rows: int = 0) -> None:
    """A database as the previous PostgreSQL design left it: every report in
    ``reports`` (plus ``extra_rows`` not in the log: damage) and in the log (two batches
    by two writers), and the writers' support rows."""
    import uuid

    import psycopg

    from calmkit_aggregator.service.columns import columns_from_reports

    with psycopg.connect(dsn) as conn:
        conn.execute(_V1_SCHEMA)
        conn.execute(
            "INSERT INTO collections VALUES ('old', %s, %s, 2, 'open', %s, 1.0, NULL, NULL)",
            (PLAN.to_json(), PLAN.digest, TOKEN_HASH),
        )
        half = len(reports) // 2
        for part in (reports[:half], reports[half:]):
            cols = columns_from_reports(PLAN, part)
            blobs = cols.encode()
            conn.execute(
                "INSERT INTO batches (collection_id, phase, count, report_ids, pseudonyms, views, "
                "cells, bits) VALUES ('old', 0, %s, %s, %s, %s, %s, %s)",
                (
                    len(part),
                    *(blobs[c] for c in ("report_ids", "pseudonyms", "views", "cells", "bits")),
                ),
            )
            n, counts = cols.support_deltas()
            conn.execute(
                "INSERT INTO support VALUES ('old', 0, %s, %s, %s)",
                (
                    uuid.uuid4(),
                    n.astype("<i8").tobytes(),
                    np.concatenate(counts).astype("<i8").tobytes(),
                ),
            )
        rows = [(r.report_id, r.pseudonym) for r in reports]
        rows += [(bytes([i]) * 16, bytes([i + 1]) * 16) for i in range(extra_rows)]
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO reports VALUES ('old', %s, %s)", rows)


def test_a_version_1_database_is_migrated(pg_dsn: str, tmp_path: Path) -> None:
    import psycopg

    _, reports = simulate(PLAN, 300, seed=29)
    _v1_database(pg_dsn, reports)
    with PgStorage(pg_dsn) as store:
        record = store.get_collection("old")
        assert record.reports == 300 and record.plans == (PLAN,)
        with Storage(tmp_path / "reference.db") as reference:
            reference.create_collection("old", PLAN, 2, TOKEN_HASH)
            reference.add_reports("old", PLAN.digest, reports)
            assert_counts_equal(store.support("old"), reference.support("old"))
        assert_counts_equal(store.recount("old"), store.support("old"))
        # the migrated log deduplicates: retries, conflicts, new reports
        assert store.add_reports("old", PLAN.digest, reports[::7]) == BatchOutcome(0, 43)
        x = reports[3]
        with pytest.raises(ReportConflict, match="pseudonym"):
            store.add_reports(
                "old", PLAN.digest, [StoredReport(b"\x05" * 16, x.pseudonym, x.view, x.payload)]
            )
        more = simulate(PLAN, 20, seed=30)[1]
        assert store.add_reports("old", PLAN.digest, more) == BatchOutcome(20, 0)
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT version FROM calmkit_schema").fetchone() == (5,)
        assert conn.execute("SELECT to_regclass('reports')").fetchone() == (None,)
    with PgStorage(pg_dsn) as again:  # opening a migrated database changes nothing
        assert again.get_collection("old").reports == 320


def test_a_damaged_version_1_database_is_refused_unchanged(pg_dsn: str) -> None:
    import psycopg

    _v1_database(pg_dsn, simulate(PLAN, 30, seed=31)[1], extra_rows=2)
    with pytest.raises(
        CalmkitError,
        match=r"reports of collection 'old' \(32\) must equal the "
        r"reports in its batch log \(30\) to migrate",
    ):
        PgStorage(pg_dsn)
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT version FROM calmkit_schema").fetchone() == (1,)
        assert conn.execute("SELECT count(*) FROM reports").fetchone() == (32,)


def test_refuses_a_newer_or_foreign_database(pg_dsn: str, pg_server: object) -> None:
    import psycopg

    with psycopg.connect(pg_dsn) as conn:
        conn.execute("CREATE TABLE calmkit_schema (version INTEGER NOT NULL)")
        conn.execute("INSERT INTO calmkit_schema VALUES (9)")
    with pytest.raises(
        CalmkitError, match=r"schema version \(9\) .* must be 5 \(or 1, 2, 3 or 4, which"
    ):
        PgStorage(pg_dsn)
    foreign = pg_server.create_database()  # type: ignore[attr-defined]
    with psycopg.connect(foreign) as conn:
        conn.execute("CREATE TABLE batches (x INTEGER)")
    with pytest.raises(
        CalmkitError,
        match=r"is not a calmkit store \(it has a table named "
        r"'batches'",
    ):
        PgStorage(foreign)


def _pg_dedupe_exact(store: PgStorage, cid: str, stored: list[StoredReport]) -> None:
    """Exactly ``stored`` is known: retries are duplicates, a stored id or pseudonym
    under another device is refused."""
    assert store.add_reports(cid, PLAN.digest, stored) == BatchOutcome(0, len(stored))
    x = stored[len(stored) // 2]
    with pytest.raises(ReportConflict, match="report_id"):
        store.add_reports(
            cid, PLAN.digest, [StoredReport(x.report_id, b"\x01" * 16, x.view, x.payload)]
        )
    with pytest.raises(ReportConflict, match="pseudonym"):
        store.add_reports(
            cid, PLAN.digest, [StoredReport(b"\x02" * 16, x.pseudonym, x.view, x.payload)]
        )


@pytest.mark.parametrize("damage", ["none", "corrupt", "other_db"])
def test_a_replica_restarts_from_its_key_snapshot(
    pg_dsn: str, pg_server: object, tmp_path: Path, damage: str
) -> None:
    """With key_snapshots, a replica's close writes its tables; its restart loads them
    and the log rows other replicas appended since. A corrupt snapshot, or one of
    another database, is not used (the tables come from the whole log)."""
    _, reports = simulate(PLAN, 1500, seed=32)
    folder = tmp_path / "keys"
    with PgStorage(pg_dsn, key_snapshots=folder) as a:
        a.create_collection("s", PLAN, 2, TOKEN_HASH)
        for i in range(0, 1000, 250):
            a.add_reports("s", PLAN.digest, reports[i : i + 250])
    snap = folder / (b"s".hex() + ".snap")
    assert snap.stat().st_mode & 0o777 == 0o600
    with PgStorage(pg_dsn) as b:  # another replica, without snapshots, goes on
        b.add_reports("s", PLAN.digest, reports[1000:1500])
    if damage == "corrupt":
        data = bytearray(snap.read_bytes())
        data[len(data) // 3] ^= 0x04
        snap.write_bytes(bytes(data))
    elif damage == "other_db":  # another database's collection "s", snapshot copied over
        other = pg_server.create_database()  # type: ignore[attr-defined]
        with PgStorage(other, key_snapshots=tmp_path / "other") as c:
            c.create_collection("s", PLAN, 2, TOKEN_HASH)
            c.add_reports("s", PLAN.digest, simulate(PLAN, 1000, seed=33)[1])
        snap.write_bytes((tmp_path / "other" / snap.name).read_bytes())
    with PgStorage(pg_dsn, key_snapshots=folder) as again:
        assert again.wait_ready(60)
        keys = again._keys["s"]
        assert keys.key_source == ("snapshot" if damage == "none" else "log")
        _pg_dedupe_exact(again, "s", reports)
        again.close_collection("s")
    assert not snap.exists()
