"""A throwaway PostgreSQL server for tests and benchmarks: ``initdb`` into a temp dir,
``pg_ctl start`` on a free loopback port, as an unprivileged user (PostgreSQL refuses to
run as root: under root the server runs as the ``postgres`` or ``nobody`` account), and
removed on stop. ``available()`` says why it cannot run here, or None."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

BINARIES = ("initdb", "pg_ctl", "postgres")


def _binary(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for root in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (root / name).exists():
            return str(root / name)
    return None


def available() -> str | None:
    """Why no throwaway server can start here (None: it can)."""
    missing = [b for b in BINARIES if _binary(b) is None]
    if missing:
        return f"PostgreSQL server binaries not found ({', '.join(missing)})"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install 'psycopg[binary]')"
    if os.geteuid() == 0 and _unprivileged() is None:
        return "running as root and no unprivileged account (postgres, nobody) to run the server"
    return None


def _unprivileged() -> pwd.struct_passwd | None:
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    return None


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, killed but not reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def server_pids(data: Path) -> list[int]:
    """The processes of the server on data directory ``data``: the postmaster (from
    its ``postmaster.pid``) and its children; none when it is not running."""
    try:
        main = int((data / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return []
    found = [main]
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == main:
                found.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgServer:
    """A running throwaway server; ``dsn(database)`` connects to it as superuser
    ``calmkit`` (trust auth on loopback only)."""

    def __init__(self, options: str = "") -> None:
        reason = available()
        if reason:
            raise RuntimeError(reason)
        self.dir = Path(tempfile.mkdtemp(prefix="calmkit-pg-"))
        self.data = self.dir / "data"
        self.port = _free_port()
        self._options = options  # more server options (``-c name=value ...``)
        self._as: list[str] = []
        if os.geteuid() == 0:
            user = _unprivileged()
            assert user is not None
            os.chown(self.dir, user.pw_uid, user.pw_gid)
            self._as = ["runuser", "-u", user.pw_name, "--"]
        self._run(
            _binary("initdb"),
            "-D",
            str(self.data),
            "-U",
            "calmkit",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
        )
        self.start()

    def start(self) -> None:
        """Start the server on its data directory (after :meth:`crash`: crash recovery)."""
        options = (
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 "
            "-c max_connections=200 -c shared_buffers=256MB -c max_wal_size=4GB "
            f"-c checkpoint_timeout=30min -c wal_compression=on {self._options}"
        )
        self._run(
            _binary("pg_ctl"),
            "-D",
            str(self.data),
            "-o",
            options,
            "-l",
            str(self.dir / "server.log"),
            "-w",
            "start",
        )

    def pids(self) -> list[int]:
        """The server's processes: the postmaster and its children."""
        return server_pids(self.data)

    def crash(self) -> None:
        """SIGKILL the postmaster and every server process at once (no shutdown, no
        flush of the WAL buffers: commits not yet written out are lost, as in a power
        cut after the kernel wrote what it had), and wait until they are gone."""
        procs = self.pids()
        for pid in procs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30  # gone, and reaped (a zombie postmaster's pid
        while any(Path(f"/proc/{pid}").exists() for pid in procs):  # blocks a new start)
            if time.monotonic() > deadline:
                if any(_alive(pid) for pid in procs):
                    raise RuntimeError("PostgreSQL processes did not die")
                (self.data / "postmaster.pid").unlink()  # dead but not reaped
                break
            time.sleep(0.01)

    def _run(self, *argv: str | None) -> None:
        done = subprocess.run([*self._as, *[a for a in argv if a]], capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"{Path(str(argv[0])).name} failed: {done.stdout}{done.stderr}")

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://calmkit@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str | None = None) -> str:
        """A new empty database; its DSN."""
        import psycopg

        name = name or f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.dsn(name)

    def stop(self) -> None:
        """Stop at once (``immediate``: no shutdown checkpoint, whose fsync of every
        database's files takes a minute after a test session) and remove the data."""
        try:
            self._run(_binary("pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
