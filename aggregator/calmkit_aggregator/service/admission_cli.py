"""``calmkit admission``: admission-ticket keys and tickets for operators' scripts
(docs/security.md "Admission tickets"), and the key files ``collection create
--admission`` reads.

Key files are one line of text, ``KIND:HEX``:

- ``ed25519-private:`` the issuer's 32-byte Ed25519 private key (mode 0600; stays with
  the app's backend, never on the aggregator);
- ``ed25519-public:`` its public key (``FILE.pub`` beside the private key; what the
  aggregator gets);
- ``hmac-sha256:`` / ``aes256-prf:`` the 32-byte key shared by issuer and aggregator
  (mode 0600).

``keygen`` writes them; ``issue`` prints a ticket in hex. Importing this module loads
neither numpy nor ``cryptography``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import stat
from pathlib import Path
from typing import Any

from calmkit_client import CalmkitError
from calmkit_client.commands import add_command

__all__ = ["admission_spec", "register"]

_KINDS = ("ed25519-private", "ed25519-public", "hmac-sha256", "aes256-prf")
_ALIASES = {"hmac": "hmac-sha256", "aes": "aes256-prf"}


def _read_key_file(path: str, secret: bool) -> tuple[str, bytes]:
    """``(kind, 32 key bytes)`` of a key file; a secret one must not be readable by
    other users (as the service's token files: ``chmod 600``)."""
    try:
        mode = os.stat(path).st_mode
        data = Path(path).read_bytes()
    except OSError as exc:
        raise CalmkitError(f"key file ({path!r}) must be readable: {exc.strerror}") from None
    if secret and os.name == "posix" and mode & 0o077:
        raise CalmkitError(
            f"key file ({path!r}) must not be readable by other users (mode "
            f"{stat.S_IMODE(mode):04o}): run chmod 600 {shlex.quote(path)}"
        )
    kind, _, text = data.decode("utf-8", "replace").strip().partition(":")
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if kind not in _KINDS or len(key) != 32:
        raise CalmkitError(
            f"key file ({path!r}) must hold one line KIND:HEX with KIND one of {list(_KINDS)} "
            "and 64 hex digits (made by `calmkit admission keygen`)"
        )
    if kind != "ed25519-public" and not secret:
        return _read_key_file(path, secret=True)  # a secret key: its mode is checked too
    return kind, key


def _write_key_file(path: str, kind: str, key: bytes, mode: int) -> None:
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, mode)
    except OSError as exc:
        raise CalmkitError(f"out ({path!r}) must be a new file: {exc.strerror}") from None
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(f"{kind}:{key.hex()}\n")


def admission_spec(spec: str | None) -> tuple[str, bytes] | None:
    """``collection create --admission``: ``ed25519:PUBLIC_KEY_FILE``,
    ``hmac:KEY_FILE`` (also ``hmac-sha256:``) or ``aes:KEY_FILE`` (also
    ``aes256-prf:``) -> ``(scheme, key)``; None: no tickets."""
    if spec is None:
        return None
    scheme, _, path = spec.partition(":")
    scheme = _ALIASES.get(scheme, scheme)
    if scheme not in ("ed25519", "hmac-sha256", "aes256-prf") or not path:
        raise CalmkitError(
            f"admission ({spec!r}) must be ed25519:PUBLIC_KEY_FILE, hmac:KEY_FILE or aes:KEY_FILE"
        )
    kind, key = _read_key_file(path, secret=scheme != "ed25519")
    want = "ed25519-public" if scheme == "ed25519" else scheme
    if kind != want:
        hint = " (the private key: give its .pub file)" if kind == "ed25519-private" else ""
        raise CalmkitError(f"admission ({spec!r}) must name a {want} key file, not {kind}{hint}")
    return scheme, key


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action",
        choices=["keygen", "issue"],
        help="keygen: write a new key file (and for ed25519 its .pub file); issue: print "
        "the ticket of one pseudonym in hex",
    )
    parser.add_argument(
        "--scheme",
        choices=["ed25519", "hmac-sha256", "aes256-prf"],
        default="ed25519",
        help="keygen: ed25519 (the aggregator gets only the public key; ~10k checks/s per "
        "core), or a key shared with the aggregator: aes256-prf (checked a batch at a "
        "time: for fast ingest) or hmac-sha256",
    )
    parser.add_argument("--out", metavar="FILE", help="keygen: the new key file (mode 0600)")
    parser.add_argument(
        "--key", metavar="FILE", help="issue: the issuer's key file (ed25519-private or shared)"
    )
    parser.add_argument("--collection", metavar="ID", help="issue: the collection id")
    parser.add_argument(
        "--pseudonym", metavar="HEX", help="issue: the device's 16-byte pseudonym in hex"
    )


def _run(args: argparse.Namespace) -> int:
    from calmkit_client.tickets import TicketIssuer, generate_ed25519_key, generate_shared_key

    if args.action == "keygen":
        if not args.out:
            raise CalmkitError("out (none given) must be set for 'keygen'")
        if args.scheme == "ed25519":
            private, public = generate_ed25519_key()
            if os.path.exists(args.out + ".pub"):
                raise CalmkitError(f"out ({args.out + '.pub'!r}) must be a new file")
            _write_key_file(args.out, "ed25519-private", private, 0o600)
            _write_key_file(args.out + ".pub", "ed25519-public", public, 0o644)
            print(f"private key: {args.out} (mode 0600: keep it with the ticket issuer)")
            print(f"public key: {args.out}.pub ({public.hex()})")
            print(f"  calmkit collection create ... --admission ed25519:{args.out}.pub")
        else:
            _write_key_file(args.out, args.scheme, generate_shared_key(), 0o600)
            print(f"shared key: {args.out} (mode 0600: the issuer and the aggregator hold it)")
            print(f"  calmkit collection create ... --admission {args.scheme}:{args.out}")
        return 0
    for name in ("key", "collection", "pseudonym"):
        if not getattr(args, name):
            raise CalmkitError(f"{name} (none given) must be set for 'issue'")
    kind, key = _read_key_file(args.key, secret=True)
    if kind == "ed25519-public":
        raise CalmkitError(f"key ({args.key!r}) is a public key: issue needs the private one")
    issuer = TicketIssuer("ed25519" if kind == "ed25519-private" else kind, key)
    try:
        pseudonym = bytes.fromhex(args.pseudonym)
    except ValueError:
        raise CalmkitError(f"pseudonym ({args.pseudonym[:40]!r}) must be hex") from None
    print(issuer.issue(args.collection, pseudonym).hex())
    return 0


def register(subparsers: Any) -> None:
    """Add ``admission`` to the ``calmkit`` parser's ``subparsers``."""
    add_command(
        subparsers,
        "admission",
        "admission-ticket keys and tickets (keygen, issue)",
        run=_run,
        options=_options,
        extra="admission",
    )
