"""calmkit_aggregator: ingestion, estimation, consistency, reconstruction, service."""
