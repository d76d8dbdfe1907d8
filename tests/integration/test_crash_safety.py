"""Crash safety: ``calmkit serve`` killed with SIGKILL at random moments during ingest,
restarted on the same database, ten times (with one graceful restart between, so later
restarts load the key snapshot and the log after it), with old-format and columnar
batches mixed;
on PostgreSQL, two replicas behind the client, killed in turn.
Every acknowledged report is counted exactly once, none is invented, resending a batch
whose ack was lost does not double count (the service commits, then
acknowledges), and the stored counts equal a recount of the batch log."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from calmkit_aggregator.service.admin import AdminClient
from calmkit_aggregator.service.pg_storage import PgStorage
from calmkit_aggregator.service.storage import Storage
from calmkit_aggregator.service.store import ReportStore
from calmkit_client import CollectionError
from calmkit_client import wire as client_wire
from calmkit_client.collector import RetryPolicy, call_with_retry, open_channel
from calmkit_client.device import DeviceState
from calmkit_simulator import synthetic_population

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="needs SIGKILL")

POP = synthetic_population(n=40_000, sizes=(2, 3, 2, 2), strength=1.0, rng=8)
BATCH = 100
SERVE = "from calmkit_client.cli import main; raise SystemExit(main())"


_LOGS: dict[int, Any] = {}  # server pid -> its stderr (a temporary file)


def _start(db: str, snapshots: Path | None = None) -> tuple[subprocess.Popen[str], str]:
    extra = [] if snapshots is None else ["--key-snapshots", str(snapshots)]
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(  # faulthandler: a SIGABRT dumps every thread's stack
        [
            sys.executable,
            "-X",
            "faulthandler",
            "-c",
            SERVE,
            "serve",
            "--address",
            "127.0.0.1:0",
            "--db",
            db,
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )
    _LOGS[proc.pid] = log
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "listening on" in line, line
    return proc, line.split("listening on ")[1].split()[0]


def _stop(proc: subprocess.Popen[str]) -> None:
    """Stop a server gracefully (SIGTERM); one that has not exited after 30 s fails the
    test with its threads' stacks (SIGABRT, faulthandler) and the end of its log."""
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        proc.wait(timeout=30)
        log = _LOGS[proc.pid]
        log.seek(0)
        pytest.fail(
            "calmkit serve did not stop within 30 s of SIGTERM:\n"
            + log.read().decode(errors="replace")[-8000:]
        )
    assert code == 0


def _collection(address: str, tmp_path: Path) -> tuple[Any, list[Any], list[list[bytes]]]:
    """Create the collection; POP's batches (every other one in columns, made once
    and resent as they are) and their report ids."""
    with AdminClient(address) as admin:
        info = admin.create_collection(POP.schema, 1.0, POP.n, 2, collection_id="crash")
    device = DeviceState(tmp_path / "device.db")
    batches, ids = [], []
    for k, start in enumerate(range(0, POP.n, BATCH)):
        users = np.arange(start, min(start + BATCH, POP.n), dtype=np.uint64)
        items = device.reports_for("crash", info.plan, POP.codes[users], users)
        encode = client_wire.columnar_batch_to_proto if k % 2 else client_wire.batch_to_proto
        batches.append(encode("crash", info.plan.digest, items))
        ids.append([r.report_id for _, r in items])
    device.close()
    return info, batches, ids


def _crash_run(db: str, tmp_path: Path, replicas: int) -> tuple[set[bytes], int]:
    """Ingest POP through ``replicas`` servers on ``db`` (batch k to replica k % r,
    every other batch in columns), SIGKILL a replica 10 times at random moments and
    restart it, resend what lost its ack, stop gracefully; (acked ids, reports the
    service counted)."""
    rng = np.random.default_rng(2024)

    def launch(i: int) -> tuple[subprocess.Popen[str], str]:  # PostgreSQL: own key snapshots
        return _start(db, tmp_path / f"keys{i}" if db.startswith("postgresql:") else None)

    servers = [launch(i) for i in range(replicas)]
    info, batches, ids = _collection(servers[0][1], tmp_path)
    acked: set[bytes] = set()
    next_batch = 0
    kills = 0
    lost_acks = 0

    def ingest(stop: threading.Event) -> None:
        nonlocal next_batch, lost_acks
        channels = [open_channel(address) for _, address in servers]
        stubs = [client_wire.aggregator_stub(c) for c in channels]
        metadata = [("authorization", f"Bearer {info.submit_token}")]
        policy = RetryPolicy(attempts=1, timeout=5.0)
        while next_batch < len(batches) and not stop.is_set():
            batch = batches[next_batch]
            stub = stubs[next_batch % replicas]
            try:
                call = stub.SubmitColumnar if next_batch % 2 else stub.SubmitReports
                call_with_retry(call, batch, policy, metadata)
            except CollectionError:
                lost_acks += 1
                break  # a server died: this batch's ack is lost; resend it later
            acked.update(ids[next_batch])
            next_batch += 1
        for c in channels:
            c.close()

    # kill once ingest passes each of 10 random batch numbers, plus a random few ms
    for target in np.sort(rng.choice(np.arange(20, len(batches) - 20), 10, replace=False)):
        stop = threading.Event()
        worker = threading.Thread(target=ingest, args=(stop,))
        worker.start()
        while next_batch < target and worker.is_alive():
            time.sleep(0.0005)
        time.sleep(float(rng.uniform(0, 0.005)))
        victim = kills % replicas
        os.kill(servers[victim][0].pid, signal.SIGKILL)  # mid-ingest, no warning
        servers[victim][0].wait()
        stop.set()
        worker.join()
        kills += 1
        servers[victim] = launch(victim)
        if kills == 5:  # one graceful restart: later restarts load its key snapshots
            for i, (proc, _) in enumerate(servers):  # and the log after them
                _stop(proc)
                servers[i] = launch(i)
    assert kills == 10 and 0 < next_batch < len(batches) and lost_acks >= 1
    ingest(threading.Event())  # finish, resending the batch whose ack was lost
    assert next_batch == len(batches)
    with AdminClient(servers[-1][1]) as admin:
        counted = admin.get_collection("crash").reports
    for proc, _ in servers:
        _stop(proc)  # graceful this time
    assert acked == {rid for batch_ids in ids for rid in batch_ids}
    return acked, counted


def _assert_counts_audited(store: ReportStore) -> None:
    """The counts stored with each batch equal a recount of the batch log."""
    recount, counts = store.recount("crash"), store.support("crash")
    np.testing.assert_array_equal(recount.n, counts.n)
    for a, b in zip(recount.counts, counts.counts):
        np.testing.assert_array_equal(a, b)
    assert int(counts.n.sum()) == POP.n


def test_acknowledged_reports_survive_sigkill(tmp_path: Path) -> None:
    db = tmp_path / "agg.db"
    acked, counted = _crash_run(str(db), tmp_path, replicas=1)
    with sqlite3.connect(db) as conn:
        blobs = b"".join(r[0] for r in conn.execute("SELECT report_ids FROM batches"))
        stored = [blobs[i : i + 16] for i in range(0, len(blobs), 16)]
    assert len(stored) == len(set(stored)) == counted == POP.n  # each exactly once
    assert acked == set(stored)  # every ack counted, nothing invented
    with Storage(str(db)) as store:
        _assert_counts_audited(store)
        assert store.wait_ready(60) and store._entries["crash"].key_source == "snapshot"


def _assert_stored_once(dsn: str, acked: set[bytes], counted: int) -> None:
    """The log holds every report once, one per pseudonym, exactly the acknowledged
    ones; the counts equal a recount of the log."""
    import psycopg

    with psycopg.connect(dsn) as conn:
        blobs = b"".join(bytes(r[0]) for r in conn.execute("SELECT report_ids FROM batches"))
        pseudonyms = b"".join(bytes(r[0]) for r in conn.execute("SELECT pseudonyms FROM batches"))
    stored = [blobs[i : i + 16] for i in range(0, len(blobs), 16)]
    devices = {pseudonyms[i : i + 16] for i in range(0, len(pseudonyms), 16)}
    assert len(stored) == len(set(stored)) == len(devices) == counted == POP.n  # exactly once
    assert acked == set(stored)  # every ack counted, nothing invented
    with PgStorage(dsn) as store:
        _assert_counts_audited(store)


def test_replicas_on_postgres_survive_sigkill(tmp_path: Path, pg_dsn: str) -> None:
    """Two ``calmkit serve --db postgresql://...`` behind the client, killed in turn."""
    acked, counted = _crash_run(pg_dsn, tmp_path, replicas=2)
    _assert_stored_once(pg_dsn, acked, counted)
    assert all((tmp_path / f"keys{i}" / (b"crash".hex() + ".snap")).exists() for i in (0, 1))


def test_replicas_survive_sigkill_of_postgres(tmp_path: Path) -> None:
    """PostgreSQL itself (every process) SIGKILLed 6 times at random moments while two
    replicas ingest, then started again (crash recovery). Two senders, one per replica,
    so that each replica reads the other's rows as soon as they commit; after a crash
    each sender resends what got no answer to the other replica. The replicas reopen
    their broken connections; every acknowledged report is stored exactly once. The
    WAL writer waits 10 s between rounds, so that a crash loses whatever a commit did
    not flush itself (a batch acknowledged before its flush would be lost with it)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import pg

    reason = pg.available()
    if reason:
        pytest.skip(reason)
    server = pg.PgServer("-c wal_writer_delay=10s")
    servers: list[tuple[subprocess.Popen[str], str]] = []
    try:
        dsn = server.create_database()
        servers += [_start(dsn, tmp_path / f"keys{i}") for i in range(2)]
        info, batches, ids = _collection(servers[0][1], tmp_path)
        acked: set[bytes] = set()
        todo = [list(range(t, len(batches), 2)) for t in (0, 1)]  # sender t's batches
        turn = [0, 1]  # sender t sends to replica turn[t] % 2
        failed = [0]

        def send(t: int, stop: threading.Event) -> None:
            """Sender t: its batches in order until a call fails (its replica or the
            database died); the failed one is resent by the next round, elsewhere."""
            channels = [open_channel(address) for _, address in servers]
            stubs = [client_wire.aggregator_stub(c) for c in channels]
            metadata = [("authorization", f"Bearer {info.submit_token}")]
            policy = RetryPolicy(attempts=1, timeout=10.0)
            while todo[t] and not stop.is_set():
                k = todo[t][0]
                stub = stubs[turn[t] % 2]
                call = stub.SubmitColumnar if k % 2 else stub.SubmitReports
                try:
                    call_with_retry(call, batches[k], policy, metadata)
                except CollectionError:
                    failed[0] += 1
                    turn[t] += 1
                    break
                acked.update(ids[k])
                todo[t].pop(0)
            for c in channels:
                c.close()

        def ingest(stop: threading.Event) -> list[threading.Thread]:
            workers = [threading.Thread(target=send, args=(t, stop)) for t in (0, 1)]
            for w in workers:
                w.start()
            return workers

        def sent() -> int:
            return len(batches) - len(todo[0]) - len(todo[1])

        rng = np.random.default_rng(2025)
        for target in np.sort(rng.choice(np.arange(20, len(batches) - 20), 6, replace=False)):
            stop = threading.Event()
            workers = ingest(stop)
            while sent() < target and any(w.is_alive() for w in workers):
                time.sleep(0.0005)
            time.sleep(float(rng.uniform(0, 0.005)))
            server.crash()  # mid-ingest, no warning
            stop.set()
            for w in workers:
                w.join()
            server.start()
        for _ in range(200):  # finish: the first calls after a restart may fail once
            for w in ingest(threading.Event()):
                w.join()
            if sent() == len(batches):
                break
            time.sleep(0.05)
        assert sent() == len(batches) and failed[0] >= 6
        assert acked == {rid for batch_ids in ids for rid in batch_ids}
        with AdminClient(servers[1][1]) as admin:
            counted = admin.get_collection("crash").reports
        for proc, _ in servers:
            _stop(proc)
        _assert_stored_once(dsn, acked, counted)
    finally:
        for proc, _ in servers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        server.stop()


def _tgkill(pid: int, tid: int, sig: int) -> None:
    """Send ``sig`` to one thread ``tid`` of process ``pid`` (Linux ``tgkill``)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(234, pid, tid, sig) != 0:  # SYS_tgkill on x86-64
        raise OSError(ctypes.get_errno(), "tgkill failed")


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.uname().machine != "x86_64",
    reason="tgkill by syscall number: Linux x86-64",
)
def test_sigterm_to_any_thread_stops_the_server(tmp_path: Path) -> None:
    """The kernel hands a process's SIGTERM to any thread; one landing on a gRPC thread
    only marks Python's handler as pending, so the main thread must not wait without a
    timeout (it did: the server then ignored SIGTERM until a second signal)."""
    proc, _ = _start(str(tmp_path / "agg.db"))
    try:
        others = [
            int(t.name) for t in Path(f"/proc/{proc.pid}/task").iterdir() if int(t.name) != proc.pid
        ]
        assert others, "calmkit serve runs its gRPC server on other threads"
        _tgkill(proc.pid, others[-1], signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
