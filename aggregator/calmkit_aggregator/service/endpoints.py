"""The HTTP endpoints a server may run beside its gRPC port: Prometheus metrics
(``/metrics``, :mod:`.metrics`) and the web console (:mod:`.console`), started by
:func:`start_endpoints` on the addresses :func:`~.server.create_server` checked.

The metrics endpoint needs the admin bearer token (``Authorization: Bearer TOKEN``)
whenever the server has one, like the admin calls; a Prometheus scrape job sets it
with ``authorization: {credentials_file: admin.token}``.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CONTENT_TYPE_LATEST

from .console import ConsoleHandler, ConsoleState
from .handlers import AggregatorService
from .http_endpoint import (
    EndpointHandler,
    HttpEndpoint,
    bearer_token,
    tls_context,
    token_hash,
    token_matches,
)
from .ingest_rate import IngestRate
from .metrics import ServiceMetrics

__all__ = ["Endpoints", "MetricsHandler", "start_endpoints"]


@dataclass(frozen=True)
class _MetricsState:
    metrics: ServiceMetrics
    token_hash: bytes | None


class MetricsHandler(EndpointHandler):
    """``GET /metrics``: the server's metrics in Prometheus' text format."""

    endpoint_name = "metrics"

    def do_GET(self) -> None:
        state: _MetricsState = self.context
        if self.path.split("?", 1)[0] != "/metrics":
            self.send_body(404, b"not found: the metrics are at /metrics\n", "text/plain")
            return
        if not token_matches(bearer_token(self.headers.get("Authorization")), state.token_hash):
            self.send_body(
                401,
                b"the admin bearer token is missing or wrong\n",
                "text/plain",
                (("WWW-Authenticate", 'Bearer realm="calmkit"'),),
            )
            return
        self.send_body(200, state.metrics.scrape(), CONTENT_TYPE_LATEST)

    do_HEAD = do_GET


@dataclass
class Endpoints:
    """The running endpoints (None: not started)."""

    metrics: HttpEndpoint | None = None
    console: HttpEndpoint | None = None
    rate: IngestRate | None = None

    @property
    def metrics_port(self) -> int | None:
        return None if self.metrics is None else self.metrics.port

    @property
    def console_port(self) -> int | None:
        return None if self.console is None else self.console.port

    def stop(self) -> None:
        for endpoint in (self.metrics, self.console):
            if endpoint is not None:
                endpoint.stop()
        if self.rate is not None:
            self.rate.stop()


def start_endpoints(
    service: AggregatorService,
    admin_token: str | None,
    tls: tuple[bytes, bytes] | None,
    metrics_address: str | None,
    console_address: str | None,
    sample_seconds: float = 5.0,
) -> Endpoints:
    """Start what is asked for (over TLS with ``tls``, the gRPC port's PEM
    ``(certificate chain, private key)``); counting starts with the metrics endpoint
    (``service.metrics`` must be a :class:`ServiceMetrics` then). On a failure,
    whatever started is stopped again."""
    started = Endpoints()
    if metrics_address is None and console_address is None:
        return started
    context = None if tls is None else tls_context(*tls)
    digest = None if admin_token is None else token_hash(admin_token)
    try:
        if metrics_address is not None:
            assert isinstance(service.metrics, ServiceMetrics)
            state = _MetricsState(service.metrics, digest)
            started.metrics = HttpEndpoint(
                "metrics_address", metrics_address, MetricsHandler, state, context
            )
        if console_address is not None:
            started.rate = IngestRate(service.storage, sample_seconds)
            console = ConsoleState(service, digest, started.rate)
            started.console = HttpEndpoint(
                "console", console_address, ConsoleHandler, console, context
            )
            started.rate.start()
    except BaseException:
        started.stop()
        raise
    return started
