"""The web console's access rules over plain HTTP (the browser test covers the pages):
logins posted from another site are refused, failed logins are limited, a session
ends at logout on the server (a replayed cookie opens nothing), every page forbids
scripts and framing, and an unknown collection is a 404 that quotes it escaped."""

from __future__ import annotations

import http.client
import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import pytest

from calmkit_aggregator.service.admin import AdminClient
from calmkit_aggregator.service.console import MAX_FAILED_LOGINS
from calmkit_client.collector import Collector
from calmkit_client.device import DeviceState
from tests.integration.servers import IDS, POP, Server

TOKEN = "console-http-admin-token-42a7c1"


def _request(
    port: int, method: str, path: str, body: str = "", source: str = "127.0.0.1", **headers: str
) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=(source, 0))
    sent = {k.replace("_", "-"): v for k, v in headers.items()}
    if body:
        sent["Content-Type"] = "application/x-www-form-urlencoded"
    conn.request(method, path, body=body.encode(), headers=sent)
    response = conn.getresponse()
    response.read()
    conn.close()
    return response


def _login(
    port: int, token: str, source: str = "127.0.0.1", **headers: str
) -> http.client.HTTPResponse:
    return _request(port, "POST", "/login", urlencode({"token": token}), source, **headers)


def _session(response: http.client.HTTPResponse) -> str:
    cookie = response.getheader("Set-Cookie") or ""
    return cookie.split(";", 1)[0]


@pytest.fixture
def console(tmp_path: Path) -> Iterator[Server]:
    with Server(tmp_path, TOKEN, console_address="127.0.0.1:0") as server:
        yield server


def test_a_login_from_another_site_is_refused(console: Server) -> None:
    port = console.console_port
    assert port is not None
    for headers in (
        {"Origin": "http://evil.example"},
        {"Sec_Fetch_Site": "cross-site"},
        {"Sec_Fetch_Site": "same-site", "Origin": f"http://127.0.0.1:{port}"},
    ):
        refused = _login(port, TOKEN, **headers)
        assert refused.status == 403 and refused.getheader("Set-Cookie") is None
    for headers in (
        {"Origin": f"http://127.0.0.1:{port}"},
        {"Sec_Fetch_Site": "same-origin"},
        {},  # no browser sent it
    ):
        ok = _login(port, TOKEN, **headers)
        assert ok.status == 303 and ok.getheader("Location") == "/"


def test_sessions_end_at_logout_and_pages_forbid_scripts(console: Server) -> None:
    port = console.console_port
    assert port is not None
    response = _login(port, TOKEN)
    cookie = _session(response)
    name, value = cookie.split("=", 1)
    assert name == "calmkit_session" and len(value) >= 40 and TOKEN not in value
    page = _request(port, "GET", "/", Cookie=cookie)
    assert page.status == 200
    policy = page.getheader("Content-Security-Policy") or ""
    assert "default-src 'none'" in policy and "script-src" not in policy
    assert "frame-ancestors 'none'" in policy and page.getheader("X-Frame-Options") == "DENY"
    assert page.getheader("Cache-Control") == "no-store"
    missing = _request(port, "GET", "/collections/%3Cscript%3E", Cookie=cookie)
    assert missing.status == 404
    assert _request(port, "POST", "/logout", Cookie=cookie).status == 303
    replayed = _request(port, "GET", "/", Cookie=cookie)
    assert (replayed.status, replayed.getheader("Location")) == (303, "/login")
    forged = _request(port, "GET", "/", Cookie="calmkit_session=" + "A" * 43)
    assert (forged.status, forged.getheader("Location")) == (303, "/login")


def test_failed_logins_are_limited(console: Server) -> None:
    port = console.console_port
    assert port is not None
    for _ in range(MAX_FAILED_LOGINS):
        assert _login(port, "not-the-token-not-the-token").status == 401
    throttled = _login(port, TOKEN)  # for a minute, even the right one
    assert throttled.status == 429 and throttled.getheader("Set-Cookie") is None
    # per client address: another client (here 127.0.0.2) is not locked out
    other = _login(port, TOKEN, source="127.0.0.2")
    assert other.status == 303 and other.getheader("Set-Cookie")


def test_a_3_way_marginal_is_drawn_as_one_heatmap_per_category(console: Server) -> None:
    """One heatmap of the last two attributes per category of the first, on one colour
    scale, each cell the gRPC Query's value (a panel of the wrong slice, or a missing
    one, fails)."""
    port = console.console_port
    assert port is not None
    with AdminClient(console.address, TOKEN) as admin:
        info = admin.create_collection(POP.schema, 1.0, POP.n, 3, collection_id="c3", pilot=0.0)
    token = info.submit_token
    assert token is not None
    with Collector(console.address, "c3", token, DeviceState.in_memory()) as client:
        client.submit_many(POP.codes[:4000], IDS[:4000])
    with AdminClient(console.address, TOKEN) as admin:
        admin.close_collection("c3")
        expected = admin.query("c3", ["a0", "a1", "a2"])
    cookie = _session(_login(port, TOKEN))
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/collections/c3?attr=a0&attr=a1&attr=a2", headers={"Cookie": cookie})
    page = conn.getresponse().read().decode("utf-8")
    conn.close()
    panels = re.findall(r'<figure class="panel"><figcaption>(.*?)</figcaption>(.*?)</figure>', page)
    categories = POP.schema.attributes[0].categories
    assert [caption for caption, _ in panels] == [f"a0 = {c}" for c in categories]
    for first, (_, svg) in enumerate(panels):
        cells = re.findall(
            r'data-row="(\d+)" data-col="(\d+)">.*?fill="#?\w+">([\d.]+)</text>', svg
        )
        assert len(cells) == expected.values[first].size
        for i, j, shown in cells:
            assert float(shown) == pytest.approx(expected.values[first, int(i), int(j)], abs=5e-5)
