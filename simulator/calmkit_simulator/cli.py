"""The ``calmkit`` command line: every command and option, with help and defaults.

This module imports nothing heavy (``calmkit --help`` answers in a blink): each
command names its implementation as ``"module:function"``, imported only when the
command runs (``calmkit_aggregator.service.cli`` for the operator commands serve,
collection and query; :mod:`.demo_cli` for demo; :mod:`.data_cli` for datasets,
population, plan, simulate and experiment). Bad
input is one line on stderr, ``calmkit: error: ...``, and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

# Names the parser offers. They mirror constants of the heavy modules; a test
# (tests/integration/test_cli_help.py) keeps them equal.
DATASETS = {
    "synthetic": "random Bayesian network, d binary attributes (default, needs no files)",
    "synthetic:LO-HI": "the same with LO to HI categories per attribute (drawn uniformly)",
    "adult": "UCI Adult, 15 attributes, numeric ones bucketized",
    "nltcs": "NLTCS, 16 binary attributes",
    "acs": "ACS (PrivBayes binarization), 23 binary attributes",
    "retail": "FIMI retail transactions, top-d items as binary attributes",
    "kosarak": "FIMI kosarak prefix, top-d items as binary attributes",
    "plants": "USDA plants presence by state, 69 binary attributes (wide: 23,215 users)",
    "dna": "DNA splice-junction features, 180 binary attributes (wide: 3,186 users)",
    "csv:PATH": "your CSV of categorical columns (optional PATH.domains.json beside it)",
}
MECHANISMS = ("calm", "uni", "fc", "am", "ft", "em", "be", "priview", "mwem", "datacube", "wff")
FIGURES = ("central", "fig4", "fig5", "fig6", "fig7", "fig8", "fig9")
PLANNERS = ("pipeline", "paper")
RECONSTRUCTIONS = ("local", "global")
PILOT_FRACTION = 0.2
PATHS = ("fast", "faithful")
DEFAULT_ADDRESS = "127.0.0.1:50051"
OPERATOR = "calmkit_aggregator.service.cli"  # serve, collection, query live by the service
MIRROR_ENV = "CALMKIT_DATASET_MIRROR"
DEBUG_ENV = "CALMKIT_DEBUG"  # set: unexpected errors print their traceback


# -- option types: a bad value is a one-line error naming the option and value -----------
def _int_at_least(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"({text!r}) must be an int >= {low}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"({value}) must be an int >= {low}")
        return value

    parse.__name__ = f"int >= {low}"
    return parse


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"({text!r}) must be a number") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"({value!r}) must be finite and > 0")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"({text!r}) must be a number") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"({value!r}) must be in [0, 1)")
    return value


POSITIVE = _int_at_least(1)
NON_NEGATIVE = _int_at_least(0)


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Help with each option's default appended (unless the help states it)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            "default" not in text
            and action.default not in (None, False, argparse.SUPPRESS)
            and action.option_strings
        ):
            text += " (default: %(default)s)"
        return text


class _Parser(argparse.ArgumentParser):
    """One line on a usage error: ``calmkit: error: ...`` (exit 2)."""

    def error(self, message: str) -> Any:
        # "argument --max-categories: (1) must be ..." -> "max_categories (1) must be ..."
        named = re.match(r"argument (?:--)?([\w-]+)[^:]*: \((.*)$", message, re.DOTALL)
        choice = re.match(r"argument (?:--)?([\w-]+)[^:]*: invalid choice: (.*) \(choose from "
                          r"(.*)\)$", message, re.DOTALL)  # fmt: skip
        if named:
            message = f"{named[1].replace('-', '_')} ({named[2]}"
        elif choice:
            message = f"{choice[1].replace('-', '_')} ({choice[2]}) must be one of [{choice[3]}]"
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _command(sub: Any, name: str, run: str, help: str, description: str | None = None) -> Any:
    parser = sub.add_parser(name, help=help, description=description or help,
                            formatter_class=_Formatter)  # fmt: skip
    parser.set_defaults(run=run)
    return parser


def _json(parser: Any, what: str = "print one JSON object instead of text") -> None:
    parser.add_argument("--json", action="store_true", help=what)


def _data_options(parser: Any, dataset_help: str = "the population") -> None:
    names = "; ".join(f"{k}: {v}" for k, v in DATASETS.items())
    parser.add_argument("--dataset", default="synthetic", metavar="NAME",
                        help=f"{dataset_help}: {names}")
    parser.add_argument("--data-dir", default=None, metavar="DIR",
                        help="dataset folder (default: $CALMKIT_DATA, else the per-user "
                        "folder that `calmkit datasets fetch` fills)")  # fmt: skip
    parser.add_argument("--d", type=POSITIVE, default=None,
                        help="keep the first d attributes (transaction data: the d most "
                        "frequent items; synthetic: d attributes; default: all, or 8)")  # fmt: skip
    parser.add_argument("--max-categories", type=_int_at_least(2), default=None, metavar="C",
                        help="cap every attribute at C categories (the C-1 most frequent "
                        "plus one for the rest; default: no cap)")  # fmt: skip


def _address(parser: Any) -> None:
    parser.add_argument("--address", default=DEFAULT_ADDRESS, metavar="HOST:PORT",
                        help="the aggregator service")  # fmt: skip
    parser.add_argument("--token-file", default=None, metavar="FILE",
                        help="file holding the admin bearer token (mode 0600; needed when "
                        "the server has one)")  # fmt: skip
    parser.add_argument("--tls-ca", default=None, metavar="FILE",
                        help="PEM certificate that signs (or is) the server's: connect with "
                        "TLS (default: plaintext, for a loopback server)")  # fmt: skip


def _planning(parser: Any, create: bool = False) -> None:
    """The planner's options (plan, simulate, collection create)."""
    parser.add_argument("--planner", choices=PLANNERS, default=None if not create else "pipeline",
                        help="pipeline: a pilot phase, then the views with the lowest "
                        "predicted error of the whole reconstruction; paper: CALM's "
                        "Algorithm 1, one phase (default: pipeline)")  # fmt: skip
    parser.add_argument("--pilot", type=_fraction, default=None, metavar="SHARE",
                        help=f"share of the users in the pilot phase (pipeline planner; 0: "
                        f"no pilot; default {PILOT_FRACTION})")  # fmt: skip
    parser.add_argument("--theta", type=_positive_float, default=None,
                        help="Algorithm 1's threshold on the sampling/noise trade-off "
                        "(paper planner; default 0.001)")  # fmt: skip
    parser.add_argument("--l", type=POSITIVE, default=None,
                        help="fix the view size (default: the planner chooses)")
    parser.add_argument("--m", type=POSITIVE, default=None,
                        help="fix the number of views (default: the planner chooses)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="calmkit", formatter_class=_Formatter,
                     description="Local differential privacy for marginal tables (CALM): "
                     "the aggregator service, its clients, simulation and evaluation.",
                     epilog="Start with `calmkit demo`; `calmkit COMMAND --help` for a "
                     "command's options.")  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_demo(sub)
    _add_serve(sub)
    _add_collection(sub)
    _add_query(sub)
    _add_datasets(sub)
    _add_population(sub)
    _add_plan(sub)
    _add_simulate(sub)
    _add_experiment(sub)
    return parser

def _add_demo(sub: Any) -> None:
    """The ``calmkit demo`` command and its options."""
    demo = _command(sub, "demo", "demo_cli:_demo",
                    "the whole system on one machine: a server, a synthetic population "
                    "reporting through the client, answers beside the truth (no "
                    "files)")  # fmt: skip
    demo.add_argument("--users", type=POSITIVE, default=100_000, help="synthetic users")
    demo.add_argument("--epsilon", type=_positive_float, default=1.0,
                      help="each user's LDP budget")  # fmt: skip
    demo.add_argument("--seed", type=NON_NEGATIVE, default=0,
                      help="seed of the population, the plan and the simulated devices' "
                      "randomness: the same seed prints the same tables")  # fmt: skip
    _json(demo, "print one JSON object (counts, phases, every table) instead of text")


def _add_serve(sub: Any) -> None:
    """The ``calmkit serve`` command and its options."""
    serve = _command(sub, "serve", f"{OPERATOR}:_serve", "run the aggregator service")
    serve.add_argument("--address", default=DEFAULT_ADDRESS, metavar="HOST:PORT",
                       help="where to listen (port 0: any free port; off loopback needs "
                       "--token-file and TLS)")  # fmt: skip
    serve.add_argument("--db", required=True, metavar="FILE|URL",
                       help="SQLite database file (created with mode 0600 if missing), or a "
                       "postgresql://user@host/db URL shared by replica servers")  # fmt: skip
    serve.add_argument("--key-snapshots", default=None, metavar="DIR",
                       help="with a postgresql:// --db: a folder for this replica's "
                       "snapshots of its deduplication tables, so a restart loads them "
                       "instead of reading the whole log (SQLite: always FILE-keys/)")  # fmt: skip
    serve.add_argument("--token-file", default=None, metavar="FILE",
                       help="admin bearer token, mode 0600 (default: none, admin calls "
                       "open: loopback only)")  # fmt: skip
    serve.add_argument("--grace", type=_positive_float, default=10.0, metavar="SECONDS",
                       help="on SIGTERM, how long in-flight calls may finish")
    serve.add_argument("--tls-cert", default=None, metavar="FILE",
                       help="PEM certificate chain: serve TLS (with --tls-key)")
    serve.add_argument("--tls-key", default=None, metavar="FILE",
                       help="PEM private key of --tls-cert (mode 0600)")
    serve.add_argument("--insecure", action="store_true",
                       help="allow a non-loopback --address without TLS (only behind a "
                       "TLS-terminating proxy or on a private network)")  # fmt: skip
    serve.add_argument("--rate-limit", type=_positive_float, default=None,
                       metavar="REPORTS_PER_S",
                       help="cap each submit token at this many reports per second "
                       "(default: no cap)")  # fmt: skip


def _add_collection(sub: Any) -> None:
    """The ``calmkit collection`` command and its options."""
    col = _command(sub, "collection", f"{OPERATOR}:_collection_checked",
                   "create, close, list or show collections")  # fmt: skip
    col.add_argument("action", choices=["create", "close", "status", "list"],
                     help="create a collection (prints its plan and submit token), close "
                     "it (no more reports), show its status, or list all")  # fmt: skip
    _address(col)
    col.add_argument("--collection", default=None, metavar="ID",
                     help="the collection id (create: the new id, 1-64 characters of "
                     "A-Z a-z 0-9 . _ -; default: the server picks one)")  # fmt: skip
    col.add_argument("--id", dest="collection", help=argparse.SUPPRESS)  # old name
    col.add_argument("--domain", default=None, metavar="SIZES",
                     help="create: category counts of the attributes a0, a1, ..., e.g. "
                     "2,3,2")  # fmt: skip
    col.add_argument("--schema", default=None, metavar="FILE",
                     help="create: a schema JSON file (names and categories; "
                     "Schema.to_dict) instead of --domain")  # fmt: skip
    col.add_argument("--epsilon", type=_positive_float, default=None,
                     help="create: each user's LDP budget (required)")
    col.add_argument("--n", type=POSITIVE, default=None,
                     help="create: how many users are expected to report (the planner needs "
                     "it; may be omitted with --views)")  # fmt: skip
    col.add_argument("--k", type=POSITIVE, default=3,
                     help="create: the size of the marginals to be queried")
    _planning(col, create=True)
    col.add_argument("--reconstruct", choices=RECONSTRUCTIONS, default="local",
                     help="create: the reconstruction the pipeline planner plans for, local or "
                     "global (it predicts that one's error); queries can still ask for "
                     "either (query --reconstruct)")  # fmt: skip
    col.add_argument("--views", default=None, metavar="VIEWS",
                     help="create: explicit views instead of a planner, e.g. '0,1;1,2'")
    col.add_argument("--seed", type=NON_NEGATIVE, default=0,
                     help="create: seed of the plan's view assignment")
    _json(col)


def _add_query(sub: Any) -> None:
    """The ``calmkit query`` command and its options."""
    query = _command(sub, "query", f"{OPERATOR}:_query",
                     "a marginal table of a collection, with standard errors")  # fmt: skip
    _address(query)
    query.add_argument("--collection", required=True, metavar="ID", help="the collection id")
    query.add_argument("--attrs", required=True, metavar="NAMES",
                       help="attribute names, comma-separated, e.g. a0,a2")
    query.add_argument("--format", choices=["table", "csv", "json"], default="table",
                       help="output format")
    query.add_argument("--replicates", type=NON_NEGATIVE, default=0,
                       help="bootstrap replicates behind the total errors (noise + "
                       "estimated bias; 0: the server's default, 32; at most 1000)")  # fmt: skip
    query.add_argument("--reconstruct", choices=RECONSTRUCTIONS, default="local",
                       help="local: maximum entropy per query over the views' projections; "
                       "global: also one model fitted to all views at once, which answers the "
                     "pairs no view holds")  # fmt: skip


def _add_datasets(sub: Any) -> None:
    """The ``calmkit datasets`` command and its options."""
    data = _command(sub, "datasets", "data_cli:_datasets",
                    "the datasets calmkit knows: list, fetch (download + verify), path",
                    "list: every dataset with its source, licence and SHA-256s; fetch NAME.. "
                    "(or all): download from the official source, verify, unpack into the "
                    "per-user data folder (or --data-dir); path NAME: where the loaders "
                    "look for it.")  # fmt: skip
    data.add_argument("action", choices=("list", "fetch", "path"), help="what to do")
    data.add_argument("names", nargs="*", metavar="NAME",
                      help="dataset names (fetch: one or more, or all; path: one)")
    data.add_argument("--data-dir", "--dir", default=None, metavar="DIR",
                      help="data folder (default: $CALMKIT_DATA, else the per-user data "
                      "folder)")  # fmt: skip
    data.add_argument("--mirror", default=None, metavar="URL_OR_DIR",
                      help="a folder or URL with the source files under their original "
                      f"names (default: the official sources; or ${MIRROR_ENV})")  # fmt: skip
    _json(data, "machine-readable output")


def _add_population(sub: Any) -> None:
    """The ``calmkit population`` command and its options."""
    pop = _command(sub, "population", "data_cli:_population",
                   "load a dataset and describe it (attributes, categories, users)")
    _data_options(pop)
    _json(pop)


def _add_plan(sub: Any) -> None:
    """The ``calmkit plan`` command and its options."""
    plan = _command(sub, "plan", "data_cli:_plan",
                    "choose the view size l, the count m and the views for a collection")
    plan.add_argument("--domain", required=True, metavar="SIZES",
                      help="category counts of the attributes, e.g. 2,2,3,2")
    plan.add_argument("--n", type=POSITIVE, required=True, help="expected users")
    plan.add_argument("--k", type=POSITIVE, required=True,
                      help="the size of the marginals to be queried")
    plan.add_argument("--epsilon", type=_positive_float, required=True,
                      help="each user's LDP budget")
    _planning(plan)
    plan.add_argument("--reconstruct", choices=RECONSTRUCTIONS, default="local",
                      help="how the answers will be reconstructed, which the pipeline "
                      "planner's predicted error accounts for (see simulate --reconstruct)")
    plan.set_defaults(planner="pipeline", pilot=PILOT_FRACTION, theta=0.001)
    _json(plan)


def _add_simulate(sub: Any) -> None:
    """The ``calmkit simulate`` command and its options."""
    sim = _command(sub, "simulate", "data_cli:_simulate",
                   "run a mechanism and Uniform on a population; report the error (SSE)")
    sim.add_argument("--mechanism", default="calm", choices=MECHANISMS, metavar="NAME",
                     help="calm (default); LDP baselines uni, fc, am, ft, em, be; central-DP "
                     "references priview, mwem, datacube, wff")  # fmt: skip
    _data_options(sim)
    sim.add_argument("--n", type=POSITIVE, default=None,
                     help="resample the population to n users, with replacement (default: "
                     "the dataset's users)")  # fmt: skip
    sim.add_argument("--k", type=POSITIVE, required=True, help="the size of the queried marginals")
    sim.add_argument("--epsilon", type=_positive_float, required=True, help="the privacy budget")
    _planning(sim)
    sim.set_defaults(theta=0.001)
    sim.add_argument("--queries", type=POSITIVE, default=50,
                     help="random k-way queries per repetition")
    sim.add_argument("--reps", type=POSITIVE, default=20,
                     help="repetitions (fresh reports each); the SSE is their mean ± sd")
    sim.add_argument("--seed", type=NON_NEGATIVE, default=0,
                     help="fixes the synthetic dataset, the resample to --n users, each "
                     "repetition's queries and the method's randomness, as independent "
                     "streams: runs that differ only in --mechanism, --planner, --l/--m or "
                     "other method options answer the same queries on the same users "
                     "(default: %(default)s)")  # fmt: skip
    sim.add_argument("--path", choices=PATHS, default="fast",
                     help="fast: sample each view's support counts directly; faithful: "
                     "every user through the client code (same distribution)")  # fmt: skip
    sim.add_argument("--no-shrink", action="store_true",
                     help="skip interaction shrinkage: the paper's CALM pipeline exactly")
    sim.add_argument("--reconstruct", choices=RECONSTRUCTIONS, default="local",
                     help="calm: how queries are answered from the views; local: maximum "
                     "entropy per query over the views' projections (the paper's); "
                     "global: also one model fitted to all views at once, which answers the "
                     "pairs no view holds")  # fmt: skip
    central = sim.add_argument_group("central-DP references (mwem, datacube, wff)")
    central.add_argument("--rounds", type=POSITIVE, default=None,
                         help="MWEM rounds T (default: the paper's rule)")
    central.add_argument("--strategy", choices=("fourier", "marginals"), default=None,
                         help="datacube strategy (default fourier)")
    central.add_argument("--budgets", choices=("optimal", "uniform"), default=None,
                         help="datacube budget allocation (default optimal)")
    central.add_argument("--noise", choices=("laplace", "gaussian"), default=None,
                         help="datacube noise (default laplace)")
    central.add_argument("--delta", type=_positive_float, default=None,
                         help="delta of (epsilon, delta)-DP: WFF (default 1e-6), datacube "
                         "with Gaussian noise")  # fmt: skip
    central.add_argument("--workload", choices=("k", "upto-k"), default=None,
                         help="WFF workload (default k: all k-way marginals)")
    _json(sim)


def _add_experiment(sub: Any) -> None:
    """The ``calmkit experiment`` command and its options."""
    exp = _command(sub, "experiment", "data_cli:_experiment",
                   "a figure of the paper (or the planner comparison): task grid, CSV, PNG "
                   "and results.md")  # fmt: skip
    exp.add_argument("figure", choices=[*FIGURES, "planner"],
                     help="a figure of the paper, or planner: the default planner against "
                     "a fixed grid of (l, m) (writes DIR/planner.md)")  # fmt: skip
    exp.add_argument("--quick", action="store_true", help="a reduced grid (seconds)")
    exp.add_argument("--out", default="results", metavar="DIR", help="output folder")
    exp.add_argument("--seed", type=NON_NEGATIVE, default=0,
                     help="seed of every task: fixes each population's resample, the queries "
                     "of each repetition and the classification split, shared by every "
                     "mechanism of a setting, and each task's own randomness "
                     "(default: %(default)s)")  # fmt: skip
    exp.add_argument("--reps", type=POSITIVE, default=None,
                     help="repetitions per setting (default: the paper's 20; --quick: 2)")
    exp.add_argument("--queries", type=POSITIVE, default=50,
                     help="random queries per repetition")
    exp.add_argument("--n", type=POSITIVE, default=None, help="only the panels with this n")
    exp.add_argument("--dataset", default=None, metavar="NAME",
                     help="run every panel on this dataset instead of the paper's")
    exp.add_argument("--data-dir", default=None, metavar="DIR",
                     help="dataset folder (default: $CALMKIT_DATA, else the per-user "
                     "folder that `calmkit datasets fetch` fills)")  # fmt: skip
    exp.add_argument("--jobs", type=POSITIVE, default=None,
                     help="worker processes (default: all cores)")
    exp.add_argument("--scheduler", default=None, metavar="ADDRESS",
                     help="run the tasks on a Dask cluster: 'local' starts a LocalCluster "
                     "of --jobs workers, tcp://host:8786 uses a running scheduler (its "
                     "workers need calmkit installed); same results as --jobs")  # fmt: skip
    exp.add_argument("--no-plot", action="store_true", help="skip the PNG (no matplotlib)")
    _json(exp, "print a JSON summary instead of text")
    exp.epilog = ("Exit status: 0 all tasks ran; 3 some task had no data (`calmkit datasets "
                  "fetch NAME`); 130 interrupted (finished tasks are cached: the same command "
                  "resumes). Outputs of an earlier run with more finished tasks are never "
                  "overwritten.")  # fmt: skip

def _resolve(run: str) -> Callable[[argparse.Namespace], int]:
    module, function = run.split(":")
    name = module if "." in module else f"calmkit_simulator.{module}"
    fn: Callable[[argparse.Namespace], int] = getattr(importlib.import_module(name), function)
    return fn


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error already printed
        return int(exc.code or 0) if not isinstance(exc.code, str) else 2
    if args.command == "datasets":
        if args.action == "path" and len(args.names) != 1:
            print(f"calmkit: error: datasets path takes one NAME ({len(args.names)} given)",
                  file=sys.stderr)  # fmt: skip
            return 2
        if args.action == "fetch" and not args.names:
            print("calmkit: error: datasets fetch needs NAME... (or all)", file=sys.stderr)
            return 2
    args.argv = None if argv is None else list(argv)[1:]
    from calmkit_client.errors import CalmkitError

    try:
        return int(_resolve(args.run)(args))
    except CalmkitError as exc:
        print(f"calmkit: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("calmkit: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (``calmkit plan ... | head``): not a bug
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # no second error when Python flushes stdout
        return 141
    except Exception as exc:  # a bug, not bad input: one line, the traceback on request
        if os.environ.get(DEBUG_ENV):
            raise
        print(f"calmkit: internal error: {type(exc).__name__}: {exc} (set {DEBUG_ENV}=1 for "
              "the traceback, and please report it)", file=sys.stderr)  # fmt: skip
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
