"""Crash safety: ``calmkit serve`` killed with SIGKILL at random moments during ingest,
restarted on the same database, ten times, with old-format and columnar batches mixed.
Every acknowledged report is counted exactly once, none is invented, resending a batch
whose ack was lost does not double count (DESIGN.md "Service": commit, then
acknowledge), and the stored counts equal a recount of the batch log."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from calmkit_aggregator.admin import AdminClient
from calmkit_aggregator.storage import Storage
from calmkit_client import CollectionError
from calmkit_client import wire as client_wire
from calmkit_client.collector import RetryPolicy, call_with_retry, open_channel
from calmkit_client.device import DeviceState
from calmkit_simulator import synthetic_population

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="needs SIGKILL")

POP = synthetic_population(n=40_000, sizes=(2, 3, 2, 2), strength=1.0, rng=8)
BATCH = 100
SERVE = "from calmkit_simulator.cli import main; raise SystemExit(main())"


def _start(db: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE, "serve", "--address", "127.0.0.1:0", "--db", str(db)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "listening on" in line, line
    return proc, line.split("listening on ")[1].split()[0]


def test_acknowledged_reports_survive_sigkill(tmp_path: Path) -> None:
    db = tmp_path / "agg.db"
    rng = np.random.default_rng(2024)
    proc, address = _start(db)
    with AdminClient(address) as admin:
        info = admin.create_collection(POP.schema, 1.0, POP.n, 2, collection_id="crash")
    device = DeviceState(tmp_path / "device.db")  # reports made once, resent as they are
    batches, ids = [], []  # every other batch in columns
    for k, start in enumerate(range(0, POP.n, BATCH)):
        users = np.arange(start, min(start + BATCH, POP.n), dtype=np.uint64)
        items = device.reports_for("crash", info.plan, POP.codes[users], users)
        encode = client_wire.columnar_batch_to_proto if k % 2 else client_wire.batch_to_proto
        batches.append(encode("crash", info.plan.digest, items))
        ids.append([r.report_id for _, r in items])
    sent = {rid for batch_ids in ids for rid in batch_ids}
    acked: set[bytes] = set()
    next_batch = 0
    kills = 0
    lost_acks = 0

    def ingest(address: str, stop: threading.Event) -> None:
        nonlocal next_batch, lost_acks
        channel = open_channel(address)
        stub = client_wire.aggregator_stub(channel)
        metadata = [("authorization", f"Bearer {info.submit_token}")]
        policy = RetryPolicy(attempts=1, timeout=5.0)
        while next_batch < len(batches) and not stop.is_set():
            batch = batches[next_batch]
            columnar = next_batch % 2
            try:
                call = stub.SubmitColumnar if columnar else stub.SubmitReports
                call_with_retry(call, batch, policy, metadata)
            except CollectionError:
                lost_acks += 1
                return  # the server died: this batch's ack is lost; resend it later
            acked.update(ids[next_batch])
            next_batch += 1
        channel.close()

    # kill once ingest passes each of 10 random batch numbers, plus a random few ms
    for target in np.sort(rng.choice(np.arange(20, len(batches) - 20), 10, replace=False)):
        stop = threading.Event()
        worker = threading.Thread(target=ingest, args=(address, stop))
        worker.start()
        while next_batch < target and worker.is_alive():
            time.sleep(0.0005)
        time.sleep(float(rng.uniform(0, 0.005)))
        os.kill(proc.pid, signal.SIGKILL)  # mid-ingest, no warning
        proc.wait()
        stop.set()
        worker.join()
        kills += 1
        proc, address = _start(db)
    assert kills == 10 and 0 < next_batch < len(batches) and lost_acks >= 1
    ingest(address, threading.Event())  # finish, resending the batch whose ack was lost
    assert next_batch == len(batches)
    with AdminClient(address) as admin:
        status = admin.get_collection("crash")
    proc.send_signal(signal.SIGTERM)  # graceful this time
    assert proc.wait(timeout=30) == 0
    device.close()
    with sqlite3.connect(db) as conn:
        blobs = b"".join(r[0] for r in conn.execute("SELECT report_ids FROM batches"))
        stored = [blobs[i : i + 16] for i in range(0, len(blobs), 16)]
    assert len(stored) == len(set(stored)) == status.reports == POP.n  # each exactly once
    assert acked == sent == set(stored)  # every ack counted, nothing invented
    with Storage(db) as store:  # the counts stored with each batch equal the log's
        recount, counts = store.recount("crash"), store.support("crash")
    np.testing.assert_array_equal(recount.n, counts.n)
    for a, b in zip(recount.counts, counts.counts):
        np.testing.assert_array_equal(a, b)
    assert int(counts.n.sum()) == POP.n
