"""Frequency-oracle throughput: client perturbation and server counting + estimation.

    python benchmarks/bench_oracles.py [--repeats 5] [--quick]

Prints medians over repeats, for GRR and OUE at L in {8, 64, 256}, epsilon = 1:

- calmkit batch ``perturb`` (seeded Generator, as in simulation; and OS entropy, as a
  production batch), one-report-at-a-time ``perturb_one``, and ``make_report``
  latency (hash, projection, perturbation, report id; OS entropy);
- server ``support`` + ``estimate`` throughput;
- the peers pure-ldp and multi-freq-ldpy when installed (``pip install -e .[bench]``),
  driven one report at a time through their client APIs (they have no batch API).

Ratios are against the named baseline: the faster peer's one-at-a-time client when
a peer is installed, else calmkit's own ``perturb_one``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peers import available_peers, peer_client, peer_server
from timing import median_seconds

from calmkit_client import GRR, OUE, Plan, Schema, make_report
from calmkit_client.randomness import OsEntropy

EPSILON = 1.0
SIZES = (8, 64, 256)


def _cells(L: int, n: int) -> np.ndarray:
    return np.random.default_rng(0).integers(0, L, size=n)


def _plan_for(L: int, oracle: str) -> tuple[Plan, list[str]]:
    """A one-view plan whose view has exactly L cells (binary attributes)."""
    bits = int(np.log2(L))
    schema = Schema.from_sizes([2] * bits)
    return Plan(schema, EPSILON, [list(range(bits))], oracles=[oracle]), ["1"] * bits


def bench(repeats: int, quick: bool) -> list[dict[str, object]]:
    rows = []
    peers = available_peers()
    for name, cls in (("GRR", GRR), ("OUE", OUE)):
        for L in SIZES:
            oracle = cls(EPSILON, L)
            n_batch = (1 << 20) if name == "GRR" else max(1 << 14, (1 << 25) // L)
            n_one = 20_000
            if quick:
                n_batch //= 8
                n_one //= 4
            cells = _cells(L, n_batch)
            small = _cells(L, n_one).tolist()
            rng = np.random.default_rng(1)
            row: dict[str, object] = {"oracle": name, "L": L}
            t = median_seconds(
                lambda o=oracle, c=cells, g=rng: o.perturb(c, g), repeats, warmup=True
            )
            row["batch_seeded"] = n_batch / t
            t = median_seconds(
                lambda o=oracle, c=cells: o.perturb(c, OsEntropy()), repeats, warmup=True
            )
            row["batch_os"] = n_batch / t

            def one_at_a_time(o=oracle, s=small) -> None:  # type: ignore[no-untyped-def]
                src = OsEntropy()
                for c in s:
                    o.perturb_one(c, src)

            row["one_os"] = n_one / median_seconds(one_at_a_time, repeats, warmup=True)
            plan, record = _plan_for(L, name)

            def reports(p=plan, r=record, k=n_one) -> None:  # type: ignore[no-untyped-def]
                for i in range(k):
                    make_report(p, r, i)

            row["make_report_us"] = 1e6 * median_seconds(reports, repeats, warmup=True) / n_one
            payloads = oracle.perturb(cells, rng)
            row["server"] = n_batch / median_seconds(
                lambda o=oracle, p=payloads: o.estimate(o.support(p), len(p)), repeats, warmup=True
            )
            for peer in peers:
                client = peer_client(peer, name, L, EPSILON)
                n_peer = min(n_one, 5000 if name == "OUE" else n_one)
                peer_cells = cells[:n_peer]
                row[f"{peer}_client"] = n_peer / median_seconds(
                    lambda cl=client, c=peer_cells: cl(c), max(1, repeats // 2), warmup=True
                )
                server = peer_server(peer, name, L, EPSILON)
                peer_reports = client(peer_cells)
                row[f"{peer}_server"] = n_peer / median_seconds(
                    lambda sv=server, r=peer_reports: sv(r), max(1, repeats // 2), warmup=True
                )
            rows.append(row)
    return rows


def _fmt(x: float) -> str:
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e3:
        return f"{x / 1e3:.0f}k"
    return f"{x:.1f}"


def report(rows: list[dict[str, object]]) -> None:
    peers = available_peers()
    baseline = "faster peer, one at a time" if peers else "calmkit perturb_one (no peer installed)"
    print(f"oracle throughput, epsilon = {EPSILON}, reports/s (medians); baseline: {baseline}")
    head = ["oracle", "L", "batch(seeded)", "batch(os)", "one(os)", "make_report", "server"]
    for peer in peers:
        head += [f"{peer}", f"{peer} srv"]
    head += ["batch/base", "server/base-srv" if peers else ""]
    print("  ".join(f"{h:>14}" for h in head if h))
    for row in rows:
        cells = [
            str(row["oracle"]),
            str(row["L"]),
            _fmt(row["batch_seeded"]),  # type: ignore[arg-type]
            _fmt(row["batch_os"]),
            _fmt(row["one_os"]),  # type: ignore[arg-type]
            f"{row['make_report_us']:.1f}us",
            _fmt(row["server"]),
        ]  # type: ignore[arg-type]
        if peers:
            clients = [float(row[f"{p}_client"]) for p in peers]  # type: ignore[arg-type]
            servers = [float(row[f"{p}_server"]) for p in peers]  # type: ignore[arg-type]
            for c, s in zip(clients, servers):
                cells += [_fmt(c), _fmt(s)]
            base, base_srv = max(clients), max(servers)
            cells += [
                f"{float(row['batch_seeded']) / base:.1f}x",  # type: ignore[arg-type]
                f"{float(row['server']) / base_srv:.1f}x",
            ]  # type: ignore[arg-type]
        else:
            cells += [f"{float(row['batch_seeded']) / float(row['one_os']):.1f}x"]  # type: ignore[arg-type]
        print("  ".join(f"{c:>14}" for c in cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="smaller batches")
    args = parser.parse_args()
    report(bench(args.repeats, args.quick))


if __name__ == "__main__":
    main()
