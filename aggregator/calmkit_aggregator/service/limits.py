"""Nothing large is read before authentication: per-method body limits and reads
gated on the caller's metadata.

gRPC reads a unary request in full (up to the server's receive limit) before its
handler runs, so a caller without any token could make the server hold 16 MiB per
call. Here every ``calmkit.v1.Aggregator`` method is served as a request-streaming
handler that reads its one message itself:

- **only once the metadata is checked** (headers arrive before the body, and an unread body
  costs only the HTTP/2 flow-control window): an admin call must carry the admin
  token (compared in constant time); a submit must carry a well-formed bearer token
  (the collection it belongs to is named in the body, so the full check follows the
  read). Refused calls end UNAUTHENTICATED with the body unread.
- **then the body must fit its method** (:data:`BODY_LIMITS`): a larger body is refused
  RESOURCE_EXHAUSTED naming the method and limit, before any parsing.

A body that is read is dropped before any refusal: an exception's traceback would
otherwise keep it (up to 16 MiB) alive until the cyclic garbage collector happens to
run, which is how a flood of refused calls used to keep gigabytes. The handler runs on
a worker thread, as before.

Stalled streams: a call holds one of the server's ``maximum_concurrent_rpcs`` slots
from its headers on, and token-less streams that never send their message used to
hold them all (every call, health checks included, then refused RESOURCE_EXHAUSTED).
So, before anything is read:

- **calls in flight per client address** (an IPv4 address, an IPv6 /64) are capped:
  a call beyond the cap is refused at once, RESOURCE_EXHAUSTED ``calls in flight from
  1.2.3.4 (9 with this one) must be at most 8 (max_calls_per_address)``, so one address
  cannot take more than its share of the server's slots;
- **the last slots are kept for small callers**: once all but an eighth of the
  server's slots are taken (:data:`RESERVE_SHARE`), a new call is admitted only from
  a network holding fewer than :data:`SMALL_CALLER_CALLS` calls (an IPv4 address, an
  IPv6 /48: a site's allocation, so that the many /64s one subscriber may hold count
  once). Stalled streams from a few addresses then fill the server only down to the
  reserve, and filling the reserve takes a further ``reserve / SMALL_CALLER_CALLS``
  networks (with the defaults: 7 addresses reach the reserve, 64 more fill it, where 8
  used to fill everything), while a collector, which makes one call at a time, still
  gets in;
- **a request message must arrive within the body timeout** of its call's start, or
  the call ends DEADLINE_EXCEEDED, so a stalled stream frees its slot.

Health checks and reflection are under both too (:meth:`Guard.interceptor`: gRPC
would read their unary requests without a time limit); they are answered on the
event loop. Bodies are not read through a small pool of slots: streams that stall
mid-body would hold every slot and starve honest calls.

Memory given back: after a body of :data:`TRIM_AFTER_BYTES` or more, glibc's
``malloc_trim`` runs (off the loop, at most once per :data:`TRIM_INTERVAL_S`), because
the allocator otherwise keeps the freed pages of a flood's bodies (measured: 100-200 MB
left after 128 refused 16 MiB calls, about 0 after a trim). Elsewhere than glibc this
is skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import hashlib
import hmac
import inspect
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent import futures
from typing import Any

import grpc

from calmkit_client.collector import ERROR_KEY, MAX_MESSAGE_BYTES
from calmkit_client.errors import RateLimited

from .rate_limit import network_of, submitter_of

__all__ = [
    "BODY_LIMITS",
    "BODY_TIMEOUT_S",
    "PUBLIC_BODY_BYTES",
    "RESERVE_SHARE",
    "SMALL_CALLER_CALLS",
    "SUBMIT_BODY_BYTES",
    "Guard",
]

PUBLIC_BODY_BYTES = 4 * 1024  # GetPlan, GetCollection: a collection id (<= 64 chars)
ADMIN_SMALL_BODY_BYTES = 64 * 1024  # ListCollections, CloseCollection, Query
# The largest valid batch is bounded by the message cap the collector splits batches
# to fit (MAX_BATCH reports of up to MAX_VIEW_CELLS-bit OUE payloads would be larger).
SUBMIT_BODY_BYTES = MAX_MESSAGE_BYTES
CREATE_BODY_BYTES = MAX_MESSAGE_BYTES  # a schema and up to MAX_VIEWS explicit views

ADMIN, SUBMIT, PUBLIC = "admin", "submit", "public"
KINDS = {
    "CreateCollection": ADMIN,
    "ListCollections": ADMIN,
    "CloseCollection": ADMIN,
    "Query": ADMIN,
    "SubmitReports": SUBMIT,
    "SubmitColumnar": SUBMIT,
    "GetPlan": PUBLIC,
    "GetCollection": PUBLIC,
}
BODY_LIMITS = {
    "CreateCollection": CREATE_BODY_BYTES,
    "ListCollections": ADMIN_SMALL_BODY_BYTES,
    "CloseCollection": ADMIN_SMALL_BODY_BYTES,
    "Query": ADMIN_SMALL_BODY_BYTES,
    "SubmitReports": SUBMIT_BODY_BYTES,
    "SubmitColumnar": SUBMIT_BODY_BYTES,
    "GetPlan": PUBLIC_BODY_BYTES,
    "GetCollection": PUBLIC_BODY_BYTES,
}
# A request message must have arrived this long after the call began: a stream that
# sends its headers and stalls holds one of the server's maximum_concurrent_rpcs slots
# until then (a 16 MiB batch needs 4.3 Mbit/s to arrive in time).
BODY_TIMEOUT_S = 30.0
# The share of the server's slots kept for networks with few calls in flight, and how
# few: a collector makes one call at a time, so a handful leaves room for a small NAT.
RESERVE_SHARE = 8  # one slot in 8
SMALL_CALLER_CALLS = 4
TRIM_AFTER_BYTES = 1 << 20  # a body this large is followed by a malloc_trim
TRIM_INTERVAL_S = 1.0
_TOKEN_SHAPE = re.compile(r"[A-Za-z0-9_-]{16,128}")  # secrets.token_urlsafe output


class _Abort(Exception):
    """A handler's ``context.abort`` on a worker thread, replayed on the loop."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class _WorkerContext:
    """What a handler uses of its context, safe to call from a worker thread."""

    def __init__(self, metadata: tuple[tuple[str, Any], ...], peer: str = "") -> None:
        self._metadata = metadata
        self._peer = peer
        self.trailing: tuple[tuple[str, str], ...] = ()

    def peer(self) -> str:
        """The caller's address (``ipv4:127.0.0.1:5555``), as gRPC names it."""
        return self._peer

    def invocation_metadata(self) -> tuple[tuple[str, Any], ...]:
        return self._metadata

    def set_trailing_metadata(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self.trailing = tuple(metadata)

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise _Abort(code, details)


def bearer(metadata: tuple[tuple[str, Any], ...]) -> str | None:
    """The ``authorization: Bearer <token>`` value, or None."""
    for key, value in metadata:
        if key == "authorization" and isinstance(value, str) and value.startswith("Bearer "):
            return value[len("Bearer ") :]
    return None


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` (None where there is no glibc)."""
    try:
        trim: Callable[[int], int] = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


class Guard:
    """Wraps each service method (``handle(raw_bytes, context)``) into the async,
    request-streaming behaviour described above; one per server."""

    def __init__(
        self,
        workers: futures.Executor,
        admin_hash: bytes | None,
        max_calls_per_address: int = 0,
        body_timeout: float = BODY_TIMEOUT_S,
        max_calls: int = 0,
    ) -> None:
        self._workers = workers
        self._admin_hash = admin_hash
        self._trim = _malloc_trim()
        self._trim_pending = False
        self._per_address = max_calls_per_address  # 0: no cap
        self._body_timeout = body_timeout
        # Past this many calls in flight only small callers get in (0: no reserve; it
        # needs the per-address cap, which is what turns every limit off at 0).
        self._crowded = max_calls - max(1, max_calls // RESERVE_SHARE) if max_calls else 0
        # Calls in flight per client address (submitter_of: an IPv6 client's /64) and
        # per network (network_of). Only the event loop touches them: no lock.
        self._in_flight: dict[str, int] = {}
        self._per_network: dict[str, int] = {}
        self._total = 0

    def _trim_soon(self) -> None:
        """Give freed memory back to the OS within TRIM_INTERVAL_S (one trim per
        interval however many large bodies arrive)."""
        if self._trim is None or self._trim_pending:
            return
        self._trim_pending = True
        asyncio.get_running_loop().call_later(TRIM_INTERVAL_S, self._run_trim)

    def _run_trim(self) -> None:
        self._trim_pending = False
        if self._trim is not None:
            asyncio.get_running_loop().run_in_executor(None, self._trim, 0)

    def refusal(self, kind: str, metadata: tuple[tuple[str, Any], ...]) -> str | None:
        """Why the metadata alone refuses the call (None: read the body)."""
        token = bearer(metadata)
        if kind == ADMIN and self._admin_hash is not None:
            digest = hashlib.sha256((token or "").encode("utf-8")).digest()
            if token is None or not hmac.compare_digest(digest, self._admin_hash):
                return "authorization (admin bearer token) is missing or wrong"
        if kind == SUBMIT and (token is None or not _TOKEN_SHAPE.fullmatch(token)):
            return "authorization (the collection's submit token) is missing or malformed"
        return None

    def wrap(
        self, name: str, handle: Callable[[bytes, Any], Any]
    ) -> Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]]:
        """The behaviour serving method ``name`` with ``handle``."""
        kind, limit = KINDS[name], BODY_LIMITS[name]

        async def serve(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            async with self._slot(context):
                return await checked(context)

        async def checked(context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            metadata = tuple((m[0], m[1]) for m in context.invocation_metadata() or ())
            why = self.refusal(kind, metadata)
            if why is not None:
                context.set_trailing_metadata(((ERROR_KEY, "AccessDenied"),))
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, why)
            body = await self._read(context)
            size = len(body[0])
            if size >= TRIM_AFTER_BYTES:
                self._trim_soon()
            if size > limit:
                body.clear()  # an abort's traceback must not keep the body alive
                await context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"request ({size} bytes) must be at most {limit} bytes for {name}",
                )
            return await self._run(handle, body, metadata, context)

        return serve

    async def _read(self, context: grpc.aio.ServicerContext[Any, Any]) -> list[bytes]:
        """The request body, alone in a list the caller empties before aborting (an
        exception's traceback would otherwise keep up to 16 MiB alive until the cyclic
        garbage collector happens to run)."""
        return [bytes(await self._message(context))]

    async def _read_in_time(self, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        """The call's next message (or EOF), aborted DEADLINE_EXCEEDED when it is not
        complete within the body timeout: a stream that stalls would otherwise hold its
        slot of ``maximum_concurrent_rpcs`` until its connection is recycled. (gRPC's
        completion of a cancelled read checks for the cancellation, so cancelling it
        here is safe.)"""
        try:
            return await asyncio.wait_for(context.read(), self._body_timeout)
        except asyncio.TimeoutError:
            pass  # abort outside the except block: the refusal needs no TimeoutError context
        limit = f"{self._body_timeout:g}"
        await context.abort(
            grpc.StatusCode.DEADLINE_EXCEEDED,
            f"request (not complete after {limit} s) must arrive within {limit} s (body_timeout)",
        )

    @contextlib.asynccontextmanager
    async def _slot(self, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[None]:
        """Hold one of the caller's address's slots for the call's life; a call beyond
        ``max_calls_per_address``, or beyond its network's share of the reserve once the
        server is nearly full (:meth:`_over`), is refused at once (RESOURCE_EXHAUSTED,
        named RateLimited so the collector retries later), freeing its server-wide slot,
        so stalled streams from a few addresses cannot take all of
        ``maximum_concurrent_rpcs``. The slot is given back however the call ends
        (returned, aborted, cancelled)."""
        if self._per_address == 0:
            yield
            return
        address = submitter_of(str(context.peer()))
        network = network_of(address)
        why = self._over(address, network)
        if why is not None:
            context.set_trailing_metadata(((ERROR_KEY, RateLimited.__name__),))
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, why)
        _count(self._in_flight, address, 1)
        _count(self._per_network, network, 1)
        self._total += 1
        try:
            yield
        finally:
            _count(self._in_flight, address, -1)
            _count(self._per_network, network, -1)
            self._total -= 1

    def _over(self, address: str, network: str) -> str | None:
        """Why one more call from ``address`` (in ``network``) is refused, or None: the
        address's cap, or, with the server's slots all but the reserve taken, the
        network's share of the reserve."""
        held = self._in_flight.get(address, 0)
        if held >= self._per_address:
            return (
                f"calls in flight from {address} ({held + 1} with this one) must be at "
                f"most {self._per_address} (max_calls_per_address)"
            )
        small = min(SMALL_CALLER_CALLS, self._per_address)
        crowded = self._crowded and self._total >= self._crowded
        if crowded and self._per_network.get(network, 0) >= small:
            return (
                f"calls in flight from {network} ({self._per_network[network] + 1} with "
                f"this one) must be at most {small} while the server is nearly full "
                f"({self._total} calls in flight; its last slots are kept for callers "
                "with few calls)"
            )
        return None

    def interceptor(self, own_service: str) -> grpc.aio.ServerInterceptor:
        """Puts the other services' methods (health, reflection) under the same
        per-address cap and body timeout (``own_service``'s are wrapped already): a
        stalled health check holds a server-wide slot like any other call."""
        return _OtherServices(self, f"/{own_service}/")

    def wrap_handler(self, handler: grpc.RpcMethodHandler[Any, Any]) -> Any:
        """``handler`` served request-streaming, its messages read here in time.
        gRPC itself reads a unary request before the behaviour runs, with no time
        limit. Only asynchronous behaviours (grpc.aio's health and reflection) are
        wrapped: a blocking one must not run on the loop."""
        behaviour = _behaviour(handler)
        if not _is_async(behaviour):
            return handler
        requests_of = self._request_stream if handler.request_streaming else self._one_message
        return _streaming_handler(handler, self._slot, requests_of, behaviour)

    def _request_stream(self, _requests: Any, context: Any) -> AsyncIterator[Any]:
        return self._messages(context)

    async def _one_message(self, _requests: Any, context: Any) -> Any:
        return await self._message(context)

    async def _message(self, context: Any) -> Any:
        """The call's one message, read in time; a call that ends without one is
        INVALID_ARGUMENT."""
        request = await self._read_in_time(context)
        if request is grpc.aio.EOF:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "request (none) was not sent")
        return request

    async def _messages(self, context: Any) -> AsyncIterator[Any]:
        """A request stream whose every message must arrive within the body timeout."""
        while (request := await self._read_in_time(context)) is not grpc.aio.EOF:
            yield request

    async def _run(
        self,
        handle: Callable[[bytes, Any], Any],
        body: list[bytes],
        metadata: tuple[tuple[str, Any], ...],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> Any:
        worker = _WorkerContext(metadata, str(context.peer()))
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._workers, _take, handle, body, worker)
        except _Abort as abort:  # leave the except block first: its traceback holds the body
            code, details = abort.code, abort.details
        if worker.trailing:
            context.set_trailing_metadata(worker.trailing)
        await context.abort(code, details)


class _OtherServices(grpc.aio.ServerInterceptor):
    """:meth:`Guard.interceptor`: each method's wrapped handler is built once."""

    def __init__(self, guard: Guard, own_prefix: str) -> None:
        self._guard = guard
        self._own_prefix = own_prefix
        self._wrapped: dict[str, Any] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        method = handler_call_details.method
        handler = await continuation(handler_call_details)
        if handler is None or method.startswith(self._own_prefix):
            return handler
        if method not in self._wrapped:
            self._wrapped[method] = self._guard.wrap_handler(handler)
        return self._wrapped[method]


def _count(counts: dict[str, int], key: str, change: int) -> None:
    """Add ``change`` to ``counts[key]``; a key at 0 is dropped, so an address with
    nothing in flight costs no memory."""
    left = counts.get(key, 0) + change
    if left:
        counts[key] = left
    else:
        del counts[key]


def _behaviour(handler: grpc.RpcMethodHandler[Any, Any]) -> Any:
    return {
        (False, False): handler.unary_unary,
        (False, True): handler.unary_stream,
        (True, False): handler.stream_unary,
        (True, True): handler.stream_stream,
    }[(handler.request_streaming, handler.response_streaming)]


def _is_async(behaviour: Any) -> bool:
    return inspect.iscoroutinefunction(behaviour) or inspect.isasyncgenfunction(behaviour)


def _streaming_handler(
    handler: grpc.RpcMethodHandler[Any, Any],
    slot: Callable[[Any], contextlib.AbstractAsyncContextManager[None]],
    requests_of: Callable[[Any, Any], Any],
    behaviour: Any,
) -> Any:
    """A request-streaming handler running ``behaviour`` on ``requests_of``'s request
    (a coroutine: one message) or requests (an iterator) while holding a ``slot``."""
    codecs = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }

    async def unary_response(requests: Any, context: Any) -> Any:
        async with slot(context):
            return await behaviour(await _ready(requests_of(requests, context)), context)

    async def stream_response(requests: Any, context: Any) -> None:
        async with slot(context):
            result = behaviour(await _ready(requests_of(requests, context)), context)
            if inspect.isasyncgen(result):  # else a coroutine calling context.write
                async for response in result:
                    await context.write(response)
            else:
                await result

    if handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(stream_response, **codecs)
    return grpc.stream_unary_rpc_method_handler(unary_response, **codecs)


async def _ready(value: Any) -> Any:
    """``value``, awaited if it is awaitable (one message) and as is if not (a stream)."""
    return await value if inspect.isawaitable(value) else value


def _take(handle: Callable[[bytes, Any], Any], body: list[bytes], context: _WorkerContext) -> Any:
    return handle(body.pop(), context)
