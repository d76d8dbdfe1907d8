"""Shared fixtures: where the shared datasets and covering designs are (or a skip)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
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


@pytest.fixture(autouse=True)
def device_state_path(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """Every test's default device state (``DeviceState()``) lives in a fresh temp
    folder, never in the real user's state folder; subprocesses inherit it."""
    path = tmp_path_factory.mktemp("device") / "device-state.sqlite"
    monkeypatch.setenv("CALMKIT_DEVICE_STATE", str(path))
    return path


@pytest.fixture
def seeded_entropy(
    monkeypatch: pytest.MonkeyPatch, entropy_draws: list[int]
) -> Callable[[int], None]:
    """``seeded_entropy(seed)`` makes the client's OS entropy source draw from
    ``default_rng(seed)`` for the rest of the test (the device API takes no seed, so
    this is how a test reproduces a device-made report). Word and byte draws consume
    the generator exactly as the simulation path (a Generator passed to
    ``make_reports``) does; draws are still logged in ``entropy_draws``."""
    from calmkit_client import randomness

    def install(seed: int) -> None:
        gen = np.random.default_rng(seed)

        def words(self: randomness.OsEntropy, count: int) -> np.ndarray:
            entropy_draws.append(8 * count)
            return randomness.random_words(gen, count)

        def token(self: randomness.OsEntropy, nbytes: int) -> bytes:
            entropy_draws.append(nbytes)
            return randomness.random_byte_array(gen, nbytes).tobytes()

        monkeypatch.setattr(randomness.OsEntropy, "words", words)
        monkeypatch.setattr(randomness.OsEntropy, "token", token)

    return install


@pytest.fixture
def entropy_draws(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that gets the byte count of every draw from the client's OS entropy
    source during the test (the draws still come from the OS)."""
    from calmkit_client import randomness

    drawn: list[int] = []
    words, token = randomness.OsEntropy.words, randomness.OsEntropy.token

    def count_words(self: randomness.OsEntropy, count: int) -> np.ndarray:
        drawn.append(8 * count)
        return words(self, count)

    def count_token(self: randomness.OsEntropy, nbytes: int) -> bytes:
        drawn.append(nbytes)
        return token(self, nbytes)

    monkeypatch.setattr(randomness.OsEntropy, "words", count_words)
    monkeypatch.setattr(randomness.OsEntropy, "token", count_token)
    return drawn


@pytest.fixture(scope="session")
def pg_server() -> object:
    """A throwaway PostgreSQL server for the session (tests/pg.py); skips with the
    reason when no server binary or psycopg is here."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    import pg

    reason = pg.available()
    if reason:
        pytest.skip(reason)
    server = pg.PgServer()
    yield server
    server.stop()


@pytest.fixture
def pg_dsn(pg_server: object) -> str:
    """A fresh, empty database on the session's PostgreSQL server."""
    return pg_server.create_database()  # type: ignore[attr-defined, no-any-return]
