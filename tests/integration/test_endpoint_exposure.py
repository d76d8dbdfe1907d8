"""The metrics and console endpoints refuse what the gRPC port refuses: off loopback
no start without an admin token, nor without TLS unless insecure; with TLS they speak
only TLS, with the gRPC port's certificate; ``calmkit serve`` refuses such a start
before it creates any file, and a port in use."""

from __future__ import annotations

import os
import socket
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from calmkit_aggregator.service.server import ServerTls, create_server, graceful_stop
from calmkit_aggregator.service.storage import Storage
from calmkit_client import CalmkitError
from calmkit_client.cli import main
from tests.certs import self_signed

TOKEN = "exposure-admin-token-0123456789"
ENDPOINTS = (("metrics_address", "metrics_address"), ("console_address", "console"))


@pytest.mark.parametrize("keyword, option", ENDPOINTS)
def test_off_loopback_needs_a_token_and_tls(keyword: str, option: str, tmp_path: Path) -> None:
    with Storage(tmp_path / "a.db") as storage:
        with pytest.raises(CalmkitError, match=rf"^{option} \('0.0.0.0:0'\) must be loopback"):
            create_server("127.0.0.1:0", storage, None, **{keyword: "0.0.0.0:0"})
        with pytest.raises(CalmkitError, match=rf"^{option} \('0.0.0.0:0'\) is not loopback"):
            create_server("127.0.0.1:0", storage, TOKEN, **{keyword: "0.0.0.0:0"})
        # --insecure lifts the TLS rule (a proxy terminates TLS), not the token's
        server, _ = create_server(
            "127.0.0.1:0", storage, TOKEN, insecure=True, **{keyword: "0.0.0.0:0"}
        )
        try:
            port = server.metrics_port or server.console_port
            assert port is not None
            path = "/metrics" if option == "metrics_address" else "/"
            with pytest.raises(urllib.error.HTTPError) as refused:  # no token, no page
                _no_redirect().open(f"http://127.0.0.1:{port}{path}", timeout=10)
            if option == "console":
                assert (refused.value.code, refused.value.headers["Location"]) == (303, "/login")
            else:
                assert refused.value.code == 401
        finally:
            graceful_stop(server, 1.0)


def _no_redirect(*handlers: urllib.request.BaseHandler) -> urllib.request.OpenerDirector:
    class Keep(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: object, **kwargs: object) -> None:
            return None

    return urllib.request.build_opener(Keep, *handlers)


def test_with_tls_both_endpoints_speak_only_tls(tmp_path: Path) -> None:
    cert, key, pem = self_signed(tmp_path / "tls")
    tls = ServerTls.from_files(cert, key)
    context = ssl.create_default_context(cadata=pem.decode())
    context.verify_flags &= ~ssl.VERIFY_X509_STRICT  # the test certificate is minimal
    with Storage(tmp_path / "a.db") as storage:
        server, _ = create_server(
            "127.0.0.1:0",
            storage,
            TOKEN,
            tls=tls,
            metrics_address="127.0.0.1:0",
            console_address="127.0.0.1:0",
        )
        try:
            request = urllib.request.Request(
                f"https://localhost:{server.metrics_port}/metrics",
                headers={"Authorization": f"Bearer {TOKEN}"},
            )
            with urllib.request.urlopen(request, context=context, timeout=10) as response:
                assert b"calmkit_batches_total" in response.read()
            login = urllib.request.Request(
                f"https://localhost:{server.console_port}/login", data=f"token={TOKEN}".encode()
            )
            opener = _no_redirect(urllib.request.HTTPSHandler(context=context))
            with pytest.raises(urllib.error.HTTPError) as redirect:  # 303 to / with a cookie
                opener.open(login, timeout=10)
            cookie = redirect.value.headers["Set-Cookie"]
            assert redirect.value.code == 303 and TOKEN not in cookie
            for attribute in ("HttpOnly", "SameSite=Strict", "Secure"):
                assert attribute in cookie
            for port in (server.metrics_port, server.console_port):
                assert port is not None
                with socket.create_connection(("127.0.0.1", port), timeout=10) as plain:
                    plain.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                    answer = plain.recv(4096)
                assert not answer.startswith(b"HTTP/")  # a TLS alert or nothing, no page
        finally:
            graceful_stop(server, 1.0)


@pytest.mark.parametrize("flag", ["--metrics-address", "--console"])
def test_serve_refuses_before_creating_anything(
    flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "new.db"
    option = flag.lstrip("-").replace("-", "_")
    code = main(["serve", "--db", str(db), flag, "0.0.0.0:0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[0].startswith(f"calmkit: error: {option} ('0.0.0.0:0') must be")
    token = tmp_path / "token"
    token.write_text(TOKEN)
    token.chmod(0o600)
    code = main(["serve", "--db", str(db), "--token-file", str(token), flag, "0.0.0.0:0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and "is not loopback" in err[0] and option in err[0]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(["serve", "--db", str(db), flag, f"127.0.0.1:{port}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and "could not be bound" in err[0]
    assert os.listdir(tmp_path) == ["token"]


def test_a_loopback_endpoint_answers_only_loopback_host_names(tmp_path: Path) -> None:
    """A page whose own domain resolves to 127.0.0.1 (DNS rebinding) reads nothing."""
    with Storage(tmp_path / "a.db") as storage:
        server, _ = create_server(
            "127.0.0.1:0",
            storage,
            None,
            metrics_address="127.0.0.1:0",
            console_address="127.0.0.1:0",
        )
        try:
            for port, path in ((server.metrics_port, "/metrics"), (server.console_port, "/")):
                url = f"http://127.0.0.1:{port}{path}"
                for host, status in (
                    (f"evil.example:{port}", 421),
                    (f"localhost:{port}", 200),
                    (f"127.0.0.1:{port}", 200),
                ):
                    request = urllib.request.Request(url, headers={"Host": host})
                    try:
                        with urllib.request.urlopen(request, timeout=10) as response:
                            got = response.status
                    except urllib.error.HTTPError as refused:
                        got = refused.code
                    assert got == status, (url, host)
        finally:
            graceful_stop(server, 1.0)
