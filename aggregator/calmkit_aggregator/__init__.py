"""calmkit_aggregator: ingestion, estimation, consistency, reconstruction, service."""

from .support import SupportCounts

__all__ = ["SupportCounts"]
