"""Storage (SQLite, and PostgreSQL for every test taking ``store``): collections round
trip, counts equal the oracles' support and survive a reopen (and SIGKILL), retries are
idempotent, conflicts and bad fields reject the whole batch, and concurrent writers lose
nothing."""

from __future__ import annotations

import hashlib
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from calmkit_aggregator import SupportCounts
from calmkit_aggregator.service.storage import SCHEMA_VERSION, Storage
from calmkit_aggregator.service.store import OPEN, BatchOutcome, CollectionRecord, StoredReport
from calmkit_client import Plan, Schema, ViewReports, make_report, make_reports
from calmkit_client.errors import (
    CalmkitError,
    CollectionClosed,
    CollectionExists,
    CollectionNotFound,
    PlanMismatch,
    ReportConflict,
)

TOKEN_HASH = hashlib.sha256(b"submit-token").digest()
ROOT = Path(__file__).resolve().parents[2]


def make_plan() -> Plan:
    """Views of 6, 6 and 15 cells at epsilon 1: GRR, GRR and OUE (2 bytes, 1 pad bit)."""
    return Plan(Schema.from_sizes((2, 3, 2, 5)), 1.0, [(0, 1), (1, 2), (1, 3)], seed=1)


@pytest.fixture
def plan() -> Plan:
    p = make_plan()
    assert p.oracles == ("GRR", "GRR", "OUE")
    return p


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path):
    """Every test that takes ``store`` runs against both backends: the shared
    conformance suite of the storage interface."""
    if request.param == "sqlite":
        with Storage(tmp_path / "calmkit.db") as s:
            yield s
    else:
        from calmkit_aggregator.service.pg_storage import PgStorage

        with PgStorage(request.getfixturevalue("pg_dsn")) as s:
            yield s


def simulate(plan: Plan, n: int, seed: int) -> tuple[list[ViewReports], list[StoredReport]]:
    """n users' reports (make_reports) and the same reports as StoredReports."""
    rng = np.random.default_rng(seed)
    codes = np.stack([rng.integers(0, s, n) for s in plan.schema.sizes], axis=1)
    batches = make_reports(plan, codes, np.arange(seed * 10**6, seed * 10**6 + n), rng=rng)
    return batches, stored(plan, batches, rng)


def stored(plan: Plan, batches: list[ViewReports], rng: np.random.Generator) -> list[StoredReport]:
    out = []
    for b in batches:
        grr = plan.view_oracles[b.view].name == "GRR"
        for rid, payload in zip(b.report_ids, b.payloads):
            value = int(payload) if grr else payload.tobytes()
            out.append(StoredReport(rid.tobytes(), rng.bytes(16), b.view, value))
    rng.shuffle(out)  # type: ignore[arg-type]
    return out


def assert_counts_equal(a: SupportCounts, b: SupportCounts) -> None:
    assert a.plan.digest == b.plan.digest
    np.testing.assert_array_equal(a.n, b.n)
    for x, y in zip(a.counts, b.counts):
        np.testing.assert_array_equal(x, y)


def assert_empty(store: Storage, cid: str) -> None:
    counts = store.support(cid)
    assert counts.n.sum() == 0 and all(c.sum() == 0 for c in counts.counts)
    assert store.get_collection(cid).reports == 0


# -- collections -----------------------------------------------------------------------
def test_collection_round_trip(tmp_path: Path, plan: Plan) -> None:
    path = tmp_path / "c.db"
    with Storage(path) as store:
        t0 = time.time()
        rec = store.create_collection("abc", plan, 2, TOKEN_HASH)
        assert (rec.collection_id, rec.k, rec.state, rec.reports) == ("abc", 2, "open", 0)
        assert rec.plan.digest == plan.digest and rec.submit_token_hash == TOKEN_HASH
        assert rec.closed_at is None and t0 - 1 <= rec.created_at <= time.time() + 1
        store.create_collection("xyz", plan, 1, TOKEN_HASH)
        assert store.get_collection("abc") == rec
        assert [r.collection_id for r in store.list_collections()] == ["abc", "xyz"]
        closed = store.close_collection("abc")
        assert closed.state == "closed" and closed.closed_at is not None
        assert store.close_collection("abc") == closed  # idempotent
        assert store.get_collection("abc") == closed
    with Storage(path) as store:
        again = store.list_collections()
        assert [r.collection_id for r in again] == ["abc", "xyz"]
        assert again[0] == closed and again[0].plan == plan
        assert again[1].state == "open" and again[1].k == 1


def test_duplicate_and_unknown_collections(store: Storage, plan: Plan) -> None:
    store.create_collection("abc", plan, 2, TOKEN_HASH)
    with pytest.raises(CollectionExists, match=r"collection_id \('abc'\) already exists"):
        store.create_collection("abc", plan, 2, TOKEN_HASH)
    for call in (
        lambda: store.get_collection("nope"),
        lambda: store.close_collection("nope"),
        lambda: store.support("nope"),
        lambda: store.add_reports("nope", plan.digest, []),
    ):
        with pytest.raises(CollectionNotFound, match=r"collection_id \('nope'\) not found"):
            call()


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("", 2, TOKEN_HASH), r"collection_id \(''\)"),
        (("c", 0, TOKEN_HASH), r"k \(0\) must be an int in \[1, 4\]"),
        (("c", 5, TOKEN_HASH), r"k \(5\)"),
        (("c", 2, b"short"), r"submit_token_hash \(b'short'\) must be 32 bytes"),
    ],
)
def test_create_rejects_bad_arguments(store: Storage, plan: Plan, args, match) -> None:
    cid, k, token_hash = args
    with pytest.raises(CalmkitError, match=match):
        store.create_collection(cid, plan, k, token_hash)
    assert store.list_collections() == []


def test_records_check_their_fields(plan: Plan) -> None:
    with pytest.raises(CalmkitError, match=r"^accepted \(-1\) must be an int >= 0"):
        BatchOutcome(-1, 0)
    with pytest.raises(CalmkitError, match=r"^duplicates \(True\) must be an int >= 0"):
        BatchOutcome(0, True)
    rest = (2, OPEN, TOKEN_HASH, 0.0, None, 0)  # k, state, token hash, times, reports
    assert CollectionRecord("c", (plan,), *rest).plan == plan
    for plans in ((), [plan], (plan, "plan")):
        with pytest.raises(CalmkitError, match=r"^plans \(.*\) must be a non-empty tuple of Plans"):
            CollectionRecord("c", plans, *rest)  # type: ignore[arg-type]
    with pytest.raises(CalmkitError, match=r"^state \('paused'\) must be 'open' or 'closed'"):
        CollectionRecord("c", (plan,), 2, "paused", TOKEN_HASH, 0.0, None, 0)


def test_schema_and_pragmas(tmp_path: Path, plan: Plan) -> None:
    path = tmp_path / "s.db"
    with Storage(path) as store:
        store.create_collection("abc", plan, 2, TOKEN_HASH)
        conn = store._conn
        assert conn is not None
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    raw = sqlite3.connect(path)
    try:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 6
        cols = [r[1] for r in raw.execute("PRAGMA table_info(batches)")]
        assert cols == [
            "seq",
            "collection_id",
            "phase",
            "count",
            "report_ids",
            "pseudonyms",
            "views",
            "cells",
            "bits",
        ]
        cols = [r[1] for r in raw.execute("PRAGMA table_info(support)")]
        assert cols == ["collection_id", "phase", "n", "counts"]
        tables = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert "reports" not in tables  # no table keyed by clients' random values
        (plan_json,) = raw.execute("SELECT plan_json FROM collections").fetchone()
        assert Plan.from_json(plan_json) == plan
    finally:
        raw.close()


def test_refuses_foreign_or_newer_database(tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as raw:
        raw.execute("CREATE TABLE t (x)")
    raw.close()
    with pytest.raises(CalmkitError, match="not a calmkit store"):
        Storage(other)
    newer = tmp_path / "newer.db"
    with sqlite3.connect(newer) as raw:
        raw.execute("PRAGMA user_version = 99")
    raw.close()
    with pytest.raises(CalmkitError, match=r"schema version \(99\)"):
        Storage(newer)


def test_closed_storage_raises(tmp_path: Path, plan: Plan) -> None:
    store = Storage(tmp_path / "x.db")
    store.close()
    store.close()  # idempotent
    with pytest.raises(CalmkitError, match="is closed"):
        store.create_collection("abc", plan, 2, TOKEN_HASH)


# -- counting and persistence -------------------------------------------------------------
def test_counts_match_oracle_support_and_survive_reopen(tmp_path: Path, plan: Plan) -> None:
    path = tmp_path / "r.db"
    batches, reports = simulate(plan, 3000, seed=1)
    expected = SupportCounts.from_reports(plan, batches)
    with Storage(path) as store:
        store.create_collection("abc", plan, 2, TOKEN_HASH)
        first = store.add_reports("abc", plan.digest, reports[:1000])
        second = store.add_reports("abc", plan.digest, reports[1000:])
        assert (first, second) == (BatchOutcome(1000, 0), BatchOutcome(2000, 0))
        assert_counts_equal(store.support("abc"), expected)
        assert store.get_collection("abc").reports == 3000
    with Storage(path) as store:
        assert_counts_equal(store.support("abc"), expected)
        assert store.get_collection("abc").reports == 3000
        # a retry after the restart is still recognised
        assert store.add_reports("abc", plan.digest, reports[:10]) == BatchOutcome(0, 10)


def test_single_reports_from_make_report(store: Storage, plan: Plan) -> None:
    store.create_collection("abc", plan, 2, TOKEN_HASH)
    rng = np.random.default_rng(5)
    reports = []
    payloads: list[list[int | bytes]] = [[] for _ in range(plan.m)]
    for u in range(300):
        r = make_report(plan, [int(rng.integers(0, s)) for s in plan.schema.sizes], u)
        reports.append(StoredReport(r.report_id, rng.bytes(16), r.view, r.payload))
        payloads[r.view].append(r.payload)
    assert store.add_reports("abc", plan.digest, reports) == BatchOutcome(300, 0)
    got = store.support("abc")
    for j, oracle in enumerate(plan.view_oracles):
        values = payloads[j]
        assert values and got.n[j] == len(values)
        arr = (
            np.array(values, np.int64)
            if oracle.name == "GRR"
            else np.frombuffer(b"".join(values), np.uint8).reshape(len(values), -1)  # type: ignore[arg-type]
        )
        np.testing.assert_array_equal(got.counts[j], oracle.support(arr))


def test_support_is_a_snapshot(store: Storage, plan: Plan) -> None:
    store.create_collection("abc", plan, 2, TOKEN_HASH)
    _, reports = simulate(plan, 200, seed=2)
    store.add_reports("abc", plan.digest, reports[:100])
    snap = store.support("abc")
    before = [c.copy() for c in snap.counts]
    store.add_reports("abc", plan.digest, reports[100:])
    for a, b in zip(snap.counts, before):
        np.testing.assert_array_equal(a, b)
    assert snap.n.sum() == 100 and store.support("abc").n.sum() == 200


def test_empty_batch(store: Storage, plan: Plan) -> None:
    store.create_collection("abc", plan, 2, TOKEN_HASH)
    assert store.add_reports("abc", plan.digest, []) == BatchOutcome(0, 0)
    assert_empty(store, "abc")


def test_acknowledged_batch_survives_sigkill(tmp_path: Path, plan: Plan) -> None:
    path = tmp_path / "k.db"
    batches, reports = simulate(plan, 500, seed=3)
    with Storage(path) as store:
        store.create_collection("abc", plan, 2, TOKEN_HASH)
    rows = [(r.report_id.hex(), r.pseudonym.hex(), r.view, r.payload) for r in reports]
    script = textwrap.dedent(
        f"""
        import os, signal
        from calmkit_aggregator.service.storage import Storage
        from calmkit_aggregator.service.store import StoredReport
        rows = {rows!r}
        store = Storage({str(path)!r})
        reports = [StoredReport(bytes.fromhex(a), bytes.fromhex(b), v, p) for a, b, v, p in rows]
        print(store.add_reports("abc", {plan.digest!r}, reports), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert proc.returncode == -9, proc.stderr
    assert "BatchOutcome(accepted=500, duplicates=0)" in proc.stdout
    with Storage(path) as store:
        assert_counts_equal(store.support("abc"), SupportCounts.from_reports(plan, batches))


def test_reload_rejects_tampered_rows(tmp_path: Path, plan: Plan) -> None:
    path = tmp_path / "t.db"
    _, reports = simulate(plan, 50, seed=4)
    with Storage(path) as store:
        store.create_collection("abc", plan, 2, TOKEN_HASH)
        store.add_reports("abc", plan.digest, reports)
    raw = sqlite3.connect(path)
    with raw:  # a view out of range in the batch log: the audit names the batch
        (views,) = raw.execute("SELECT views FROM batches").fetchone()
        raw.execute("UPDATE batches SET views = ?", (views[:-4] + (99).to_bytes(4, "little"),))
    raw.close()
    with (
        Storage(path) as store,
        pytest.raises(
            CalmkitError,
            match=r"batch 1 of collection 'abc' is invalid: reports\[49\]\.view \(99\)",
        ),
    ):
        store.recount("abc")
    raw = sqlite3.connect(path)
    with raw:  # stored counts of the wrong size: refused on open
        raw.execute("UPDATE support SET n = x'00'")
    raw.close()
    with pytest.raises(
        CalmkitError, match=r"stored support of collection 'abc' \(phase 0\) must hold 3 view"
    ):
        Storage(path)
    raw = sqlite3.connect(path)
    with raw:
        raw.execute("UPDATE collections SET plan_json = '{}'")
    raw.close()
    with pytest.raises(CalmkitError, match=r"plan_json of collection 'abc' \(phase 0\) is invalid"):
        Storage(path)


# -- idempotence and conflicts ---------------------------------------------------------------
def test_retry_is_all_duplicates(store: Storage, plan: Plan) -> None:
    store.create_collection("abc", plan, 2, TOKEN_HASH)
    _, reports = simulate(plan, 400, seed=6)
    assert store.add_reports("abc", plan.digest, reports[:300]) == BatchOutcome(300, 0)
    before = store.support("abc")
    assert store.add_reports("abc", plan.digest, reports[:300]) == BatchOutcome(0, 300)
    assert_counts_equal(store.support("abc"), before)
    # a partly retried batch: only the new reports count
    assert store.add_reports("abc", plan.digest, reports[200:]) == BatchOutcome(100, 100)
    assert store.get_collection("abc").reports == 400


def test_identical_repeats_in_one_batch_count_once(store: Storage, plan: Plan) -> None:
    store.create_collection("abc", plan, 2, TOKEN_HASH)
    batches, reports = simulate(plan, 100, seed=7)
    doubled = reports + reports[:40] + reports[10:20]
    assert store.add_reports("abc", plan.digest, doubled) == BatchOutcome(100, 50)
    assert_counts_equal(store.support("abc"), SupportCounts.from_reports(plan, batches))


@pytest.mark.parametrize("conflict", [False, True])
def test_a_repeat_in_a_batch_that_misses_a_view_is_judged_not_crashed(
    store: Storage, plan: Plan, conflict: bool
) -> None:
    # A device resending one report within a batch of one view: the other views hold no
    # report in the batch (their payload columns are empty), which must not break the
    # comparison of the repeat's content.
    store.create_collection("abc", plan, 2, TOKEN_HASH)
    _, reports = simulate(plan, 100, seed=11)
    first = next(r for r in reports if r.view == 0)
    again = StoredReport(first.report_id, first.pseudonym, 0, _other_payload(plan, first))
    batch = [first, again if conflict else first]
    if conflict:
        with pytest.raises(ReportConflict, match=r"reports\[1\]\.report_id"):
            store.add_reports("abc", plan.digest, batch)
        assert store.get_collection("abc").reports == 0  # nothing of it stored
    else:
        assert store.add_reports("abc", plan.digest, batch) == BatchOutcome(1, 1)
        assert store.get_collection("abc").reports == 1


def _other_payload(plan: Plan, r: StoredReport) -> int | bytes:
    oracle = plan.view_oracles[r.view]
    if oracle.name == "GRR":
        assert isinstance(r.payload, int)
        return (r.payload + 1) % oracle.L
    assert isinstance(r.payload, bytes)
    return bytes([r.payload[0] ^ 0x80]) + r.payload[1:]


@pytest.mark.parametrize("where", ["stored", "batch"])
@pytest.mark.parametrize(
    "change", ["grr_payload", "oue_payload", "pseudonym", "view", "new_id_same_pseudonym"]
)
def test_conflicts_reject_the_whole_batch(
    store: Storage, plan: Plan, where: str, change: str
) -> None:
    store.create_collection("abc", plan, 2, TOKEN_HASH)
    rng = np.random.default_rng(8)
    batches, reports = simulate(plan, 300, seed=8)
    k = next(i for i, r in enumerate(reports) if r.view == (2 if change == "oue_payload" else 0))
    old = reports[k]
    if change.endswith("payload"):
        clash = StoredReport(old.report_id, old.pseudonym, old.view, _other_payload(plan, old))
    elif change == "pseudonym":
        clash = StoredReport(old.report_id, rng.bytes(16), old.view, old.payload)
    elif change == "view":  # views 0 and 1 are both GRR over 6 cells
        clash = StoredReport(old.report_id, old.pseudonym, 1, old.payload)
    else:
        clash = StoredReport(rng.bytes(16), old.pseudonym, old.view, old.payload)
    rest = [r for i, r in enumerate(reports) if i != k]
    if where == "stored" and change not in ("pseudonym", "new_id_same_pseudonym"):
        # A stored (report id, pseudonym) pair is a retry whatever the content: the
        # stored report stands and the answer reveals nothing of it (docs/security.md).
        assert store.add_reports("abc", plan.digest, [old]) == BatchOutcome(1, 0)
        outcome = store.add_reports("abc", plan.digest, [*rest[:100], clash, *rest[100:]])
        assert outcome == BatchOutcome(len(rest), 1)
        assert_counts_equal(store.support("abc"), SupportCounts.from_reports(plan, batches))
        return
    if where == "stored":
        assert store.add_reports("abc", plan.digest, [old]) == BatchOutcome(1, 0)
        before = store.support("abc")
        field = "pseudonym" if change == "new_id_same_pseudonym" else "report_id"
        with pytest.raises(ReportConflict, match=rf"reports\[100\]\.{field} \(b"):
            store.add_reports("abc", plan.digest, [*rest[:100], clash, *rest[100:]])
        assert_counts_equal(store.support("abc"), before)
    else:
        with pytest.raises(ReportConflict, match=r"reports\[150\]\.(report_id|pseudonym)"):
            store.add_reports("abc", plan.digest, [*reports[:150], clash, *reports[150:]])
        assert_empty(store, "abc")
        rest = reports
    # nothing of the rejected batch was stored: the rest is all new, then all counted
    assert store.add_reports("abc", plan.digest, rest) == BatchOutcome(len(rest), 0)
    assert_counts_equal(store.support("abc"), SupportCounts.from_reports(plan, batches))


# -- validation ---------------------------------------------------------------------------
def _bad(plan: Plan, reports: list[StoredReport], kind: str) -> tuple[StoredReport, str]:
    """A malformed report and the message it must raise (at batch index 7)."""
    grr = next(r for r in reports if r.view == 0)
    oue = next(r for r in reports if r.view == 2)
    if kind == "view":
        return StoredReport(grr.report_id, grr.pseudonym, 3, 1), r"reports\[7\]\.view \(3\)"
    if kind == "view_type":
        return StoredReport(grr.report_id, grr.pseudonym, True, 1), r"reports\[7\]\.view \(True\)"
    if kind == "grr_cell":
        return (
            StoredReport(grr.report_id, grr.pseudonym, 0, 6),
            r"reports\[7\]\.payload \(6\) must be an int cell in \[0, 6\) \(view 0 is GRR\)",
        )
    if kind == "grr_negative":
        return StoredReport(grr.report_id, grr.pseudonym, 0, -1), r"reports\[7\]\.payload \(-1\)"
    if kind == "grr_huge":
        return StoredReport(grr.report_id, grr.pseudonym, 0, 2**70), r"reports\[7\]\.payload \(1"
    if kind == "grr_bytes":
        return (
            StoredReport(grr.report_id, grr.pseudonym, 0, b"\x01"),
            r"reports\[7\]\.payload \(b'\\x01'\) must be an int cell",
        )
    if kind == "oue_length":
        return (
            StoredReport(oue.report_id, oue.pseudonym, 2, b"\x00\x00\x00"),
            r"reports\[7\]\.payload \(b'\\x00\\x00\\x00'\) must be 2 bytes \(view 2 is OUE",
        )
    if kind == "oue_int":
        return StoredReport(oue.report_id, oue.pseudonym, 2, 3), r"reports\[7\]\.payload \(3\)"
    if kind == "oue_padding":
        return (
            StoredReport(oue.report_id, oue.pseudonym, 2, b"\x00\x01"),
            r"reports\[7\]\.bits \(last byte 0x01\) must have its 1 padding bits zero",
        )
    if kind == "report_id":
        return (
            StoredReport(b"r" * 15, grr.pseudonym, grr.view, grr.payload),
            r"reports\[7\]\.report_id \(b'rrrrrrrrrrrrrrr'\) must be 16 bytes",
        )
    if kind == "pseudonym":
        return (
            StoredReport(grr.report_id, "p" * 16, grr.view, grr.payload),  # type: ignore[arg-type]
            r"reports\[7\]\.pseudonym \('pppppppppppppppp'\) must be 16 bytes",
        )
    assert kind == "type"
    return ("not a report", r"reports\[7\] \('not a report'\) must be a StoredReport")  # type: ignore[return-value]


@pytest.mark.parametrize(
    "kind",
    [
        "view",
        "view_type",
        "grr_cell",
        "grr_negative",
        "grr_huge",
        "grr_bytes",
        "oue_length",
        "oue_int",
        "oue_padding",
        "report_id",
        "pseudonym",
        "type",
    ],
)
def test_bad_field_rejects_the_batch(store: Storage, plan: Plan, kind: str) -> None:
    store.create_collection("abc", plan, 2, TOKEN_HASH)
    batches, reports = simulate(plan, 200, seed=9)
    bad, match = _bad(plan, reports[100:], kind)
    with pytest.raises(CalmkitError, match=match):
        store.add_reports("abc", plan.digest, [*reports[:7], bad, *reports[7:]])
    assert_empty(store, "abc")
    assert store.add_reports("abc", plan.digest, reports) == BatchOutcome(200, 0)
    assert_counts_equal(store.support("abc"), SupportCounts.from_reports(plan, batches))


def test_numpy_ints_are_accepted(store: Storage, plan: Plan) -> None:
    store.create_collection("abc", plan, 2, TOKEN_HASH)
    _, reports = simulate(plan, 60, seed=10)
    np_reports = [
        StoredReport(
            r.report_id,
            r.pseudonym,
            np.int64(r.view),  # type: ignore[arg-type]
            np.int32(r.payload) if isinstance(r.payload, int) else r.payload,  # type: ignore[arg-type]
        )
        for r in reports
    ]
    assert store.add_reports("abc", plan.digest, np_reports) == BatchOutcome(60, 0)
    assert store.add_reports("abc", plan.digest, reports) == BatchOutcome(0, 60)


def test_closed_collection_and_wrong_digest(store: Storage, plan: Plan) -> None:
    store.create_collection("abc", plan, 2, TOKEN_HASH)
    _, reports = simulate(plan, 20, seed=11)
    other = Plan(plan.schema, 1.0, plan.views, seed=2)
    with pytest.raises(PlanMismatch, match=rf"plan_digest \('{other.digest}'\)"):
        store.add_reports("abc", other.digest, reports)
    assert store.add_reports("abc", plan.digest, reports[:10]) == BatchOutcome(10, 0)
    store.close_collection("abc")
    with pytest.raises(CollectionClosed, match=r"collection_id \('abc'\) is closed"):
        store.add_reports("abc", plan.digest, reports[10:])
    assert store.get_collection("abc").reports == 10


# -- concurrency and speed -----------------------------------------------------------------
def test_concurrent_writers(tmp_path: Path, plan: Plan) -> None:
    path = tmp_path / "cc.db"
    batches, reports = simulate(plan, 8 * 5 * 100, seed=12)
    chunks = [reports[i : i + 100] for i in range(0, len(reports), 100)]
    outcomes: list[BatchOutcome] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)
    with Storage(path) as store:
        store.create_collection("abc", plan, 2, TOKEN_HASH)

        def work(mine: list[list[StoredReport]]) -> None:
            try:
                barrier.wait()
                for chunk in mine:
                    outcomes.append(store.add_reports("abc", plan.digest, chunk))
                    store.support("abc")  # readers interleave with writers
                    outcomes.append(store.add_reports("abc", plan.digest, chunk[:5]))
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(chunks[t::8],)) for t in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        assert sum(o.accepted for o in outcomes) == len(reports)
        assert sum(o.duplicates for o in outcomes) == 5 * len(chunks)
        expected = SupportCounts.from_reports(plan, batches)
        assert_counts_equal(store.support("abc"), expected)
    with Storage(path) as store:
        assert_counts_equal(store.support("abc"), expected)


def test_large_batch_and_its_retry(store: Storage, plan: Plan) -> None:
    """A 10,000-report batch and its full retry (speed: benchmarks/bench_service.py)."""
    store.create_collection("abc", plan, 2, TOKEN_HASH)
    batches, reports = simulate(plan, 10_000, seed=13)
    assert store.add_reports("abc", plan.digest, reports) == BatchOutcome(10_000, 0)
    assert store.add_reports("abc", plan.digest, reports) == BatchOutcome(0, 10_000)
    assert_counts_equal(store.support("abc"), SupportCounts.from_reports(plan, batches))


def test_keys_alike_in_their_first_bytes_are_told_apart(store: Storage, plan: Plan) -> None:
    """Report ids and pseudonyms that share their first 8 bytes (as a client could
    choose them) are still distinct reports; repeats among them still count once."""
    store.create_collection("abc", plan, 2, TOKEN_HASH)
    _, reports = simulate(plan, 300, seed=14)
    alike = [
        StoredReport(
            b"\x11" * 8 + r.report_id[8:], b"\x22" * 8 + r.pseudonym[8:], r.view, r.payload
        )
        for r in reports
    ]
    assert store.add_reports("abc", plan.digest, alike[:200] + alike[:20]) == BatchOutcome(200, 20)
    assert store.add_reports("abc", plan.digest, alike) == BatchOutcome(100, 200)
    clash = StoredReport(
        alike[5].report_id, b"\x22" * 8 + b"\x00" * 8, alike[5].view, alike[5].payload
    )
    with pytest.raises(ReportConflict, match=r"reports\[1\]\.report_id"):
        store.add_reports("abc", plan.digest, [alike[6], clash])
    assert store.get_collection("abc").reports == 300
