"""The documentation site builds with no warning (``mkdocs build --strict``: broken
links and anchors, pages outside the nav, docstrings mkdocstrings cannot parse), and
every ``calmkit`` command line in the guides and the README parses."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from calmkit_client.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
GUIDES = [
    "README.md",
    *(
        f"docs/{p}"
        for p in (
            "index.md",
            "getting-started.md",
            "evaluate.md",
            "embed.md",
            "operate.md",
            "how-calm-works.md",
            "wire-protocol.md",
            "security.md",
        )
    ),
]


def test_the_site_builds_without_a_warning(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="mkdocs is in the dev extra: pip install -e '.[dev]'")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "api" / "index.html").is_file()


def _command_lines() -> list[tuple[str, str]]:
    """(where, line) of every ``calmkit ...`` line in a ```bash block (continuations
    joined, comments and shell variables dropped)."""
    out = []
    for rel in GUIDES:
        text = (ROOT / rel).read_text(encoding="utf-8")
        for block in re.findall(r"```bash\n(.*?)```", text, re.S):
            joined = re.sub(r"\\\n\s*", " ", block)
            for line in joined.splitlines():
                code = line.split("  #")[0].split(" # ")[0].strip()
                if code.startswith("calmkit "):
                    out.append((rel, code))
    return out


COMMANDS = _command_lines()


def test_the_guides_show_commands() -> None:
    assert len(COMMANDS) >= 20
    assert any("calmkit evaluate" in c for _, c in COMMANDS)


@pytest.mark.parametrize(("where", "line"), COMMANDS, ids=[c for _, c in COMMANDS])
def test_every_command_line_in_the_docs_parses(where: str, line: str) -> None:
    argv = [a for a in shlex.split(line)[1:] if a != "$A"]
    if "$A" in line:  # the operator's connection options, as the guide exports them
        argv += ["--address", "agg.example:50051"]
    if "[" in line:  # a synopsis with optional parts, not a command
        pytest.skip(f"{where}: {line} is a synopsis")
    parser = build_parser()
    try:
        parser.parse_args(argv)
    except SystemExit as exc:
        pytest.fail(f"{where}: `{line}` does not parse (exit {exc.code})")


def test_no_page_speaks_of_the_session_that_wrote_it() -> None:
    # a page stands alone for its reader: no work session, its scratch folder or what
    # a live one showed
    words = re.compile(r"\b(?:live|the|this) session\b|\bscratch (?:directory|folder)", re.I)
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found = [
        f"{page.relative_to(ROOT)}: {match[0]!r}"
        for page in pages
        for match in words.finditer(page.read_text(encoding="utf-8"))
    ]
    assert not found, found
