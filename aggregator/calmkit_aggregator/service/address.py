"""The listening address of ``calmkit serve``: ``HOST:PORT``, checked before anything
is created, so a bad one is one clear error rather than a surprise (gRPC would read
``127.0.0.1:70000`` as port 4464, ``:-1`` as 65535 and a bare ``localhost`` as 443)."""

from __future__ import annotations

import contextlib
import errno
import re
import socket

from calmkit_client import CalmkitError

__all__ = ["check_address", "probe_bind"]

_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+(%[\w.-]+)?\]|[A-Za-z0-9._-]+)$")


def check_address(address: str) -> tuple[str, int]:
    """``(host, port)`` of ``HOST:PORT`` (an IPv6 host in brackets: ``[::1]:50051``;
    port 0: any free port), or a :class:`~calmkit_client.CalmkitError` naming the
    value."""
    problem = (
        f"address ({address!r}) must be HOST:PORT with a port in 1-65535 (0: any free "
        "port; an IPv6 host in brackets, [::1]:50051)"
    )
    if not isinstance(address, str) or ":" not in address:
        raise CalmkitError(problem)
    host, port = address.rsplit(":", 1)
    if not _HOST.match(host) or not port.isascii() or not port.isdigit():
        raise CalmkitError(problem)
    if not 0 <= int(port) <= 65535 or (len(port) > 1 and port.startswith("0")):
        raise CalmkitError(problem)
    return host, int(port)


def probe_bind(address: str) -> None:
    """Refuse, before any storage is opened, an address whose port another process
    listens on (the real bind comes later, after the store is open: a PostgreSQL store
    would already have created its tables). A bound and closed socket (with
    ``SO_REUSEADDR``, so connections of a stopped server in TIME_WAIT do not count);
    port 0 and hosts that do not resolve are left to the real bind."""
    host, port = check_address(address)
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
    except OSError:
        return
    for family, kind, proto, _, sockaddr in infos:
        with contextlib.closing(socket.socket(family, kind, proto)) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(sockaddr)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise CalmkitError(
                        f"address ({address!r}) could not be bound: the port is in use "
                        "or the host is not an address of this machine"
                    ) from None
