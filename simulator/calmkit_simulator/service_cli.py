"""The service commands of ``calmkit``: serve, collection, query, and the demo that
runs all of it on one machine."""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import signal
import stat
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from calmkit_client import CalmkitError, Schema, SchemaError

DEFAULT_ADDRESS = "127.0.0.1:50051"


def _read_secret_file(option: str, path: str) -> bytes:
    """A file holding a secret: readable, and not by other users (like ssh keys)."""
    try:
        mode = os.stat(path).st_mode
        data = Path(path).read_bytes()
    except OSError as exc:
        raise CalmkitError(f"{option} ({path!r}) must be readable: {exc.strerror}") from None
    if os.name == "posix" and mode & 0o077:
        raise CalmkitError(
            f"{option} ({path!r}) must not be readable by other users (mode "
            f"{stat.S_IMODE(mode):04o}): run chmod 600 {shlex.quote(path)}"
        )
    return data


def _read_token(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        token = _read_secret_file("token_file", path).decode("utf-8").strip()
    except UnicodeDecodeError:
        raise CalmkitError(f"token_file ({path!r}) must be UTF-8 text") from None
    if len(token) < 16:
        raise CalmkitError(f"token_file ({path!r}) must hold a token of >= 16 characters")
    return token


def _read_ca(path: str | None) -> bytes | None:
    """``--tls-ca``: the PEM certificate(s) that sign (or are) the server's."""
    if path is None:
        return None
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise CalmkitError(f"tls_ca ({path!r}) must be readable: {exc.strerror}") from None
    if b"-----BEGIN CERTIFICATE-----" not in data:
        raise CalmkitError(f"tls_ca ({path!r}) must be a PEM certificate file")
    return data


def _admin(args: argparse.Namespace) -> Any:
    from calmkit_aggregator.admin import AdminClient

    return AdminClient(args.address, _read_token(args.token_file),
                       root_certificates=_read_ca(args.tls_ca))  # fmt: skip


def _progress(total: int, desc: str, enabled: bool) -> Any:
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # progress bars are optional
        return None
    return tqdm(total=total, desc=desc, unit="report", file=sys.stderr)


# -- serve --------------------------------------------------------------------------------
def _serve(args: argparse.Namespace) -> int:
    from calmkit_aggregator.pg_storage import PgStorage, is_postgres_url
    from calmkit_aggregator.server import ServerTls, create_server, graceful_stop
    from calmkit_aggregator.service import log_json
    from calmkit_aggregator.storage import Storage

    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    token = _read_token(args.token_file)
    if (args.tls_cert is None) != (args.tls_key is None):
        raise CalmkitError("tls_cert and tls_key must be given together")
    tls = None
    if args.tls_cert is not None:
        _read_secret_file("tls_key", args.tls_key)  # the key file's mode is checked
        tls = ServerTls.from_files(args.tls_cert, args.tls_key)
    storage = PgStorage(args.db) if is_postgres_url(args.db) else Storage(args.db)
    try:
        server, port = create_server(
            args.address, storage, admin_token=token, tls=tls, insecure=args.insecure,
            rate_limit=args.rate_limit,
        )  # fmt: skip
    except BaseException:
        storage.close()
        raise
    host = args.address.rsplit(":", 1)[0]
    scheme = "TLS" if tls is not None else "plaintext"
    print(f"calmkit serve: listening on {host}:{port} ({scheme}, db {storage.path})", flush=True)
    if token is None:
        print("calmkit serve: no --token-file, so admin calls are open; bound to loopback only",
              flush=True)  # fmt: skip
    log_json("serving", address=f"{host}:{port}", db=storage.path, admin_token=token is not None,
             tls=tls is not None, rate_limit=args.rate_limit)  # fmt: skip
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    log_json("stopping", grace_seconds=args.grace)
    graceful_stop(server, args.grace)
    storage.close()
    log_json("stopped")
    return 0


# -- collection ---------------------------------------------------------------------------
def _schema_from_args(args: argparse.Namespace) -> Schema:
    if args.schema:
        try:
            return Schema.from_dict(json.loads(Path(args.schema).read_text(encoding="utf-8")))
        except (OSError, json.JSONDecodeError) as exc:
            msg = f"schema ({args.schema!r}) must be a readable JSON file: {exc}"
            raise SchemaError(msg) from None
    if args.domain:
        try:
            return Schema.from_sizes([int(x) for x in args.domain.split(",")])
        except ValueError:
            raise SchemaError(f"domain ({args.domain!r}) must be comma-separated ints") from None
    raise SchemaError("schema (none given) must come from --domain or --schema")


def _parse_views(text: str | None) -> list[list[int]] | None:
    if not text:
        return None
    try:
        return [[int(a) for a in part.split(",")] for part in text.split(";")]
    except ValueError:
        raise CalmkitError(f"views ({text!r}) must look like '0,1;1,2;0,2'") from None


def _info_dict(info: Any) -> dict[str, Any]:
    return {
        "collection_id": info.collection_id,
        "state": info.state,
        "m": info.plan.m,
        "l": max(len(v) for v in info.plan.views),
        "views": [list(v) for v in info.plan.views],
        "oracles": list(info.plan.oracles or ()),
        "plan_digest": info.plan.digest,
        "k": info.k,
        "reports": info.reports,
        "view_reports": list(info.view_reports),
        "phase": info.phase,
        "phase_reports": list(info.phase_reports),
        "pilot_target": info.pilot_target,
        **({"submit_token": info.submit_token} if info.submit_token else {}),
    }


def _collection(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        if args.action == "create":
            info = admin.create_collection(
                _schema_from_args(args), args.epsilon, args.n or 0, args.k,
                collection_id=args.collection or "", theta=args.theta,
                views=_parse_views(args.views),
                m=args.m, l=args.l, seed=args.seed, planner=args.planner, pilot=args.pilot,
            )  # fmt: skip
        elif args.action == "close":
            info = admin.close_collection(args.collection)
        elif args.action == "list":
            items = [_info_dict(i) for i in admin.list_collections()]
            print(json.dumps(items) if args.json else "\n".join(
                f"{i['collection_id']}  {i['state']:6s}  {i['reports']} reports  m={i['m']}"
                for i in items))  # fmt: skip
            return 0
        else:
            info = admin.get_collection(args.collection)
    out = _info_dict(info)
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"collection {out['collection_id']}: {out['state']}, {out['reports']} reports")
    if out["pilot_target"] and out["phase"] == 0:
        print(f"  phase 0 (pilot): {out['reports']} of {out['pilot_target']} reports; then the "
              "server chooses the views of phase 1 from them")  # fmt: skip
    elif out["pilot_target"]:
        print(f"  phase {out['phase']} (after a pilot of {out['phase_reports'][0]} reports)")
    print(f"  plan {out['plan_digest'][:16]}: m = {out['m']} views of l = {out['l']}, "
          f"k = {out['k']}, oracles {sorted(set(out['oracles']))}")  # fmt: skip
    if "submit_token" in out:
        print(f"  submit token (shown once; give it to your apps): {out['submit_token']}")
    return 0


# -- query --------------------------------------------------------------------------------
def _format_table(answer: Any, fmt: str) -> str:
    from itertools import product

    values, variance = answer.values, answer.variance
    cells = list(product(*(range(s) for s in values.shape)))
    if fmt == "json":
        return json.dumps({
            "attributes": list(answer.attributes), "shape": list(values.shape),
            "values": values.reshape(-1).tolist(),
            "variance": [None if np.isnan(v) else v for v in variance.reshape(-1).tolist()],
            "method": answer.method, "reports": answer.reports, "state": answer.state,
            "variance_method": answer.variance_method, "replicates": answer.replicates,
        })  # fmt: skip
    if fmt == "csv":
        lines = [",".join([*answer.attributes, "fraction", "std_error"])]
        for c in cells:
            se = "" if np.isnan(variance[c]) else f"{np.sqrt(variance[c]):.6g}"
            lines.append(",".join([*map(str, c), f"{values[c]:.6g}", se]))
        return "\n".join(lines)
    header = "  ".join(f"{a:>10s}" for a in answer.attributes) + "    fraction   std.err"
    lines = [header]
    for c in cells:
        se = "       n/a" if np.isnan(variance[c]) else f"{np.sqrt(variance[c]):10.4f}"
        lines.append("  ".join(f"{x:>10d}" for x in c) + f"  {values[c]:10.4f}{se}")
    note = "" if answer.state == "closed" else " (collection open: provisional)"
    lines.append(f"{answer.method}, {answer.reports} reports{note}")
    if answer.variance_method:
        lines.append(f"std.err: {answer.variance_method}")
    return "\n".join(lines)


def _query(args: argparse.Namespace) -> int:
    attrs = [a.strip() for a in args.attrs.split(",") if a.strip()]
    with _admin(args) as admin:
        answer = admin.query(args.collection, attrs, args.replicates)
    print(_format_table(answer, args.format))
    return 0


# -- demo ---------------------------------------------------------------------------------
DEMO_SIZES = (2, 3, 2, 2, 4, 2, 3, 2)
DEMO_QUERIES = [(0, 1), (2, 4), (5, 7), (0, 1, 2), (3, 4, 6), (1, 5, 7)]
DEMO_WAVES = 20


def _demo(args: argparse.Namespace) -> int:
    """Everything on one machine: an embedded server on a free loopback port with a
    temporary SQLite database, a synthetic population reporting through the real
    client over gRPC, then 2- and 3-way marginals beside the truth."""
    from calmkit_aggregator.admin import AdminClient
    from calmkit_aggregator.server import create_server, graceful_stop
    from calmkit_aggregator.storage import Storage
    from calmkit_client import wire as client_wire
    from calmkit_client.collector import Collector

    from .devices import SimulatedDevices
    from .synthetic import synthetic_population

    t0 = time.perf_counter()
    pop = synthetic_population(n=args.users, sizes=DEMO_SIZES, strength=1.5, rng=args.seed)
    with tempfile.TemporaryDirectory(prefix="calmkit-demo-") as tmp:
        storage = Storage(Path(tmp) / "aggregator.db")
        server, port = create_server("127.0.0.1:0", storage)
        address = f"127.0.0.1:{port}"
        try:
            with AdminClient(address) as admin:
                info = admin.create_collection(
                    pop.schema, args.epsilon, pop.n, 3, collection_id="demo", seed=args.seed
                )
                bar = _progress(pop.n, "reports", sys.stderr.isatty() and not args.json)
                # simulated devices: seeded, so the same --seed prints the same tables
                state = SimulatedDevices.seeded(args.seed)
                ids = np.arange(pop.n, dtype=np.uint64)
                # users arrive in waves; each wave fetches the plan again, so once the
                # pilot has its reports the next waves report under the second phase
                waves = np.array_split(np.arange(pop.n), DEMO_WAVES)
                with Collector(address, info.collection_id, info.submit_token, state) as client:
                    ack = client_wire.Acknowledgement()
                    for wave in waves:
                        done = client.submit_many(pop.codes[wave], ids[wave],
                                                  progress=bar.update if bar else None)  # fmt: skip
                        ack = ack + done
                state.close()
                if bar is not None:
                    bar.close()
                closed = admin.close_collection(info.collection_id)
                answers = [
                    (q, admin.query(info.collection_id, [pop.schema.attributes[a].name for a in q]))
                    for q in DEMO_QUERIES
                ]
        finally:
            graceful_stop(server, 5.0)
            storage.close()
    schema = pop.schema
    rows = []
    for q, answer in answers:
        truth = pop.marginal(q)
        labels = [schema.attributes[a].categories for a in q]
        cells = [
            {"labels": [labels[i][c] for i, c in enumerate(index)],
             "true": float(truth[index]), "estimate": float(answer.values[index]),
             "std_error": float(np.sqrt(answer.variance[index]))}
            for index in np.ndindex(truth.shape)
        ]  # fmt: skip
        rows.append({
            "attrs": list(answer.attributes), "method": answer.method,
            "sse": float(((answer.values - truth) ** 2).sum()),
            "uniform_sse": float(((truth - 1.0 / truth.size) ** 2).sum()),
            "cells": cells,
        })  # fmt: skip
    phases = [{"reports": int(r)} for r in closed.phase_reports]
    phases[0]["views"] = info.plan.m
    if len(phases) > 1:
        phases[-1]["views"] = closed.plan.m
    out = {
        "users": pop.n, "epsilon": args.epsilon, "seed": args.seed,
        "acknowledged": ack.accepted + ack.duplicates,
        "counted": closed.reports,
        "phases": phases,
        "queries": rows,
    }  # fmt: skip
    seconds = time.perf_counter() - t0
    if args.json:
        print(json.dumps(out))
        return 0
    _print_demo(out, pop, info, closed, address, seconds)
    return 0


DEMO_CELLS = 12  # table rows printed per query (--json has every cell)


def _print_demo(out: dict[str, Any], pop: Any, info: Any, closed: Any, address: str,
                seconds: float) -> None:  # fmt: skip
    plan, phases = closed.plan, out["phases"]
    print(f"calmkit demo: {pop.describe().splitlines()[0]} (seed {out['seed']})")
    print(f"  server on {address}, SQLite storage in a temporary directory")
    print(f"  collection {closed.collection_id}, epsilon {out['epsilon']} per user")
    if len(phases) > 1:
        print(f"  pilot: {phases[0]['reports']} users reported on {info.plan.m} attribute "
              f"pairs; from their reports\n  the server chose {plan.m} views of "
              f"{max(len(v) for v in plan.views)} attributes for the other "
              f"{phases[1]['reports']} users (plan {plan.digest[:12]})")  # fmt: skip
    else:
        print(f"  one phase: m = {plan.m} views (plan {plan.digest[:12]})")
    print(f"  {out['acknowledged']} reports acknowledged, {out['counted']} counted; closed")
    print("  answers: 'projection' sums down a view that holds every queried attribute;")
    print("  'maxent' (no view holds them all) is the maximum-entropy table that agrees with")
    print("  the views' overlapping marginals. SSE: sum of squared errors over the cells;")
    print("  Uniform: the error of answering 1/cells everywhere, knowing nothing.")
    for r in out["queries"]:
        names = r["attrs"]
        ratio = r["uniform_sse"] / r["sse"] if r["sse"] > 0 else float("inf")
        print(f"\n  {' x '.join(names)}: {r['method']}, SSE {r['sse']:.2e} "
              f"(Uniform {r['uniform_sse']:.2e}, {ratio:.0f}x larger)")  # fmt: skip
        width = [max(len(n), *(len(c["labels"][i]) for c in r["cells"]))
                 for i, n in enumerate(names)]  # fmt: skip
        head = "  ".join(n.ljust(w) for n, w in zip(names, width))
        print(f"    {head}    true  estimate  std.err")
        for c in r["cells"][:DEMO_CELLS]:
            cell = "  ".join(lab.ljust(w) for lab, w in zip(c["labels"], width))
            print(f"    {cell}  {c['true']:6.3f}  {c['estimate']:8.3f}  {c['std_error']:7.3f}")
        if len(r["cells"]) > DEMO_CELLS:
            print(f"    ... {len(r['cells']) - DEMO_CELLS} more cells (--json has every cell)")
    print("\n  std.err: the estimate's standard error (parametric bootstrap, 32 replicates)")
    print(f"  done in {seconds:.1f} s")


def _collection_checked(args: argparse.Namespace) -> int:
    if args.action in ("close", "status") and not args.collection:
        raise CalmkitError(f"collection (none given) must be set for '{args.action}'")
    if args.action == "create" and args.epsilon is None:
        raise CalmkitError("epsilon (none given) must be set for 'create'")
    if args.action == "create" and args.n is None and not args.views:
        raise CalmkitError(
            "n (none given) must be set for 'create': how many users are expected to report "
            "(the planner needs it), or give --views"
        )
    return _collection(args)
