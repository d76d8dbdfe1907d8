"""Admission of a batch to a collection that requires tickets (docs/security.md
"Admission tickets"; the ticket format and the two schemes are in
:mod:`calmkit_client.tickets`).

A batch is admitted whole or refused whole, before storage sees it, when

- every report carries a ticket valid for its own pseudonym in this collection under
  the collection's key (one library call per ticket: Ed25519 or HMAC-SHA-256), and
- every report's view is the view its pseudonym is assigned to under the plan the
  batch names (:meth:`~calmkit_client.plan.Plan.assign_pseudonyms`): a ticket holder
  cannot choose where a report lands.

The refusal (:class:`~calmkit_client.errors.AdmissionRefused`) names the first bad
report's position and what is wrong, never the ticket sent. One report per ticket is
not checked here: storage already keeps one report per pseudonym per collection.
"""

from __future__ import annotations

import numpy as np

from calmkit_client import Plan
from calmkit_client.echo import show
from calmkit_client.errors import AdmissionRefused
from calmkit_client.tickets import TicketVerifier

from .columns import ReportColumns

__all__ = ["admit"]


def admit(
    verifier: TicketVerifier,
    collection_id: str,
    plan: Plan,
    batch: ReportColumns,
    tickets: bytes,
) -> None:
    """Check ``batch`` (validated for ``plan``) and its ``tickets`` (concatenated, in
    batch order); raise :class:`AdmissionRefused` naming the first bad report."""
    n, size = len(batch), verifier.ticket_bytes
    if len(tickets) != n * size:
        raise AdmissionRefused(
            f"tickets ({len(tickets)} bytes) must be one {verifier.scheme} ticket of {size} "
            f"bytes per report ({n * size}): collection {show(collection_id)} admits only "
            "reports with tickets"
        )
    views = plan.assign_pseudonyms(batch.pseudonyms)
    wrong_view = np.flatnonzero(views != batch.views)
    if wrong_view.size:  # cheap, so checked before the signatures
        i = int(wrong_view[0])
        raise AdmissionRefused(
            f"reports[{i}].view ({int(batch.views[i])}) must be the view its pseudonym is "
            f"assigned to ({int(views[i])})"
        )
    valid = verifier.verify_many(collection_id, batch.pseudonyms, tickets)
    bad = np.flatnonzero(~valid)
    if bad.size:
        raise AdmissionRefused(
            f"reports[{int(bad[0])}].ticket is not a valid {verifier.scheme} ticket for its "
            f"pseudonym in collection {show(collection_id)} ({bad.size} of {n} reports)"
        )
