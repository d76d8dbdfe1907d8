"""``calmkit demo``: the whole system on one machine (an embedded server, a synthetic
population reporting through the real client, marginals beside the truth): its options
and the code that runs it. It needs the aggregator extra (the server)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NoReturn

from calmkit_client.commands import NON_NEGATIVE, POSITIVE, add_command, json_option, positive_float

from .progress import Progress

__all__ = ["DEMO_QUERIES", "compare_to_uniform", "register"]

DEMO_QUERIES = [(0, 1), (2, 4), (5, 7), (0, 1, 2), (3, 4, 6), (1, 5, 7)]
DEMO_WAVES = 20


def register(subparsers: Any) -> None:
    """Add ``calmkit demo`` to the ``calmkit`` parser's ``subparsers``."""
    add_command(
        subparsers,
        "demo",
        "the whole system on one machine: a server, a synthetic population "
        "reporting through the client, answers beside the truth (no files)",
        run=_demo,
        options=_demo_options,
        extra="aggregator",
    )


def _demo_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--users", type=POSITIVE, default=100_000, help="synthetic users")
    parser.add_argument(
        "--epsilon", type=positive_float, default=1.0, help="each user's LDP budget"
    )
    parser.add_argument(
        "--seed",
        type=NON_NEGATIVE,
        default=0,
        help="seed of the population, the plan and the simulated devices' "
        "randomness: the same seed prints the same tables",
    )
    json_option(parser, "print one JSON object (counts, phases, every table) instead of text")


def _demo(args: argparse.Namespace) -> int:
    """Everything on one machine: an embedded server on a free loopback port with a
    temporary SQLite database, a synthetic population reporting through the real
    client over gRPC, then 2- and 3-way marginals beside the truth."""
    from .synthetic import demo_population

    t0 = time.perf_counter()
    pop = demo_population(n=args.users, rng=args.seed)
    try:
        run = _serve_and_collect(pop, args)
    except KeyboardInterrupt:
        _exit_interrupted()
    info, closed = run["info"], run["closed"]
    phases = [{"reports": int(r)} for r in closed.phase_reports]
    phases[0]["views"] = info.plan.m
    if len(phases) > 1:
        phases[-1]["views"] = closed.plan.m
    out = {
        "users": pop.n,
        "epsilon": args.epsilon,
        "seed": args.seed,
        "acknowledged": run["acknowledged"],
        "counted": closed.reports,
        "phases": phases,
        "queries": _tables(pop, run["answers"]),
    }
    seconds = time.perf_counter() - t0
    if args.json:
        print(json.dumps(out))
        return 0
    _print_demo(out, pop, info, closed, run["address"], seconds)
    return 0


def _serve_and_collect(pop: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Start the server, create the collection, let every user report, close it and
    query :data:`DEMO_QUERIES`: the collection as created and as closed, the reports
    acknowledged, the answers and the server's address."""
    from calmkit_aggregator.service.admin import AdminClient
    from calmkit_aggregator.service.server import create_server, graceful_stop
    from calmkit_aggregator.service.storage import Storage
    from calmkit_client.collector import RetryPolicy

    tmp = tempfile.mkdtemp(prefix="calmkit-demo-")
    try:
        storage = Storage(Path(tmp) / "aggregator.db")
        server, port = create_server("127.0.0.1:0", storage)
        address = f"127.0.0.1:{port}"
        _stage(args, f"server on {address}; {pop.n} users report through the client")
        try:
            # a query's first answer computes its error bars (a bootstrap of the whole
            # reconstruction): allow it minutes on a slow machine, not the default 30 s
            with AdminClient(address, retry=RetryPolicy(timeout=600.0, total=900.0)) as admin:
                info = admin.create_collection(
                    pop.schema, args.epsilon, pop.n, 3, collection_id="demo", seed=args.seed
                )
                acknowledged = _report(pop, address, info, args)
                closed = admin.close_collection(info.collection_id)
                _stage(args, f"{acknowledged} reports acknowledged; answering the queries")
                answers = [
                    (q, admin.query(info.collection_id, [pop.schema.attributes[a].name for a in q]))
                    for q in DEMO_QUERIES
                ]
        except KeyboardInterrupt:
            # ^C: cancel the calls in flight and leave at once. A server thread may be
            # busy (planning phase 1, a bootstrap) and would hold the store's lock: the
            # store is not closed, its files are removed below, the process exits
            # without waiting for that thread (_exit_interrupted)
            server.stop(0)
            raise
        graceful_stop(server, 5.0)
        storage.close()
    finally:
        _remove_tree(tmp)
    return {
        "info": info,
        "closed": closed,
        "acknowledged": acknowledged,
        "answers": answers,
        "address": address,
    }


def _report(pop: Any, address: str, info: Any, args: argparse.Namespace) -> int:
    """Every user reports through the client; returns the reports acknowledged."""
    import numpy as np

    from calmkit_client import wire as client_wire
    from calmkit_client.collector import Collector

    from .devices import SimulatedDevices

    bar = None if args.json else Progress(pop.n, "calmkit demo: reports", every=2.0)
    # simulated devices: seeded, so the same --seed prints the same tables
    state = SimulatedDevices.seeded(args.seed)
    ids = np.arange(pop.n, dtype=np.uint64)
    # users arrive in waves; each wave fetches the plan again, so once the
    # pilot has its reports the next waves report under the second phase
    waves = np.array_split(np.arange(pop.n), DEMO_WAVES)
    with Collector(address, info.collection_id, info.submit_token, state) as client:
        ack = client_wire.Acknowledgement()
        for wave in waves:
            done = client.submit_many(
                pop.codes[wave], ids[wave], progress=bar.update if bar else None
            )
            ack = ack + done
    state.close()
    if bar is not None:
        bar.close()
    return int(ack.accepted + ack.duplicates)


INTERRUPTED = 130


def _remove_tree(path: str) -> None:
    """Remove the demo's temporary folder, also while a cancelled server thread may
    still create a file in it (a second pass removes what the first missed)."""
    for _ in range(3):
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.exists(path):
            return
    print(f"calmkit demo: could not remove {path}: remove it by hand", file=sys.stderr)


def _exit_interrupted() -> NoReturn:
    """After ^C: say what was kept (nothing: the temporary folder is gone), flush, and
    end the process with status 130 at once. ``os._exit``, not ``return``: a server
    thread still busy (the phase-1 planner, a bootstrap) would otherwise be joined at
    interpreter exit, seconds later."""
    print(
        "calmkit demo: interrupted; nothing is kept (the demo's server is stopped and its "
        "temporary database removed)",
        file=sys.stderr,
        flush=True,
    )
    sys.stdout.flush()
    os._exit(INTERRUPTED)


def _stage(args: argparse.Namespace, text: str) -> None:
    """A line on stderr as a stage starts, so a piped or logged run shows progress."""
    if not args.json:
        print(f"calmkit demo: {text}", file=sys.stderr, flush=True)


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def compare_to_uniform(sse: float, uniform_sse: float) -> str:
    """Uniform's error against the estimate's, in words that cannot be misread."""
    if sse <= 0:
        return "the estimate is exact"
    ratio = uniform_sse / sse
    if ratio >= 1:
        return f"Uniform's error is {ratio:.{0 if ratio >= 10 else 1}f}x the estimate's"
    return f"the estimate's error is {1 / ratio:.1f}x Uniform's: it does worse than knowing nothing"


def _tables(pop: Any, answers: list[tuple[tuple[int, ...], Any]]) -> list[dict[str, Any]]:
    """Each answer as a labelled table beside the truth, with its SSE and Uniform's."""
    import numpy as np

    schema = pop.schema
    rows = []
    for q, answer in answers:
        truth = pop.marginal(q)
        labels = [schema.attributes[a].categories for a in q]
        cells = [
            {
                "labels": [labels[i][c] for i, c in enumerate(index)],
                "true": float(truth[index]),
                "estimate": float(answer.values[index]),
                "total_error": float(np.sqrt(answer.variance[index])),
            }
            for index in np.ndindex(truth.shape)
        ]
        rows.append(
            {
                "attrs": list(answer.attributes),
                "method": answer.method,
                "sse": float(((answer.values - truth) ** 2).sum()),
                "uniform_sse": float(((truth - 1.0 / truth.size) ** 2).sum()),
                "cells": cells,
            }
        )
    return rows


DEMO_CELLS = 12  # table rows printed per query (--json has every cell)


def _print_demo(
    out: dict[str, Any], pop: Any, info: Any, closed: Any, address: str, seconds: float
) -> None:
    plan, phases = closed.plan, out["phases"]
    print(f"calmkit demo: {pop.describe().splitlines()[0]} (seed {out['seed']})")
    print(f"  server on {address}, SQLite storage in a temporary directory")
    print(f"  collection {closed.collection_id}, epsilon {out['epsilon']} per user")
    if len(phases) > 2:
        print(
            f"  pilot, two rounds: {phases[0]['reports']} users reported on "
            f"{_plural(info.plan.m, 'view')} (random attribute pairs), then "
            f"{phases[1]['reports']} on\n  pairs chosen from their reports"
        )
    elif len(phases) > 1:
        print(f"  pilot: {phases[0]['reports']} users reported on {_plural(info.plan.m, 'view')}")
    if len(phases) > 1:
        print(
            f"  from the pilot's reports the server chose {_plural(plan.m, 'view')} of "
            f"{_plural(max(len(v) for v in plan.views), 'attribute')}\n  for the other "
            f"{phases[-1]['reports']} users (plan {plan.digest[:12]})"
        )
    else:
        print(f"  one phase: {_plural(plan.m, 'view')} (plan {plan.digest[:12]})")
    print(f"  {out['acknowledged']} reports acknowledged, {out['counted']} counted; closed")
    print("  answers: 'projection' sums down a view that holds every queried attribute;")
    print("  'maxent' (no view holds them all) is the maximum-entropy table that agrees with")
    print("  the views' overlapping marginals. SSE: sum of squared errors over the cells;")
    print("  Uniform: the error of answering 1/cells everywhere, knowing nothing.")
    for r in out["queries"]:
        names = r["attrs"]
        print(
            f"\n  {' x '.join(names)}: {r['method']}, SSE {r['sse']:.2e}; Uniform "
            f"{r['uniform_sse']:.2e} ({compare_to_uniform(r['sse'], r['uniform_sse'])})"
        )
        width = [
            max(len(n), *(len(c["labels"][i]) for c in r["cells"])) for i, n in enumerate(names)
        ]
        head = "  ".join(n.ljust(w) for n, w in zip(names, width))
        print(f"    {head}    true  estimate  total.err")
        for c in r["cells"][:DEMO_CELLS]:
            cell = "  ".join(lab.ljust(w) for lab, w in zip(c["labels"], width))
            print(f"    {cell}  {c['true']:6.3f}  {c['estimate']:8.3f}  {c['total_error']:9.3f}")
        if len(r["cells"]) > DEMO_CELLS:
            print(f"    ... {len(r['cells']) - DEMO_CELLS} more cells (--json has every cell)")
    print("\n  total.err: the estimate's root-mean-square total error, noise + estimated bias:")
    print("  a parametric bootstrap of the unshrunk reconstruction (32 replicates: its noise")
    print("  and bias), the shrinkage's displacement, and for max-ent answers the interactions")
    print("  no view holds, sized from those the views show. estimate +- 1.96 total.err is a")
    print("  ~95% interval (measured coverage: docs/uncertainty.md)")
    print(f"  done in {seconds:.1f} s")
