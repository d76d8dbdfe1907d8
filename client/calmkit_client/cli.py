"""The ``calmkit`` command: the top-level parser and the dispatch to each command.

This module is the console script's entry point, in the one package every install
has. It defines no command itself: each package registers its own
(:func:`calmkit_simulator.cli.register`: demo, datasets, population, plan, simulate,
experiment; :func:`calmkit_aggregator.service.cli.register`: serve, collection,
query), each with its options beside the code that runs it. A command's options are
added only when that command is parsed, so ``calmkit --help`` imports no numerics,
and a command whose optional dependencies are missing says which extra to install
(``pip install 'calmkit[aggregator]'``) instead of failing with a traceback.

Bad input is one line on stderr, ``calmkit: error: ...``, and exit status 2. The
option types and the help formatter every package's commands share are in
:mod:`calmkit_client.commands`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from .commands import CommandParser, HelpFormatter, missing_extra
from .errors import CalmkitError

__all__ = ["DEBUG_ENV", "build_parser", "commands", "main"]

DEBUG_ENV = "CALMKIT_DEBUG"  # set: unexpected errors print their traceback


def build_parser() -> CommandParser:
    """The ``calmkit`` parser, with every package's commands registered."""
    from calmkit_aggregator.service import cli as service
    from calmkit_simulator import cli as simulator

    parser = CommandParser(
        prog="calmkit",
        formatter_class=HelpFormatter,
        description="Local differential privacy for marginal tables "
        "(CALM): the aggregator service, its clients, simulation and "
        "evaluation.",
        epilog="Start with `calmkit demo`; `calmkit COMMAND --help` for a command's options.\n"
        "Technical terms (view, support counts, Norm-Sub, interaction shrinkage,\n"
        "Algorithm 1, ...): the documentation's glossary, docs/glossary.md.",
    )
    parser.add_argument(
        "--version", action="version", version=f"calmkit {_version()}", help="print the version"
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in (simulator.register, service.register):
        register(subparsers)
    return parser


def _version() -> str:
    """The installed distribution's version (the package's own when not installed)."""
    from importlib import metadata

    try:
        return metadata.version("calmkit")
    except metadata.PackageNotFoundError:
        from . import __version__

        return __version__


def commands(parser: argparse.ArgumentParser) -> dict[str, CommandParser]:
    """The commands registered on ``parser`` (built by :func:`build_parser`), by name."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``calmkit`` with ``argv`` (default: the process's arguments); returns the
    exit status: 0 done, 2 bad input or a missing extra, 1 a bug, 130 interrupted."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error already printed
        return int(exc.code or 0) if not isinstance(exc.code, str) else 2
    args.argv = None if argv is None else list(argv)[1:]
    return _dispatch(commands(parser)[args.command], args)


def _dispatch(command: CommandParser, args: argparse.Namespace) -> int:
    """Run the parsed command; every failure becomes one line on stderr."""
    assert command.run is not None, command.prog
    try:
        return int(command.run(args))
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
        advice = (
            missing_extra(command.prog, command.extra, exc)
            if isinstance(exc, ModuleNotFoundError)
            else None
        )
        if advice is not None:
            print(f"calmkit: error: {advice}", file=sys.stderr)
            return 2
        if os.environ.get(DEBUG_ENV):
            raise
        print(
            f"calmkit: internal error: {type(exc).__name__}: {exc} (set {DEBUG_ENV}=1 for "
            "the traceback, and please report it)",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
