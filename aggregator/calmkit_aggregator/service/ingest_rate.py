"""The web console's ingest rate over time: every collection's report count, read from
the store every ``interval`` seconds on a thread of its own (nothing in the ingest
path), the last :data:`MAX_SAMPLES` samples kept in memory (a restart starts a new
series)."""

from __future__ import annotations

import collections
import itertools
import threading
import time

from calmkit_client import CalmkitError

from .store import ReportStore

__all__ = ["MAX_SAMPLES", "IngestRate"]

MAX_SAMPLES = 720  # an hour at the default interval of 5 s


class IngestRate:
    """Samples ``storage`` every ``interval`` seconds once :meth:`start` is called."""

    def __init__(self, storage: ReportStore, interval: float = 5.0) -> None:
        if not 0.05 <= interval <= 3600:
            raise CalmkitError(f"interval ({interval!r}) must be in [0.05, 3600] seconds")
        self._storage = storage
        self.interval = interval
        self._series: dict[str, collections.deque[tuple[float, int]]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="calmkit-rate")

    def start(self) -> None:
        self._thread.start()

    def sample(self) -> None:
        """Read every collection's report count now."""
        now = time.time()
        records = self._storage.list_collections()
        with self._lock:
            for record in records:
                series = self._series.setdefault(
                    record.collection_id, collections.deque(maxlen=MAX_SAMPLES)
                )
                series.append((now, record.reports))

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample()
            except Exception:  # a store closing under us: the next sample retries
                pass
            self._stop.wait(self.interval)

    def rates(self, collection_id: str) -> list[tuple[float, float]]:
        """``(time, reports per second since the previous sample)``, oldest first."""
        with self._lock:
            points = list(self._series.get(collection_id, ()))
        return [
            (t1, (n1 - n0) / (t1 - t0))
            for (t0, n0), (t1, n1) in itertools.pairwise(points)
            if t1 > t0
        ]

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
