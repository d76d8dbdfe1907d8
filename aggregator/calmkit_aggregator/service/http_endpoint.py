"""What the service's two HTTP endpoints (Prometheus metrics, :mod:`.metrics`, and the
web console, :mod:`.console`) share: how they listen, TLS, and how a request proves
it may read.

- **Where they may listen** is decided by the gRPC port's rule
  (:func:`~.server.check_exposure`, called under the endpoint's option name): beyond
  loopback the server needs an admin token, and TLS unless ``insecure``.
- **TLS** uses the gRPC port's certificate chain and key (:func:`tls_context`); the
  handshake runs on the connection's own thread, so a client that stalls it holds no
  other request up.
- **Tokens** are compared as SHA-256 digests with :func:`hmac.compare_digest`
  (:func:`token_matches`); a request's bearer token comes only from its
  ``Authorization`` header, never from a URL.
- **Host names**: an endpoint bound to loopback answers only requests addressed to a
  loopback name (``Host: 127.0.0.1:PORT``, ``localhost``, ``[::1]``), so a web page
  that points its own domain name at 127.0.0.1 (DNS rebinding) cannot read it.
- **Requests** get a bounded time to arrive (:data:`REQUEST_TIMEOUT_S`), each
  response carries headers that keep it out of caches, frames and other origins, and
  each request is logged as one JSON line without its query string or any header.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import ssl
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from calmkit_client import CalmkitError

from .address import check_address
from .handlers import log_json

__all__ = [
    "REQUEST_TIMEOUT_S",
    "EndpointHandler",
    "HttpEndpoint",
    "bearer_token",
    "cross_site",
    "loopback_host",
    "tls_context",
    "token_hash",
    "token_matches",
]

REQUEST_TIMEOUT_S = 30.0  # a connection that sends nothing for this long is closed
MAX_BODY_BYTES = 4096  # the largest request body read (the console's login form)

SECURITY_HEADERS = (
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-store"),
    ("X-Frame-Options", "DENY"),
)


def loopback_host(host: str) -> bool:
    """Whether ``HOST[:PORT]`` (an address, or a ``Host`` header) names loopback."""
    name = urlsplit("//" + host.strip()).hostname or ""
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def token_hash(token: str) -> bytes:
    """The SHA-256 digest a token is compared by."""
    return hashlib.sha256(token.encode("utf-8")).digest()


def token_matches(given: str | None, expected: bytes | None) -> bool:
    """Whether ``given`` is the token whose digest is ``expected`` (None: no token is
    needed), in time independent of where they differ."""
    if expected is None:
        return True
    return given is not None and hmac.compare_digest(token_hash(given), expected)


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer TOKEN`` header (None when absent)."""
    if authorization and authorization.startswith("Bearer "):
        return authorization[len("Bearer ") :].strip()
    return None


def cross_site(headers: Any) -> bool:
    """Whether a POST comes from another site (a cross-site request forgery): its
    ``Sec-Fetch-Site`` is not same-origin, or (a browser without that header) its
    ``Origin`` is not the host it was sent to. A request with neither header comes
    from no browser, which no other site can make send it."""
    site = headers.get("Sec-Fetch-Site")
    if site is not None:
        return site not in ("same-origin", "none")
    origin = headers.get("Origin")
    if origin is None:
        return False
    return bool(urlsplit(origin).netloc != headers.get("Host", ""))


def tls_context(certificate_chain: bytes, private_key: bytes) -> ssl.SSLContext:
    """A server context (TLS 1.2 or later) with the gRPC port's PEM chain and key. The
    ssl module loads keys only from files: they pass through a private temporary
    folder (mode 0700) that is removed before this returns."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    with tempfile.TemporaryDirectory(prefix="calmkit-tls-") as folder:
        cert, key = Path(folder) / "chain.pem", Path(folder) / "key.pem"
        for path, data in ((cert, certificate_chain), (key, private_key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(data)
        context.load_cert_chain(cert, key)
    return context


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = False  # a port in use is refused, as on the gRPC port

    def __init__(
        self, address: tuple[str, int], handler: type, context: Any, loopback: bool
    ) -> None:
        self.endpoint_context = context  # what the handler reads (the service, tokens)
        self.loopback = loopback  # bound to loopback: answer only loopback Host names
        super().__init__(address, handler)


class EndpointHandler(BaseHTTPRequestHandler):
    """Base of the endpoints' request handlers: the server's ``endpoint_context``,
    secure default headers, bounded bodies, and one JSON log line per request."""

    server_version = "calmkit"
    sys_version = ""
    timeout = REQUEST_TIMEOUT_S
    protocol_version = "HTTP/1.1"
    endpoint_name = "http"

    @property
    def context(self) -> Any:
        return self.server.endpoint_context  # type: ignore[attr-defined]

    @property
    def over_tls(self) -> bool:
        return isinstance(self.connection, ssl.SSLSocket)

    def parse_request(self) -> bool:
        """http.server's parsing, then the Host check of a loopback endpoint."""
        if not super().parse_request():
            return False
        if self.server.loopback and not loopback_host(self.headers.get("Host", "")):  # type: ignore[attr-defined]
            self.close_connection = True
            body = b"misdirected request: this endpoint answers only to a loopback host name\n"
            self.send_body(421, body, "text/plain")
            return False
        return True

    def send_body(
        self,
        status: int,
        body: bytes,
        content_type: str,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in SECURITY_HEADERS + headers:
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def read_body(self) -> bytes:
        """The request body, at most :data:`MAX_BODY_BYTES` (a longer one is refused)."""
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY_BYTES:
            raise CalmkitError(f"content_length must be in [0, {MAX_BODY_BYTES}]")
        return self.rfile.read(length)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        path = self.path.split("?", 1)[0]  # form values and attributes stay out of logs
        log_json(self.endpoint_name, method=self.command, path=path, status=int(code or 0))

    def log_message(self, format: str, *args: Any) -> None:
        """http.server's own lines (errors, timeouts): dropped, so nothing a client
        sent reaches the log except through :meth:`log_request`."""


class HttpEndpoint:
    """A :class:`ThreadingHTTPServer` on ``address`` serving ``handler`` on its own
    thread (over TLS with ``tls``); ``port`` is the bound port (``HOST:0`` picks
    one)."""

    def __init__(
        self,
        option: str,
        address: str,
        handler: type[EndpointHandler],
        context: Any,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        host, port = check_address(address)
        try:
            self._httpd = _Server(
                (host.strip("[]"), port), handler, context, loopback_host(address)
            )
        except OSError as exc:
            raise CalmkitError(
                f"{option} ({address!r}) could not be bound: the port is in use or the "
                f"host is not an address of this machine ({exc.strerror})"
            ) from None
        if tls is not None:
            self._httpd.socket = tls.wrap_socket(
                self._httpd.socket, server_side=True, do_handshake_on_connect=False
            )
        self.port = int(self._httpd.server_address[1])
        self.tls = tls is not None
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.2},
            daemon=True,
            name=f"calmkit-{option}",
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop taking requests and close the socket (requests in flight finish on
        their own threads). Idempotent."""
        if self._thread.is_alive():
            self._httpd.shutdown()
            self._thread.join()
        self._httpd.server_close()
