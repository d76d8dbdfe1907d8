"""Both storage backends keep a collection's admission (scheme and key) across a
restart, refuse a bad one, and open databases made before admission existed."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest

from calmkit_aggregator.service.storage import SCHEMA_VERSION, Storage
from calmkit_client import CalmkitError, Plan, Schema
from calmkit_client.tickets import TicketIssuer, generate_ed25519_key, generate_hmac_key

PLAN = Plan(Schema.from_sizes((2, 3, 2)), 1.0, [(0, 1), (1, 2)], seed=1)
TOKEN = hashlib.sha256(b"t").digest()


def _verifiers() -> list:
    return [
        TicketIssuer.ed25519(generate_ed25519_key()[0]).verifier(),
        TicketIssuer.hmac(generate_hmac_key()).verifier(),
        TicketIssuer.aes(generate_hmac_key()).verifier(),
    ]


def test_sqlite_keeps_the_admission(tmp_path: Path) -> None:
    ed, mac, aes = _verifiers()
    with Storage(tmp_path / "a.db") as s:
        s.create_collection("e", PLAN, 2, TOKEN, admission=ed)
        s.create_collection("h", PLAN, 2, TOKEN, admission=mac)
        s.create_collection("a", PLAN, 2, TOKEN, admission=aes)
        s.create_collection("none", PLAN, 2, TOKEN)
        with pytest.raises(CalmkitError, match=r"admission \('ed25519'\) must be a TicketVerifier"):
            s.create_collection("bad", PLAN, 2, TOKEN, admission="ed25519")  # type: ignore[arg-type]
        assert "bad" not in s
    with Storage(tmp_path / "a.db") as s:
        assert s.get_collection("e").admission == ed
        assert s.get_collection("h").admission == mac
        assert s.get_collection("a").admission == aes
        assert s.get_collection("none").admission is None


def test_a_version_4_sqlite_file_gets_the_admissions_table(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with Storage(path) as s:
        s.create_collection("old", PLAN, 2, TOKEN)
    with sqlite3.connect(path) as conn:  # as a version 4 file was
        conn.execute("DROP TABLE admissions")
        conn.execute("ALTER TABLE collections DROP COLUMN expected_n")
        conn.execute("PRAGMA user_version = 4")
    (ed,) = _verifiers()[:1]
    with Storage(path) as s:
        assert s.get_collection("old").admission is None
        s.create_collection("new", PLAN, 2, TOKEN, admission=ed)
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 6
    with Storage(path) as s:
        assert s.get_collection("new").admission == ed


def test_postgres_keeps_the_admission_and_migrates_version_3(pg_dsn: str) -> None:
    import psycopg

    from calmkit_aggregator.service.pg_storage import PG_SCHEMA_VERSION, PgStorage

    ed, mac, _ = _verifiers()
    with PgStorage(pg_dsn) as s:
        s.create_collection("e", PLAN, 2, TOKEN, admission=ed)
        s.create_collection("none", PLAN, 2, TOKEN)
    with PgStorage(pg_dsn) as s:
        assert s.get_collection("e").admission == ed
        assert s.get_collection("none").admission is None
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # as a version 3 database was
        conn.execute("DELETE FROM admissions")
        conn.execute("DROP TABLE admissions")
        conn.execute("ALTER TABLE collections DROP COLUMN expected_n")
        conn.execute("UPDATE calmkit_schema SET version = 3")
    with PgStorage(pg_dsn) as s:
        assert s.get_collection("e").admission is None
        s.create_collection("h", PLAN, 2, TOKEN, admission=mac)
        assert s.get_collection("h").admission == mac
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT version FROM calmkit_schema").fetchone()[0] == 5
    assert PG_SCHEMA_VERSION == 5
