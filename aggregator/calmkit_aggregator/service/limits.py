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
run, which is how a flood of refused calls used to keep gigabytes. Bodies are not
read through a small pool of slots: streams that stall mid-body would hold every slot
and starve honest calls (calls in flight are capped by the server's
``maximum_concurrent_rpcs`` instead). The handler runs on a worker thread, as before;
health checks and reflection are not wrapped and are answered on the event loop.

Memory given back: after a body of :data:`TRIM_AFTER_BYTES` or more, glibc's
``malloc_trim`` runs (off the loop, at most once per :data:`TRIM_INTERVAL_S`), because
the allocator otherwise keeps the freed pages of a flood's bodies (measured: 100-200 MB
left after 128 refused 16 MiB calls, about 0 after a trim). Elsewhere than glibc this
is skipped.
"""

from __future__ import annotations

import asyncio
import ctypes
import hashlib
import hmac
import re
from collections.abc import Awaitable, Callable
from concurrent import futures
from typing import Any

import grpc

from calmkit_client.collector import ERROR_KEY, MAX_MESSAGE_BYTES

__all__ = [
    "BODY_LIMITS",
    "PUBLIC_BODY_BYTES",
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

    def __init__(self, workers: futures.Executor, admin_hash: bytes | None) -> None:
        self._workers = workers
        self._admin_hash = admin_hash
        self._trim = _malloc_trim()
        self._trim_pending = False

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
        raw = await context.read()
        if raw is grpc.aio.EOF:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "request (none) was not sent")
        return [bytes(raw)]

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


def _take(handle: Callable[[bytes, Any], Any], body: list[bytes], context: _WorkerContext) -> Any:
    return handle(body.pop(), context)
