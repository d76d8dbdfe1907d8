"""Serving the aggregator safely (docs/security.md).

``create_server(address, storage)`` -> ``(server, port)``, started. The service runs on
a ``grpc.aio`` server in its own event-loop thread behind a blocking facade
(:class:`Server`):

- **Slow streams cannot starve it.** The event loop reads request bodies; a handler
  gets a worker thread (``max_workers`` of them, for SQLite and numpy work) only once
  its whole message has arrived, so streams that send headers and stall hold no
  worker. Health checks are answered on the loop itself and do not queue behind
  ingest. At most ``max_concurrent_rpcs`` calls are in flight, at most
  ``max_calls_per_address`` of them from one client address, and a request message
  must arrive within ``body_timeout`` seconds (:mod:`.limits`), so stalled streams
  from one address cannot take every slot, nor hold one for long. A connection carries
  at most ``MAX_STREAMS_PER_CONNECTION`` streams and is recycled after
  ``MAX_CONNECTION_AGE_S`` (plus a grace period).
- **A port in use is refused** (``grpc.so_reuseport`` off): a second server on the
  same port fails with :class:`~calmkit_client.CalmkitError` instead of silently
  sharing the traffic.
- **TLS** with a PEM certificate chain and key (:class:`ServerTls`). A bind beyond
  loopback without TLS is refused unless ``insecure=True``.
- **Metrics and console** (``metrics_address``, ``console_address``): HTTP endpoints
  in the same process (:mod:`.endpoints`), under the same rules as the gRPC port and
  over TLS with its certificate; their bound ports are ``Server.metrics_port`` and
  ``Server.console_port``.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import threading
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import _async as health_aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from calmkit_client import CalmkitError
from calmkit_client.collector import MAX_MESSAGE_BYTES
from calmkit_client.validation import check_int

from . import wire
from .address import check_address
from .endpoints import Endpoints, start_endpoints
from .handlers import AggregatorService
from .http_endpoint import loopback_host
from .limits import BODY_TIMEOUT_S, Guard
from .metrics import NO_METRICS, ServiceMetrics
from .store import ReportStore

__all__ = [
    "BODY_TIMEOUT_S",
    "MAX_CALLS_PER_ADDRESS",
    "Server",
    "ServerTls",
    "check_exposure",
    "create_server",
    "graceful_stop",
    "is_loopback",
]

# Calls in flight (beyond: RESOURCE_EXHAUSTED), health checks included. Not raised
# with the per-address cap: a stalled stream costs only 15-25 kB (2,000-2,300 of them:
# RSS +35 to +49 MB), but one pushing a large body costs far more (2,000 streams each
# sending what flow control admits of a 16 MiB message: +1 GB without the cap,
# +72 MB with it), and slots beyond what honest clients need would only raise that
# worst case (docs/security.md "Slow streams").
MAX_CONCURRENT_RPCS = 2048
# Calls in flight from one client address (an IPv6 client's /64), so that streams one
# address opens and stalls cannot take every slot of MAX_CONCURRENT_RPCS: a collector
# makes one call at a time, so this leaves room for a large NAT.
MAX_CALLS_PER_ADDRESS = MAX_CONCURRENT_RPCS // 8
MAX_STREAMS_PER_CONNECTION = 64
MAX_CONNECTION_AGE_S = 300  # then GOAWAY; clients reconnect transparently
MAX_CONNECTION_AGE_GRACE_S = 60  # in-flight calls get this long to finish


def is_loopback(address: str) -> bool:
    """Whether ``HOST:PORT`` binds only the loopback interface (``localhost``, or a
    loopback address such as ``127.0.0.1`` or ``[::1]``)."""
    return loopback_host(address)


@dataclass(frozen=True, repr=False)
class ServerTls:
    """A server's TLS identity: a PEM certificate chain and its PEM private key."""

    certificate_chain: bytes
    private_key: bytes

    def __post_init__(self) -> None:
        for field, value, marker in (
            ("certificate_chain", self.certificate_chain, b"-----BEGIN CERTIFICATE-----"),
            ("private_key", self.private_key, b"PRIVATE KEY-----"),
        ):
            if not isinstance(value, bytes) or marker not in value:
                raise CalmkitError(f"tls {field} must be PEM bytes containing {marker.decode()}")

    @classmethod
    def from_files(cls, cert_file: str | Path, key_file: str | Path) -> ServerTls:
        """Read ``--tls-cert`` and ``--tls-key``; a missing or non-PEM file is a clear
        error naming the option and path."""
        values = []
        for option, path in (("tls_cert", cert_file), ("tls_key", key_file)):
            try:
                values.append(Path(path).read_bytes())
            except OSError as exc:
                msg = f"{option} ({str(path)!r}) must be readable: {exc.strerror}"
                raise CalmkitError(msg) from None
        try:
            return cls(values[0], values[1])
        except CalmkitError as exc:
            raise CalmkitError(f"{exc} (files {str(cert_file)!r}, {str(key_file)!r})") from None

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials([(self.private_key, self.certificate_chain)])

    def __repr__(self) -> str:  # never print the key
        chain = len(self.certificate_chain)
        return f"ServerTls(certificate_chain=<{chain} bytes>, private_key=<hidden>)"


class _Stopping:
    """What :meth:`Server.stop` returns: ``wait()`` blocks until the server is down."""

    def __init__(self, done: futures.Future[None]) -> None:
        self._done = done

    def wait(self, timeout: float | None = None) -> bool:
        try:
            self._done.result(timeout)
        except futures.TimeoutError:
            return False
        return True


class Server:
    """A started ``grpc.aio`` server running on its own event-loop thread; the blocking
    methods here are what the CLI, tests and benchmarks use."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        thread: threading.Thread,
        server: grpc.aio.Server,
        health_servicer: health_aio.HealthServicer,
        workers: futures.ThreadPoolExecutor,
        port: int,
        tls: bool,
        endpoints: Endpoints | None = None,
    ) -> None:
        self._loop = loop
        self._thread = thread
        self._server = server
        self._health = health_servicer
        self._workers = workers
        self.port = port
        self.tls = tls
        self._stopped: futures.Future[None] | None = None
        self._lock = threading.Lock()
        self._endpoints = endpoints or Endpoints()
        self.metrics_port = self._endpoints.metrics_port
        self.console_port = self._endpoints.console_port

    def _call(self, coro: object) -> futures.Future[object]:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)  # type: ignore[arg-type]

    def enter_graceful_shutdown(self) -> None:
        """Health checks answer NOT_SERVING from now on (load balancers drain us)."""
        if self._loop.is_running():
            self._call(self._health.enter_graceful_shutdown()).result()

    def stop(self, grace: float | None = None) -> _Stopping:
        """Refuse new calls, let in-flight ones finish within ``grace`` seconds, then
        cancel the rest and end the loop thread. Idempotent."""
        with self._lock:
            if self._stopped is None:
                self._stopped = futures.Future()
                threading.Thread(
                    target=self._shutdown, args=(grace,), daemon=True, name="calmkit-grpc-stop"
                ).start()
            return _Stopping(self._stopped)

    def _shutdown(self, grace: float | None) -> None:
        assert self._stopped is not None
        try:
            self._endpoints.stop()
            if self._loop.is_running():
                self._call(self._stop(grace)).result()
                self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._workers.shutdown(wait=True)
            self._loop.close()
        finally:
            self._stopped.set_result(None)

    async def _stop(self, grace: float | None) -> None:
        """Stop the server, then end what is left on the loop (calls still waiting for
        a request body that never came) so the loop closes clean."""
        await self._server.stop(grace)
        rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in rest:
            task.cancel()
        await asyncio.gather(*rest, return_exceptions=True)

    def wait_for_termination(self, timeout: float | None = None) -> bool:
        """Block until the server stopped (or ``timeout`` passed: then False)."""
        self._thread.join(timeout)
        return not self._thread.is_alive()


def _options() -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.so_reuseport", 0),  # a second server on a bound port fails
        ("grpc.max_concurrent_streams", MAX_STREAMS_PER_CONNECTION),
        ("grpc.max_connection_age_ms", MAX_CONNECTION_AGE_S * 1000),
        ("grpc.max_connection_age_grace_ms", MAX_CONNECTION_AGE_GRACE_S * 1000),
    ]


async def _start(
    address: str,
    service: AggregatorService,
    tls: ServerTls | None,
    workers: futures.ThreadPoolExecutor,
    max_concurrent_rpcs: int,
    admin_token: str | None = None,
    max_calls_per_address: int = MAX_CALLS_PER_ADDRESS,
    body_timeout: float = BODY_TIMEOUT_S,
) -> tuple[grpc.aio.Server, health_aio.HealthServicer, int]:
    # The service's handlers are plain functions: the guard checks the metadata, reads
    # the request on the loop and runs the handler on ``workers`` once it is complete.
    # Its interceptor puts health checks and reflection under the same per-address
    # cap and body timeout.
    admin_hash = hashlib.sha256(admin_token.encode("utf-8")).digest() if admin_token else None
    guard = Guard(workers, admin_hash, max_calls_per_address, body_timeout, max_concurrent_rpcs)
    server = grpc.aio.server(
        migration_thread_pool=workers,
        options=_options(),
        maximum_concurrent_rpcs=max_concurrent_rpcs,
        interceptors=(guard.interceptor(wire.SERVICE_NAME),),
    )
    wire.add_servicer(service, server, guard)
    health_servicer = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in ("", wire.SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection(
        (wire.SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    try:
        if tls is None:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, tls.credentials())
    except RuntimeError:  # grpc raises or returns 0 when the bind fails
        port = 0
    if port == 0:
        await server.stop(None)
        raise CalmkitError(
            f"address ({address!r}) could not be bound: the port is in use or the host "
            "is not an address of this machine"
        )
    await server.start()
    return server, health_servicer, port


def check_exposure(
    address: str,
    admin_token: str | None,
    tls: ServerTls | None,
    insecure: bool,
    option: str = "address",
) -> None:
    """Refuse what :func:`create_server` would refuse about ``address`` before it binds
    (a malformed address; beyond loopback, no admin token, or no TLS unless
    ``insecure``), so a caller can check before it creates anything. ``option`` names
    the address in the message (the metrics and console endpoints follow the same
    rules)."""
    try:
        check_address(address)
    except CalmkitError as exc:
        raise CalmkitError(str(exc).replace("address", option, 1)) from None
    if admin_token is None and not is_loopback(address):
        raise CalmkitError(
            f"{option} ({address!r}) must be loopback (127.0.0.1, ::1, localhost) when no "
            "token file protects the admin calls"
        )
    if tls is None and not insecure and not is_loopback(address):
        raise CalmkitError(
            f"{option} ({address!r}) is not loopback, so tokens and reports would cross the "
            "network in clear: give a TLS certificate and key (--tls-cert/--tls-key), or "
            "insecure=True (--insecure) if a proxy or private network protects them"
        )


def _check_stream_limits(max_calls_per_address: int, body_timeout: float) -> None:
    check_int("max_calls_per_address", max_calls_per_address, 0)
    if (
        isinstance(body_timeout, bool)
        or not isinstance(body_timeout, (int, float))
        or not 0 < body_timeout < math.inf
    ):
        raise CalmkitError(f"body_timeout ({body_timeout!r}) must be a number of seconds > 0")


def create_server(
    address: str,
    storage: ReportStore,
    admin_token: str | None = None,
    *,
    tls: ServerTls | None = None,
    insecure: bool = False,
    max_workers: int = 8,
    max_concurrent_rpcs: int = MAX_CONCURRENT_RPCS,
    max_calls_per_address: int = MAX_CALLS_PER_ADDRESS,
    body_timeout: float = BODY_TIMEOUT_S,
    rate_limit: float | None = None,
    rate_burst: int | None = None,
    metrics_address: str | None = None,
    console_address: str | None = None,
    console_sample_seconds: float = 5.0,
) -> tuple[Server, int]:
    """Start the service on ``address`` (``HOST:0`` picks a free port); return
    ``(server, port)``.

    Without an admin token the address must be loopback. Beyond loopback, ``tls`` is
    required unless ``insecure=True`` says that something else (a TLS-terminating
    proxy, a private network) protects the bearer tokens on the wire. ``rate_limit``
    caps each client address at that many reports per second per collection, at most
    ``rate_burst`` at once (default: one second's worth); None: no cap.
    ``max_calls_per_address`` caps the calls in flight from one client address (an
    IPv6 client's /64; 0: no cap; clients behind one proxy or NAT share it), and a
    request message must arrive within ``body_timeout`` seconds of its call's start,
    so streams that send headers and stall cannot hold every one of the
    ``max_concurrent_rpcs`` slots.
    ``metrics_address`` serves Prometheus metrics, ``console_address`` the web console
    (sampling the ingest rate every ``console_sample_seconds``); both follow the
    address's rules and are off when None.
    """
    check_exposure(address, admin_token, tls, insecure)
    for option, extra in (("metrics_address", metrics_address), ("console", console_address)):
        if extra is not None:
            check_exposure(extra, admin_token, tls, insecure, option=option)
    if not 1 <= max_workers <= 256:
        raise CalmkitError(f"max_workers ({max_workers}) must be in [1, 256]")
    _check_stream_limits(max_calls_per_address, body_timeout)
    metrics = NO_METRICS if metrics_address is None else ServiceMetrics(storage)
    service = AggregatorService(
        storage, admin_token, rate_limit=rate_limit, rate_burst=rate_burst, metrics=metrics
    )
    endpoints = start_endpoints(
        service,
        admin_token,
        None if tls is None else (tls.certificate_chain, tls.private_key),
        metrics_address,
        console_address,
        console_sample_seconds,
    )
    workers = futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="calmkit-rpc")
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True, name="calmkit-grpc")
    thread.start()
    started = asyncio.run_coroutine_threadsafe(
        _start(
            address,
            service,
            tls,
            workers,
            max_concurrent_rpcs,
            admin_token,
            max_calls_per_address,
            body_timeout,
        ),
        loop,
    )
    try:
        server, health_servicer, port = started.result()
    except BaseException:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
        workers.shutdown(wait=False)
        endpoints.stop()
        raise
    running = Server(
        loop, thread, server, health_servicer, workers, port, tls is not None, endpoints
    )
    return running, port


def graceful_stop(server: Server, grace: float = 10.0) -> None:
    """Report NOT_SERVING to health checks, refuse new calls, let in-flight ones (an
    ingesting batch is committed before its ack) finish within ``grace`` seconds."""
    server.enter_graceful_shutdown()
    server.stop(grace).wait()
