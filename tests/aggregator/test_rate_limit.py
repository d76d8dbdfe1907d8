"""The per-token submit rate limit: a token bucket of one second's worth, refilled at
``rate``; a batch passes while the bucket is not empty and may leave it in debt."""

from __future__ import annotations

import pytest

from calmkit_aggregator.service.rate_limit import RateLimit
from calmkit_client.errors import CalmkitError, RateLimited


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_average_rate_holds_and_keys_are_separate() -> None:
    clock = Clock()
    limit = RateLimit(100.0, clock)
    limit.charge(b"a", 250)  # a batch bigger than the bucket passes once: level -150
    with pytest.raises(RateLimited, match=r"retry in 1\.50 s"):
        limit.charge(b"a", 1)
    limit.charge(b"b", 100)  # another token has its own bucket
    clock.now += 1.49
    with pytest.raises(RateLimited):
        limit.charge(b"a", 1)
    clock.now += 0.02  # the debt is paid: level +0.5
    limit.charge(b"a", 50)
    # over 10 s of steady asking, about rate * 10 reports get in
    admitted = 0
    for _ in range(1000):
        clock.now += 0.01
        try:
            limit.charge(b"c", 10)
            admitted += 10
        except RateLimited:
            pass
    assert 1000 <= admitted <= 1000 + 100 + 10  # rate * time, plus the first bucket


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), "5"])
def test_rate_must_be_positive_and_finite(bad: object) -> None:
    with pytest.raises(CalmkitError, match=r"rate_limit \(.*\) must be finite and > 0"):
        RateLimit(bad)  # type: ignore[arg-type]
