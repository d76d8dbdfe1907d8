"""The listening address of ``calmkit serve``: ``HOST:PORT``, checked before anything
is created, so a bad one is one clear error rather than a surprise (gRPC would read
``127.0.0.1:70000`` as port 4464, ``:-1`` as 65535 and a bare ``localhost`` as 443)."""

from __future__ import annotations

import re

from calmkit_client import CalmkitError

__all__ = ["check_address"]

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
