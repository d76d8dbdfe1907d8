"""Every ```bash block of the guides runs, as written, in the test suite.

Each page is one shell session in a temporary folder, its blocks run in the order a
reader follows them (state carries over: files, exported variables, a server started
by an earlier block). A block runs under ``bash -euo pipefail``: any command that
fails fails the test, which names the block (page and line) and shows its output.

What the harness adds, and nothing else:

- **files a page assumes the reader has** (``SETUP``): a small ``mydata.csv`` with a
  numeric ``age`` column; a TLS key and certificate for ``localhost`` with an admin
  token (mode 0600) where a page starts ``calmkit serve`` with them without making
  them.
- **the network**: ``agg.example`` is ``localhost``, port 50051 a free port, and
  ``0.0.0.0`` is ``127.0.0.1`` (the test listens on loopback only).
- **a foreground server runs in the background**: ``calmkit serve ...`` starts the
  server and returns once it logs ``serving`` (a reader runs it in another terminal);
  the page's servers are stopped with SIGTERM at the end.
- **the devices**: right after each ``calmkit collection create``, 2,000 synthetic
  users report with the real client and the printed submit token
  (``tests/doc_devices.py``), as the apps of the embed page would.

A block preceded by ``<!-- not run: REASON -->`` is not run; ``NOT_RUN`` lists every such
block, and each shows as a skip with its reason. A block preceded by
``<!-- needs: the public datasets -->`` runs only when the datasets are on this machine
(``CALMKIT_DATA``, or ``calmkit datasets fetch all``) and skips saying so otherwise.
Python blocks run in tests/test_readme.py; ```text blocks are output or diagrams.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from tests.certs import self_signed
from tests.test_docs_site import GUIDES

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"<!--\s*(not run|needs):\s*(.*?)\s*-->")
DATASETS_MARKER = "the public datasets"
BLOCK_TIMEOUT_S = 300.0

# every block a guide does not run, by (page, its first line): the markdown's marker
# holds the reason, and a new marker must be added here deliberately
NOT_RUN = {
    ("README.md", 'pip install -e ".[dev]" && calmkit demo      # set-up + the main job'),
    (
        "docs/getting-started.md",
        'pip install -e ".[dev]" && calmkit demo      # set-up + the main job',
    ),
    (
        "docs/evaluate.md",
        "dask scheduler                                  # on one machine: prints tcp://HOST:8786",
    ),
    (
        "docs/evaluate.md",
        "calmkit datasets fetch all                              # download + verify (~20 MB)",
    ),
    ("docs/operate.md", "pg_dump -Fc --file calmkit.dump postgresql://calmkit@db.example/calmkit"),
}


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # the block's first line in the page
    code: str
    marker: tuple[str, str] | None  # ("not run" | "needs", reason)

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def first(self) -> str:
        return self.code.splitlines()[0]


def _blocks(page: str) -> list[Block]:
    lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
    out, start = [], None
    for i, line in enumerate(lines):
        if start is None and line.strip() == "```bash":
            start = i
        elif start is not None and line.strip() == "```":
            before = [x for x in lines[:start] if x.strip()]
            found = MARKER.fullmatch(before[-1].strip()) if before else None
            marker = (found.group(1), found.group(2)) if found else None
            out.append(Block(page, start + 2, "\n".join(lines[start + 1 : i]), marker))
            start = None
    return out


BLOCKS = [b for page in GUIDES for b in _blocks(page)]


# -- what a page assumes the reader has ----------------------------------------------------
def _csv(folder: Path) -> None:
    """mydata.csv: 2,000 people, a numeric age, smoker depending on age, region, sex."""
    rng = np.random.default_rng(0)
    age = rng.integers(18, 91, 2000)
    smoker = np.where(rng.random(2000) < 0.1 + 0.005 * (age - 18), "yes", "no")
    region = rng.choice(list("NESW"), 2000)
    sex = rng.choice(["f", "m"], 2000)
    rows = [
        "age,smoker,region,sex",
        *(",".join(map(str, r)) for r in zip(age, smoker, region, sex)),
    ]
    (folder / "mydata.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")


def _tls(folder: Path) -> None:
    """server.crt / server.key (0600) for localhost, its own CA also as ca.crt, and an
    admin token (0600)."""
    cert, _, pem = self_signed(folder)
    (folder / "ca.crt").write_bytes(pem)
    token = folder / "admin.token"
    token.write_text(os.urandom(24).hex() + "\n", encoding="utf-8")
    token.chmod(0o600)
    assert cert.is_file()


SETUP: dict[str, tuple[Callable[[Path], None], ...]] = {
    "README.md": (_tls, _csv),
    "docs/evaluate.md": (_csv,),
    "docs/security.md": (_tls,),
}

# the shell around each block: `calmkit serve` in the background, devices after
# `collection create`; state (exports) saved for the page's next block
PRELUDE = r"""
docs_wait_serving() {  # LOG PID: until the server logs "serving" (or dies)
  for _ in $(seq 600); do
    grep -q '"event": "serving"' "$1" && return 0
    kill -0 "$2" 2>/dev/null || { echo "calmkit serve exited:" >&2; cat "$1" >&2; return 1; }
    sleep 0.05
  done
  echo "calmkit serve did not start in 30 s:" >&2; cat "$1" >&2; return 1
}
calmkit() {
  if [ "${1-}" = serve ]; then
    local log="serve-$(ls serve-*.log 2>/dev/null | wc -l).log"
    command calmkit "$@" >"$log" 2>&1 &
    echo $! >> .docs-pids
    docs_wait_serving "$log" $!
  elif [ "${1-}" = collection ] && [ "${2-}" = create ]; then
    local out
    out=$(command calmkit "$@")
    printf '%s\n' "$out"
    "$DOCS_PYTHON" -m tests.doc_devices "$out" "$@"
  else
    command calmkit "$@"
  fi
}
[ -f .docs-env ] && . ./.docs-env
"""


def _localise(code: str, port: int) -> str:
    """The block on this machine: agg.example is localhost, 50051 a free port, 0.0.0.0
    loopback."""
    return (
        code.replace("agg.example", "localhost")
        .replace("50051", str(port))
        .replace("0.0.0.0", "127.0.0.1")
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PageSession:
    """One page's shell session: its folder, its next block, its servers."""

    page: str
    folder: Path
    port: int = field(default_factory=_free_port)
    done: int = 0  # blocks of the page run so far
    failed: str | None = None

    def __post_init__(self) -> None:
        bin_dir = self.folder / ".bin"
        bin_dir.mkdir(parents=True)
        shim = bin_dir / "calmkit"  # this checkout's calmkit, whatever is installed
        shim.write_text(
            f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m calmkit_client.cli "$@"\n'
        )
        shim.chmod(0o755)
        for setup in SETUP.get(self.page, ()):
            setup(self.folder)
        packages = [ROOT / p for p in ("client", "aggregator", "simulator", "protos")]
        self.env = {
            **os.environ,
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONPATH": os.pathsep.join(map(str, [*packages, ROOT])),
            "DOCS_PYTHON": sys.executable,
            "NO_COLOR": "1",
        }

    def run(self, block: Block) -> subprocess.CompletedProcess[str]:
        code = _localise(block.code, self.port)
        script = f"{PRELUDE}\n{code}\nexport -p > .docs-env\n"
        return subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=self.folder,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=BLOCK_TIMEOUT_S,
        )

    def stop(self) -> None:
        pids = self.folder / ".docs-pids"
        if not pids.exists():
            return
        for pid in map(int, pids.read_text().split()):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
        deadline = time.monotonic() + 30
        for pid in map(int, pids.read_text().split()):  # gone, or a zombie: stopped
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.fixture(scope="module")
def sessions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, PageSession]]:
    made: dict[str, PageSession] = {}
    yield made
    for session in made.values():
        session.stop()


def _runnable(block: Block) -> bool:
    if block.marker is None:
        return True
    return block.marker[0] == "needs" and _have_datasets()


def _have_datasets() -> bool:
    """CALMKIT_DATA is set and holds the datasets the blocks load."""
    from calmkit_simulator.catalog import dataset_path

    folder = os.environ.get("CALMKIT_DATA")
    return bool(folder) and all(dataset_path(n, folder).exists() for n in ("adult", "nltcs"))


# -- the tests ----------------------------------------------------------------------------
def test_the_guides_have_their_blocks() -> None:
    pages = {b.page for b in BLOCKS}
    assert {"README.md", "docs/operate.md", "docs/evaluate.md", "docs/security.md"} <= pages
    assert sum(_runnable(b) or b.marker == ("needs", DATASETS_MARKER) for b in BLOCKS) >= 8


def test_every_block_not_run_is_listed_with_its_reason() -> None:
    marked = {(b.page, b.first): b.marker for b in BLOCKS if b.marker and b.marker[0] == "not run"}
    assert set(marked) == NOT_RUN, "update NOT_RUN deliberately when a guide marks a block"
    for key, (_, reason) in marked.items():
        assert len(reason) >= 20, f"{key}: the reason ({reason!r}) must say why"
    for b in BLOCKS:
        if b.marker and b.marker[0] == "needs":
            assert b.marker[1] == DATASETS_MARKER, f"{b.where}: unknown need {b.marker[1]!r}"


def test_no_guide_hides_a_command_in_another_fence() -> None:
    """A command shown in a ```text or bare fence would escape this test: only output
    and diagrams may be there (lines of output start with `$ ` only as a transcript)."""
    for page in GUIDES:
        text = (ROOT / page).read_text(encoding="utf-8")
        for lang, body in re.findall(r"^```(\w*)\n(.*?)^```", text, re.S | re.M):
            if lang in ("bash", "python"):
                continue
            for line in body.splitlines():
                assert not line.startswith("calmkit "), f"{page}: a command in a ```{lang} fence"


@pytest.mark.parametrize("block", BLOCKS, ids=[b.where for b in BLOCKS])
def test_block_runs(
    block: Block, sessions: dict[str, PageSession], tmp_path_factory: pytest.TempPathFactory
) -> None:
    if block.marker is not None and block.marker[0] == "not run":
        pytest.skip(f"{block.where} not run: {block.marker[1]}")
    if block.marker is not None and not _have_datasets():
        pytest.skip(
            f"{block.where} needs the public datasets: set CALMKIT_DATA to a folder "
            "holding them (`CALMKIT_DATA=DIR calmkit datasets fetch all` downloads them)"
        )
    if block.page not in sessions:
        sessions[block.page] = PageSession(block.page, tmp_path_factory.mktemp("page"))
    session = sessions[block.page]
    page_blocks = [b for b in BLOCKS if b.page == block.page]
    for earlier in page_blocks[session.done : page_blocks.index(block) + 1]:
        if session.failed is not None:
            pytest.fail(f"{block.where}: an earlier block of the page failed ({session.failed})")
        session.done += 1
        if not _runnable(earlier):
            continue
        done = session.run(earlier)
        if done.returncode != 0:
            session.failed = earlier.where
            pytest.fail(
                f"{earlier.where} exited {done.returncode}\n--- stdout\n{done.stdout[-4000:]}"
                f"\n--- stderr\n{done.stderr[-4000:]}"
            )
