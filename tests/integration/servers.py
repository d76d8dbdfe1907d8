"""What the service tests share: the aggregator on a free loopback port over a fresh
SQLite store (the ``server`` fixture of conftest.py), and the population of
test_service.py and test_service_columnar.py."""

from __future__ import annotations

import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from calmkit_aggregator.service.admin import AdminClient
from calmkit_aggregator.service.server import create_server, graceful_stop
from calmkit_aggregator.service.storage import Storage
from calmkit_client import wire as client_wire
from calmkit_simulator import synthetic_population

POP = synthetic_population(n=6000, sizes=(2, 3, 2, 2, 4), strength=1.5, rng=3)
IDS = np.arange(POP.n, dtype=np.uint64)


class Server:
    """A running service; ``stop()`` (or leaving a ``with`` block) stops it and closes
    its store. ``options`` go to ``create_server`` (``metrics_address="127.0.0.1:0"``,
    ``console_address=...``: their bound ports are ``metrics_port`` and
    ``console_port``)."""

    def __init__(self, tmp: Path, admin_token: str | None = None, **options: Any) -> None:
        self.storage = Storage(tmp / "agg.db")
        try:
            self.server, self.port = create_server(
                "127.0.0.1:0", self.storage, admin_token, **options
            )
        except BaseException:
            self.storage.close()
            raise
        self.address = f"127.0.0.1:{self.port}"
        self.metrics_port = self.server.metrics_port
        self.console_port = self.server.console_port

    def stop(self) -> None:
        graceful_stop(self.server, 2.0)
        self.storage.close()

    def __enter__(self) -> Server:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def create_collection(
    address: str, collection_id: str = "c1", **opts: object
) -> client_wire.CollectionInfo:
    """A one-phase collection of :data:`POP` (phases with a pilot:
    tests/integration/test_phases.py)."""
    opts.setdefault("pilot", 0.0)
    with AdminClient(address) as admin:
        return admin.create_collection(
            POP.schema, 1.0, POP.n, 3, collection_id=collection_id, seed=7, **opts
        )


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int, token: str | None = None) -> Samples:
    """Every sample of one scrape of a server's metrics endpoint, keyed by (name,
    labels)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers=headers)
    with urllib.request.urlopen(request, timeout=10) as response:
        text = response.read().decode("utf-8")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def sample(samples: Samples, name: str, **labels: str) -> float:
    """One sample's value (0 when absent: a labelled counter not yet incremented)."""
    return samples.get((name, frozenset(labels.items())), 0.0)
