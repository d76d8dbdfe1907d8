"""The service tests' ``server`` fixture: a fresh service per test (tests/integration/
servers.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.servers import Server


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    with Server(tmp_path) as srv:
        yield srv
