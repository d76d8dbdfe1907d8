"""A flood of token-less 16 MiB GetPlan calls: the server's memory and its health
checks, against calmkit before its body limits (docs/security.md "Large bodies before
authentication").

    python benchmarks/flood.py [--calls 128] [--connections 8] [--reps 3]
        [--baseline-ref 2fb3c19]

Each rep starts a server (``create_server`` over a fresh SQLite file) in a
subprocess, sends ``--calls`` concurrent GetPlan calls whose body is just under the
16 MiB receive limit, spread over ``--connections`` HTTP/2 connections, while a prober
checks health every 10 ms on a connection of its own. Printed per server: the RSS at
start, its peak during the flood, what is left 2 s after it (growth over the start)
and the health checks' p50 / p99 / max (all medians over reps). The baseline is the
code at ``--baseline-ref``, checked out in a temporary git worktree (or a directory
holding a checkout).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from calmkit_client import wire as client_wire
from calmkit_client.collector import MAX_MESSAGE_BYTES

ROOT = Path(__file__).resolve().parents[1]
BASELINE_REF = "2fb3c19"  # main before the body limits
FLOOD_BYTES = MAX_MESSAGE_BYTES - 64
PACKAGES = ("client", "aggregator", "simulator", "protos")
SERVE = """
import sys
from calmkit_aggregator.service.server import create_server
from calmkit_aggregator.service.storage import Storage
server, port = create_server("127.0.0.1:0", Storage(sys.argv[1]))
print(port, flush=True)
sys.stdin.read()
"""


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


@contextlib.contextmanager
def _server(code: Path) -> Iterator[tuple[int, str]]:
    """A server of the checkout at ``code`` in a subprocess: ``(pid, address)``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(code / p) for p in PACKAGES)}
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.Popen(
            [sys.executable, "-c", SERVE, str(Path(tmp) / "agg.db")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        assert proc.stdout is not None
        try:
            yield proc.pid, f"127.0.0.1:{int(proc.stdout.readline())}"
        finally:
            proc.kill()
            proc.wait()


def _flood(address: str, calls: int, connections: int) -> None:
    body = client_wire.pb.CollectionRef(collection_id="x" * FLOOD_BYTES)
    options = [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.use_local_subchannel_pool", 1),  # a connection of its own per channel
    ]
    channels = [grpc.insecure_channel(address, options=options) for _ in range(connections)]
    try:
        stubs = [client_wire.pb_grpc.AggregatorStub(c) for c in channels]
        pending = [stubs[i % connections].GetPlan.future(body, timeout=120) for i in range(calls)]
        for call in pending:
            call.exception()
    finally:
        for channel in channels:
            channel.close()


def _probe(address: str, stop: threading.Event, latencies: list[float]) -> None:
    with grpc.insecure_channel(address) as channel:
        check = health_pb2_grpc.HealthStub(channel).Check
        check(health_pb2.HealthCheckRequest(), timeout=5)
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                check(health_pb2.HealthCheckRequest(), timeout=5)
            except grpc.RpcError:
                pass  # counted at the deadline
            latencies.append(time.perf_counter() - t0)
            stop.wait(0.01)


def one_rep(code: Path, calls: int, connections: int) -> dict[str, float]:
    """One flood against a fresh server of ``code``: RSS (MB) and health latency (ms)."""
    with _server(code) as (pid, address):
        _flood(address, 2, 1)  # warm up
        start = _rss_mb(pid)
        stop, latencies, peak = threading.Event(), [], [start]
        prober = threading.Thread(target=_probe, args=(address, stop, latencies))
        prober.start()
        flood = threading.Thread(target=_flood, args=(address, calls, connections))
        flood.start()
        while flood.is_alive():
            peak.append(_rss_mb(pid))
            time.sleep(0.01)
        stop.set()
        prober.join()
        time.sleep(2.0)
        after = _rss_mb(pid)
    ms = 1e3 * np.array(latencies)
    return {
        "start": start,
        "peak": max(peak),
        "left": after - start,
        "p50": float(np.quantile(ms, 0.5)),
        "p99": float(np.quantile(ms, 0.99)),
        "max": float(ms.max()),
    }


@contextlib.contextmanager
def _checkout(ref: str) -> Iterator[Path | None]:
    """``ref`` in a temporary git worktree, or ``ref`` itself when it is a directory
    holding a checkout (None: git failed)."""
    if Path(ref, "aggregator").is_dir():
        yield Path(ref)
        return
    worktree = Path(tempfile.mkdtemp()) / "baseline"
    git = shutil.which("git") or "git"
    made = subprocess.run(
        [git, "-C", str(ROOT), "worktree", "add", "--detach", str(worktree), ref],
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
            [git, "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)],
            capture_output=True,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=128)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--baseline-ref", default=BASELINE_REF)
    args = parser.parse_args()
    print(
        f"{args.calls} token-less {FLOOD_BYTES / 2**20:.0f} MiB GetPlan calls over "
        f"{args.connections} connections, medians of {args.reps} reps"
    )
    print(
        f"{'server':<22}{'RSS start':>10}{'peak':>8}{'left +':>8}"
        f"{'health p50':>12}{'p99':>8}{'max':>8}   (MB, ms)"
    )
    with _checkout(args.baseline_ref) as baseline:
        servers = [("current", ROOT)]
        if baseline is not None:
            servers.insert(0, (f"baseline ({args.baseline_ref})", baseline))
        for name, code in servers:
            reps = [one_rep(code, args.calls, args.connections) for _ in range(args.reps)]
            med = {k: statistics.median(r[k] for r in reps) for k in reps[0]}
            print(
                f"{name:<22}{med['start']:>10.0f}{med['peak']:>8.0f}{med['left']:>8.0f}"
                f"{med['p50']:>12.1f}{med['p99']:>8.1f}{med['max']:>8.1f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
