"""Error types. Every calmkit error derives from :class:`CalmkitError` and its message
names the offending field and value: ``epsilon (-1.0) must be finite and > 0``."""

from __future__ import annotations


class CalmkitError(ValueError):
    """Base class of every error calmkit raises on bad input or state."""


class SchemaError(CalmkitError):
    """An attribute, label, code or record does not fit the schema."""


class OracleError(CalmkitError):
    """A frequency-oracle parameter or payload is invalid."""


class PlanError(CalmkitError):
    """A collection plan is malformed, or a report does not belong to it."""


# -- collections (the aggregator service; raised on both sides of the wire) ---------------
class CollectionError(CalmkitError):
    """A collection-level request cannot be served."""


class CollectionNotFound(CollectionError):
    """No collection has this id (gRPC NOT_FOUND)."""


class CollectionExists(CollectionError):
    """A collection with this id already exists (gRPC ALREADY_EXISTS)."""


class CollectionClosed(CollectionError):
    """The collection no longer accepts reports (gRPC FAILED_PRECONDITION)."""


class PlanMismatch(CollectionError):
    """A report was made under another plan than the collection's (FAILED_PRECONDITION)."""


class ReportConflict(CollectionError):
    """A report id or pseudonym already holds a different report (ALREADY_EXISTS)."""


class AccessDenied(CollectionError):
    """A missing or wrong bearer token (gRPC UNAUTHENTICATED / PERMISSION_DENIED)."""


class AdmissionRefused(AccessDenied):
    """A report of the batch lacks a valid admission ticket for its pseudonym, or
    claims a view its pseudonym is not assigned to, in a collection that requires
    tickets (gRPC PERMISSION_DENIED); the batch was refused whole."""


# -- the device's privacy ledger ------------------------------------------------------------
class BudgetExceeded(CalmkitError):
    """A new report would spend more privacy than the device's budget allows."""


# -- the service's transient refusals (the client retries them with backoff) ---------------
class ServiceUnavailable(CollectionError):
    """The server cannot serve the call now, e.g. it is shutting down (UNAVAILABLE)."""


class NotSupported(CollectionError):
    """The server does not offer the call (UNIMPLEMENTED): an older calmkit server."""


class StorageFull(CollectionError):
    """The server's storage is full (RESOURCE_EXHAUSTED): the batch was refused whole
    and nothing of it stored; the client retries it while an operator frees space."""


class RateLimited(CollectionError):
    """A client address sent reports faster than the server's rate limit
    (RESOURCE_EXHAUSTED); the client retries after a wait."""


class BatchTooLarge(CollectionError):
    """A batch holds more reports than the server's rate limit admits at once
    (RESOURCE_EXHAUSTED): resent whole it would fail again, so the
    :class:`~calmkit_client.collector.Collector` splits it."""


class CollectionFull(CollectionError):
    """The collection holds its cap of reports (``max_reports``; RESOURCE_EXHAUSTED):
    the batch was refused whole. Not retried: the collection takes no more reports
    until an operator raises the cap or opens another collection."""
