"""``calmkit serve`` refuses a bad start before it creates anything: a malformed
``--address``, a non-loopback one without TLS, a port in use, a password in ``--db``;
and a refused start leaves no database file behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from calmkit_aggregator.service.server import create_server, graceful_stop
from calmkit_aggregator.service.storage import Storage
from calmkit_client import CalmkitError
from calmkit_client.cli import main

BAD_ADDRESSES = (
    "127.0.0.1:70000",
    ":-1",
    "localhost",
    "127.0.0.1:",
    ":50051",
    "::1:50051",
    "127.0.0.1:+80",
    "127.0.0.1:0x50",
    "host name:80",
)


def _serve(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    code = main(["serve", *argv])
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize("address", BAD_ADDRESSES)
def test_a_bad_address_is_refused_naming_it_and_creates_no_file(
    address: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _serve(["--address", address, "--db", str(tmp_path / "a.db")], capsys)
    assert code == 2
    assert err == [
        f"calmkit: error: address ({address!r}) must be HOST:PORT with a port in 1-65535 "
        "(0: any free port; an IPv6 host in brackets, [::1]:50051)"
    ]
    assert os.listdir(tmp_path) == []
    with Storage(tmp_path / "b.db") as storage, pytest.raises(CalmkitError, match="1-65535"):
        create_server(address, storage)


def test_bracketed_ipv6_and_port_0_are_accepted(tmp_path: Path) -> None:
    with Storage(tmp_path / "a.db") as storage:
        for address in ("[::1]:0", "127.0.0.1:0", "localhost:0"):
            try:
                server, port = create_server(address, storage)
            except CalmkitError as exc:  # a machine without IPv6 cannot bind ::1
                assert "could not be bound" in str(exc) and address.startswith("[")
                continue
            assert 1 <= port <= 65535
            graceful_stop(server, 1.0)


def test_a_refused_start_leaves_no_database_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "new.db"
    # beyond loopback without TLS (with a token): refused before the store is created
    token = tmp_path / "token"
    token.write_text("t" * 32)
    token.chmod(0o600)
    code, err = _serve(
        ["--address", "0.0.0.0:0", "--db", str(db), "--token-file", str(token)], capsys
    )
    assert code == 2 and "is not loopback" in err[0]
    # the port in use: refused before the store is opened
    with Storage(tmp_path / "other.db") as storage:
        server, port = create_server("127.0.0.1:0", storage)
        try:
            code, err = _serve(["--address", f"127.0.0.1:{port}", "--db", str(db)], capsys)
        finally:
            graceful_stop(server, 1.0)
    assert code == 2 and "could not be bound" in err[0]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("new")) == []
    # an existing database is left as it was
    Storage(db).close()
    before = sorted(p.name for p in tmp_path.iterdir())
    with Storage(tmp_path / "other.db") as storage:
        server, port = create_server("127.0.0.1:0", storage)
        try:
            code, err = _serve(["--address", f"127.0.0.1:{port}", "--db", str(db)], capsys)
        finally:
            graceful_stop(server, 1.0)
    assert code == 2 and db.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_port_in_use_creates_no_postgres_tables(
    pg_dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import psycopg

    with Storage(tmp_path / "other.db") as storage:
        server, port = create_server("127.0.0.1:0", storage)
        try:
            code, err = _serve(["--address", f"127.0.0.1:{port}", "--db", pg_dsn], capsys)
        finally:
            graceful_stop(server, 1.0)
    assert code == 2 and "could not be bound" in err[0]
    with psycopg.connect(pg_dsn) as conn:
        tables = conn.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'"
        ).fetchone()
    assert tables == (0,)  # the schema was never created


@pytest.mark.parametrize(
    "db",
    [
        "postgresql://calmkit:s3cret@127.0.0.1:1/agg",
        "postgresql://calmkit@127.0.0.1:1/agg?password=s3cret",
    ],
)
def test_a_password_in_db_is_refused_saying_how_to_pass_it(
    db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("psycopg")
    code, err = _serve(["--address", "127.0.0.1:0", "--db", db], capsys)
    assert code == 2 and len(err) == 1
    assert "must not hold a password" in err[0] and "visible in ps" in err[0]
    assert "PGPASSWORD" in err[0] and "--db-password-file" in err[0]
    assert "s3cret" not in err[0]


def test_the_db_password_file_is_a_secret_for_postgres_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = tmp_path / "pw"
    secret.write_text("s3cret\n")
    secret.chmod(0o644)
    pg = "postgresql://calmkit@127.0.0.1:1/agg"
    code, err = _serve(["--db", pg, "--db-password-file", str(secret)], capsys)
    assert code == 2 and "must not be readable by other users" in err[0]
    secret.chmod(0o600)
    code, err = _serve(["--db", str(tmp_path / "a.db"), "--db-password-file", str(secret)], capsys)
    assert code == 2 and "db_password_file must go with a postgresql:// db" in err[0]
    assert not (tmp_path / "a.db").exists()
