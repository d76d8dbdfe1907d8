"""Ingest throughput of the aggregator service over gRPC on loopback (issue 4).

    python benchmarks/bench_service.py [--users 50000] [--runs 3]

An in-process server with a fresh SQLite database per run; a synthetic population of
8 attributes reports through the real client (``Collector.submit_many``, which makes
and memoises the reports in a ``DeviceState``, then sends batches that the server
validates, commits and counts). Baseline: the same client sending one report per call
(``Collector.submit``), on a 2,000-user slice. Prints median reports/s and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from calmkit_aggregator.admin import AdminClient
from calmkit_aggregator.server import create_server, graceful_stop
from calmkit_aggregator.storage import Storage
from calmkit_client import Collector, DeviceState
from calmkit_simulator import synthetic_population

SIZES = (2, 3, 2, 2, 4, 2, 3, 2)


def _run(users: int, batch_size: int | None) -> float:
    """Reports per second for one fresh server; batch_size None = one per call."""
    pop = synthetic_population(n=users, sizes=SIZES, rng=0)
    with tempfile.TemporaryDirectory() as tmp:
        storage = Storage(Path(tmp) / "agg.db")
        server, port = create_server("127.0.0.1:0", storage)
        address = f"127.0.0.1:{port}"
        try:
            with AdminClient(address) as admin:
                info = admin.create_collection(pop.schema, 1.0, users, 3, collection_id="b")
            state = DeviceState(Path(tmp) / "device.db")
            with Collector(address, "b", info.submit_token, state,
                           batch_size=batch_size or 1) as client:  # fmt: skip
                client.plan()
                t0 = time.perf_counter()
                if batch_size is None:
                    for i in range(users):
                        client.submit(pop.schema.decode_record(pop.codes[i]), user_id=i)
                else:
                    client.submit_many(pop.codes, np.arange(users, dtype=np.uint64))
                seconds = time.perf_counter() - t0
            state.close()
            assert int(storage.support("b").n.sum()) == users
        finally:
            graceful_stop(server, 2.0)
            storage.close()
    return users / seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=50_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    single = statistics.median(_run(2000, None) for _ in range(args.runs))
    print(f"baseline: Collector.submit, one report per call     {single:12,.0f} reports/s")
    for batch in (1000, 5000):
        rate = statistics.median(_run(args.users, batch) for _ in range(args.runs))
        print(f"Collector.submit_many, batches of {batch:5d}           {rate:12,.0f} reports/s"
              f"   {rate / single:5.1f}x")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
