"""Admission tickets: a per-user right to submit one report to one collection.

The threat. A collection's submit token ships inside every copy of the app, so whoever
unpacks the app holds it and could submit any number of made-up reports, each under a
fresh random pseudonym, and pick the view of each one: a few thousand fakes placed on
one view move that view's estimate wherever the attacker likes. The submit token says
"this is our app", never "this is one of our users".

A ticket binds ``(collection_id, pseudonym)``: the app's backend, which knows its
users (a login, an account), issues one ticket per user for the pseudonym the user's
device shows it (:meth:`~calmkit_client.device.DeviceState.pseudonym`), and the
aggregator refuses a batch holding any report without a valid ticket for its own
pseudonym. The signed message is ::

    b"calmkit/ticket/v1\\0" + collection_id (UTF-8) + b"\\0" + pseudonym (16 bytes)

The version prefix keeps a ticket from ever being valid for another protocol using
the same key; the NUL separates the id (which holds no NUL: see
:func:`~calmkit_client.ids.check_collection_id`) from the fixed-size pseudonym, so no
two (collection, pseudonym) pairs give one message. Since the aggregator stores one
report per pseudonym per collection, one ticket carries at most one report; a second
report under it is a conflict, a resend of the same report a duplicate. And since a
collection with admission also requires each report's view to be the one its
pseudonym hashes to under the report's plan, a ticket holder cannot choose a view.

Three schemes, all from well-kept libraries (no cryptographic primitive is written
here):

``ed25519`` (the ``cryptography`` package): a ticket is a 64-byte Ed25519 signature
(RFC 8032) by the issuer's private key; the aggregator holds only the 32-byte public
key, so neither the aggregator nor anyone who copies its database can mint tickets.
Verification costs one signature check per report (about 10k per second per core,
with the GIL released so server threads run in parallel).

``hmac-sha256`` (the standard library): a ticket is HMAC-SHA-256 (RFC 2104) of the
message under a 32-byte key shared by issuer and aggregator; verification is about
600k per second. Whoever holds the key can mint tickets: the aggregator (which could
forge reports in its own database anyway, so that adds nothing) and anyone who steals
the key from its database or configuration, which is the added risk of this scheme.
Tickets are compared with :func:`hmac.compare_digest` (constant time).

``aes256-prf`` (the ``cryptography`` package): the same trust as ``hmac-sha256`` (a
32-byte key shared by issuer and aggregator), but checked a whole batch at a time. The
collection's key is ``K_c = HMAC-SHA-256(key, b"calmkit/ticket-key/v1\0" +
collection_id)``, and a ticket is the AES-256 block encryption of the 16-byte
pseudonym under ``K_c``. A block cipher is a pseudorandom permutation, so on one-block
inputs it is a pseudorandom function and thus a MAC for fixed-length messages: without
``K_c``, a ticket for a pseudonym not yet seen is guessed with probability about
``2^-128``; binding the collection through the key (not the message) keeps the input one
block. The aggregator encrypts a batch's pseudonyms in one library call (each block
independently, ECB: here exactly n single-block evaluations, not a mode of encryption
for data) and compares all tickets with one array comparison that reads every byte
(no early exit). About 60 times faster than HMAC-SHA-256 per ticket in Python: the
scheme to use when ingest speed matters and a shared key is acceptable.

Neither scheme hides from the aggregator which user a ticket was issued to if the
issuer and the aggregator compare notes (the issuer sees the pseudonym): tickets are
linkable. A report's privacy does not rest on that: each report is epsilon-LDP even
when its user is known (docs/security.md "Admission tickets" discusses unlinkable
variants).
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from .echo import show
from .errors import CalmkitError
from .ids import check_collection_id

__all__ = [
    "PSEUDONYM_BYTES",
    "SCHEMES",
    "TICKET_BYTES",
    "TicketIssuer",
    "TicketVerifier",
    "generate_ed25519_key",
    "generate_hmac_key",
    "generate_shared_key",
    "ticket_message",
]

PSEUDONYM_BYTES = 16
ED25519, HMAC, AES = "ed25519", "hmac-sha256", "aes256-prf"
SCHEMES = (ED25519, HMAC, AES)
SHARED = (HMAC, AES)  # schemes whose key issuer and aggregator share (a secret)
TICKET_BYTES = {ED25519: 64, HMAC: 32, AES: 16}  # a ticket's length per scheme
KEY_BYTES = 32  # an Ed25519 private or public key, a shared key
_PREFIX = b"calmkit/ticket/v1\0"
_KEY_PREFIX = b"calmkit/ticket-key/v1\0"


def _aes_tags(key: bytes, collection_id: str, pseudonyms: bytes) -> bytes:
    """``aes256-prf`` tickets of the concatenated 16-byte ``pseudonyms``: AES-256 of
    each under the collection's key (see the module docstring), in one call."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    collection_key = hmac.digest(key, _KEY_PREFIX + collection_id.encode("utf-8"), "sha256")
    encryptor = Cipher(algorithms.AES(collection_key), modes.ECB()).encryptor()
    return encryptor.update(pseudonyms) + encryptor.finalize()


def _check_scheme(scheme: object) -> str:
    if scheme not in SCHEMES:
        raise CalmkitError(f"scheme ({show(scheme)}) must be one of {list(SCHEMES)}")
    return str(scheme)


def _check_key(name: str, key: object) -> bytes:
    if not isinstance(key, (bytes, bytearray)) or len(key) != KEY_BYTES:
        size = len(key) if isinstance(key, (bytes, bytearray)) else type(key).__name__
        raise CalmkitError(f"{name} ({size}) must be {KEY_BYTES} bytes")
    return bytes(key)


def _check_pseudonym(pseudonym: object) -> bytes:
    if not isinstance(pseudonym, (bytes, bytearray)) or len(pseudonym) != PSEUDONYM_BYTES:
        raise CalmkitError(f"pseudonym ({show(pseudonym)}) must be {PSEUDONYM_BYTES} bytes")
    return bytes(pseudonym)


def _ed25519() -> Any:
    """The ``cryptography`` package's Ed25519 module: an optional dependency (the
    ``admission`` and ``aggregator`` extras); without it, ModuleNotFoundError names it
    (and the ``calmkit`` command names the extra)."""
    from cryptography.hazmat.primitives.asymmetric import ed25519

    return ed25519


def ticket_message(collection_id: str, pseudonym: bytes) -> bytes:
    """The bytes a ticket signs (see the module docstring)."""
    check_collection_id(collection_id)
    return _PREFIX + collection_id.encode("utf-8") + b"\0" + _check_pseudonym(pseudonym)


def generate_ed25519_key() -> tuple[bytes, bytes]:
    """A new Ed25519 key pair ``(private 32 bytes, public 32 bytes)`` (OS entropy)."""
    ed = _ed25519()
    private = ed.Ed25519PrivateKey.generate()
    return _raw_private(private), _raw_public(private.public_key())


def generate_shared_key() -> bytes:
    """A new 32-byte shared key (hmac-sha256, aes256-prf) from the OS entropy source."""
    return os.urandom(KEY_BYTES)


def generate_hmac_key() -> bytes:
    """A new 32-byte HMAC key from the OS entropy source."""
    return generate_shared_key()


def _raw_private(private: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization as ser

    raw: bytes = private.private_bytes(ser.Encoding.Raw, ser.PrivateFormat.Raw, ser.NoEncryption())
    return raw


def _raw_public(public: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization as ser

    raw: bytes = public.public_bytes(ser.Encoding.Raw, ser.PublicFormat.Raw)
    return raw


class TicketIssuer:
    """Issues tickets (the app's backend). Build with :meth:`ed25519` (private key),
    :meth:`hmac` or :meth:`aes` (a shared key); :attr:`aggregator_key` is what the
    aggregator gets (the public key; for a shared-key scheme the key itself)."""

    def __init__(self, scheme: str, key: bytes) -> None:
        self.scheme = _check_scheme(scheme)
        key = _check_key("key", key)
        self._private: Any = None
        if self.scheme == ED25519:
            self._private = _ed25519().Ed25519PrivateKey.from_private_bytes(key)
            self.aggregator_key = _raw_public(self._private.public_key())
        else:
            self.aggregator_key = key  # the shared key is the aggregator's key too
        self._key = key

    @classmethod
    def ed25519(cls, private_key: bytes) -> TicketIssuer:
        """An issuer signing with a 32-byte raw Ed25519 private key."""
        return cls(ED25519, private_key)

    @classmethod
    def hmac(cls, key: bytes) -> TicketIssuer:
        """An issuer with a 32-byte HMAC-SHA-256 key (shared with the aggregator)."""
        return cls(HMAC, key)

    @classmethod
    def aes(cls, key: bytes) -> TicketIssuer:
        """An issuer with a 32-byte ``aes256-prf`` key (shared with the aggregator)."""
        return cls(AES, key)

    def issue(self, collection_id: str, pseudonym: bytes) -> bytes:
        """The ticket of ``pseudonym`` in ``collection_id``."""
        message = ticket_message(collection_id, pseudonym)
        if self.scheme == AES:
            return _aes_tags(self._key, collection_id, _check_pseudonym(pseudonym))
        if self.scheme == ED25519:
            signature: bytes = self._private.sign(message)
            return signature
        return hmac.new(self._key, message, hashlib.sha256).digest()

    def verifier(self) -> TicketVerifier:
        """The matching verifier (public key only for ed25519)."""
        return TicketVerifier(self.scheme, self.aggregator_key)

    def __repr__(self) -> str:  # never shows the key
        return f"TicketIssuer({self.scheme!r})"


class TicketVerifier:
    """Checks tickets (the aggregator): ``scheme`` and ``key`` (the issuer's 32-byte
    public key for ed25519, the shared 32-byte key for hmac-sha256)."""

    def __init__(self, scheme: str, key: bytes) -> None:
        self.scheme = _check_scheme(scheme)
        self.key = _check_key("key", key)
        self.ticket_bytes = TICKET_BYTES[self.scheme]
        self._public: Any = None
        if self.scheme == ED25519:
            try:
                self._public = _ed25519().Ed25519PublicKey.from_public_bytes(self.key)
            except ValueError as exc:
                raise CalmkitError(f"key (32 bytes) is not an Ed25519 public key: {exc}") from None

    @property
    def fingerprint(self) -> str:
        """``scheme:`` and 16 hex digits of a SHA-256 of the key: names the key in
        listings without revealing it (also for the secret hmac key, whose 256 bits a
        64-bit digest prefix does not help to guess)."""
        digest = hashlib.sha256(b"calmkit/admission-key/v1\0" + self.key).hexdigest()
        return f"{self.scheme}:{digest[:16]}"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, TicketVerifier)
            and other.scheme == self.scheme
            and hmac.compare_digest(other.key, self.key)
        )

    def __hash__(self) -> int:
        return hash(self.fingerprint)

    def __repr__(self) -> str:  # never shows an hmac key
        return f"TicketVerifier({self.fingerprint!r})"

    def verify(self, collection_id: str, pseudonym: bytes, ticket: bytes) -> bool:
        """Whether ``ticket`` is valid for ``pseudonym`` in ``collection_id``."""
        if not isinstance(ticket, (bytes, bytearray)) or len(ticket) != self.ticket_bytes:
            return False
        if self.scheme == AES:
            check_collection_id(collection_id)
            expected = _aes_tags(self.key, collection_id, _check_pseudonym(pseudonym))
            return hmac.compare_digest(expected, bytes(ticket))
        return self._check(ticket_message(collection_id, pseudonym), bytes(ticket))

    def _check(self, message: bytes, ticket: bytes) -> bool:
        if self.scheme == ED25519:
            from cryptography.exceptions import InvalidSignature

            try:
                self._public.verify(ticket, message)
            except InvalidSignature:
                return False
            return True
        expected = hmac.new(self.key, message, hashlib.sha256).digest()
        return hmac.compare_digest(expected, ticket)

    def verify_many(
        self, collection_id: str, pseudonyms: np.ndarray, tickets: bytes | Sequence[bytes]
    ) -> np.ndarray:
        """Validity (n,) bool of n tickets for ``pseudonyms`` (n, 16) uint8, the tickets
        either concatenated (``n * ticket_bytes`` bytes) or one bytes each.

        The messages are built in one array operation; the checks are one library call
        per ticket (neither library verifies a batch in one call; Ed25519 batch
        verification would only pay off in C), which the ``cryptography`` package runs
        with the GIL released. A ticket of the wrong length is invalid."""
        check_collection_id(collection_id)
        keys = np.ascontiguousarray(pseudonyms, dtype=np.uint8)
        if keys.ndim != 2 or keys.shape[1] != PSEUDONYM_BYTES:
            raise CalmkitError(f"pseudonyms (shape {keys.shape}) must have shape (n, 16)")
        n = keys.shape[0]
        size = self.ticket_bytes
        if isinstance(tickets, (bytes, bytearray)):
            if len(tickets) != n * size:
                raise CalmkitError(
                    f"tickets ({len(tickets)} bytes) must be {size} bytes per report ({n * size})"
                )
            raw = bytes(tickets)
            if self.scheme == AES:  # one comparison of the whole batch
                return self._verify_aes(collection_id, keys, raw, np.ones(n, dtype=bool))
            parts = [raw[i * size : (i + 1) * size] for i in range(n)]
        else:
            parts = [bytes(t) if isinstance(t, (bytes, bytearray)) else b"" for t in tickets]
            if len(parts) != n:
                raise CalmkitError(f"tickets ({len(parts)} given) must match pseudonyms ({n})")
        if self.scheme == AES:
            right = np.array([len(t) == size for t in parts], dtype=bool)
            given = b"".join(t if len(t) == size else bytes(size) for t in parts)
            return self._verify_aes(collection_id, keys, given, right)
        head = np.frombuffer(_PREFIX + collection_id.encode("utf-8") + b"\0", dtype=np.uint8)
        rows = np.concatenate([np.broadcast_to(head, (n, head.size)), keys], axis=1)
        width = rows.shape[1]
        flat = np.ascontiguousarray(rows).tobytes()
        check = self._check
        out = np.fromiter(
            (
                len(t) == size and check(flat[i * width : (i + 1) * width], t)
                for i, t in enumerate(parts)
            ),
            dtype=bool,
            count=n,
        )
        return out

    def _verify_aes(
        self, collection_id: str, keys: np.ndarray, given: bytes, right: np.ndarray
    ) -> np.ndarray:
        """``aes256-prf`` for a whole batch: one encryption of every pseudonym, one array
        comparison reading every byte of ``given`` (the tickets concatenated; ``right``:
        which had the right length)."""
        n, size = keys.shape[0], self.ticket_bytes
        expected = np.frombuffer(_aes_tags(self.key, collection_id, keys.tobytes()), np.uint8)
        same = (np.frombuffer(given, np.uint8) == expected).reshape(n, size).all(axis=1)
        out: np.ndarray = same & right
        return out
