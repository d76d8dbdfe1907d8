"""The aggregator service at scale: ingest rate as the store grows, bytes written per
report, restart time, health under full ingest, against the previous design.

    python benchmarks/bench_service.py [--reports 10000000] [--clients 4] [--batch 1000]
        [--baseline-reports 300000] [--baseline-ref 12bb76a] [--reps 5]
        [--postgres-replicas 1 2] [--postgres-reports 2000000]
        [--postgres-baseline-ref 406b95c]

A real ``calmkit serve`` process (SQLite, a fresh database) and ``--clients`` client
processes, each sending pre-built batches of ``--batch`` reports back to back over
loopback gRPC; the main process checks health every 20 ms meanwhile. Reports are
random but valid for the plan (8 attributes, 5 pair views, four GRR and one OUE), each
with its own random report id and pseudonym, so every one is new.

current: ``SubmitColumnar`` batches into the append-only batch log (schema 3).
baseline: the code at ``--baseline-ref`` (per-report ``ReportBatch`` messages into one
row per report under two random-key B-trees, schema 2), checked out with ``git worktree``
and run the same way, for ``--baseline-reports`` reports (it slows as it grows).

Printed per design, each figure the median over ``--reps`` fresh runs: acknowledged
reports/s overall and per window of the store's size,
the last window's rate over the first's, bytes the server process wrote (from
``/proc/PID/io``) per report and per stored byte, health p50/p99/max, and after a
restart: seconds until the port answers health and a query (serving) and until a new
report is accepted. Bytes written count the server processes during ingest and their
graceful stop (SQLite: the key snapshots) and, on PostgreSQL, the database's
processes during ingest (WAL and what it flushed): the kernel's per-process
``write_bytes``, which overcounts rewritten page-cache folios. *disk* is what reached the
block device holding the store (after a ``CHECKPOINT`` on PostgreSQL and a ``sync``),
during ingest and the graceful stop, from every process on the machine (run it on a
quiet one). And CPU seconds per 1000 reports
of the server processes, the clients and (PostgreSQL) the database's processes, with
the cores they kept busy and the cores the same work would need at 150,000 reports/s.

PostgreSQL: a throwaway PostgreSQL 15 server (tests/pg.py: a temp dir, loopback, as an
unprivileged user) with 1 and 2 ``calmkit serve`` replicas, the clients spread over
them. The current design (the
batch log, deduplication in each replica's memory) and the previous one at
``--postgres-baseline-ref`` (every key under two unique indexes) run alternately, rep
by rep, so both see the same machine.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]
SIZES = (2, 3, 2, 2, 4, 2, 3, 2)
VIEWS = ((0, 1), (2, 3), (4, 5), (6, 7), (1, 4))
BASELINE_REF = "12bb76a"  # the last commit with schema 2 and ReportBatch only
PG_BASELINE_REF = "406b95c"  # the last commit with every key under unique indexes in PG
TARGET_RATE = 150_000  # reports/s: the PostgreSQL target, for the cores it would take
PACKAGES = ("client", "aggregator", "simulator", "protos")


# -- a server process -------------------------------------------------------------------------
def _serve(
    code: Path, db: Path | str, snapshots: Path | None = None
) -> tuple[subprocess.Popen[str], str]:
    """A ``calmkit serve`` of ``code`` on ``db``; ``snapshots``: its ``--key-snapshots``
    folder (PostgreSQL, when ``code`` has the option)."""
    path = ":".join(str(code / p) for p in PACKAGES)
    boot = (
        f"import sys; sys.path[:0] = {path.split(':')!r}; "
        "from calmkit_client.cli import main; raise SystemExit(main())"
    )
    cli = code / "simulator" / "calmkit_simulator" / "cli.py"
    extra = []
    if snapshots is not None and "--key-snapshots" in cli.read_text():
        extra = ["--key-snapshots", str(snapshots)]
    proc = subprocess.Popen(
        [sys.executable, "-c", boot, "serve", "--address", "127.0.0.1:0", "--db", str(db), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.search(r"listening on (\S+)", line)
    if not match:
        raise SystemExit(f"server did not start: {line!r}")
    return proc, match.group(1)


def _cpu(pids: list[int]) -> dict[int, float]:
    """CPU seconds (user + system) each live process has used so far (Linux)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[pid] = (int(fields[11]) + int(fields[12])) / tick
    return out


def _postgres_pids(data: Path) -> list[int]:
    """The PostgreSQL server's processes: the postmaster and its children."""
    sys.path.insert(0, str(ROOT / "tests"))
    import pg

    return pg.server_pids(data)


def _used(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds used between two samples (processes started meanwhile count whole)."""
    return sum(t - before.get(pid, 0.0) for pid, t in after.items())


def _wal(db: Path | str) -> float:
    """PostgreSQL's WAL bytes so far (``pg_stat_wal``); 0 for SQLite."""
    if not str(db).startswith("postgresql:"):
        return 0.0
    import psycopg

    with psycopg.connect(str(db)) as conn:
        row = conn.execute("SELECT wal_bytes FROM pg_stat_wal").fetchone()
    return float(row[0]) if row else 0.0


def _disk_written(path: Path | str) -> int:
    """Bytes written so far to the block device holding ``path``, after a ``sync``:
    what reached the disk (WAL, data, file-system journal), from every process on the
    machine, so read it on a quiet one. The per-process ``write_bytes`` of
    ``/proc/PID/io`` counts a whole page-cache folio each time a written-back one is
    dirtied again; with large folios (ext4 on Linux >= 6.16) a commit that rewrites the
    tail of the WAL is counted several times over."""
    os.sync()
    dev = os.stat(path).st_dev
    stat = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/stat")
    try:
        return int(stat.read_text().split()[6]) * 512  # sectors written
    except (OSError, IndexError, ValueError):
        return 0


def _checkpoint(db: Path | str) -> None:
    """PostgreSQL: write every dirty page now (``CHECKPOINT``); nothing for SQLite."""
    if not str(db).startswith("postgresql:"):
        return
    import psycopg

    with psycopg.connect(str(db), autocommit=True) as conn:
        conn.execute("CHECKPOINT")


def _written(pid: int) -> int:
    """Bytes the process caused to be written to storage so far (Linux)."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("write_bytes:"):
            return int(line.split()[1])
    return 0


def _health(address: str, timeout: float = 2.0) -> float | None:
    """Seconds one health check took (None: it failed)."""
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        t0 = time.perf_counter()
        try:
            stub.Check(health_pb2.HealthCheckRequest(), timeout=timeout)
        except grpc.RpcError:
            return None
        return time.perf_counter() - t0


# -- clients -------------------------------------------------------------------------------------
def _batches(plan_json: str, count: int, batch: int, seed: int, columnar: bool) -> list[bytes]:
    """Serialized request messages of random valid reports (built before timing)."""
    from calmkit_client import Plan
    from calmkit_proto.v1 import calmkit_pb2 as pb

    plan = Plan.from_json(plan_json)
    rng = np.random.default_rng(seed)
    limits = np.array([o.L for o in plan.view_oracles])
    grr = np.array([o.name == "GRR" for o in plan.view_oracles])
    nbytes = (limits + 7) // 8
    out = []
    for start in range(0, count, batch):
        n = min(batch, count - start)
        views = rng.integers(0, plan.m, n)
        cells = rng.integers(0, 1 << 30, n) % limits[views]
        ids, pseudonyms = rng.bytes(16 * n), rng.bytes(16 * n)
        oue_bytes = [bytes(int(nbytes[v])) for v in views[~grr[views]]]
        if columnar:
            msg = pb.ColumnarBatch(
                collection_id="scale",
                plan_digest=plan.digest,
                count=n,
                views=views.astype("<u4").tobytes(),
                cells=cells[grr[views]].astype("<u4").tobytes(),
                bits=b"".join(oue_bytes),
                report_ids=ids,
                pseudonyms=pseudonyms,
            )
        else:
            oue = iter(oue_bytes)
            reports = [
                pb.Report(
                    view=int(v),
                    report_id=ids[16 * i : 16 * i + 16],
                    pseudonym=pseudonyms[16 * i : 16 * i + 16],
                    **({"cell": int(c)} if grr[v] else {"bits": next(oue)}),
                )
                for i, (v, c) in enumerate(zip(views, cells))
            ]
            msg = pb.ReportBatch(collection_id="scale", plan_digest=plan.digest, reports=reports)
        out.append(msg.SerializeToString())
    return out


def _client(
    address: str,
    token: str,
    plan_json: str,
    count: int,
    batch: int,
    seed: int,
    columnar: bool,
    ready: mp.Barrier,
    out: mp.Queue,
) -> None:
    messages = _batches(plan_json, count, batch, seed, columnar)
    method = "SubmitColumnar" if columnar else "SubmitReports"
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(f"/calmkit.v1.Aggregator/{method}")
        metadata = (("authorization", f"Bearer {token}"),)
        ready.wait()
        done = []
        cpu0 = time.process_time()
        for message in messages:
            call(message, metadata=metadata, timeout=60)
            done.append(time.time())
    out.put((done, time.process_time() - cpu0))


# -- one design ----------------------------------------------------------------------------------
def _measure(
    code: Path,
    tmp: Path,
    reports: int,
    clients: int,
    batch: int,
    columnar: bool,
    windows: int,
    replicas: int = 0,
) -> dict[str, float]:
    """One fresh run; ``replicas`` > 0: that many servers on a throwaway PostgreSQL
    (clients spread over them), else one server on SQLite."""
    pg_server = None  # (the server process runs ``code``; clients and admin run this checkout)
    if replicas:
        sys.path.insert(0, str(ROOT / "tests"))
        import pg

        pg_server = pg.PgServer()
        db: Path | str = pg_server.create_database()
    else:
        db = tmp / "agg.db"
    try:
        return _ingest(
            code,
            db,
            reports,
            clients,
            batch,
            columnar,
            windows,
            max(replicas, 1),
            None if pg_server is None else pg_server.data,
        )
    finally:
        if pg_server is not None:
            pg_server.stop()


def _ingest(
    code: Path,
    db: Path | str,
    reports: int,
    clients: int,
    batch: int,
    columnar: bool,
    windows: int,
    replicas: int,
    pg_data: Path | None,
) -> dict[str, float]:
    from calmkit_aggregator.service.admin import AdminClient
    from calmkit_client import Schema

    folders = (
        [None] * replicas
        if pg_data is None
        else [pg_data.parent / f"keys{i}" for i in range(replicas)]
    )
    servers = [_serve(code, db, folder) for folder in folders]
    disk_path = pg_data if pg_data is not None else Path(db).parent  # the store's device
    address = servers[0][1]
    with AdminClient(address) as admin:
        info = admin.create_collection(
            Schema.from_sizes(SIZES), 1.0, reports, 2, collection_id="scale", views=VIEWS, seed=1
        )
    plan_json = info.plan.to_json()
    ctx = mp.get_context("spawn")
    ready, out = ctx.Barrier(clients + 1), ctx.Queue()
    addresses = [servers[i % replicas][1] for i in range(clients)]
    procs = _client_processes(
        ctx, addresses, info.submit_token, plan_json, reports, batch, columnar, ready, out
    )
    for p in procs:
        p.start()
    wal0 = _wal(db)
    disk0 = _disk_written(disk_path)  # its sync done before any client sends
    ready.wait()
    db_pids = _postgres_pids(pg_data) if pg_data is not None else []
    written0 = sum(_written(p.pid) for p, _ in servers)
    db_written0 = {pid: _written(pid) for pid in db_pids}
    t0 = time.time()
    server_cpu0 = _cpu([p.pid for p, _ in servers])
    db_cpu0 = _cpu(_postgres_pids(pg_data)) if pg_data is not None else {}
    probes: list[float | None] = []
    stop = threading.Event()

    def probe() -> None:
        while not stop.is_set():
            probes.append(_health(address))
            time.sleep(0.02)

    prober = threading.Thread(target=probe)
    prober.start()
    results = [out.get() for _ in procs]
    server_cpu = _used(server_cpu0, _cpu([p.pid for p, _ in servers]))
    db_cpu = _used(db_cpu0, _cpu(_postgres_pids(pg_data))) if pg_data is not None else 0.0
    finished = sorted(t for done, _ in results for t in done)
    client_cpu = sum(cpu for _, cpu in results)
    for p in procs:
        p.join()
    stop.set()
    prober.join()
    seconds = finished[-1] - t0
    written = sum(_written(p.pid) for p, _ in servers) - written0
    db_written = sum(_written(pid) - db_written0.get(pid, 0) for pid in db_pids)
    wal = _wal(db) - wal0
    _checkpoint(db)  # PostgreSQL: the data pages the ingest dirtied reach the disk too
    disk = _disk_written(disk_path) - disk0
    rates = _window_rates(finished, t0, windows, batch)
    ok = np.array([p for p in probes if p is not None]) * 1e3
    at_stop, disk_stop = _stop_servers(servers, disk_path)
    stored_bytes = reports * (16 + 16 + 4 + 4)  # ids, pseudonym, view, a cell (or OUE bytes)
    restart = _restart(code, db, info.submit_token, plan_json, folders[0])
    return {
        "rate": reports / seconds,
        "first": rates[0],
        "last": rates[-1],
        "written_per_report": (written + db_written + at_stop) / reports,
        "written_per_stored": (written + db_written + at_stop) / stored_bytes,
        "written_at_stop": at_stop / reports,
        "written_by_servers": written / reports,  # during ingest (key snapshots, logs)
        "written_by_db": db_written / reports,
        "wal_per_report": wal / reports,  # PostgreSQL's own count (pg_stat_wal)
        "disk_per_report": (disk + disk_stop) / reports,
        "disk_per_stored": (disk + disk_stop) / stored_bytes,
        "disk_at_stop": disk_stop / reports,
        "health_p50": float(np.percentile(ok, 50)) if ok.size else float("nan"),
        "health_p99": float(np.percentile(ok, 99)) if ok.size else float("nan"),
        "health_max": float(ok.max()) if ok.size else float("nan"),
        "health_failed": sum(p is None for p in probes),
        "cpu_server": 1e3 * server_cpu / reports,  # CPU seconds per 1000 reports
        "cpu_clients": 1e3 * client_cpu / reports,
        "cpu_db": 1e3 * db_cpu / reports,
        "cores": (server_cpu + client_cpu + db_cpu) / seconds,
        **restart,
    }


def _window_rates(finished: list[float], t0: float, windows: int, batch: int) -> list[float]:
    """Reports per second in each of ``windows`` windows of the store's size: the
    batches done in order of completion (``finished``, their end times)."""
    edges = np.linspace(0, len(finished), windows + 1).astype(int)
    stamps = np.array([t0, *finished])
    return [
        (edges[i + 1] - edges[i]) * batch / (stamps[edges[i + 1]] - stamps[edges[i]])
        for i in range(windows)
    ]


def _client_processes(
    ctx: Any,
    addresses: list[str],
    token: str,
    plan_json: str,
    reports: int,
    batch: int,
    columnar: bool,
    ready: Any,
    out: Any,
) -> list[Any]:
    """One client process per address, the reports shared out evenly (not started)."""
    share = -(-reports // len(addresses))
    return [
        ctx.Process(
            target=_client,
            args=(
                address,
                token,
                plan_json,
                min(share, reports - i * share),
                batch,
                100 + i,
                columnar,
                ready,
                out,
            ),
        )
        for i, address in enumerate(addresses)
    ]


def _stop_servers(
    servers: list[tuple[subprocess.Popen[str], str]], disk_path: Path
) -> tuple[int, int]:
    """Stop every server gracefully; what they wrote while stopping (SQLite: the key
    snapshots) and what reached the store's disk meanwhile, in bytes."""
    at_stop = 0
    disk_stop0 = _disk_written(disk_path)
    for p, _ in servers:
        before = _written(p.pid)
        p.send_signal(signal.SIGTERM)
        os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT)  # exited, not yet reaped
        at_stop += _written(p.pid) - before
        p.wait(timeout=60)
    return at_stop, _disk_written(disk_path) - disk_stop0


def _restart(
    code: Path, db: Path | str, token: str, plan_json: str, snapshots: Path | None
) -> dict[str, float]:
    """Seconds from process start to: health and a query answered; a new report accepted."""
    from calmkit_aggregator.service.admin import AdminClient

    t0 = time.perf_counter()
    proc, address = _serve(code, db, snapshots)
    while _health(address, 0.5) is None:
        time.sleep(0.01)
    with AdminClient(address) as admin:
        admin.query("scale", ["a0", "a1"], replicates=2)
    serving = time.perf_counter() - t0
    message = _batches(plan_json, 1, 1, seed=999, columnar=False)[0]
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary("/calmkit.v1.Aggregator/SubmitReports")
        call(message, metadata=(("authorization", f"Bearer {token}"),), timeout=120)
    accepting = time.perf_counter() - t0
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    return {"restart_serving": serving, "restart_accepting": accepting}


def _median_of(reps: int, *args: object) -> dict[str, float]:
    """Each figure's median over ``reps`` fresh runs of :func:`_run`."""
    return _alternating(reps, [args])[0]


def _alternating(reps: int, designs: list[tuple[object, ...]]) -> list[dict[str, float]]:
    """Each design's figures, medians over ``reps`` fresh runs of :func:`_run`, the
    designs taking turns within each rep (so they share the machine's moods)."""
    runs: list[list[dict[str, float]]] = [[] for _ in designs]
    for _ in range(reps):
        for i, args in enumerate(designs):
            runs[i].append(_run(*args))  # type: ignore[arg-type]
    return [{key: float(statistics.median(r[key] for r in rs)) for key in rs[0]} for rs in runs]


def _run(
    code: Path,
    reports: int,
    clients: int,
    batch: int,
    columnar: bool,
    windows: int,
    replicas: int = 0,
) -> dict[str, float]:
    """One design in a child process (its own imports of ``code``)."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    job = (code, reports, clients, batch, columnar, windows, replicas, out)
    child = ctx.Process(target=_child, args=job)
    child.start()
    result = out.get()
    child.join()
    if isinstance(result, str):
        raise SystemExit(f"the measurement failed:\n{result}")
    return result


def _child(
    code: Path,
    reports: int,
    clients: int,
    batch: int,
    columnar: bool,
    windows: int,
    replicas: int,
    out: mp.Queue,
) -> None:
    try:
        with tempfile.TemporaryDirectory() as tmp:
            out.put(_measure(code, Path(tmp), reports, clients, batch, columnar, windows, replicas))
    except BaseException:
        out.put(traceback.format_exc())
        raise


def _report(name: str, r: dict[str, float], reports: int) -> None:
    print(f"{name}: {reports:,} reports (medians)", flush=True)
    print(
        f"  acknowledged        {r['rate']:12,.0f} reports/s   first window {r['first']:,.0f}/s, "
        f"last {r['last']:,.0f}/s (last/first {r['last'] / r['first']:.2f})"
    )
    print(
        f"  written             {r['written_per_report']:10,.0f} bytes/report  "
        f"({r['written_per_stored']:.1f}x the bytes stored; {r['written_at_stop']:,.0f} of them "
        f"by the graceful stop, {r.get('written_by_servers', float('nan')):,.0f} by the servers "
        f"during ingest, {r.get('written_by_db', float('nan')):,.0f} by the database)"
    )
    if r.get("disk_per_report", 0.0) > 0:
        print(
            f"  disk                {r['disk_per_report']:10,.0f} bytes/report  "
            f"({r['disk_per_stored']:.1f}x the bytes stored; {r['disk_at_stop']:,.0f} of them "
            "at the graceful stop; the device, after a checkpoint and sync)"
        )
    if r.get("wal_per_report", 0.0) > 0:
        print(f"  WAL                 {r['wal_per_report']:10,.0f} bytes/report  (pg_stat_wal)")
    print(
        f"  health              p50 {r['health_p50']:.1f} ms, p99 {r['health_p99']:.1f} ms, "
        f"max {r['health_max']:.1f} ms, {r['health_failed']} failed"
    )
    print(
        f"  restart             serving after {r['restart_serving']:.2f} s, accepting reports "
        f"after {r['restart_accepting']:.2f} s"
    )
    per_report = r["cpu_server"] + r["cpu_clients"] + r["cpu_db"]
    print(
        f"  CPU s/1000 reports  server(s) {r['cpu_server']:.4f}, clients {r['cpu_clients']:.4f}, "
        f"database {r['cpu_db']:.4f}; {r['cores']:.2f} cores busy; "
        f"{per_report * TARGET_RATE / 1e3:.2f} cores at {TARGET_RATE:,}/s"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reports", type=int, default=10_000_000)
    parser.add_argument("--baseline-reports", type=int, default=300_000)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--windows", type=int, default=10)
    parser.add_argument("--baseline-ref", default=BASELINE_REF)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument(
        "--postgres-replicas",
        type=int,
        nargs="*",
        default=[1, 2],
        help="replica counts to run on a throwaway PostgreSQL (none: skip)",
    )
    parser.add_argument("--postgres-reports", type=int, default=2_000_000)
    parser.add_argument(
        "--postgres-baseline-ref",
        default=PG_BASELINE_REF,
        help="the previous PostgreSQL design, run alternately (empty: skip)",
    )
    args = parser.parse_args()
    base = None
    if args.baseline_reports:
        with _checkout(args.baseline_ref) as worktree:
            if worktree is not None:
                base = _median_of(
                    args.reps,
                    worktree,
                    args.baseline_reports,
                    args.clients,
                    args.batch,
                    False,
                    args.windows,
                )
                _report(
                    f"baseline ({args.baseline_ref}: ReportBatch, schema 2)",
                    base,
                    args.baseline_reports,
                )
    current = None
    if args.reports:
        current = _median_of(
            args.reps, ROOT, args.reports, args.clients, args.batch, True, args.windows
        )
        _report("current (SubmitColumnar, batch log, schema 3)", current, args.reports)
    if base is not None and current is not None:
        ratio = {k: current[k] / base[k] for k in ("rate", "written_per_report", "health_p99")}
        print(
            f"current / baseline: reports/s {ratio['rate']:.1f}x, bytes written per report "
            f"{ratio['written_per_report']:.2f}x, health p99 {ratio['health_p99']:.2f}x"
        )
    if not args.postgres_replicas:
        return 0
    with _checkout(args.postgres_baseline_ref or None) as pg_base:
        for replicas in args.postgres_replicas:
            job = (args.postgres_reports, args.clients, args.batch, True, args.windows, replicas)
            designs = [(ROOT, *job)] + ([(pg_base, *job)] if pg_base is not None else [])
            results = _alternating(args.reps, designs)
            pg = results[0]
            _report(
                f"PostgreSQL, {replicas} replica(s): batch log, keys in memory",
                pg,
                args.postgres_reports,
            )
            if current is not None:
                print(
                    f"PostgreSQL {replicas} replica(s) / SQLite current: reports/s "
                    f"{pg['rate'] / current['rate']:.2f}x"
                )
            if pg_base is not None:
                old = results[1]
                _report(
                    f"PostgreSQL, {replicas} replica(s), baseline "
                    f"({args.postgres_baseline_ref}: keys under unique indexes)",
                    old,
                    args.postgres_reports,
                )
                print(
                    f"PostgreSQL {replicas} replica(s) current / baseline: reports/s "
                    f"{pg['rate'] / old['rate']:.2f}x, last/first window "
                    f"{pg['last'] / pg['first']:.2f} vs {old['last'] / old['first']:.2f}, "
                    f"CPU per report {_per_report(pg) / _per_report(old):.2f}x"
                )
    return 0


def _per_report(r: dict[str, float]) -> float:
    return r["cpu_server"] + r["cpu_clients"] + r["cpu_db"]


@contextlib.contextmanager
def _checkout(ref: str | None) -> Iterator[Path | None]:
    """``ref`` checked out in a temporary git worktree, or ``ref`` itself when it is a
    directory holding a checkout (None: no ref, or git failed)."""
    if ref and Path(ref, "aggregator").is_dir():
        yield Path(ref)
        return
    if not ref or not shutil.which("git"):
        yield None
        return
    worktree = Path(tempfile.mkdtemp()) / "baseline"
    made = subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(worktree), ref],
        capture_output=True,
    )
    if made.returncode != 0:
        print(f"baseline skipped: git worktree add {ref} failed: {made.stderr.decode().strip()}")
        yield None
        return
    try:
        yield worktree
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)],
            capture_output=True,
        )


if __name__ == "__main__":
    raise SystemExit(main())
