"""The operator's admission commands against a real server: keygen writes key files
with the right modes, issue prints tickets the server admits, collection create
--admission requires them and collection status shows the scheme."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from calmkit_client import AdmissionRefused, Collector, DeviceState
from calmkit_client.cli import main
from calmkit_client.tickets import TICKET_BYTES
from tests.integration.servers import Server

CREATE = "collection create --domain 2,3 --epsilon 1 --views 0,1;0;1 --k 2".split()


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


@pytest.mark.parametrize("scheme", ["ed25519", "hmac-sha256", "aes256-prf"])
def test_keygen_issue_create_round_trip(
    server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str], scheme: str
) -> None:
    key = str(tmp_path / "issuer.key")
    printed = _run(capsys, "admission", "keygen", "--scheme", scheme, "--out", key)
    assert os.stat(key).st_mode & 0o777 == 0o600
    create = [*CREATE, "--address", server.address]
    if scheme == "ed25519":
        public = Path(key + ".pub").read_text().strip()
        assert public.startswith("ed25519-public:") and public.split(":")[1] in printed
        spec = f"ed25519:{key}.pub"
        assert main([*create, "--admission", f"ed25519:{key}"]) == 2
        assert "the private key: give its .pub file" in capsys.readouterr().err
    else:
        spec = f"{scheme.split('-')[0].removesuffix('256')}:{key}"  # hmac:, aes:
    out = _run(capsys, *create, "--collection", "cli-adm", "--admission", spec, "--json")
    created = json.loads(out)
    assert created["admission"].startswith(scheme + ":")
    status = _run(capsys, "collection", "status", "--address", server.address, "--id", "cli-adm")
    assert f"admission tickets required: {created['admission']}" in status
    state = DeviceState.in_memory()
    with Collector(server.address, "cli-adm", created["submit_token"], state=state) as c:
        with pytest.raises(AdmissionRefused):
            c.submit([1, 2])
        issue = ["admission", "issue", "--key", key, "--collection", "cli-adm"]
        ticket = _run(capsys, *issue, "--pseudonym", c.pseudonym().hex()).strip()
        assert len(bytes.fromhex(ticket)) == TICKET_BYTES[scheme]
        assert c.submit([1, 2], ticket=bytes.fromhex(ticket)).accepted == 1


def test_key_files_readable_by_others_are_refused(
    server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = str(tmp_path / "shared.key")
    _run(capsys, "admission", "keygen", "--scheme", "hmac-sha256", "--out", key)
    os.chmod(key, 0o644)
    create = [*CREATE, "--address", server.address]
    assert main([*create, "--admission", f"hmac:{key}"]) == 2
    assert "must not be readable by other users (mode 0644)" in capsys.readouterr().err
    issue = ["admission", "issue", "--key", key, "--collection", "c", "--pseudonym", "00" * 16]
    assert main(issue) == 2
    assert "chmod 600" in capsys.readouterr().err
    assert main(["admission", "keygen", "--out", key]) == 2  # never overwrites a key
    assert "must be a new file" in capsys.readouterr().err
    Path(tmp_path / "junk").write_text("nonsense\n")
    assert main([*create, "--admission", f"ed25519:{tmp_path}/junk"]) == 2
    assert "must hold one line KIND:HEX" in capsys.readouterr().err
