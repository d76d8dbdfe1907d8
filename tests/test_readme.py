"""Every Python block of README.md and of the guides (docs/*.md) runs as written.

Blocks run in a fresh namespace in a temporary folder. A block that starts with
``# needs: calmkit datasets fetch NAME`` skips (saying so) when that dataset is not
on this machine. The app block reads its server from the environment, as the README
says; here a real TLS server on loopback stands behind it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from calmkit_aggregator.service.admin import AdminClient
from calmkit_aggregator.service.server import ServerTls, create_server, graceful_stop
from calmkit_aggregator.service.storage import Storage
from calmkit_client import Schema
from tests.certs import self_signed

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NEEDS = re.compile(r"^# needs: calmkit datasets fetch (\w+)", re.MULTILINE)


def _blocks() -> list[tuple[str, str]]:
    """("PAGE:first line", code) of every ```python block of every page."""
    out = []
    for page in PAGES:
        lines = page.read_text(encoding="utf-8").splitlines()
        start = None
        for i, line in enumerate(lines, 1):
            if start is None and line.strip() == "```python":
                start = i
            elif start is not None and line.strip() == "```":
                where = f"{page.relative_to(ROOT)}:{start + 1}"
                out.append((where, "\n".join(lines[start : i - 1])))
                start = None
    return out


BLOCKS = _blocks()


def test_the_pages_have_the_blocks_they_should() -> None:
    codes = [code for _, code in BLOCKS]
    assert len(BLOCKS) >= 4
    assert any("make_report(" in c for c in codes)
    assert any("reconstruct(support)" in c for c in codes)
    assert any("Collector(" in c for c in codes)
    for line, code in BLOCKS:  # complete: every name a block uses, it imports
        assert "import" in code, f"{line} imports nothing"


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The README's service: TLS, a collection survey-1 over domain 2,3,2,4."""
    folder = tmp_path_factory.mktemp("server")
    cert_file, key_file, _ = self_signed(folder)
    storage = Storage(folder / "calmkit.db")
    tls = ServerTls.from_files(cert_file, key_file)
    server, port = create_server("127.0.0.1:0", storage, tls=tls)
    address = f"localhost:{port}"
    with AdminClient(address, root_certificates=cert_file.read_bytes()) as admin:
        info = admin.create_collection(
            Schema.from_sizes((2, 3, 2, 4)), 1.0, 1000, 3, collection_id="survey-1", pilot=0.0
        )
    yield {
        "CALMKIT_ADDRESS": address,
        "CALMKIT_CA": str(cert_file),
        "CALMKIT_SUBMIT_TOKEN": info.submit_token or "",
    }
    graceful_stop(server, 1.0)
    storage.close()


@pytest.mark.parametrize("line, code", BLOCKS, ids=[n for n, _ in BLOCKS])
def test_block_runs(
    line: int,
    code: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name in NEEDS.findall(code):
        from calmkit_simulator.catalog import dataset_path

        if not dataset_path(name).exists():
            pytest.skip(
                f"{line} needs the {name} dataset ({dataset_path(name)} is "
                f"absent: run `calmkit datasets fetch {name}`)"
            )
    if "CALMKIT_ADDRESS" in code:
        for key, value in request.getfixturevalue("tls_server").items():
            monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, line, "exec"), {"__name__": "__main__"})
    out = capsys.readouterr().out
    if "print(" in code:
        assert out.strip(), f"{line} printed nothing"
    if ".submit(" in code:
        assert "Acknowledgement(accepted=1, duplicates=0)" in out
