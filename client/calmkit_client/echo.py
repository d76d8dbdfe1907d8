"""Bounded echo of untrusted strings (docs/security.md "Client strings in
errors and logs").

Whatever a client sends (collection ids, digests, attribute names) may be huge or
hold control and bidirectional-override characters. Errors and log lines show it
through :func:`show`: ``repr``-escaped, so such characters are visible as escapes, and
cut to a few dozen characters with the full length stated.
"""

from __future__ import annotations

__all__ = ["MAX_DETAIL_CHARS", "SHOW_CHARS", "bounded", "show"]

SHOW_CHARS = 64  # of one echoed value
MAX_DETAIL_CHARS = 1024  # of a whole error message or log field


def show(value: object, limit: int = SHOW_CHARS) -> str:
    """``repr(value)`` (control and bidi characters escaped: ``str.isprintable`` rules),
    at most ``limit`` characters of it, then ``... (N chars)`` or ``... (N bytes)``."""
    if isinstance(value, (str, bytes)) and len(value) > limit:
        unit = "chars" if isinstance(value, str) else "bytes"
        head = value[:limit]
        return f"{head!r}... ({len(value)} {unit})"
    text = repr(value)
    return text if len(text) <= limit + 16 else f"{text[:limit]}... ({len(text)} chars)"


def bounded(text: str, limit: int = MAX_DETAIL_CHARS) -> str:
    """``text`` cut to ``limit`` characters (a last guard for whole messages)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"
