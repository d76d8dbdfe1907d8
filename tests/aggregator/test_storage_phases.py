"""Storage of collections with phases: reports under any phase's plan, per-phase and
combined counts, restart, conflicts across phases, and the version 1 migration."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest

from calmkit_aggregator import SupportCounts
from calmkit_aggregator.phases import PhasedDesign
from calmkit_aggregator.service.storage import SCHEMA_VERSION, Storage
from calmkit_aggregator.service.store import BatchOutcome, StoredReport
from calmkit_client import Plan, Schema
from calmkit_client.errors import CalmkitError, CollectionClosed, PlanMismatch, ReportConflict
from tests.aggregator.test_storage import TOKEN_HASH, assert_counts_equal, simulate

SCHEMA = Schema.from_sizes((2, 3, 2, 5))
PILOT = Plan(SCHEMA, 1.0, [(0, 1), (2, 3)], seed=1)
MAIN = Plan(SCHEMA, 1.0, [(0, 1, 2), (1, 3), (0, 3)], seed=2)
DESIGN = PhasedDesign(expected_n=1000, pilot_reports=100, k=2, seed=1)


def _phased(store: Storage) -> tuple[list[StoredReport], list[StoredReport]]:
    store.create_collection("p", PILOT, 2, TOKEN_HASH, DESIGN)
    first = simulate(PILOT, 150, seed=1)
    store.add_reports("p", PILOT.digest, first[1])
    record = store.add_phase("p", 1, MAIN)
    assert (record.phase, record.plan, record.plans) == (1, MAIN, (PILOT, MAIN))
    second = simulate(MAIN, 400, seed=2)
    store.add_reports("p", MAIN.digest, second[1])
    return first[1], second[1]


def test_reports_count_per_phase_and_combine(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with Storage(path) as store:
        _phased(store)
        # a pilot report made before the switch and sent after it still counts
        extra = simulate(PILOT, 5, seed=9)[1]
        store.add_reports("p", PILOT.digest, extra)
        record = store.get_collection("p")
        assert record.phase_reports == (155, 400) and record.reports == 555
        assert record.design == DESIGN
        combined = store.support("p")
        assert combined.plan.views == PILOT.views + MAIN.views
        pilot, main = store.phase_support("p", 0), store.phase_support("p", 1)
        assert int(pilot.n.sum()) == 155 and int(main.n.sum()) == 400
        np.testing.assert_array_equal(combined.n, np.concatenate([pilot.n, main.n]))
    with Storage(path) as again:  # a restart rebuilds both phases
        record = again.get_collection("p")
        assert record.plans == (PILOT, MAIN) and record.design == DESIGN
        assert_counts_equal(again.phase_support("p", 0), pilot)
        assert_counts_equal(again.phase_support("p", 1), main)


def test_phases_advance_once_and_refuse_skips_and_closed_collections(tmp_path: Path) -> None:
    with Storage(tmp_path / "s.db") as store:
        store.create_collection("p", PILOT, 2, TOKEN_HASH, DESIGN)
        store.add_phase("p", 1, MAIN)
        other = Plan(SCHEMA, 1.0, [(0, 2)], seed=3)
        assert store.add_phase("p", 1, other).plans == (PILOT, MAIN)  # the first stays
        with pytest.raises(CalmkitError, match=r"phase \(3\) must be the next phase \(2\)"):
            store.add_phase("p", 3, other)
        with pytest.raises(CalmkitError, match="schema and epsilon"):
            store.add_phase("p", 2, Plan(SCHEMA, 2.0, [(0, 2)]))
        store.close_collection("p")
        with pytest.raises(CollectionClosed):
            store.add_phase("p", 2, other)


def test_unknown_digests_and_cross_phase_conflicts_are_refused(tmp_path: Path) -> None:
    with Storage(tmp_path / "s.db") as store:
        early, _ = _phased(store)
        with pytest.raises(PlanMismatch, match="must be one of the collection's plans"):
            store.add_reports("p", "f" * 64, early[:1])
        # the same (report id, pseudonym) resent under the other phase is a retry: the
        # stored report stands, whatever the content (nothing stored is revealed)
        moved = StoredReport(early[0].report_id, early[0].pseudonym, 2, 0)
        assert store.add_reports("p", MAIN.digest, [moved]) == BatchOutcome(0, 1)
        # one report per user over all phases
        again = StoredReport(b"\x01" * 16, early[1].pseudonym, 2, 0)
        with pytest.raises(ReportConflict, match="pseudonym"):
            store.add_reports("p", MAIN.digest, [again])
        assert store.get_collection("p").reports == 550


_V1_SCHEMA = """
CREATE TABLE collections (
    id TEXT PRIMARY KEY, plan_json TEXT NOT NULL, digest TEXT NOT NULL, k INTEGER NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('open', 'closed')), submit_token_hash BLOB NOT NULL,
    created_at REAL NOT NULL, closed_at REAL
);
CREATE TABLE reports (
    collection_id TEXT NOT NULL REFERENCES collections (id), report_id BLOB NOT NULL,
    pseudonym BLOB NOT NULL, view INTEGER NOT NULL, payload BLOB NOT NULL,
    PRIMARY KEY (collection_id, report_id)
) WITHOUT ROWID;
CREATE UNIQUE INDEX reports_pseudonym ON reports (collection_id, pseudonym);
PRAGMA user_version = 1;
"""


def test_a_version_1_database_is_migrated_in_place(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    _, reports = simulate(MAIN, 300, seed=4)
    raw = sqlite3.connect(path)
    raw.executescript(_V1_SCHEMA)
    raw.execute(
        "INSERT INTO collections VALUES (?, ?, ?, 2, 'open', ?, 1.0, NULL)",
        ("old", MAIN.to_json(), MAIN.digest, TOKEN_HASH),
    )
    raw.executemany(
        "INSERT INTO reports VALUES ('old', ?, ?, ?, ?)",
        [(r.report_id, r.pseudonym, r.view, r.payload) for r in reports],
    )
    raw.commit()
    raw.close()
    expected = SupportCounts.zeros(MAIN)
    for r in reports:  # the counts the v1 rows hold
        oracle = MAIN.view_oracles[r.view]
        if isinstance(r.payload, bytes):
            payload = np.frombuffer(r.payload, np.uint8)[None]
        else:
            payload = np.array([r.payload])
        expected.counts[r.view][:] += oracle.support(payload)
        expected.n[r.view] += 1
    with Storage(path) as store:
        record = store.get_collection("old")
        assert record.plans == (MAIN,) and record.design is None and record.reports == 300
        assert_counts_equal(store.support("old"), expected)
        more = simulate(MAIN, 10, seed=5)[1]
        assert store.add_reports("old", MAIN.digest, more).accepted == 10
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert raw.execute("SELECT sum(count) FROM batches WHERE phase = 0").fetchone()[0] == 310
    raw.close()


def test_a_design_stored_before_reconstructions_loads_as_local(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    planned_global = PhasedDesign(
        expected_n=1000, pilot_reports=100, k=2, seed=1, reconstruction="global"
    )
    with Storage(path) as store:
        store.create_collection("p", PILOT, 2, TOKEN_HASH, DESIGN)
        store.create_collection("g", PILOT, 2, TOKEN_HASH, planned_global)
    old = '{"expected_n": 1000, "k": 2, "l": null, "m": null, "pilot_reports": 100, "seed": 1}'
    with sqlite3.connect(path) as raw:  # the row as stored before designs had the key
        raw.execute("UPDATE collections SET design_json = ? WHERE id = 'p'", (old,))
    with Storage(path) as store:
        design = store.get_collection("p").design
        assert design == DESIGN and design is not None and design.reconstruction == "local"
        assert store.get_collection("g").design == planned_global
    with sqlite3.connect(path) as raw:  # a value no planner knows: refused, naming it
        raw.execute(
            "UPDATE collections SET design_json = ? WHERE id = 'p'",
            (old.replace('"seed"', '"reconstruction": "nearest", "seed"'),),
        )
    with pytest.raises(CalmkitError, match=r"reconstruction \('nearest'\) must be one of"):
        Storage(path)
