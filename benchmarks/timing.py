"""The timing rule every benchmark here uses: the median wall time of ``runs`` calls."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_seconds(fn: Callable[[], object], runs: int, warmup: bool = False) -> float:
    """Median seconds of ``runs`` calls of ``fn`` (after one untimed call if ``warmup``)."""
    if warmup:
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
