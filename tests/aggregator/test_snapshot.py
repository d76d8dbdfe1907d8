"""Key snapshots of the SQLite store: a restart loads the key tables from the snapshot
written on close (and the log rows after it) instead of rebuilding them from the whole
log; a snapshot that is missing, corrupt, truncated, of another database or ahead of
the log is not used (the tables are rebuilt from the log), and deduplication stays
exact either way: every stored report's retry is a duplicate, a stored id or pseudonym
under another device is a conflict."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from calmkit_aggregator.service import snapshot as snapshot_module
from calmkit_aggregator.service.snapshot import HEADER_BYTES, SnapshotError, read_snapshot
from calmkit_aggregator.service.storage import Storage
from calmkit_aggregator.service.store import BatchOutcome, StoredReport
from calmkit_client.errors import ReportConflict

from .test_storage import ROOT, TOKEN_HASH, make_plan, simulate

PLAN = make_plan()
REPORTS = simulate(PLAN, 3000, seed=41)[1]


def _fill(path: Path, reports: list[StoredReport], create: bool = True) -> None:
    with Storage(path) as store:
        if create:
            store.create_collection("c", PLAN, 2, TOKEN_HASH)
        for i in range(0, len(reports), 500):
            store.add_reports("c", PLAN.digest, reports[i : i + 500])


def _snapshot_file(path: Path) -> Path:
    return Path(f"{path}-keys") / (b"c".hex() + ".snap")


def _check_dedupe(store: Storage, stored: list[StoredReport]) -> None:
    """Exactly the stored reports are known: their retries are all duplicates, another
    device's use of a stored id or pseudonym is refused, new reports are new."""
    assert store.add_reports("c", PLAN.digest, stored) == BatchOutcome(0, len(stored))
    x = stored[len(stored) // 2]
    with pytest.raises(ReportConflict, match="report_id"):
        store.add_reports(
            "c", PLAN.digest, [StoredReport(x.report_id, b"\x01" * 16, x.view, x.payload)]
        )
    with pytest.raises(ReportConflict, match="pseudonym"):
        store.add_reports(
            "c", PLAN.digest, [StoredReport(b"\x02" * 16, x.pseudonym, x.view, x.payload)]
        )
    fresh = simulate(PLAN, 10, seed=42)[1]
    assert store.add_reports("c", PLAN.digest, fresh) == BatchOutcome(10, 0)
    assert store.get_collection("c").reports == len(stored) + 10


def _source(store: Storage) -> str:
    assert store.wait_ready(60)
    return store._entries["c"].key_source


def test_a_restart_loads_the_snapshot_written_on_close(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    _fill(path, REPORTS)
    snap = _snapshot_file(path)
    assert snap.exists() and snap.stat().st_mode & 0o777 == 0o600
    loaded = read_snapshot(str(snap), "c")
    assert loaded.reports == 3000 and len(loaded.by_pseudonym) == 3000
    with Storage(path) as store:
        assert _source(store) == "snapshot"
        _check_dedupe(store, REPORTS)


def test_the_log_after_the_snapshot_is_replayed(tmp_path: Path) -> None:
    """A snapshot from a graceful stop, then reports stored by a process killed with
    SIGKILL (no snapshot): the restart loads the snapshot and the log rows after it."""
    path = tmp_path / "t.db"
    _fill(path, REPORTS[:2000])
    rows = [(r.report_id.hex(), r.pseudonym.hex(), r.view, r.payload) for r in REPORTS[2000:]]
    script = textwrap.dedent(
        f"""
        import os, signal
        from calmkit_aggregator.service.storage import Storage
        from calmkit_aggregator.service.store import StoredReport
        store = Storage({str(path)!r})
        reports = [StoredReport(bytes.fromhex(a), bytes.fromhex(b), v, p)
                   for a, b, v, p in {rows!r}]
        for i in range(0, len(reports), 250):
            store.add_reports("c", {PLAN.digest!r}, reports[i : i + 250])
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert proc.returncode == -9, proc.stderr
    assert read_snapshot(str(_snapshot_file(path)), "c").reports == 2000  # the old one
    with Storage(path) as store:
        assert _source(store) == "snapshot"
        _check_dedupe(store, REPORTS)


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["payload", "header", "truncated", "other_db", "ahead"])
def test_an_unusable_snapshot_falls_back_to_the_log(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "d.db"
    _fill(path, REPORTS[:2000])
    snap = _snapshot_file(path)
    if damage == "payload":  # a bit of a stored report id, in the id table
        used_bytes = int.from_bytes(snap.read_bytes()[48:56], "little")
        _flip(snap, HEADER_BYTES + used_bytes + 16 * 1000 + 3)
    elif damage == "header":
        _flip(snap, 9)
    elif damage == "truncated":
        snap.write_bytes(snap.read_bytes()[:-100])
    elif damage == "other_db":  # a snapshot of another database's collection "c"
        other = tmp_path / "other.db"
        _fill(other, REPORTS[1000:3000])
        shutil.copy(_snapshot_file(other), snap)
    else:  # the database restored from a copy older than the snapshot
        shutil.copy(path, tmp_path / "old.db")
        _fill(path, REPORTS[2000:], create=False)
        os.replace(tmp_path / "old.db", path)
    if damage in ("payload", "header", "truncated"):
        with pytest.raises(SnapshotError):
            read_snapshot(str(snap), "c")
    with Storage(path) as store:
        assert _source(store) == "log"
        _check_dedupe(store, REPORTS[:2000])


def test_snapshots_during_ingest_widen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past SNAPSHOT_FIRST reports, a snapshot each time the tables double, written in
    the background; none of a closed collection."""
    monkeypatch.setattr(snapshot_module, "SNAPSHOT_FIRST", 400)
    path = tmp_path / "w.db"
    written = []
    with Storage(path) as store:
        store.create_collection("c", PLAN, 2, TOKEN_HASH)
        for i in range(0, 3000, 100):
            store.add_reports("c", PLAN.digest, REPORTS[i : i + 100])
            if store._snapshotter is not None:
                store._snapshotter.join()
            written.append(store._entries["c"].snapshot_reports)
        assert sorted(set(written)) == [0, 400, 800, 1600]
        assert read_snapshot(str(_snapshot_file(path)), "c").reports == 1600
        before = store.snapshot_bytes
    assert store.snapshot_bytes > before  # the close wrote the last one
    assert read_snapshot(str(_snapshot_file(path)), "c").reports == 3000
    with Storage(path) as store:
        store.close_collection("c")
        assert not _snapshot_file(path).exists()


def test_memory_databases_write_no_snapshot() -> None:
    with Storage(":memory:") as store:
        store.create_collection("c", PLAN, 2, TOKEN_HASH)
        store.add_reports("c", PLAN.digest, simulate(PLAN, 50, seed=43)[1])
    assert store.snapshot_bytes == 0


def test_snapshot_sizes_per_report(tmp_path: Path) -> None:
    """About 48 bytes per report (report id and pseudonym for the id table, the
    pseudonym for the other) plus a bit per slot."""
    path = tmp_path / "z.db"
    _fill(path, REPORTS)
    size = _snapshot_file(path).stat().st_size
    assert 48 * 3000 < size < 48 * 3000 + 2 * 8192 // 8 + 1024
