"""The service's Prometheus metrics (``calmkit serve --metrics-address``).

Counted as calls are handled, each a few lock-protected additions per batch (no work
per report):

- ``calmkit_reports_accepted_total``, ``calmkit_reports_duplicate_total``: reports of
  acknowledged batches, new and already stored;
- ``calmkit_batches_total``: acknowledged batches;
- ``calmkit_refused_total{rpc,code,error}``: calls refused, by gRPC status code and
  calmkit error class (the codes clients get, see the security page);
  ``calmkit_reports_refused_total{code,error}``: the reports in refused batches;
- ``calmkit_rate_limited_total``: batches refused by the rate limit;
- ``calmkit_ingest_seconds``: time from a batch's arrival at its handler to its
  acknowledgement (histogram); ``calmkit_storage_commit_seconds``: the storage's
  part of it, the transaction that stores the batch and its counts (histogram);
- ``calmkit_manipulation_flags_total{scope}``: manipulation flags raised (``batch``,
  ``pilot``, ``collection``).

Read from the store when scraped (:class:`CollectionGauges`; nothing in the ingest
path): per collection, its reports, expected number of users, report cap, phase,
pilot target, whether it is open, and its stored flags.

Every server has its own :class:`~prometheus_client.CollectorRegistry`: two servers in
one process count apart. A server without a metrics endpoint counts nothing
(:data:`NO_METRICS`).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .store import OPEN, ReportStore

__all__ = ["NO_METRICS", "CollectionGauges", "NullMetrics", "ServiceMetrics"]

# seconds: a batch of a few thousand reports takes milliseconds; a slow disk, seconds
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)
SUBMIT_RPCS = ("SubmitReports", "SubmitColumnar")


class NullMetrics:
    """What a server without a metrics endpoint counts: nothing."""

    def batch(self, accepted: int, duplicates: int, seconds: float, commit: float) -> None:
        """An acknowledged batch (``seconds`` in its handler, ``commit`` storing it)."""

    def refused(self, rpc: str, code: str, error: str, reports: int) -> None:
        """A refused call (``reports``: the batch's size for a submit call, else 0)."""

    def flag(self, scope: str) -> None:
        """A manipulation flag raised (``batch``, ``pilot`` or ``collection``)."""


NO_METRICS = NullMetrics()


class CollectionGauges(Collector):
    """Per-collection gauges read from ``storage`` at scrape time."""

    def __init__(self, storage: ReportStore) -> None:
        self._storage = storage

    def collect(self) -> Iterator[Metric]:
        labels = ["collection"]
        families = {
            "reports": GaugeMetricFamily(
                "calmkit_collection_reports", "Reports counted", labels=labels
            ),
            "expected": GaugeMetricFamily(
                "calmkit_collection_expected_reports",
                "Users the collection was planned for (--n); 0 when not given",
                labels=labels,
            ),
            "cap": GaugeMetricFamily(
                "calmkit_collection_max_reports", "Report cap (0: none)", labels=labels
            ),
            "phase": GaugeMetricFamily(
                "calmkit_collection_phase", "Current phase (0: pilot or single)", labels=labels
            ),
            "pilot": GaugeMetricFamily(
                "calmkit_collection_pilot_target",
                "Pilot reports that start phase 1 (0: no pilot)",
                labels=labels,
            ),
            "open": GaugeMetricFamily(
                "calmkit_collection_open", "1 while open, 0 once closed", labels=labels
            ),
            "flags": GaugeMetricFamily(
                "calmkit_collection_flags", "Manipulation flags stored", labels=labels
            ),
        }
        for record in self._storage.list_collections():
            design = record.design
            values = {
                "reports": record.reports,
                "expected": record.expected_users,
                "cap": record.max_reports,
                "phase": record.phase,
                "pilot": 0 if design is None else design.pilot_reports,
                "open": int(record.state == OPEN),
                "flags": len(record.flags),
            }
            for key, family in families.items():
                family.add_metric([record.collection_id], float(values[key]))
        yield from families.values()


class ServiceMetrics(NullMetrics):
    """The counters of one server, in its own registry (with :class:`CollectionGauges`
    over ``storage``); :meth:`scrape` is the text a Prometheus scrape gets."""

    def __init__(self, storage: ReportStore) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._accepted = Counter(
            "calmkit_reports_accepted", "Reports stored (acknowledged, new)", registry=r
        )
        self._duplicates = Counter(
            "calmkit_reports_duplicate", "Reports acknowledged as already stored", registry=r
        )
        self._batches = Counter("calmkit_batches", "Batches acknowledged", registry=r)
        self._refused = Counter(
            "calmkit_refused",
            "Calls refused, by gRPC status code and calmkit error class",
            ["rpc", "code", "error"],
            registry=r,
        )
        self._refused_reports = Counter(
            "calmkit_reports_refused",
            "Reports in refused batches, by status code and error class",
            ["code", "error"],
            registry=r,
        )
        self._rate_limited = Counter(
            "calmkit_rate_limited", "Batches refused by the rate limit", registry=r
        )
        self._ingest = Histogram(
            "calmkit_ingest_seconds",
            "A batch's time from its handler to its acknowledgement",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self._commit = Histogram(
            "calmkit_storage_commit_seconds",
            "The transaction storing a batch and its counts",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self._flags = Counter(
            "calmkit_manipulation_flags", "Manipulation flags raised", ["scope"], registry=r
        )
        r.register(CollectionGauges(storage))

    def batch(self, accepted: int, duplicates: int, seconds: float, commit: float) -> None:
        self._accepted.inc(accepted)
        self._duplicates.inc(duplicates)
        self._batches.inc()
        self._ingest.observe(seconds)
        self._commit.observe(commit)

    def refused(self, rpc: str, code: str, error: str, reports: int) -> None:
        self._refused.labels(rpc, code, error).inc()
        if rpc in SUBMIT_RPCS:
            self._refused_reports.labels(code, error).inc(reports)
            if error == "RateLimited":
                self._rate_limited.inc()

    def flag(self, scope: str) -> None:
        self._flags.labels(scope).inc()

    def scrape(self) -> bytes:
        return generate_latest(self.registry)
