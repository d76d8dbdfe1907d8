"""The service's commands of ``calmkit``: serve, collection and query, each with its
options beside the code that runs it (:func:`register` adds them to the ``calmkit``
parser), and the planner's options that ``calmkit plan`` and ``calmkit simulate`` share
with ``collection create``.

Importing this module loads neither numpy nor anything of the aggregator extra: the
server, the admin client and the planner are imported when a command runs or its
options are added.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shlex
import shutil
import signal
import stat
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from calmkit_client import CalmkitError, SchemaError
from calmkit_client.commands import (
    NON_NEGATIVE,
    POSITIVE,
    add_command,
    fraction,
    json_option,
    positive_float,
)

from .admission_cli import admission_spec
from .admission_cli import register as register_admission
from .backup_cli import register as register_backup

if TYPE_CHECKING:
    from calmkit_client import Schema

    from .store import ReportStore

__all__ = ["DEFAULT_ADDRESS", "planning_options", "register"]

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
    from calmkit_aggregator.service.admin import AdminClient

    return AdminClient(
        args.address, _read_token(args.token_file), root_certificates=_read_ca(args.tls_ca)
    )


# -- options shared by commands -----------------------------------------------------------
def _address_options(parser: argparse.ArgumentParser) -> None:
    """Where the admin commands (collection, query) find the service."""
    parser.add_argument(
        "--address", default=DEFAULT_ADDRESS, metavar="HOST:PORT", help="the aggregator service"
    )
    parser.add_argument(
        "--token-file",
        default=None,
        metavar="FILE",
        help="file holding the admin bearer token (mode 0600; needed when the server has one)",
    )
    parser.add_argument(
        "--tls-ca",
        default=None,
        metavar="FILE",
        help="PEM certificate that signs (or is) the server's: connect with "
        "TLS (default: plaintext, for a loopback server)",
    )


def planning_options(parser: argparse.ArgumentParser) -> None:
    """The planner's options (``calmkit plan``, ``simulate`` and ``collection create``):
    --planner, --pilot, --theta, --l, --m. They default to None (not given), and the
    command sets its own."""
    from calmkit_aggregator.planning.algorithm1 import DEFAULT_THETA
    from calmkit_aggregator.planning.collection import PLANNERS
    from calmkit_aggregator.planning.pilot import PILOT_FRACTION

    parser.add_argument(
        "--planner",
        choices=PLANNERS,
        default=None,
        help="pipeline: a pilot (one phase, or two where half of it can measure "
        "attribute pairs: the second on pairs chosen from the first), then the views "
        "with the lowest predicted error of the whole reconstruction; paper: CALM's "
        "Algorithm 1, one phase (default: pipeline)",
    )
    parser.add_argument(
        "--pilot",
        type=fraction,
        default=None,
        metavar="SHARE",
        help=f"share of the users in the pilot, both rounds (pipeline planner; 0: "
        f"no pilot; default {PILOT_FRACTION})",
    )
    parser.add_argument(
        "--theta",
        type=positive_float,
        default=None,
        help="Algorithm 1's threshold on the sampling/noise trade-off "
        f"(paper planner; default {DEFAULT_THETA})",
    )
    parser.add_argument(
        "--l", type=POSITIVE, default=None, help="fix the view size (default: the planner chooses)"
    )
    parser.add_argument(
        "--m",
        type=POSITIVE,
        default=None,
        help="fix the number of views (default: the planner chooses)",
    )


# -- serve --------------------------------------------------------------------------------
def _serve_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--address",
        default=DEFAULT_ADDRESS,
        metavar="HOST:PORT",
        help="where to listen (port 0: any free port; off loopback needs --token-file and TLS)",
    )
    parser.add_argument(
        "--db",
        required=True,
        metavar="FILE|URL",
        help="SQLite database file (created with mode 0600 if missing), or a "
        "postgresql://user@host/db URL shared by replica servers",
    )
    parser.add_argument(
        "--db-password-file",
        default=None,
        metavar="FILE",
        help="with a postgresql:// --db: a file (mode 0600) whose first line is the "
        "password (or set PGPASSWORD, or PGPASSFILE; never put it in --db)",
    )
    parser.add_argument(
        "--key-snapshots",
        default=None,
        metavar="DIR",
        help="with a postgresql:// --db: a folder for this replica's "
        "snapshots of its deduplication tables, so a restart loads them "
        "instead of reading the whole log (SQLite: always FILE-keys/)",
    )
    parser.add_argument(
        "--token-file",
        default=None,
        metavar="FILE",
        help="admin bearer token, mode 0600 (default: none, admin calls open: loopback only)",
    )
    parser.add_argument(
        "--grace",
        type=positive_float,
        default=10.0,
        metavar="SECONDS",
        help="on SIGTERM, how long in-flight calls may finish",
    )
    parser.add_argument(
        "--tls-cert",
        default=None,
        metavar="FILE",
        help="PEM certificate chain: serve TLS (with --tls-key)",
    )
    parser.add_argument(
        "--tls-key", default=None, metavar="FILE", help="PEM private key of --tls-cert (mode 0600)"
    )
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="allow a non-loopback --address without TLS (only behind a "
        "TLS-terminating proxy or on a private network)",
    )
    _serve_limit_options(parser)
    _serve_endpoint_options(parser)


def _serve_limit_options(parser: argparse.ArgumentParser) -> None:
    """What one client address may cost: reports per second, calls in flight, time to
    send a request."""
    parser.add_argument(
        "--rate-limit",
        type=positive_float,
        default=None,
        metavar="REPORTS_PER_S",
        help="cap each client address at this many reports per second per collection "
        "(default: no cap)",
    )
    parser.add_argument(
        "--rate-burst",
        type=POSITIVE,
        default=None,
        metavar="REPORTS",
        help="the largest batch a client address may send at once under --rate-limit; "
        "larger batches are refused and the client splits them (default: one second's "
        "worth of --rate-limit)",
    )
    parser.add_argument(
        "--max-calls-per-address",
        type=NON_NEGATIVE,
        default=None,
        metavar="N",
        help="calls in flight from one client address (an IPv6 /64), so streams one "
        "address stalls cannot take the server's 2048 slots; clients behind one proxy or "
        "NAT share its address: raise it (or 0: no cap, and no reserve) behind a proxy "
        "that keeps more calls open. The last eighth of the slots is kept for networks "
        "with fewer than 4 calls in flight (default: 256)",
    )
    parser.add_argument(
        "--body-timeout",
        type=positive_float,
        default=None,
        metavar="SECONDS",
        help="a call's request message must arrive within this long, or the call ends "
        "DEADLINE_EXCEEDED; raise it if clients send large batches over slow links "
        "(default: 30, enough for 16 MiB at 4.3 Mbit/s)",
    )


def _serve_endpoint_options(parser: argparse.ArgumentParser) -> None:
    """The optional HTTP endpoints beside the gRPC service."""
    parser.add_argument(
        "--metrics-address",
        default=None,
        metavar="HOST:PORT",
        help="serve Prometheus metrics at http(s)://HOST:PORT/metrics, under --address's "
        "rules (off loopback: --token-file, whose token scrapes need as a bearer token, "
        "and TLS) (default: none, no metrics endpoint)",
    )
    parser.add_argument(
        "--console",
        default=None,
        metavar="HOST:PORT",
        help="serve the read-only web console at http(s)://HOST:PORT/, under --address's "
        "rules; with --token-file it asks for the admin token (default: none, no console)",
    )


def _read_db_password(args: argparse.Namespace) -> str | None:
    """``--db-password-file``'s first line (mode 0600 checked); a password inside a
    postgresql:// ``--db`` is refused."""
    from calmkit_aggregator.service.pg_storage import is_postgres_url, refuse_password_in

    if is_postgres_url(args.db):
        refuse_password_in(args.db)
    path = getattr(args, "db_password_file", None)
    if path is None:
        return None
    try:
        lines = _read_secret_file("db_password_file", path).decode("utf-8").splitlines()
    except UnicodeDecodeError:
        raise CalmkitError(f"db_password_file ({path!r}) must be UTF-8 text") from None
    if not lines or not lines[0]:
        raise CalmkitError(f"db_password_file ({path!r}) must hold the password on its first line")
    return lines[0]


def _new_paths(db: str) -> list[str]:
    """The files a SQLite store at ``db`` would create that do not exist yet."""
    paths = [db, db + "-wal", db + "-shm", db + "-journal", db + "-keys"]
    return [p for p in paths if not os.path.lexists(p)]


def _remove(paths: list[str]) -> None:
    """Remove what this start created (files, or the key snapshot folder)."""
    for path in paths:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):  # never created, or not removable: keep the error
                os.unlink(path)


def _open_storage(db: str, snapshots: str | None, password: str | None) -> ReportStore:
    """The store behind ``--db``: PostgreSQL for a postgresql:// URL, else SQLite."""
    from calmkit_aggregator.service.pg_storage import PgStorage, is_postgres_url
    from calmkit_aggregator.service.storage import Storage

    if is_postgres_url(db):
        return PgStorage(db, key_snapshots=snapshots, password=password)
    if password is not None:
        raise CalmkitError("db_password_file must go with a postgresql:// db")
    if snapshots is not None:
        raise CalmkitError(
            f"key_snapshots ({snapshots!r}) must go with a postgresql:// db (SQLite keeps "
            "its key snapshots next to the database file, in FILE-keys/)"
        )
    return Storage(db)


def _stream_limits(args: argparse.Namespace) -> dict[str, Any]:
    """``--max-calls-per-address`` and ``--body-timeout`` as given (create_server's
    defaults otherwise)."""
    given = {
        "max_calls_per_address": args.max_calls_per_address,
        "body_timeout": args.body_timeout,
    }
    return {name: value for name, value in given.items() if value is not None}


def _start(
    args: argparse.Namespace, token: str | None, tls: Any, limits: dict[str, Any]
) -> tuple[ReportStore, Any, int]:
    """The store behind ``--db`` and the server on it, started; a refused start closes
    the store and leaves none of the files it created behind."""
    from calmkit_aggregator.service.pg_storage import is_postgres_url
    from calmkit_aggregator.service.server import create_server

    password = _read_db_password(args)
    snapshots = getattr(args, "key_snapshots", None)
    created = [] if is_postgres_url(args.db) else _new_paths(args.db)
    try:
        storage = _open_storage(args.db, snapshots, password)
        try:
            server, port = create_server(
                args.address,
                storage,
                admin_token=token,
                tls=tls,
                insecure=args.insecure,
                rate_limit=args.rate_limit,
                rate_burst=args.rate_burst,
                metrics_address=args.metrics_address,
                console_address=args.console,
                **limits,
            )
        except BaseException:
            storage.close()
            raise
    except BaseException:
        _remove(created)  # a refused start leaves nothing of its own behind
        raise
    return storage, server, port


def _announce(
    args: argparse.Namespace,
    server: Any,
    port: int,
    db: str,
    admin_token: bool,
    tls: bool,
    limits: dict[str, Any],
) -> None:
    """Say where the server listens (stdout) and log how it serves."""
    from calmkit_aggregator.service.handlers import log_json

    host = args.address.rsplit(":", 1)[0]
    scheme = "TLS" if tls else "plaintext"
    print(f"calmkit serve: listening on {host}:{port} ({scheme}, db {db})", flush=True)
    web = "https" if tls else "http"
    for what, address, port_of, path in (
        ("metrics", args.metrics_address, server.metrics_port, "/metrics"),
        ("console", args.console, server.console_port, "/"),
    ):
        if address is not None:
            print(f"calmkit serve: {what} on {web}://{address.rsplit(':', 1)[0]}:{port_of}{path}")
    if not admin_token:
        print(
            "calmkit serve: no --token-file, so admin calls are open; bound to loopback only",
            flush=True,
        )
    log_json(
        "serving",
        address=f"{host}:{port}",
        db=db,
        admin_token=admin_token,
        tls=tls,
        rate_limit=args.rate_limit,
        rate_burst=args.rate_burst,
        **limits,
        metrics_port=server.metrics_port,
        console_port=server.console_port,
    )


def _serve(args: argparse.Namespace) -> int:
    from calmkit_aggregator.service.address import probe_bind
    from calmkit_aggregator.service.handlers import log_json
    from calmkit_aggregator.service.server import (
        BODY_TIMEOUT_S,
        MAX_CALLS_PER_ADDRESS,
        ServerTls,
        check_exposure,
        graceful_stop,
    )

    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    token = _read_token(args.token_file)
    if (args.tls_cert is None) != (args.tls_key is None):
        raise CalmkitError("tls_cert and tls_key must be given together")
    tls = None
    if args.tls_cert is not None:
        _read_secret_file("tls_key", args.tls_key)  # the key file's mode is checked
        tls = ServerTls.from_files(args.tls_cert, args.tls_key)
    if args.rate_burst is not None and args.rate_limit is None:
        raise CalmkitError(f"rate_burst ({args.rate_burst}) must go with --rate-limit")
    check_exposure(args.address, token, tls, args.insecure)  # before anything is created
    limits = {
        "max_calls_per_address": MAX_CALLS_PER_ADDRESS,
        "body_timeout": BODY_TIMEOUT_S,
        **_stream_limits(args),
    }
    extra = {"metrics_address": args.metrics_address, "console": args.console}
    for option, address in extra.items():
        if address is not None:
            check_exposure(address, token, tls, args.insecure, option=option)
    for address in (args.address, *(a for a in extra.values() if a is not None)):
        probe_bind(address)  # a port in use: refused before the store creates anything
    storage, server, port = _start(args, token, tls, limits)
    # Set before "listening" is printed, so a SIGTERM at once still stops gracefully.
    # A plain list, not a threading.Event: the handler runs in the main thread between
    # bytecodes, possibly inside the Event's own wait() holding its lock, and Event.set()
    # would then wait for that lock for ever (seen: a server that never stopped).
    signals: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: signals.append(signum))
    _announce(args, server, port, storage.path, token is not None, tls is not None, limits)
    # a timed sleep: a signal delivered to another thread (gRPC's) only marks the Python
    # handler as pending, and a main thread blocked without a timeout would never run it
    while not signals:
        time.sleep(0.2)
    log_json("stopping", grace_seconds=args.grace)
    graceful_stop(server, args.grace)
    storage.close()
    log_json("stopped")
    return 0


# -- collection ---------------------------------------------------------------------------
def _collection_options(parser: argparse.ArgumentParser) -> None:
    from calmkit_aggregator.reconstruction.methods import RECONSTRUCTIONS

    parser.add_argument(
        "action",
        choices=["create", "close", "status", "list"],
        help="create a collection (prints its plan and submit token), close "
        "it (no more reports), show its status, or list all",
    )
    _address_options(parser)
    parser.add_argument(
        "--collection",
        default=None,
        metavar="ID",
        help="the collection id (create: the new id, 1-64 characters of "
        "A-Z a-z 0-9 . _ -; default: the server picks one)",
    )
    parser.add_argument("--id", dest="collection", help=argparse.SUPPRESS)  # old name
    parser.add_argument(
        "--domain",
        default=None,
        metavar="SIZES",
        help="create: category counts of the attributes a0, a1, ..., e.g. 2,3,2",
    )
    parser.add_argument(
        "--schema",
        default=None,
        metavar="FILE",
        help="create: a schema JSON file (names and categories; "
        "Schema.to_dict) instead of --domain (not both)",
    )
    parser.add_argument(
        "--epsilon",
        type=positive_float,
        default=None,
        help="create: each user's LDP budget (required)",
    )
    parser.add_argument(
        "--n",
        type=POSITIVE,
        default=None,
        help="create: how many users are expected to report (the planner "
        "needs it; may be omitted with --views)",
    )
    parser.add_argument(
        "--k", type=POSITIVE, default=3, help="create: the size of the marginals to be queried"
    )
    planning_options(parser)
    parser.add_argument(
        "--reconstruct",
        choices=RECONSTRUCTIONS,
        default="local",
        help="create: the reconstruction the pipeline planner plans for, local "
        "or global (it predicts that one's error); queries can still ask for "
        "either (query --reconstruct)",
    )
    parser.add_argument(
        "--views",
        default=None,
        metavar="VIEWS",
        help="create: explicit views instead of a planner (so not with --planner, "
        "--pilot, --theta, --l or --m), e.g. '0,1;1,2'",
    )
    parser.add_argument(
        "--seed", type=NON_NEGATIVE, default=0, help="create: seed of the plan's view assignment"
    )
    parser.add_argument(
        "--max-reports",
        type=NON_NEGATIVE,
        default=0,
        metavar="N",
        help="create: the most reports the collection takes; a batch that would pass "
        "it is refused whole (CollectionFull). 0 (default): 2 x --n",
    )
    parser.add_argument(
        "--admission",
        default=None,
        metavar="SCHEME:FILE",
        help="create: every report needs an admission ticket: ed25519:PUBLIC_KEY_FILE, "
        "hmac:KEY_FILE or aes:KEY_FILE (shared keys, mode 0600), made by `calmkit admission "
        "keygen`",
    )
    json_option(parser)


def _schema_from_args(args: argparse.Namespace) -> Schema:
    from calmkit_client import Schema

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
        "max_reports": info.max_reports,
        "expected_n": info.expected_n,
        "flags": list(info.flags),
        "pilot_check": info.pilot_check,
        "admission": info.admission,
        **({"submit_token": info.submit_token} if info.submit_token else {}),
    }


def _collection(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        if args.action == "create":
            info = admin.create_collection(
                _schema_from_args(args),
                args.epsilon,
                args.n or 0,
                args.k,
                collection_id=args.collection or "",
                theta=args.theta,
                views=_parse_views(args.views),
                m=args.m,
                l=args.l,
                seed=args.seed,
                planner=args.planner or "pipeline",
                pilot=args.pilot,
                reconstruction=args.reconstruct,
                max_reports=args.max_reports,
                admission=admission_spec(args.admission),
            )
        elif args.action == "close":
            info = admin.close_collection(args.collection)
        elif args.action == "list":
            items = [_info_dict(i) for i in admin.list_collections()]
            print(
                json.dumps(items)
                if args.json
                else "\n".join(
                    f"{i['collection_id']}  {i['state']:6s}  {i['reports']} reports  m={i['m']}"
                    for i in items
                )
            )
            return 0
        else:
            info = admin.get_collection(args.collection)
    out = _info_dict(info)
    if args.json:
        print(json.dumps(out))
        return 0
    expected = f" of {out['expected_n']} expected (--n)" if out["expected_n"] else ""
    print(f"collection {out['collection_id']}: {out['state']}, {out['reports']} reports{expected}")
    if info.in_pilot:
        print(
            f"  phase {out['phase']} (pilot): {out['reports']} of {out['pilot_target']} "
            "reports; then the server chooses the views of the main phase from them"
        )
    elif out["pilot_target"]:
        print(f"  phase {out['phase']} (after a pilot of {info.pilot_reports} reports)")
    print(
        f"  plan {out['plan_digest'][:16]}: m = {out['m']} views of l = {out['l']}, "
        f"k = {out['k']}, oracles {sorted(set(out['oracles']))}"
    )
    print(f"  report cap: {out['max_reports']}" if out["max_reports"] else "  report cap: none")
    if out["pilot_check"]:
        print(f"  pilot check: {out['pilot_check']}")
    for flag in out["flags"]:
        print(f"  MANIPULATION FLAG: {flag}")
    if out["admission"]:
        print(f"  admission tickets required: {out['admission']}")
    if "submit_token" in out:
        print(f"  submit token (shown once; give it to your apps): {out['submit_token']}")
    return 0


def _collection_checked(args: argparse.Namespace) -> int:
    if args.action in ("close", "status") and not args.collection:
        raise CalmkitError(f"collection (none given) must be set for '{args.action}'")
    if args.action == "create":
        _check_create_conflicts(args)
    if args.action == "create" and args.epsilon is None:
        raise CalmkitError("epsilon (none given) must be set for 'create'")
    if args.action == "create" and args.n is None and not args.views:
        raise CalmkitError(
            "n (none given) must be set for 'create': how many users are expected to report "
            "(the planner needs it), or give --views"
        )
    return _collection(args)


# collection create's planner options, which explicit --views replace
_PLANNER_FLAGS = ("planner", "pilot", "theta", "l", "m")


def _check_create_conflicts(args: argparse.Namespace) -> None:
    """Options of ``collection create`` that exclude each other: --schema and --domain
    (both say what the attributes are), --views and the planner's options (explicit
    views are not planned). Either one would be dropped in silence."""
    if args.schema and args.domain:
        raise CalmkitError(
            f"schema ({args.schema!r}) must not go with --domain ({args.domain!r}): both "
            "give the attributes; give one of them"
        )
    planned = [
        f"--{k} ({getattr(args, k)})" for k in _PLANNER_FLAGS if getattr(args, k) is not None
    ]
    if args.views and planned:
        raise CalmkitError(
            f"views ({args.views!r}) must not go with {', '.join(planned)}: explicit views "
            "are not planned; give the views or the planner's options"
        )


# -- query --------------------------------------------------------------------------------
def _query_options(parser: argparse.ArgumentParser) -> None:
    from calmkit_aggregator.reconstruction.methods import RECONSTRUCTIONS

    _address_options(parser)
    parser.add_argument("--collection", required=True, metavar="ID", help="the collection id")
    parser.add_argument(
        "--attrs",
        required=True,
        metavar="NAMES",
        help="attribute names, comma-separated, e.g. a0,a2",
    )
    parser.add_argument(
        "--format", choices=["table", "csv", "json"], default="table", help="output format"
    )
    parser.add_argument(
        "--replicates",
        type=_replicates,
        default=0,
        help="bootstrap replicates behind the total errors (noise + "
        "estimated bias): 0 (default: the server's, 32) or 2 to 1000",
    )
    parser.add_argument(
        "--reconstruct",
        choices=RECONSTRUCTIONS,
        default="local",
        help="local: maximum entropy per query over the views' projections; "
        "global: also one model fitted to all views at once, which answers "
        "the pairs no view holds",
    )


# The server's bounds on bootstrap replicates (reconstruction.uncertainty.MAX_REPLICATES),
# checked here before any call (the parser loads without numpy or gRPC).
_MAX_REPLICATES = 1000


def _replicates(text: str) -> int:
    """An argparse type: 0 (the server's default) or 2 to 1000 bootstrap replicates."""
    value = NON_NEGATIVE(text)
    if value == 1 or value > _MAX_REPLICATES:
        raise argparse.ArgumentTypeError(
            f"({value}) must be 0 (the server's default) or in [2, {_MAX_REPLICATES}]"
        )
    return value


def _query(args: argparse.Namespace) -> int:
    attrs = [a.strip() for a in args.attrs.split(",") if a.strip()]
    with _admin(args) as admin:
        answer = admin.query(
            args.collection, attrs, args.replicates, getattr(args, "reconstruct", "")
        )
    from calmkit_aggregator.service.answer_format import format_answer

    print(format_answer(answer, args.format))
    return 0


# -- registration -------------------------------------------------------------------------
def register(subparsers: Any) -> None:
    """Add serve, collection and query to the ``calmkit`` parser's ``subparsers``. serve
    and collection need the aggregator extra (``pip install 'calmkit[aggregator]'``);
    query only talks to a running service, so the base install runs it."""
    add_command(
        subparsers,
        "serve",
        "run the aggregator service",
        run=_serve,
        options=_serve_options,
        extra="aggregator",
    )
    add_command(
        subparsers,
        "collection",
        "create, close, list or show collections",
        run=_collection_checked,
        options=_collection_options,
        extra="aggregator",
    )
    add_command(
        subparsers,
        "query",
        "a marginal table of a collection, each cell with its total error (noise + estimated bias)",
        run=_query,
        options=_query_options,
        extra=None,
    )
    register_admission(subparsers)
    register_backup(subparsers)
