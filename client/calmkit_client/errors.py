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
