"""The report cap, manipulation flags and the pilot check in storage (SQLite, and
PostgreSQL for every test taking ``store``): a batch that would pass the cap is refused
whole, retries are still acknowledged once full, the cap holds under concurrent
writers (two PostgreSQL replicas), flags and the pilot check survive a reopen, a pilot
that failed its check takes no new reports once the next phase is stored (also through
another replica) while a passed one does, and older databases are migrated with no
cap."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from calmkit_aggregator.phases import PILOT_SET_ASIDE
from calmkit_aggregator.service.storage import Storage
from calmkit_aggregator.service.store import MAX_FLAGS, BatchOutcome, StoredReport
from calmkit_client import Plan
from calmkit_client.errors import CalmkitError, CollectionFull, PlanMismatch
from tests.aggregator import test_storage as base
from tests.aggregator.test_storage import TOKEN_HASH, make_plan, simulate
from tests.aggregator.test_storage_phases import DESIGN, MAIN, PILOT

store = base.store  # the fixtures: both backends, and the plan
plan = base.plan


def test_a_batch_past_the_cap_is_refused_whole_and_retries_pass(store: Storage, plan: Plan) -> None:
    store.create_collection("c", plan, 2, TOKEN_HASH, max_reports=100)
    assert store.get_collection("c").max_reports == 100
    _, reports = simulate(plan, 160, seed=1)
    assert store.add_reports("c", plan.digest, reports[:60]) == BatchOutcome(60, 0)
    with pytest.raises(CollectionFull, match=r"takes at most 100 reports and holds 60, so .* 50"):
        store.add_reports("c", plan.digest, reports[60:110])
    assert store.get_collection("c").reports == 60  # nothing of it stored
    assert store.add_reports("c", plan.digest, reports[60:100]) == BatchOutcome(40, 0)
    # full: retries of stored reports are still acknowledged, as duplicates
    assert store.add_reports("c", plan.digest, reports[:100]) == BatchOutcome(0, 100)
    with pytest.raises(CollectionFull):  # one new report among retries: refused whole
        store.add_reports("c", plan.digest, reports[:101])
    assert store.recount("c").n.sum() == store.get_collection("c").reports == 100


def test_no_cap_by_default_and_a_bad_cap_is_refused(store: Storage, plan: Plan) -> None:
    store.create_collection("c", plan, 2, TOKEN_HASH)
    assert store.get_collection("c").max_reports == 0
    _, reports = simulate(plan, 50, seed=2)
    assert store.add_reports("c", plan.digest, reports) == BatchOutcome(50, 0)
    for bad in (-1, 1.5, "10"):
        with pytest.raises(CalmkitError, match=r"max_reports .* must be an int >= 0"):
            store.create_collection("d", plan, 2, TOKEN_HASH, max_reports=bad)  # type: ignore[arg-type]


def test_flags_and_the_pilot_check_are_kept(store: Storage, plan: Plan) -> None:
    store.create_collection("c", plan, 2, TOKEN_HASH)
    store.add_flag("c", "batch of 5 reports from ipv4:127.0.0.1:1: view 0 ...")
    store.add_flag("c", "x" * 2000)
    store.set_pilot_check("c", "passed")
    record = store.get_collection("c")
    assert record.flags == ("batch of 5 reports from ipv4:127.0.0.1:1: view 0 ...", "x" * 500)
    assert record.pilot_check == "passed"
    for i in range(MAX_FLAGS):
        store.add_flag("c", f"flag {i}")
    assert len(store.get_collection("c").flags) == MAX_FLAGS  # the first ones kept


def test_flags_cap_and_pilot_check_survive_a_reopen(tmp_path: Path) -> None:
    plan = make_plan()
    with Storage(tmp_path / "a.db") as s:
        s.create_collection("c", plan, 2, TOKEN_HASH, max_reports=7)
        s.add_flag("c", "flagged")
        s.set_pilot_check("c", "failed: because")
    with Storage(tmp_path / "a.db") as s:
        record = s.get_collection("c")
        assert (record.max_reports, record.flags, record.pilot_check) == (
            7,
            ("flagged",),
            "failed: because",
        )


FAILED = "failed: view 0 (a0 x a1); phase 1 planned by Algorithm 1 without the pilot"
REFUSED = (
    rf"plan_digest \({PILOT.digest[:12]}\) is the pilot's, which failed its check: fetch "
    rf"the current plan \({MAIN.digest[:12]}\); nothing of the batch was stored"
)


def _pilot_done(store: Storage, check: str) -> list[StoredReport]:
    """A phased collection "p" (cap 300) whose 100 pilot reports are stored, its pilot
    check ``check`` and its main phase started; the pilot's next 100 reports."""
    store.create_collection("p", PILOT, 2, TOKEN_HASH, DESIGN, max_reports=300)
    _, pilot = simulate(PILOT, 200, seed=7)
    assert store.add_reports("p", PILOT.digest, pilot[:100]) == BatchOutcome(100, 0)
    store.set_pilot_check("p", check)
    store.add_phase("p", 1, MAIN)
    return pilot


def test_a_failed_pilot_takes_no_new_reports_but_acknowledges_retries(store: Storage) -> None:
    pilot = _pilot_done(store, FAILED)
    before = store.recount("p")
    with pytest.raises(PlanMismatch, match=REFUSED):
        store.add_reports("p", PILOT.digest, pilot[100:])
    with pytest.raises(PlanMismatch, match=REFUSED):  # one new report among retries
        store.add_reports("p", PILOT.digest, pilot[:101])
    record = store.get_collection("p")
    assert (record.phase_reports, record.reports) == ((100, 0), 100)  # nothing stored
    base.assert_counts_equal(store.recount("p"), before)
    # retries of the stored pilot reports are still acknowledged, as duplicates
    assert store.add_reports("p", PILOT.digest, pilot[:100]) == BatchOutcome(0, 100)
    _, main = simulate(MAIN, 200, seed=8)  # the cap's places stay for the main phase
    assert store.add_reports("p", MAIN.digest, main) == BatchOutcome(200, 0)
    assert store.get_collection("p").phase_reports == (100, 200)


def test_a_failed_pilot_takes_reports_until_the_next_phase_is_stored(store: Storage) -> None:
    store.create_collection("p", PILOT, 2, TOKEN_HASH, DESIGN)
    _, pilot = simulate(PILOT, 20, seed=9)
    store.set_pilot_check("p", FAILED)  # checked, the next phase not stored yet
    assert store.add_reports("p", PILOT.digest, pilot[:10]) == BatchOutcome(10, 0)
    store.add_phase("p", 1, MAIN)
    with pytest.raises(PlanMismatch, match=REFUSED):
        store.add_reports("p", PILOT.digest, pilot[10:])


@pytest.mark.parametrize("check", ["passed", f"passed; {PILOT_SET_ASIDE}"])
def test_a_passed_pilot_takes_late_reports(store: Storage, check: str) -> None:
    pilot = _pilot_done(store, check)
    assert store.add_reports("p", PILOT.digest, pilot[100:]) == BatchOutcome(100, 0)
    assert store.get_collection("p").phase_reports == (200, 0)


def test_a_failed_pilot_is_refused_through_another_postgres_replica(pg_dsn: str) -> None:
    from calmkit_aggregator.service.pg_storage import PgStorage

    a, b = PgStorage(pg_dsn), PgStorage(pg_dsn)
    try:
        a.create_collection("p", PILOT, 2, TOKEN_HASH, DESIGN)
        _, pilot = simulate(PILOT, 200, seed=10)
        assert b.add_reports("p", PILOT.digest, pilot[:100]) == BatchOutcome(100, 0)
        a.set_pilot_check("p", FAILED)  # b's copy of the record still says nothing of it
        a.add_phase("p", 1, MAIN)
        with pytest.raises(PlanMismatch, match=REFUSED):
            b.add_reports("p", PILOT.digest, pilot[100:])
        assert b.add_reports("p", PILOT.digest, pilot[:100]) == BatchOutcome(0, 100)
        assert a.get_collection("p").phase_reports == (100, 0)
    finally:
        a.close()
        b.close()


def test_a_version_3_file_is_migrated_with_no_cap(tmp_path: Path) -> None:
    plan = make_plan()
    path = tmp_path / "old.db"
    _, reports = simulate(plan, 30, seed=3)
    with Storage(path) as s:
        s.create_collection("old", plan, 2, TOKEN_HASH, max_reports=10)
        s.add_reports("old", plan.digest, reports[:10])
    raw = sqlite3.connect(path)  # back to version 3: without the columns and the table
    raw.executescript(
        "ALTER TABLE collections DROP COLUMN max_reports; "
        "ALTER TABLE collections DROP COLUMN pilot_check; DROP TABLE flags; "
        "DROP TABLE admissions; ALTER TABLE collections DROP COLUMN expected_n; "
        "PRAGMA user_version = 3;"
    )
    raw.close()
    with Storage(path) as s:
        record = s.get_collection("old")
        assert (record.max_reports, record.flags, record.pilot_check) == (0, (), "")
        assert s.add_reports("old", plan.digest, reports[10:]) == BatchOutcome(20, 0)
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA user_version").fetchone()[0] == 6
    raw.close()


def _flood(stores: list, plan: Plan, batches: list[list[StoredReport]]) -> list[object]:
    """Every batch sent at once from threads over ``stores`` (round robin); each
    batch's outcome or error, in batch order."""
    results: list[object] = [None] * len(batches)
    start = threading.Barrier(len(batches))

    def send(i: int, batch: list[StoredReport]) -> None:
        start.wait()
        try:
            results[i] = stores[i % len(stores)].add_reports("c", plan.digest, batch)
        except CalmkitError as exc:
            results[i] = exc

    threads = [threading.Thread(target=send, args=(i, b)) for i, b in enumerate(batches)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_the_cap_holds_under_concurrent_writers(tmp_path: Path) -> None:
    plan = make_plan()
    _, reports = simulate(plan, 1200, seed=4)
    batches = [reports[i : i + 50] for i in range(0, 1200, 50)]
    with Storage(tmp_path / "c.db") as s:
        s.create_collection("c", plan, 2, TOKEN_HASH, max_reports=500)
        results = _flood([s], plan, batches)
        accepted = [r for r in results if isinstance(r, BatchOutcome)]
        full = [r for r in results if isinstance(r, CollectionFull)]
        assert len(accepted) == 10 and len(full) == 14, results
        assert s.get_collection("c").reports == 500 == s.recount("c").n.sum()


def test_the_cap_holds_over_two_postgres_replicas(pg_dsn: str) -> None:
    from calmkit_aggregator.service.pg_storage import PgStorage

    plan = make_plan()
    _, reports = simulate(plan, 1200, seed=5)
    batches = [reports[i : i + 50] for i in range(0, 1200, 50)]
    a, b = PgStorage(pg_dsn), PgStorage(pg_dsn)
    try:
        a.create_collection("c", plan, 2, TOKEN_HASH, max_reports=500)
        results = _flood([a, b], plan, batches)
        accepted = [r for r in results if isinstance(r, BatchOutcome)]
        full = [r for r in results if isinstance(r, CollectionFull)]
        assert len(accepted) == 10 and len(full) == 14, results
        assert a.get_collection("c").reports == b.get_collection("c").reports == 500
        assert a.recount("c").n.sum() == 500
        # once full, a retry through the other replica is acknowledged as duplicates
        first = next(i for i, r in enumerate(results) if isinstance(r, BatchOutcome))
        other = (b, a)[first % 2]
        assert other.add_reports("c", plan.digest, batches[first]) == BatchOutcome(0, 50)
    finally:
        a.close()
        b.close()


def test_a_version_2_postgres_database_is_migrated_with_no_cap(pg_dsn: str) -> None:
    import psycopg

    from calmkit_aggregator.service.pg_storage import PgStorage

    plan = make_plan()
    _, reports = simulate(plan, 30, seed=6)
    with PgStorage(pg_dsn) as s:
        s.create_collection("old", plan, 2, TOKEN_HASH, max_reports=10)
        s.add_reports("old", plan.digest, reports[:10])
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            "ALTER TABLE collections DROP COLUMN max_reports, DROP COLUMN pilot_check, "
            "DROP COLUMN expected_n; "
            "DROP TABLE flags; DROP TABLE admissions; UPDATE calmkit_schema SET version = 2"
        )
    with PgStorage(pg_dsn) as s:
        record = s.get_collection("old")
        assert (record.max_reports, record.flags, record.pilot_check) == (0, (), "")
        assert s.add_reports("old", plan.digest, reports[10:]) == BatchOutcome(20, 0)
        s.add_flag("old", "kept")
    with PgStorage(pg_dsn) as s:
        assert s.get_collection("old").flags == ("kept",)
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT version FROM calmkit_schema").fetchone() == (5,)
