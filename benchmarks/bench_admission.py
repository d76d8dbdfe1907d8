"""Ingest with admission tickets: reports/s of a real ``calmkit serve`` (SQLite, a
fresh database per run) with admission off, aes256-prf, hmac-sha256 and ed25519, in
one run; and (mode ``observed``) admission off with the metrics endpoint and the web
console on, both read every ``--poll`` seconds during ingest.

    python benchmarks/bench_admission.py [--reports 100000] [--clients 4] [--batch 1000]
        [--reps 5] [--modes off,aes256-prf,hmac-sha256,ed25519] [--poll 1.0]
    python benchmarks/bench_admission.py --modes off,observed --reports 300000 --reps 7

Like benchmarks/bench_service.py: ``--clients`` client processes each send pre-built
``SubmitColumnar`` batches of ``--batch`` reports back to back over loopback gRPC. The
reports are the same in every mode (same seeds): random pseudonyms, each report on the
view its pseudonym is assigned to (what a collection with admission requires), a
random valid payload, and in the admission modes the ticket of each pseudonym, issued
before timing. The modes run in turn within each rep (rotated from rep to rep), so all
see the same machine. Printed: per mode the median reports/s over ``--reps`` runs, the
individual runs, and the ratio of the median to admission off's.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("client", "aggregator", "simulator", "protos")
SIZES = (2, 3, 2, 2, 4, 2, 3, 2)
VIEWS = ((0, 1), (2, 3), (4, 5), (6, 7), (1, 4))
MODES = ("off", "aes256-prf", "hmac-sha256", "ed25519")
OBSERVED = "observed"  # admission off; metrics and console on and read during ingest


def _serve(db: Path, observed: bool = False) -> tuple[subprocess.Popen[str], str, list[str]]:
    """A ``calmkit serve`` of this checkout on ``db``, its address, and (``observed``)
    the URLs of its metrics and console."""
    path = [str(ROOT / p) for p in PACKAGES]
    boot = (
        f"import sys; sys.path[:0] = {path!r}; "
        "from calmkit_client.cli import main; raise SystemExit(main())"
    )
    extra = ["--metrics-address", "127.0.0.1:0", "--console", "127.0.0.1:0"] if observed else []
    proc = subprocess.Popen(
        [sys.executable, "-c", boot, "serve", "--address", "127.0.0.1:0", "--db", str(db), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    match = re.search(r"listening on (\S+)", proc.stdout.readline())
    if not match:
        raise SystemExit("server did not start")
    urls = []
    for _ in range(2 if observed else 0):
        found = re.search(r" on (http\S+)", proc.stdout.readline())
        if not found:
            raise SystemExit("server did not start its metrics or console")
        urls.append(found.group(1))
    return proc, match.group(1), urls


def _poll(urls: list[str], every: float, stop: threading.Event, reads: list[int]) -> None:
    """Read every URL (the metrics scrape, the console's collections page) every
    ``every`` seconds until ``stop``; count the reads."""
    while True:
        for url in urls:
            with urllib.request.urlopen(url, timeout=30) as response:
                response.read()
            reads[0] += 1
        if stop.wait(every):
            return


def _issuer(mode: str, key: bytes) -> Any:
    from calmkit_client.tickets import TicketIssuer

    return TicketIssuer(mode, key) if mode not in ("off", OBSERVED) else None


def _batches(plan_json: str, count: int, batch: int, seed: int, mode: str, key: bytes) -> list:
    """Serialized ``ColumnarBatch`` messages (built before timing), with tickets unless
    ``mode`` is off. The same ``seed`` gives the same reports in every mode."""
    from calmkit_client import Plan
    from calmkit_proto.v1 import calmkit_pb2 as pb

    plan = Plan.from_json(plan_json)
    issuer = _issuer(mode, key)
    rng = np.random.default_rng(seed)
    limits = np.array([o.L for o in plan.view_oracles])
    grr = np.array([o.name == "GRR" for o in plan.view_oracles])
    nbytes = (limits + 7) // 8
    out = []
    for start in range(0, count, batch):
        n = min(batch, count - start)
        pseudonyms = rng.integers(0, 256, (n, 16), dtype=np.uint8)
        views = plan.assign_pseudonyms(pseudonyms)
        cells = rng.integers(0, 1 << 30, n) % limits[views]
        ids = rng.bytes(16 * n)
        tickets = b""
        if issuer is not None:
            tickets = b"".join(issuer.issue("bench", bytes(p)) for p in pseudonyms)
        msg = pb.ColumnarBatch(
            collection_id="bench",
            plan_digest=plan.digest,
            count=n,
            views=views.astype("<u4").tobytes(),
            cells=cells[grr[views]].astype("<u4").tobytes(),
            bits=b"".join(bytes(int(nbytes[v])) for v in views[~grr[views]]),
            report_ids=ids,
            pseudonyms=pseudonyms.tobytes(),
            tickets=tickets,
        )
        out.append(msg.SerializeToString())
    return out


def _client(
    address: str,
    token: str,
    plan_json: str,
    count: int,
    batch: int,
    seed: int,
    mode: str,
    key: bytes,
    ready: Any,
    out: Any,
) -> None:
    messages = _batches(plan_json, count, batch, seed, mode, key)
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary("/calmkit.v1.Aggregator/SubmitColumnar")
        metadata = (("authorization", f"Bearer {token}"),)
        ready.wait()
        for message in messages:
            call(message, metadata=metadata, timeout=120)
    out.put(time.time())


def _run(mode: str, tmp: Path, reports: int, clients: int, batch: int, poll: float = 1.0) -> float:
    """Reports/s of one fresh server in ``mode``."""
    from calmkit_aggregator.service.admin import AdminClient
    from calmkit_client import Schema
    from calmkit_client.tickets import generate_ed25519_key, generate_hmac_key

    key = b""
    admission = None
    if mode == "ed25519":
        key, public = generate_ed25519_key()
        admission = (mode, public)
    elif mode in ("hmac-sha256", "aes256-prf"):
        key = generate_hmac_key()
        admission = (mode, key)
    db = tmp / f"{mode}-{time.monotonic_ns()}.db"
    server, address, urls = _serve(db, observed=mode == OBSERVED)
    stop, reads = threading.Event(), [0]
    poller = threading.Thread(target=_poll, args=(urls, poll, stop, reads), daemon=True)
    try:
        with AdminClient(address) as admin:
            info = admin.create_collection(
                Schema.from_sizes(SIZES),
                1.0,
                reports,
                2,
                collection_id="bench",
                views=VIEWS,
                seed=1,
                admission=admission,
            )
        ctx = mp.get_context("spawn")
        ready, out = ctx.Barrier(clients + 1), ctx.Queue()
        share = -(-reports // clients)
        plan_json, token = info.plan.to_json(), info.submit_token
        procs = [
            ctx.Process(
                target=_client,
                args=(address, token, plan_json, share, batch, 100 + i, mode, key, ready, out),
            )
            for i in range(clients)
        ]
        for p in procs:
            p.start()
        ready.wait()
        t0 = time.time()
        poller.start()
        last = max(out.get() for _ in procs)
        stop.set()
        poller.join()
        if urls and not reads[0]:
            raise SystemExit(f"{mode}: ingest ended before the first read of {urls}")
        for p in procs:
            p.join()
        with AdminClient(address) as admin:
            stored = admin.get_collection("bench").reports
        if stored != share * clients:
            raise SystemExit(f"{mode}: {stored} reports stored, {share * clients} sent")
        return float(share * clients / (last - t0))
    finally:
        server.terminate()
        server.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reports", type=int, default=100_000)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--modes", default=",".join(MODES), help="modes, comma-separated")
    parser.add_argument("--poll", type=float, default=1.0, help="observed: seconds between reads")
    args = parser.parse_args()
    modes = tuple(args.modes.split(","))
    if modes[0] != "off" or not set(modes) <= {*MODES, OBSERVED}:
        raise SystemExit(f"modes ({args.modes!r}) must start with off, of {[*MODES, OBSERVED]}")
    rates: dict[str, list[float]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as folder:
        for rep in range(args.reps):
            order = modes[rep % len(modes) :] + modes[: rep % len(modes)]
            for mode in order:
                rate = _run(mode, Path(folder), args.reports, args.clients, args.batch, args.poll)
                rates[mode].append(rate)
                print(f"rep {rep} {mode:12s} {rate:10,.0f} reports/s", flush=True)
    base = statistics.median(rates["off"])
    print(
        f"\n{args.reports} reports, {args.clients} clients, batch {args.batch}, "
        f"{args.reps} reps (medians)"
    )
    print(f"{'mode':12s} {'reports/s':>10s} {'vs off':>7s}  runs")
    for mode in modes:
        median = statistics.median(rates[mode])
        runs = ", ".join(f"{r:,.0f}" for r in rates[mode])
        print(f"{mode:12s} {median:10,.0f} {median / base:6.2f}x  {runs}")


if __name__ == "__main__":
    main()
