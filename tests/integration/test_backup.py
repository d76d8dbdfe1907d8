"""``calmkit backup`` / ``restore`` against a real server under ingest: a backup taken
while the client's batches are being acknowledged holds every report acknowledged
before it began, its stored support counts equal a recount of its batch log, a
restore refuses what it should, and a closed collection's backup answers the same
marginals. PostgreSQL: ``pg_dump -Fc`` / ``pg_restore`` of the test cluster, the route
the operator's guide documents."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from calmkit_aggregator.service.admin import AdminClient
from calmkit_aggregator.service.backup import backup, check_backup, restore
from calmkit_aggregator.service.storage import SCHEMA_VERSION, Storage
from calmkit_client import CalmkitError, Collector, DeviceState
from calmkit_client.cli import main
from calmkit_simulator import synthetic_population
from tests.integration.servers import Server

POP = synthetic_population(n=60_000, sizes=(2, 3, 2, 2, 4), strength=1.5, rng=5)
IDS = np.arange(POP.n, dtype=np.uint64)
BATCH = 500


def _create(address: str, collection_id: str = "c1") -> str:
    with AdminClient(address) as admin:
        info = admin.create_collection(
            POP.schema, 1.0, POP.n, 3, collection_id=collection_id, seed=7, pilot=0.0
        )
    return info.submit_token or ""


def _assert_consistent(db: Path) -> dict[str, int]:
    """Open ``db`` with the storage class: per collection, the stored support counts
    equal a recount of the batch log; returns the reports per collection."""
    with Storage(db) as storage:
        out = {}
        for record in storage.list_collections():
            stored, recounted = (
                storage.support(record.collection_id),
                storage.recount(record.collection_id),
            )
            assert np.array_equal(stored.n, recounted.n), record.collection_id
            for a, b in zip(stored.counts, recounted.counts):
                assert np.array_equal(a, b), record.collection_id
            out[record.collection_id] = int(np.sum(stored.n))
        return out


@pytest.fixture
def ingesting(tmp_path: Path) -> Iterator[tuple[Server, DeviceState, dict[str, object]]]:
    """A server with collection c1 and a thread submitting POP through the client in
    batches; ``progress["acked"]`` counts the users whose batch was acknowledged (in
    order: users ``IDS[:acked]``)."""
    with Server(tmp_path) as server:
        token = _create(server.address)
        state = DeviceState.in_memory()
        progress: dict[str, object] = {"acked": 0, "error": None, "token": token}
        lock = threading.Lock()

        def count(n: int) -> None:
            with lock:
                progress["acked"] = int(progress["acked"]) + n  # type: ignore[call-overload]

        def ingest() -> None:
            try:
                with Collector(server.address, "c1", token, state, batch_size=BATCH) as c:
                    c.submit_many(POP.codes, IDS, progress=count)
            except BaseException as exc:  # reported by the test
                progress["error"] = exc

        thread = threading.Thread(target=ingest)
        progress["thread"] = thread
        thread.start()
        try:
            yield server, state, progress
        finally:
            thread.join()


def test_backup_during_ingest_holds_every_acknowledged_report(
    tmp_path: Path, ingesting: tuple[Server, DeviceState, dict[str, object]]
) -> None:
    server, state, progress = ingesting
    while int(progress["acked"]) < 10_000:  # type: ignore[call-overload]
        assert progress["error"] is None, progress["error"]
        time.sleep(0.001)
    before = int(progress["acked"])  # type: ignore[call-overload]
    info = backup(server.storage.path, tmp_path / "backup.db")
    after = int(progress["acked"])  # type: ignore[call-overload]
    thread = progress["thread"]
    assert isinstance(thread, threading.Thread)
    thread.join()
    assert progress["error"] is None, progress["error"]
    assert after < POP.n, "ingest ended before the backup did: the test shows nothing"
    copied = info.reports["c1"]
    assert before <= copied <= after + BATCH, (before, copied, after)
    assert info.schema_version == SCHEMA_VERSION

    restored = tmp_path / "restored.db"
    assert restore(tmp_path / "backup.db", restored).reports == {"c1": copied}
    assert _assert_consistent(restored) == {"c1": copied}
    # the restored store knows every report acknowledged before the backup: sent again
    # (the same reports: the device state recalls them) they are all duplicates, and
    # of all the users' reports exactly those not in the copy are accepted
    with _server_on(restored) as address:
        token = str(progress["token"])
        with Collector(address, "c1", token, state, batch_size=BATCH) as c:
            old = c.submit_many(POP.codes[:before], IDS[:before])
            assert (old.accepted, old.duplicates) == (0, before)
            rest = c.submit_many(POP.codes, IDS)
        assert rest.accepted == POP.n - copied


def test_backup_cli_restore_refuses_and_forces(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with Server(tmp_path) as server:
        token = _create(server.address)
        with Collector(server.address, "c1", token, DeviceState.in_memory()) as c:
            c.submit_many(POP.codes[:3000], IDS[:3000])
        db = server.storage.path
        assert main(["backup", "--db", db, str(tmp_path / "b.db")]) == 0
        assert "1 collection(s), 3,000 reports" in capsys.readouterr().out
        # never overwrites a backup
        assert main(["backup", "--db", db, str(tmp_path / "b.db")]) == 2
        assert "exists" in capsys.readouterr().err
    target = tmp_path / "live.db"
    target.write_bytes(b"something precious")
    assert main(["restore", str(tmp_path / "b.db"), "--db", str(target)]) == 2
    err = capsys.readouterr().err
    assert "refuses to replace" in err and "--force" in err
    assert target.read_bytes() == b"something precious"
    (tmp_path / "live.db-keys").mkdir()  # the replaced database's key cache goes too
    (tmp_path / "live.db-keys" / "stale").write_bytes(b"x")
    assert main(["restore", str(tmp_path / "b.db"), "--db", str(target), "--force"]) == 0
    assert "3,000 reports" in capsys.readouterr().out
    assert _assert_consistent(target) == {"c1": 3000}
    assert not (tmp_path / "live.db-keys" / "stale").exists()
    assert target.stat().st_mode & 0o077 == 0


def test_restore_names_what_is_wrong_with_a_backup(tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("not a database")
    with pytest.raises(CalmkitError, match=r"backup \('.*notes.txt'\) is not a SQLite database"):
        restore(text, tmp_path / "a.db")
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE t (x)")
    with pytest.raises(CalmkitError, match=r"is not a calmkit database"):
        restore(other, tmp_path / "a.db")
    with Storage(tmp_path / "real.db"):
        pass
    future = tmp_path / "future.db"
    shutil.copy(tmp_path / "real.db", future)
    with sqlite3.connect(future) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(
        CalmkitError, match=rf"has schema version {SCHEMA_VERSION + 1}; this calmkit opens 1 to "
    ):
        restore(future, tmp_path / "a.db")
    assert not (tmp_path / "a.db").exists()
    assert check_backup(tmp_path / "real.db").reports == {}


def test_backup_of_a_closed_collection_answers_the_same(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    with Server(tmp_path / "a") as server:
        token = _create(server.address)
        with Collector(server.address, "c1", token, DeviceState.in_memory()) as c:
            c.submit_many(POP.codes[:20_000], IDS[:20_000])
        with AdminClient(server.address) as admin:
            admin.close_collection("c1")
            original = admin.query("c1", ["a0", "a2", "a4"], replicates=8)
        backup(server.storage.path, tmp_path / "b.db")
    restored = tmp_path / "r.db"
    restore(tmp_path / "b.db", restored)
    with _server_on(restored) as address, AdminClient(address) as admin:
        again = admin.query("c1", ["a0", "a2", "a4"], replicates=8)
    assert again.state == "closed" and again.reports == original.reports == 20_000
    assert np.array_equal(again.values, original.values)
    assert np.array_equal(again.variance, original.variance)


def test_pg_dump_and_pg_restore_keep_a_collection(pg_server: object, tmp_path: Path) -> None:
    """The operator's guide's PostgreSQL route, run: pg_dump -Fc of a database with a
    closed collection, pg_restore into an empty one, the same answer from it."""
    from calmkit_aggregator.service.pg_storage import PgStorage
    from calmkit_aggregator.service.server import create_server, graceful_stop
    from tests import pg

    dump_bin, restore_bin = pg._binary("pg_dump"), pg._binary("pg_restore")
    if dump_bin is None or restore_bin is None:
        pytest.skip("pg_dump / pg_restore not found")
    source = pg_server.create_database()  # type: ignore[attr-defined]
    storage = PgStorage(source)
    server, port = create_server("127.0.0.1:0", storage)
    try:
        token = _create(f"127.0.0.1:{port}")
        with Collector(f"127.0.0.1:{port}", "c1", token, DeviceState.in_memory()) as c:
            c.submit_many(POP.codes[:20_000], IDS[:20_000])
        with AdminClient(f"127.0.0.1:{port}") as admin:
            admin.close_collection("c1")
            original = admin.query("c1", ["a0", "a2", "a4"], replicates=8)
        dump = tmp_path / "calmkit.dump"
        subprocess.run([dump_bin, "-Fc", "--file", str(dump), source], check=True)
    finally:
        graceful_stop(server, 1.0)
        storage.close()
    target = pg_server.create_database()  # type: ignore[attr-defined]
    subprocess.run([restore_bin, "--no-owner", "--dbname", target, str(dump)], check=True)
    storage = PgStorage(target)
    server, port = create_server("127.0.0.1:0", storage)
    try:
        with AdminClient(f"127.0.0.1:{port}") as admin:
            again = admin.query("c1", ["a0", "a2", "a4"], replicates=8)
        stored, recounted = storage.support("c1"), storage.recount("c1")
    finally:
        graceful_stop(server, 1.0)
        storage.close()
    assert again.reports == original.reports == 20_000
    assert np.array_equal(again.values, original.values)
    assert np.array_equal(again.variance, original.variance)
    assert np.array_equal(stored.n, recounted.n)


# -- helpers -------------------------------------------------------------------------------
class _server_on:  # a context manager used like a function
    """A server on an existing SQLite file; yields its address."""

    def __init__(self, db: Path) -> None:
        from calmkit_aggregator.service.server import create_server

        self.storage = Storage(db)
        self.server, port = create_server("127.0.0.1:0", self.storage)
        self.address = f"127.0.0.1:{port}"

    def __enter__(self) -> str:
        return self.address

    def __exit__(self, *exc: object) -> None:
        from calmkit_aggregator.service.server import graceful_stop

        graceful_stop(self.server, 1.0)
        self.storage.close()
