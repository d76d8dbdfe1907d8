"""Collection ids (docs/security.md "Collection ids").

A collection id is 1-64 characters from ``A-Z a-z 0-9 . _ -`` and starts with a letter
or digit: safe in file names, URLs, logs and shells, and free of control or
bidirectional characters. The client checks it before any call; the server checks it
on create and before any lookup of an id it does not hold.
"""

from __future__ import annotations

import re

from .echo import show
from .errors import CalmkitError

__all__ = ["MAX_COLLECTION_ID", "check_collection_id"]

MAX_COLLECTION_ID = 64
_RULE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def check_collection_id(value: object, field: str = "collection_id") -> str:
    """``value`` if it is a valid collection id, else :class:`CalmkitError` naming
    ``field`` and showing the value bounded."""
    if not isinstance(value, str):
        raise CalmkitError(f"{field} ({show(value)}) must be a str")
    if _RULE.fullmatch(value) is None:
        raise CalmkitError(
            f"{field} ({show(value)}) must be 1-{MAX_COLLECTION_ID} characters from "
            "A-Z a-z 0-9 . _ - starting with a letter or digit"
        )
    return value
