"""Progress of long runs: a tqdm bar on a terminal, and off one (CI logs, ``nohup``,
pipes) a line every ``every`` seconds with tasks done, elapsed time and ETA
(:class:`Progress`); or a bar only, none off a terminal (:func:`progress_bar`)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

__all__ = ["Progress", "progress_bar"]


def _clock(seconds: float) -> str:
    seconds = round(seconds)
    return (
        f"{seconds // 3600}h{seconds // 60 % 60:02d}m"
        if seconds >= 3600
        else (f"{seconds // 60}m{seconds % 60:02d}s")
    )


class Progress:
    """``update(n)`` as tasks finish; ``close()`` at the end. ``stream`` defaults to
    stderr; ``clock`` to ``time.monotonic`` (tests pass their own)."""

    def __init__(
        self,
        total: int,
        desc: str,
        every: float = 30.0,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        bar: bool | None = None,
    ) -> None:
        self.total, self.desc, self.every = total, desc, every
        self.stream = stream if stream is not None else sys.stderr
        self._clock = clock
        self.done = 0
        self._t0 = self._last = clock()
        self._bar: Any = None
        if bar if bar is not None else self.stream.isatty():
            try:
                from tqdm import tqdm

                self._bar = tqdm(total=total, desc=desc, file=self.stream)
            except ImportError:  # progress bars are optional: lines instead
                self._bar = None

    def update(self, n: int = 1) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.update(n)
            return
        now = self._clock()
        if now - self._last >= self.every and self.done < self.total:
            self._last = now
            self._line(now)

    def _line(self, now: float) -> None:
        elapsed = now - self._t0
        rate = self.done / elapsed if elapsed > 0 else 0.0
        eta = f", ETA {_clock((self.total - self.done) / rate)}" if rate > 0 else ""
        pct = 100 * self.done / self.total if self.total else 100.0
        print(
            f"{self.desc}: {self.done}/{self.total} ({pct:.0f}%), {_clock(elapsed)} elapsed{eta}",
            file=self.stream,
            flush=True,
        )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def progress_bar(total: int, desc: str, enabled: bool) -> Any:
    """A tqdm bar of ``total`` reports on stderr, or None when not ``enabled`` or tqdm
    (the simulator extra) is not installed: progress bars are optional."""
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, unit="report", file=sys.stderr)
