"""``calmkit backup`` and ``calmkit restore``: the SQLite store's online backup and its
checked restore (:mod:`.backup`), as operator commands. They need no extra (the
standard library's sqlite3 and the store). Importing this module loads neither numpy
nor the store."""

from __future__ import annotations

import argparse
from typing import Any

from calmkit_client.commands import add_command

__all__ = ["register"]


def _backup_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db",
        required=True,
        metavar="FILE",
        help="the SQLite database of `calmkit serve --db` (the server may be running)",
    )
    parser.add_argument("out", metavar="OUT", help="the backup file to write (must not exist)")


def _restore_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("backup", metavar="BACKUP", help="a file written by `calmkit backup`")
    parser.add_argument(
        "--db", required=True, metavar="FILE", help="the database file to restore it as"
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace an existing --db (its server stopped first; default: refuse)",
    )


def _backup(args: argparse.Namespace) -> int:
    from .backup import backup

    info = backup(args.db, args.out)
    print(f"calmkit backup: {info.describe()}")
    return 0


def _restore(args: argparse.Namespace) -> int:
    from .backup import restore

    info = restore(args.backup, args.db, force=args.force)
    print(f"calmkit restore: {args.db} from {info.describe()}")
    return 0


def register(subparsers: Any) -> None:
    """Add backup and restore to the ``calmkit`` parser's ``subparsers``."""
    add_command(
        subparsers,
        "backup",
        "copy a running server's SQLite database, consistently (PostgreSQL: pg_dump)",
        run=_backup,
        options=_backup_options,
        extra=None,  # sqlite3 and the store: no extra needed
    )
    add_command(
        subparsers,
        "restore",
        "check a backup and put it in place as a SQLite database (PostgreSQL: pg_restore)",
        run=_restore,
        options=_restore_options,
        extra=None,  # sqlite3 and the store: no extra needed
    )
