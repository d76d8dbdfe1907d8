"""What every package's ``calmkit`` commands are built from: the option types (a bad
value is a one-line error naming the option and value), the ``--json`` flag, the help
formatter, :class:`CommandParser` and :func:`add_command`, which registers a command on
the top-level parser of :mod:`calmkit_client.cli`.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from typing import Any

__all__ = [
    "NON_NEGATIVE",
    "POSITIVE",
    "CommandParser",
    "HelpFormatter",
    "Run",
    "add_command",
    "fraction",
    "int_at_least",
    "json_option",
    "missing_extra",
    "positive_float",
]

Run = Callable[[argparse.Namespace], int]
Options = Callable[[argparse.ArgumentParser], None]


# -- option types: a bad value is a one-line error naming the option and value -----------
def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an int >= ``low`` (the error names the value and the bound)."""

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


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"({text!r}) must be a number") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"({value!r}) must be finite and > 0")
    return value


def fraction(text: str) -> float:
    """An argparse type: a number in [0, 1)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"({text!r}) must be a number") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"({value!r}) must be in [0, 1)")
    return value


POSITIVE = int_at_least(1)
NON_NEGATIVE = int_at_least(0)


def json_option(
    parser: argparse.ArgumentParser, help: str = "print one JSON object instead of text"
) -> None:
    """The ``--json`` flag, as every command that can print JSON spells it."""
    parser.add_argument("--json", action="store_true", help=help)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Help with each option's default appended unless the help states it: its value,
    "off" for a flag, "required" for a required option, "none" for an option without
    a default. A default of 0 is stated."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if not action.option_strings or action.default == argparse.SUPPRESS:
            return text
        if "default" in text or "required" in text:
            return text
        if action.required:
            return text + " (required)"
        if action.default is False and action.nargs == 0:
            return text + " (default: off)"
        if action.default is None:
            return text + " (default: none)"
        return text + " (default: %(default)s)"


class CommandParser(argparse.ArgumentParser):
    """An argparse parser with one-line usage errors (``calmkit: error: ...``, exit 2).

    A command's parser also carries what runs it (``run``), the function that adds its
    options (``options``, called on first parse, so listing the commands imports none
    of them) and the extra its optional dependencies come from (``extra``, as in
    ``pip install 'calmkit[aggregator]'``; None: the base install suffices).
    """

    def __init__(
        self,
        *args: Any,
        run: Run | None = None,
        options: Options | None = None,
        extra: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.run, self.extra = run, extra
        self._options = options

    def load_options(self) -> None:
        """Add the command's options (once). A missing extra ends the program with
        exit status 2 and the ``pip install`` line that provides it."""
        options, self._options = self._options, None
        if options is None:
            return
        try:
            options(self)
        except ModuleNotFoundError as exc:
            advice = missing_extra(self.prog, self.extra, exc)
            if advice is None:
                raise
            self.exit(2, f"calmkit: error: {advice}\n")

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self.load_options()
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> Any:
        # "argument --max-categories: (1) must be ..." -> "max_categories (1) must be ..."
        named = re.match(r"argument (?:--)?([\w-]+)[^:]*: \((.*)$", message, re.DOTALL)
        choice = re.match(
            r"argument (?:--)?([\w-]+)[^:]*: invalid choice: (.*) \(choose from "
            r"(.*)\)$",
            message,
            re.DOTALL,
        )
        if named:
            message = f"{named[1].replace('-', '_')} ({named[2]}"
        elif choice:
            message = f"{choice[1].replace('-', '_')} ({choice[2]}) must be one of [{choice[3]}]"
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def missing_extra(prog: str, extra: str | None, exc: ModuleNotFoundError) -> str | None:
    """The advice for a command (``prog``, e.g. ``calmkit serve``) that could not import
    a third-party module: the extra to install. None when the module is calmkit's own
    or the command declares no extra (then the missing module is a bug, not a choice
    of install)."""
    module = exc.name or ""
    if extra is None or not module or module.startswith("calmkit_"):
        return None
    return (
        f"{prog} needs the {extra} extra: pip install 'calmkit[{extra}]' "
        f"({module} is not installed)"
    )


def add_command(
    subparsers: Any,
    name: str,
    help: str,
    *,
    run: Run,
    options: Options,
    extra: str | None,
    description: str | None = None,
    epilog: str | None = None,
) -> CommandParser:
    """Register command ``name`` on the top-level parser's ``subparsers``.

    ``help`` is its line in ``calmkit --help`` (and its description unless one is
    given); ``options(parser)`` adds its options when the command is parsed; ``run(args)``
    runs it and returns the exit status; ``extra`` names the extra it needs (None:
    none), which a missing third-party module makes the advice name.
    """
    parser: CommandParser = subparsers.add_parser(
        name,
        help=help,
        description=description or help,
        epilog=epilog,
        formatter_class=HelpFormatter,
        run=run,
        options=options,
        extra=extra,
    )
    return parser
