"""Fake reports against a real server on SQLite (docs/security.md "Manipulation",
"Report cap", "The pilot check"): three attacks, what is flagged and what it costs.

    python benchmarks/manipulation.py [--n 52500] [--pilot-n 50000] [--seed 0]

1. **One cell, 5%.** A plan of 8 disjoint GRR views (2 x 4 cells each, epsilon 1); n
   honest reports (make_reports, seeded), then fakes making 5% of all reports, all
   naming view 0's cell 0. Printed: flagged or not (status, answer, batch), the served
   cell without and with the fakes, the truth, and the bound honest + s x
   max_shift_per_share (s: the fakes' share of view 0's reports).
2. **Flood.** A collection created for n users (default cap 2 n); the n genuine
   reports, then fakes in 10,000-report batches until the server refuses: fakes
   accepted, fakes refused past the cap, genuine refused (must be 0), and a resend of
   the genuine reports (duplicates, none refused).
3. **Pilot hijack.** The default planner (pilot 20% of --pilot-n, 8 attributes, k 2):
   the pilot filled by fakes (cell 0 of every GRR view, all ones on every OUE view),
   500 at a time under each pilot round's plan as the server serves it, then the
   genuine users under the main phase's plan. Mean L1 error over all 2-way
   marginals against the population, for a genuine pilot, the fake pilot with the
   check (the main phase by Algorithm 1, the pilot left out of the answers), and the fake
   pilot with the check switched off in this process (as before the check).
"""

from __future__ import annotations

import argparse
import itertools
import tempfile
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from calmkit_aggregator.integrity import max_shift_per_share
from calmkit_aggregator.service import handlers
from calmkit_aggregator.service.admin import AdminClient
from calmkit_aggregator.service.server import create_server, graceful_stop
from calmkit_aggregator.service.storage import Storage
from calmkit_client import CalmkitError, CollectionFull, Plan, make_reports
from calmkit_client import wire as client_wire
from calmkit_client.collector import RetryPolicy, call_with_retry
from calmkit_simulator import synthetic_population

BATCH = 10_000
PILOT_BATCH = 500  # reports per batch while the pilot runs: each round fills in turn


class Served:
    """A real server over a fresh SQLite file."""

    def __init__(self, folder: Path) -> None:
        self.storage = Storage(folder / "agg.db")
        self.server, port = create_server("127.0.0.1:0", self.storage)
        self.address = f"127.0.0.1:{port}"
        self.admin = AdminClient(self.address)

    def close(self) -> None:
        self.admin.close()
        graceful_stop(self.server, 2.0)
        self.storage.close()


def columns(cid: str, plan: Plan, views: np.ndarray, payloads: list[np.ndarray], rng: Any) -> Any:
    """A ColumnarBatch of reports in view order, with fresh ids from ``rng``."""
    n = len(views)
    ids, pseudonyms = rng.bytes(16 * n), rng.bytes(16 * n)
    return client_wire.columnar_batch_from_arrays(cid, plan, views, payloads, ids, pseudonyms)


def honest(cid: str, plan: Plan, codes: np.ndarray, rng: np.random.Generator) -> list[Any]:
    out = []
    for lo in range(0, len(codes), BATCH):
        part = codes[lo : lo + BATCH]
        ids = rng.integers(0, 2**63, len(part)).astype(np.uint64)
        made = make_reports(plan, part, ids, rng=rng)
        views = np.concatenate([np.full(b.n, b.view) for b in made])
        out.append(columns(cid, plan, views, [b.payloads for b in made], rng))
    return out


def fakes(cid: str, plan: Plan, per_view: dict[int, int], rng: np.random.Generator) -> Any:
    views, payloads = [], []
    for j, o in enumerate(plan.view_oracles):
        k = per_view.get(j, 0)
        views.append(np.full(k, j))
        if o.name == "GRR":
            payloads.append(np.zeros(k, np.int64))
        else:
            ones = np.ones((k, o.L), np.uint8)
            payloads.append(np.packbits(ones, axis=1))
    return columns(cid, plan, np.concatenate(views), payloads, rng)


def send(address: str, token: str, batch: Any) -> Any:
    with grpc.insecure_channel(address) as channel:
        stub = client_wire.aggregator_stub(channel)
        return call_with_retry(
            stub.SubmitColumnar,
            batch,
            RetryPolicy(attempts=1),
            [("authorization", f"Bearer {token}")],
        )


def one_cell(srv: Served, n: int, seed: int) -> None:
    sizes = (2, 4) * 8
    views = [(2 * i, 2 * i + 1) for i in range(8)]
    pop = synthetic_population(n=n, sizes=sizes, strength=1.5, rng=seed)
    rng = np.random.default_rng(seed)
    made = {
        c: srv.admin.create_collection(pop.schema, 1.0, n, 2, collection_id=c, views=views)
        for c in ("honest", "attacked")
    }
    plan = made["honest"].plan
    batches = honest("x", plan, pop.codes, rng)
    for c, info in made.items():
        for b in batches:
            b.collection_id = c
            send(srv.address, info.submit_token, b)
    count = round(0.05 * n / 0.95)
    ack = send(srv.address, made["attacked"].submit_token, fakes("attacked", plan, {0: count}, rng))
    status = srv.admin.get_collection("attacked")
    clean = srv.admin.get_collection("honest")
    a = srv.admin.query("attacked", ["a0", "a1"], replicates=2)
    h = srv.admin.query("honest", ["a0", "a1"], replicates=2)
    share = count / (count + clean.view_reports[0])
    bound = share * max_shift_per_share(plan.view_oracles[0])
    truth = pop.marginal([0, 1]).reshape(-1)[0]
    print("1. one cell, 5% fakes (all on view 0, cell 0)")
    print(f"   fakes {ack.accepted} = 5% of all reports, {share:.1%} of view 0's")
    print(
        f"   flagged: status {bool(status.flags)}, answer {bool(a.flags)}, honest {bool(h.flags)}"
    )
    for flag in status.flags:
        print(f"     {flag[:150]}")
    print(
        f"   cell: truth {truth:.3f}, served honest-only {h.values.reshape(-1)[0]:.3f}, "
        f"served attacked {a.values.reshape(-1)[0]:.3f}, bound honest + s x "
        f"{a.max_shift_per_share:.2f} = {h.values.reshape(-1)[0] + bound:.3f}"
    )


def flood(srv: Served, n: int, seed: int) -> None:
    sizes = (2, 4) * 8
    views = [(2 * i, 2 * i + 1) for i in range(8)]
    pop = synthetic_population(n=n, sizes=sizes, strength=1.5, rng=seed)
    rng = np.random.default_rng(seed + 1)
    info = srv.admin.create_collection(pop.schema, 1.0, n, 2, collection_id="flood", views=views)
    plan, token = info.plan, info.submit_token
    genuine = honest("flood", plan, pop.codes, rng)
    refused_genuine = sum(0 if send(srv.address, token, b) else 1 for b in genuine)
    accepted = refused = 0
    for _ in range(300):  # up to 3M fakes
        batch = fakes("flood", plan, {j: BATCH // 8 for j in range(8)}, rng)
        try:
            accepted += send(srv.address, token, batch).accepted
        except CollectionFull:
            refused += batch.count
            if refused >= 5 * BATCH:
                break
    dup = [send(srv.address, token, b) for b in genuine]
    status = srv.admin.get_collection("flood")
    print(f"2. flood: collection for n = {n}, cap {info.max_reports} (default 2 n)")
    print(f"   genuine accepted {n - refused_genuine * BATCH}, genuine refused {refused_genuine}")
    print(f"   fakes accepted {accepted}, fakes refused past the cap {refused} (then stopped)")
    print(
        f"   genuine resent after full: {sum(d.duplicates for d in dup)} duplicates, "
        f"{sum(d.accepted for d in dup)} accepted; stored {status.reports}; flagged "
        f"{bool(status.flags)}"
    )


def pilot_error(srv: Served, n: int, seed: int, cid: str, fake: bool) -> tuple[float, str]:
    sizes = (2, 3, 2, 2, 4, 3, 2, 2)
    pop = synthetic_population(n=n, sizes=sizes, strength=1.5, rng=seed)
    rng = np.random.default_rng(seed + 2)
    info = srv.admin.create_collection(pop.schema, 1.0, n, 2, collection_id=cid, seed=seed)
    status, used = info, 0
    while status.in_pilot:  # each round's plan as the server serves it, PILOT_BATCH at a time
        plan, size = status.plan, PILOT_BATCH
        if fake:
            per_view = {j: size // plan.m + (j < size % plan.m) for j in range(plan.m)}
            send(srv.address, info.submit_token, fakes(cid, plan, per_view, rng))
        else:
            for b in honest(cid, plan, pop.codes[used : used + size], rng):
                send(srv.address, info.submit_token, b)
            used += size
        status = srv.admin.get_collection(cid)
    rest = pop.codes[used : used + n - status.reports]
    for b in honest(cid, status.plan, rest, rng):
        send(srv.address, info.submit_token, b)
    errors = []
    for a, b in itertools.combinations(range(len(sizes)), 2):
        answer = srv.admin.query(cid, [f"a{a}", f"a{b}"], replicates=2)
        errors.append(np.abs(answer.values - pop.marginal([a, b])).sum())
    return float(np.mean(errors)), status.pilot_check


def hijack(srv: Served, n: int, seed: int) -> None:
    print(f"3. pilot hijack: n = {n}, pilot 20% (default planner), k = 2")
    genuine, check = pilot_error(srv, n, seed, "genuine", fake=False)
    print(f"   genuine pilot: mean L1 over 2-way marginals {genuine:.4f} (pilot check {check})")
    guarded, check = pilot_error(srv, n, seed, "guarded", fake=True)
    print(f"   fake pilot, checked: {guarded:.4f} (pilot check {check[:110]}...)")
    real = handlers.pilot_result
    handlers.pilot_result = lambda parts, phase: (True, "passed (check off)")
    try:
        unguarded, _ = pilot_error(srv, n, seed, "unguarded", fake=True)
    finally:
        handlers.pilot_result = real
    print(f"   fake pilot, check off (as before): {unguarded:.4f}")
    print(
        "   (a pilot that fails its check is also left out of the answers; with the check "
        "off its fakes, 20% of all reports, stay in them)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=52_500)
    parser.add_argument("--pilot-n", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        srv = Served(Path(tmp))
        try:
            one_cell(srv, args.n, args.seed)
            flood(srv, args.n, args.seed)
            hijack(srv, args.pilot_n, args.seed)
        except CalmkitError as exc:
            print(f"error: {exc}")
            return 1
        finally:
            srv.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
