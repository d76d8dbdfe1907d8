"""A collection keeps the number of users it was planned for (``--n``) in both storage
backends, across a restart; a bad value is refused naming it; databases from before it
was stored open with 0 (a phased collection's design still knows it); the service
serves it, and the console and metrics measure progress against it."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest

from calmkit_aggregator.phases import PhasedDesign
from calmkit_aggregator.service.admin import AdminClient
from calmkit_aggregator.service.storage import Storage
from calmkit_client import CalmkitError, Plan, Schema
from tests.integration.servers import POP, Server, create_collection, sample, scrape

PLAN = Plan(Schema.from_sizes((2, 3, 2)), 1.0, [(0, 1), (1, 2)], seed=1)
TOKEN = hashlib.sha256(b"t").digest()
DESIGN = PhasedDesign(40_000, 8_000, 2)


def test_sqlite_keeps_the_expected_users_and_refuses_a_bad_value(tmp_path: Path) -> None:
    with Storage(tmp_path / "a.db") as s:
        s.create_collection("n", PLAN, 2, TOKEN, expected_n=12_345)
        s.create_collection("none", PLAN, 2, TOKEN)
        s.create_collection("phased", PLAN, 2, TOKEN, DESIGN, expected_n=40_000)
        with pytest.raises(CalmkitError, match=r"expected_n \(-5\) must be an int >= 0"):
            s.create_collection("bad", PLAN, 2, TOKEN, expected_n=-5)
        assert "bad" not in s
    with Storage(tmp_path / "a.db") as s:
        assert s.get_collection("n").expected_users == 12_345
        assert s.get_collection("none").expected_users == 0
        assert s.get_collection("phased").expected_users == 40_000


def test_a_version_5_sqlite_file_opens_with_no_expected_users(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with Storage(path) as s:
        s.create_collection("one", PLAN, 2, TOKEN)
        s.create_collection("phased", PLAN, 2, TOKEN, DESIGN)
    with sqlite3.connect(path) as conn:  # as a version 5 file was
        conn.execute("ALTER TABLE collections DROP COLUMN expected_n")
        conn.execute("PRAGMA user_version = 5")
    with Storage(path) as s:
        assert s.get_collection("one").expected_n == 0
        assert s.get_collection("phased").expected_users == 40_000  # from its design
        s.create_collection("new", PLAN, 2, TOKEN, expected_n=7)
    with Storage(path) as s:
        assert s.get_collection("new").expected_users == 7


def test_postgres_keeps_the_expected_users_and_migrates_version_4(pg_dsn: str) -> None:
    import psycopg

    from calmkit_aggregator.service.pg_storage import PgStorage

    with PgStorage(pg_dsn) as s:
        s.create_collection("n", PLAN, 2, TOKEN, expected_n=12_345)
        with pytest.raises(CalmkitError, match=r"expected_n \(True\) must be an int >= 0"):
            s.create_collection("bad", PLAN, 2, TOKEN, expected_n=True)
    with PgStorage(pg_dsn) as s:
        assert s.get_collection("n").expected_users == 12_345
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # as a version 4 database was
        conn.execute("ALTER TABLE collections DROP COLUMN expected_n")
        conn.execute("UPDATE calmkit_schema SET version = 4")
    with PgStorage(pg_dsn) as s:
        assert s.get_collection("n").expected_users == 0
        s.create_collection("new", PLAN, 2, TOKEN, expected_n=9)
        assert s.get_collection("new").expected_users == 9
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT version FROM calmkit_schema").fetchone()[0] == 5


def test_the_service_serves_it_and_measures_progress_against_it(tmp_path: Path) -> None:
    with Server(tmp_path, metrics_address="127.0.0.1:0", console_address="127.0.0.1:0") as srv:
        info = create_collection(srv.address, "one-phase")  # no pilot: one phase
        assert info.pilot_target == 0 and info.expected_n == POP.n
        with AdminClient(srv.address) as admin:
            assert admin.get_collection("one-phase").expected_n == POP.n
        assert srv.metrics_port is not None and srv.console_port is not None
        gauge = sample(
            scrape(srv.metrics_port), "calmkit_collection_expected_reports", collection="one-phase"
        )
        assert gauge == POP.n
        page = _console_page(srv.console_port)
        assert f"of {POP.n:,} (expected users (--n))" in page


def _console_page(port: int) -> str:
    """The console's collections page (no admin token: open on loopback)."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/")
    response = conn.getresponse()
    body = response.read().decode("utf-8")
    conn.close()
    assert response.status == 200, (response.status, body[:200])
    return body
