"""The ways a query can be answered from a collection's views, named without loading
the reconstruction itself (planning, storage and the service's wire layer check the
name; only :mod:`.pipeline` runs it).

- ``"local"``: per-query maximum entropy over the views' projections, §4.5 of "CALM:
  Consistent Adaptive Local Marginal for Marginal Release under Local Differential
  Privacy" (Zhang et al., CCS 2018);
- ``"global"``: inference in one model fitted to all views (:mod:`.global_model`).
"""

from __future__ import annotations

from calmkit_client import CalmkitError

__all__ = ["RECONSTRUCTIONS", "check_reconstruction"]

RECONSTRUCTIONS = ("local", "global")


def check_reconstruction(value: object) -> str:
    """``value`` if it names a reconstruction (:data:`RECONSTRUCTIONS`), else a
    :class:`CalmkitError` naming it (a string shown to 32 characters)."""
    if not isinstance(value, str) or value not in RECONSTRUCTIONS:
        shown = repr(value[:32] if isinstance(value, str) else value)
        raise CalmkitError(f"reconstruction ({shown}) must be one of {list(RECONSTRUCTIONS)}")
    return value
