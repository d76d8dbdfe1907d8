"""Shared fixtures: where the shared datasets and covering designs are (or a skip)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("CALMKIT_SHARED", ROOT.parent / "shared"))


@pytest.fixture(scope="session")
def datasets_dir() -> Path:
    """``../shared/datasets`` (or ``$CALMKIT_DATA``); skips when absent."""
    path = Path(os.environ.get("CALMKIT_DATA", SHARED / "datasets"))
    if not path.is_dir():
        pytest.skip(f"shared datasets folder not found at {path} (set CALMKIT_DATA)")
    return path
