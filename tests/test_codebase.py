"""Rules every shipped module keeps: it cites papers by title, not by files a calmkit user
does not have."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("client/calmkit_client", "aggregator/calmkit_aggregator",
            "simulator/calmkit_simulator", "protos/calmkit_proto")  # fmt: skip
LOCAL_FILES = re.compile(r"papers/|DESIGN\.md|notes/")


def _shipped_modules() -> list[Path]:
    return sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py"))


def test_shipped_code_cites_no_local_files() -> None:
    modules = _shipped_modules()
    assert len(modules) > 80
    hits = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
            for path in modules
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
            if LOCAL_FILES.search(line)]  # fmt: skip
    assert hits == []
