"""Storage faults in a real service: a full disk is RESOURCE_EXHAUSTED and a lost
database UNAVAILABLE, each with a plain message (no exception class, no connection
string); the Collector retries both and every acknowledged report is stored once."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from calmkit_aggregator.service.server import create_server, graceful_stop
from calmkit_client import CalmkitError
from calmkit_client import wire as client_wire
from calmkit_client.collector import Collector, RetryPolicy, call_with_retry, open_channel
from calmkit_client.device import DeviceState
from calmkit_client.errors import CollectionError, ServiceUnavailable, StorageFull
from tests.integration.servers import IDS, POP, Server, create_collection

FORBIDDEN = ("Error", "sqlite", "psycopg", "postgres", "calmkit@", "127.0.0.1", "Traceback")


def _fill_disk(server: Server) -> int:
    """Cap the store's database at its current size: the next insert is SQLITE_FULL
    ("database or disk is full"), as on a full disk. Returns the old cap."""
    conn = server.storage._conn
    assert conn is not None
    with server.storage._lock:
        old = int(conn.execute("PRAGMA max_page_count").fetchone()[0])
        pages = int(conn.execute("PRAGMA page_count").fetchone()[0])
        conn.execute(f"PRAGMA max_page_count = {pages}")
    return old


def _free_disk(server: Server, cap: int) -> None:
    conn = server.storage._conn
    assert conn is not None
    with server.storage._lock:
        conn.execute(f"PRAGMA max_page_count = {cap}")


def test_disk_full_is_resource_exhausted_and_the_collector_retries(
    server: Server, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="calmkit.aggregator")
    info = create_collection(server.address)
    users = slice(0, 400)
    state = DeviceState.in_memory()
    items = state.reports_for("c1", info.plan, POP.codes[users], IDS[users])
    batch = client_wire.batch_to_proto("c1", info.plan.digest, items)
    metadata = [("authorization", f"Bearer {info.submit_token}")]
    stub = client_wire.aggregator_stub(open_channel(server.address))
    cap = _fill_disk(server)
    # one try: the status is RESOURCE_EXHAUSTED, named StorageFull, a plain message
    with pytest.raises(StorageFull) as err:
        call_with_retry(stub.SubmitReports, batch, RetryPolicy(attempts=1), metadata)
    message = str(err.value)
    assert "storage is full" in message and "retry" in message
    assert not any(word.lower() in message.lower() for word in FORBIDDEN), message
    assert int(server.storage.support("c1").n.sum()) == 0  # refused whole
    assert '"event": "storage_fault"' in caplog.text  # the details: in the server's log
    assert "database or disk is full" in caplog.text
    # the Collector rides it out: space comes back after a second, the batch goes in
    timer = threading.Timer(1.0, _free_disk, (server, cap))
    timer.start()
    started = time.monotonic()
    try:
        with Collector(server.address, "c1", info.submit_token, state) as client:
            ack = client.submit_many(POP.codes[users], IDS[users])
    finally:
        timer.cancel()
    assert time.monotonic() - started >= 0.9
    assert (ack.accepted, ack.duplicates) == (400, 0)
    assert int(server.storage.support("c1").n.sum()) == 400


def test_a_locked_sqlite_database_is_unavailable_with_a_plain_message(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sqlite3

    info = create_collection(server.address)

    def locked(*args: object, **kwargs: object) -> object:
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(server.storage, "get_collection", locked)
    stub = client_wire.aggregator_stub(open_channel(server.address))
    with pytest.raises(ServiceUnavailable) as err:
        call_with_retry(stub.GetPlan, client_wire.collection_ref("c1"), RetryPolicy(attempts=1))
    assert "database is unavailable" in str(err.value)
    assert not any(word.lower() in str(err.value).lower() for word in FORBIDDEN)
    assert info.submit_token


class _Failed(grpc.RpcError):
    """A failed call as the client sees it: a code, a message, the error's name."""

    def __init__(self, code: grpc.StatusCode, name: str = "") -> None:
        self._code, self._name = code, name

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return "down"

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("calmkit-error", self._name),) if self._name else ()


def _always(error: _Failed) -> tuple[list[float], BaseException]:
    """Retry a call that always fails with ``error`` under the default policy on a fake
    clock; return the waits and the error raised in the end."""
    now = [0.0]
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        now[0] += seconds

    def call(request: object, timeout: float, metadata: object) -> str:
        raise error

    with pytest.raises(CollectionError) as err:
        call_with_retry(call, None, RetryPolicy(), sleep=sleep, clock=lambda: now[0])
    return sleeps, err.value


def test_the_default_policy_retries_faults_for_a_minute_with_jitter() -> None:
    for error, cls in (
        (_Failed(grpc.StatusCode.UNAVAILABLE), ServiceUnavailable),
        (_Failed(grpc.StatusCode.UNAVAILABLE, "ServiceUnavailable"), ServiceUnavailable),
        (_Failed(grpc.StatusCode.RESOURCE_EXHAUSTED, "StorageFull"), StorageFull),
    ):
        sleeps, raised = _always(error)
        assert type(raised) is cls and "still failing after" in str(raised)
        assert 55.0 <= sum(sleeps) <= 60.0  # rides out a 10-13 s database restart
        # jittered: each wait in [w/2, w] of its exponential step, and not all equal
        steps = [min(0.1 * 2.0**i, 5.0) for i in range(len(sleeps))]
        assert all(s / 2 <= w <= s for w, s in zip(sleeps, steps))
        assert len({round(w, 6) for w in sleeps[-5:]}) > 1
    # a message over the size limit (RESOURCE_EXHAUSTED without a name) fails at once
    sleeps, raised = _always(_Failed(grpc.StatusCode.RESOURCE_EXHAUSTED))
    assert sleeps == [] and "RESOURCE_EXHAUSTED" in str(raised)
    with pytest.raises(CalmkitError, match=r"total \(0\) must be finite and > 0"):
        RetryPolicy(total=0)
    with pytest.raises(CalmkitError, match=r"jitter \(2\) must be in \[0, 1\]"):
        RetryPolicy(jitter=2)


@pytest.fixture
def own_pg() -> Iterator[object]:
    """A PostgreSQL server of this test's own, to stop and restart (tests/pg.py)."""
    sys.path.insert(0, str(Path(__file__).parents[1]))
    import pg

    reason = pg.available()
    if reason:
        pytest.skip(reason)
    server = pg.PgServer()
    yield server
    with contextlib.suppress(RuntimeError):  # already down when the test failed mid-way
        server.stop()


def test_postgres_restart_is_unavailable_then_ridden_out(
    own_pg: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from calmkit_aggregator.service.pg_storage import PgStorage

    dsn = own_pg.create_database("faults")
    store = PgStorage(dsn)
    server, port = create_server("127.0.0.1:0", store)
    address = f"127.0.0.1:{port}"
    try:
        info = create_collection(address)
        first = slice(0, 300)
        with Collector(address, "c1", info.submit_token, DeviceState.in_memory()) as client:
            assert client.submit_many(POP.codes[first], IDS[first]).accepted == 300
        own_pg.crash()  # PostgreSQL gone: a token-less GetPlan learns nothing of it
        stub = client_wire.aggregator_stub(open_channel(address))
        ref = client_wire.collection_ref("c1")
        for _ in range(2):  # the call that finds the connection broken, then a reconnect
            with pytest.raises(ServiceUnavailable) as err:
                call_with_retry(stub.GetPlan, ref, RetryPolicy(attempts=1))
            message = str(err.value)
            assert "database is unavailable" in message
            for part in ("calmkit", "127.0.0.1", str(own_pg.port), "faults", "Error"):
                assert part not in message, message
        assert "connection" in caplog.text.lower()  # the details are in the server's log
        # PostgreSQL back within the retry budget: the Collector's submit goes through
        timer = threading.Timer(3.0, own_pg.start)
        timer.start()
        second = slice(300, 900)
        try:
            with Collector(address, "c1", info.submit_token, DeviceState.in_memory()) as client:
                ack = client.submit_many(POP.codes[second], IDS[second])
        finally:
            timer.join()
        assert (ack.accepted, ack.duplicates) == (600, 0)
        assert int(store.support("c1").n.sum()) == 900  # each acknowledged report once
        with PgStorage(dsn) as fresh:  # and so says the database itself
            assert fresh.get_collection("c1").reports == 900
    finally:
        graceful_stop(server, 2.0)
        store.close()


def test_a_password_reaches_postgres_from_the_environment_or_a_file_only(
    own_pg: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pg
    import psycopg

    from calmkit_aggregator.service.pg_storage import PgStorage

    dsn = own_pg.create_database("secret")
    with psycopg.connect(own_pg.dsn(), autocommit=True) as conn:
        conn.execute("ALTER ROLE calmkit PASSWORD 'pw-4711'")
    (own_pg.data / "pg_hba.conf").write_text(
        "local all all trust\nhost all all 127.0.0.1/32 scram-sha-256\n"
    )
    own_pg._run(pg._binary("pg_ctl"), "-D", str(own_pg.data), "-w", "reload")
    time.sleep(0.5)
    monkeypatch.delenv("PGPASSWORD", raising=False)
    monkeypatch.setenv("PGPASSFILE", str(tmp_path / "none"))
    with pytest.raises(CalmkitError, match="cannot be opened") as err:
        PgStorage(dsn)  # no password anywhere: refused by the server
    assert "pw-4711" not in str(err.value)
    with PgStorage(dsn, password="pw-4711") as store:  # --db-password-file's way
        assert store.list_collections() == []
    monkeypatch.setenv("PGPASSWORD", "pw-4711")  # libpq's own way
    with PgStorage(dsn) as store:
        assert store.list_collections() == []
    monkeypatch.delenv("PGPASSWORD")
    passfile = tmp_path / "pgpass"
    passfile.write_text(f"127.0.0.1:{own_pg.port}:secret:calmkit:pw-4711\n")
    passfile.chmod(0o600)
    monkeypatch.setenv("PGPASSFILE", str(passfile))
    with PgStorage(dsn) as store:
        assert store.list_collections() == []
    _serve_with_a_password_file(dsn, tmp_path)


def _serve_with_a_password_file(dsn: str, tmp_path: Path) -> None:
    """`calmkit serve --db-password-file` end to end: the server starts on a
    password-only PostgreSQL, the password is in no process argument, and a
    collection can be created through it."""
    import re
    import signal
    import subprocess
    import sys

    from calmkit_aggregator.service.admin import AdminClient

    secret = tmp_path / "db.password"
    secret.write_text("pw-4711\n")
    secret.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if k != "PGPASSWORD"}
    env["PGPASSFILE"] = str(tmp_path / "none")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "calmkit_client.cli",
            "serve",
            "--address",
            "127.0.0.1:0",
            "--db",
            dsn,
            "--db-password-file",
            str(secret),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        match = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
        assert match, (line, proc.stderr.read() if proc.stderr else "")
        argv = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        assert b"pw-4711" not in argv  # what ps shows
        with AdminClient(f"127.0.0.1:{match.group(1)}") as admin:
            info = admin.create_collection(POP.schema, 1.0, 1000, 2, collection_id="pw", pilot=0.0)
        assert info.collection_id == "pw"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "pw-4711" not in err


def test_logged_details_never_show_a_password() -> None:
    from calmkit_aggregator.service.faults import mask_secrets

    for text in (
        "connection to postgresql://calmkit:s3cret@db.example/agg failed",
        "host=db port=5432 password=s3cret user=calmkit",
        "host=db password = 's3cret x' user=calmkit",
    ):
        masked = mask_secrets(text)
        assert "s3cret" not in masked and "***" in masked and "calmkit" in masked


def test_each_storage_fault_gets_its_code() -> None:
    import errno
    import sqlite3

    from calmkit_aggregator.service.faults import as_fault

    psycopg = pytest.importorskip("psycopg")

    full = (
        sqlite3.OperationalError("database or disk is full"),
        OSError(errno.ENOSPC, "No space left on device"),
    )
    lost = (
        sqlite3.OperationalError("database is locked"),
        sqlite3.OperationalError("unable to open database file"),
        psycopg.OperationalError("connection refused"),
        psycopg.errors.AdminShutdown("terminating connection due to administrator command"),
    )
    for exc in full:
        assert type(as_fault(exc)) is StorageFull
    for exc in lost:
        assert type(as_fault(exc)) is ServiceUnavailable
    for exc in (sqlite3.OperationalError("no such table: x"), OSError(errno.EACCES, "no")):
        assert as_fault(exc) is None  # a bug, not a fault: INTERNAL, not retried


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 3 MiB tmpfs: a real file system that runs out of space (ENOSPC). Needs
    the right to mount (root with CAP_SYS_ADMIN); skips saying so otherwise."""
    import subprocess

    where = tmp_path / "tiny"
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if done.returncode:
        pytest.skip(f"cannot mount a small tmpfs here ({done.stderr.strip()[:80]})")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_a_real_full_disk_refuses_whole_batches_and_keeps_every_acknowledged_one(
    tiny_disk: Path,
) -> None:
    """Batches until the file system is full: each is acknowledged or refused whole
    with StorageFull (nothing retried here), and after a restart every acknowledged
    report is there, no more."""
    from calmkit_aggregator.service.storage import Storage

    storage = Storage(tiny_disk / "agg.db")
    server, port = create_server("127.0.0.1:0", storage)
    address = f"127.0.0.1:{port}"
    acknowledged, refused = 0, 0
    try:
        info = create_collection(address, max_reports=10**7)  # the disk, not the cap
        metadata = [("authorization", f"Bearer {info.submit_token}")]
        stub = client_wire.aggregator_stub(open_channel(address))
        state = DeviceState.in_memory()
        for start in range(0, 400_000, 2000):
            ids = list(range(10**6 + start, 10**6 + start + 2000))
            codes = POP.codes[[i % POP.n for i in range(start, start + 2000)]]
            items = state.reports_for("c1", info.plan, codes, ids)
            batch = client_wire.columnar_batch_to_proto("c1", info.plan.digest, items)
            try:
                call = stub.SubmitColumnar
                ack = call_with_retry(call, batch, RetryPolicy(attempts=1), metadata)
                acknowledged += ack.accepted
            except StorageFull as exc:
                refused += 1
                assert not any(w.lower() in str(exc).lower() for w in FORBIDDEN), str(exc)
                if refused >= 3:
                    break
        assert acknowledged > 0 and refused >= 3  # the disk did fill up
    finally:
        graceful_stop(server, 2.0)
        storage.close()
    with Storage(tiny_disk / "agg.db") as reopened:
        assert int(reopened.support("c1").n.sum()) == acknowledged
