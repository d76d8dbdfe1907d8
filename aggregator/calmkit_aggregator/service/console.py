"""The web console (``calmkit serve --console HOST:PORT``): read-only pages over the
running service, in the same process.

Everything it shows comes from the service's own answers: a collection's status is
what ``GetCollection`` serves (:meth:`~.handlers.AggregatorService.status`), a
marginal what ``Query`` serves (:meth:`~.handlers.AggregatorService.answer`, the same
code and caches), so the console's numbers are ``calmkit query``'s. The ingest rate is
sampled from the store on a thread of its own (:mod:`.ingest_rate`).

Access (docs/operate.md "Web console"):

- With an admin token, every page needs a session: the token is posted once to
  ``/login`` (never in a URL; compared as a digest in constant time), and the
  browser gets a random session id (:func:`secrets.token_urlsafe`) in a cookie that
  is ``HttpOnly``, ``SameSite=Strict`` and, over TLS, ``Secure``. The server keeps
  only the ids' digests. Failed logins are limited to :data:`MAX_FAILED_LOGINS` a
  minute per client address (an IPv6 client's /64), so no client can lock the others
  out; a token of >= 16 characters is out of reach of guessing at that rate.
- POSTs (log in, log out) from another site are refused
  (:func:`~.http_endpoint.cross_site`); every other request is a read.
- Pages carry no script, and a content security policy forbids any.
- Without an admin token the server is loopback only and the console open, like the
  admin calls.
"""

from __future__ import annotations

import collections
import hashlib
import secrets
import threading
import time
from dataclasses import dataclass, field
from html import escape
from http.cookies import CookieError, SimpleCookie
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from calmkit_client import CalmkitError

from .answer_format import format_answer
from .console_pages import (
    CSS,
    Row,
    collection_page,
    collections_page,
    error_page,
    login_page,
    marginal_section,
)
from .handlers import AggregatorService, log_json
from .http_endpoint import EndpointHandler, cross_site, token_matches
from .ingest_rate import IngestRate
from .rate_limit import address_key

__all__ = ["COOKIE", "MAX_FAILED_LOGINS", "SESSION_SECONDS", "ConsoleHandler", "ConsoleState"]

COOKIE = "calmkit_session"
SESSION_SECONDS = 12 * 3600
MAX_SESSIONS = 1000  # beyond: the oldest session ends
MAX_FAILED_LOGINS = 20  # a minute, per client address
MAX_TRACKED_CLIENTS = 10_000  # addresses with recent failed logins kept (beyond: the oldest go)
CSP = (
    "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)


def _digest(session_id: str) -> str:
    return hashlib.sha256(session_id.encode("utf-8")).hexdigest()


@dataclass
class ConsoleState:
    """What the console's handlers share: the service, the admin token's digest (None:
    no login), the sessions and the ingest-rate sampler."""

    service: AggregatorService
    token_hash: bytes | None
    rate: IngestRate
    sessions: dict[str, float] = field(default_factory=dict)  # id digest -> expiry
    failures: dict[str, collections.deque[float]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def new_session(self) -> str:
        session_id = secrets.token_urlsafe(32)
        with self.lock:
            if len(self.sessions) >= MAX_SESSIONS:
                del self.sessions[min(self.sessions, key=self.sessions.__getitem__)]
            self.sessions[_digest(session_id)] = time.time() + SESSION_SECONDS
        return session_id

    def valid(self, session_id: str | None) -> bool:
        if self.token_hash is None:
            return True
        if not session_id:
            return False
        with self.lock:
            expiry = self.sessions.get(_digest(session_id))
            if expiry is not None and expiry < time.time():
                del self.sessions[_digest(session_id)]
                expiry = None
        return expiry is not None

    def end(self, session_id: str | None) -> None:
        if session_id:
            with self.lock:
                self.sessions.pop(_digest(session_id), None)

    def throttled(self, client: str) -> bool:
        """Whether too many logins from ``client`` (:func:`~.rate_limit.address_key`)
        failed in the last minute."""
        now = time.time()
        with self.lock:
            recent = self.failures.get(client)
            while recent and recent[0] < now - 60:
                recent.popleft()
            return recent is not None and len(recent) >= MAX_FAILED_LOGINS

    def failed(self, client: str) -> None:
        with self.lock:
            if client not in self.failures and len(self.failures) >= MAX_TRACKED_CLIENTS:
                del self.failures[next(iter(self.failures))]  # the longest tracked
            self.failures.setdefault(client, collections.deque()).append(time.time())

    def row(self, collection_id: str) -> Row:
        info = self.service.status(collection_id)
        expected = info.expected_n or None
        return Row(info, expected, self.rate.rates(collection_id))


class ConsoleHandler(EndpointHandler):
    """The console's routes: ``/login``, ``/logout``, ``/`` (the collections),
    ``/collections/ID`` (with ``?attr=NAME&...&reconstruct=local|global`` a marginal),
    ``/collections/ID/marginal.csv`` and ``.json``, ``/console.css``."""

    endpoint_name = "console"

    @property
    def state(self) -> ConsoleState:
        return self.context  # type: ignore[no-any-return]

    # -- plumbing ------------------------------------------------------------------------
    def _html(self, status: int, body: bytes, extra: tuple[tuple[str, str], ...] = ()) -> None:
        headers = (("Content-Security-Policy", CSP), *extra)
        self.send_body(status, body, "text/html; charset=utf-8", headers)

    def _redirect(self, where: str, extra: tuple[tuple[str, str], ...] = ()) -> None:
        self.send_body(303, b"", "text/plain", (("Location", where), *extra))

    def _session(self) -> str | None:
        try:
            jar = SimpleCookie(self.headers.get("Cookie") or "")
        except CookieError:
            return None
        morsel = jar.get(COOKIE)
        return None if morsel is None else morsel.value

    def _cookie(self, value: str, max_age: int) -> tuple[str, str]:
        secure = "; Secure" if self.over_tls else ""
        return (
            "Set-Cookie",
            f"{COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}",
        )

    # -- routes --------------------------------------------------------------------------
    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path == "/console.css":
            self.send_body(200, CSS, "text/css; charset=utf-8")
            return
        if url.path == "/login":
            if self.state.valid(self._session()):
                self._redirect("/")
            else:
                self._html(200, login_page())
            return
        if not self.state.valid(self._session()):
            self._redirect("/login")
            return
        try:
            self._route(url.path, parse_qs(url.query))
        except CalmkitError as exc:  # an unknown collection or attribute: say which
            self._html(404, error_page(str(exc)))
        except Exception as exc:  # keep serving; the log says what failed
            log_json("console_error", path=url.path, error=f"{type(exc).__name__}: {exc}")
            self._html(500, error_page("internal error (see the server's log)"))

    do_HEAD = do_GET

    def _route(self, path: str, query: dict[str, list[str]]) -> None:
        parts = [unquote(p) for p in path.strip("/").split("/")] if path != "/" else []
        if not parts:
            rows = [self.state.row(r.collection_id) for r in self._records()]
            self._html(200, collections_page(rows))
        elif len(parts) == 2 and parts[0] == "collections":
            self._collection(parts[1], query)
        elif len(parts) == 3 and parts[0] == "collections" and parts[2] in _DOWNLOADS:
            self._download(parts[1], query, parts[2])
        else:
            self._html(404, error_page("no such page"))

    def _records(self) -> list[Any]:
        return list(self.state.service.storage.list_collections())

    def _collection(self, collection_id: str, query: dict[str, list[str]]) -> None:
        row = self.state.row(collection_id)
        chosen = query.get("attr", [])
        reconstruct = (query.get("reconstruct") or ["local"])[0]
        marginal = ""
        if chosen:
            try:
                answer = self.state.service.answer(collection_id, chosen, 0, reconstruct)
                schema = row.info.plan.schema
                labels = [schema.attributes[schema.index(a)].categories for a in answer.attributes]
                marginal = marginal_section(collection_id, answer, labels, reconstruct)
            except CalmkitError as exc:
                marginal = f'<p class="error" id=query-error>{escape(str(exc))}</p>'
        self._html(200, collection_page(row, chosen, reconstruct, marginal))

    def _download(self, collection_id: str, query: dict[str, list[str]], name: str) -> None:
        reconstruct = (query.get("reconstruct") or ["local"])[0]
        answer = self.state.service.answer(collection_id, query.get("attr", []), 0, reconstruct)
        fmt, content_type = _DOWNLOADS[name]
        body = (format_answer(answer, fmt) + "\n").encode("utf-8")
        stem = "-".join([collection_id, *answer.attributes])
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in stem)
        disposition = ("Content-Disposition", f'attachment; filename="{safe}.{fmt}"')
        self.send_body(200, body, content_type, (disposition,))

    def do_POST(self) -> None:
        url = urlsplit(self.path)
        if cross_site(self.headers):
            self._html(403, error_page("cross-site request refused"))
            return
        if url.path == "/logout":
            self.state.end(self._session())
            self._redirect("/login", (self._cookie("", 0),))
        elif url.path == "/login":
            self._login()
        else:
            self._html(404, error_page("no such page"))

    def _login(self) -> None:
        state = self.state
        if state.token_hash is None:
            self._redirect("/")
            return
        client = address_key(self.client_address[0])
        if state.throttled(client):
            self._html(429, login_page("too many failed logins: wait a minute"))
            return
        try:
            form = parse_qs(self.read_body().decode("utf-8", "replace"))
        except CalmkitError:
            form = {}
        token = (form.get("token") or [""])[0].strip()
        if not token_matches(token, state.token_hash):
            state.failed(client)
            self._html(401, login_page("wrong token"))
            return
        session = state.new_session()
        self._redirect("/", (self._cookie(session, SESSION_SECONDS),))


_DOWNLOADS = {
    "marginal.csv": ("csv", "text/csv; charset=utf-8"),
    "marginal.json": ("json", "application/json"),
}
