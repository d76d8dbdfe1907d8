"""The simulator's commands of ``calmkit``: demo (:mod:`.demo_cli`), and datasets,
population, plan, simulate and experiment (:mod:`.data_cli`). Each is defined, options
and all, beside the code that runs it; :func:`register` adds them to the ``calmkit``
parser, which lives in :mod:`calmkit_client.cli`.

Importing this module needs only the base install: the numerics a command needs are
imported when it runs or its options are added.
"""

from __future__ import annotations

from typing import Any

from . import data_cli, demo_cli, evaluate_cli

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add the simulator's commands to the ``calmkit`` parser's ``subparsers``."""
    demo_cli.register(subparsers)
    data_cli.register(subparsers)
    evaluate_cli.register(subparsers)
