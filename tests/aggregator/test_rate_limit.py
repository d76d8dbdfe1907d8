"""The per-submitter rate limit: a bucket of ``burst`` reports per key, refilled at
``rate``; a batch passes only when the bucket holds all of it, and a batch larger than
the burst is refused outright (it could never pass)."""

from __future__ import annotations

import pytest

from calmkit_aggregator.service.rate_limit import RateLimit, network_of, submitter_of
from calmkit_client.errors import BatchTooLarge, CalmkitError, RateLimited


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_batch_passes_only_when_the_bucket_holds_it() -> None:
    clock = Clock()
    limit = RateLimit(100.0, clock)
    limit.charge("a", 80)  # level 20
    with pytest.raises(RateLimited, match=r"retry in 0\.30 s"):
        limit.charge("a", 50)  # 50 > 20: refused, nothing drawn
    clock.now += 0.29
    with pytest.raises(RateLimited):
        limit.charge("a", 50)  # level 49
    clock.now += 0.02
    limit.charge("a", 50)  # level 51 -> 1
    limit.charge("b", 100)  # another submitter has its own bucket


def test_a_batch_larger_than_the_burst_is_refused_not_let_through() -> None:
    clock = Clock()
    limit = RateLimit(100.0, clock, burst=300)
    with pytest.raises(BatchTooLarge, match=r"batch \(301 reports\) must be at most .* \(300"):
        limit.charge("a", 301)
    limit.charge("a", 300)  # the refused batch drew nothing: the bucket was full


def test_no_more_than_rate_times_time_plus_one_burst_gets_in() -> None:
    clock = Clock()
    limit = RateLimit(100.0, clock)
    admitted = 0
    for _ in range(1000):  # 10 s of asking for 30 reports every 10 ms
        clock.now += 0.01
        try:
            limit.charge("c", 30)
            admitted += 30
        except RateLimited:
            pass
    assert 1000 - 30 <= admitted <= 1000 + 100  # rate * time, plus the first full bucket


def test_full_idle_buckets_are_dropped_past_the_bound() -> None:
    clock = Clock()
    limit = RateLimit(10.0, clock, max_buckets=100)
    for i in range(100):
        limit.charge(i, 10)
    assert limit.buckets == 100
    clock.now += 2.0  # all refilled
    limit.charge("new", 1)
    assert limit.buckets == 1


@pytest.mark.parametrize(
    ("peer", "submitter"),
    [
        ("ipv4:10.1.2.3:5555", "10.1.2.3"),
        ("ipv6:[2001:db8:0:1::7]:443", "2001:db8:0:1::/64"),
        ("ipv6:%5B2001:db8:0:1:ffff::9%5D:443", "2001:db8:0:1::/64"),
        ("ipv6:[::ffff:127.0.0.1]:40000", "127.0.0.1"),
        ("ipv6:[::1]:40000", "::/64"),
        ("unix:/tmp/sock", "unix:/tmp/sock"),
    ],
)
def test_submitter_is_the_address_or_the_ipv6_64(peer: str, submitter: str) -> None:
    assert submitter_of(peer) == submitter


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), "5"])
def test_rate_must_be_positive_and_finite(bad: object) -> None:
    with pytest.raises(CalmkitError, match=r"rate_limit \(.*\) must be finite and > 0"):
        RateLimit(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, -3, 1.5, "9"])
def test_burst_must_be_a_positive_int(bad: object) -> None:
    with pytest.raises(CalmkitError, match=r"rate_burst \(.*\) must be an int >= 1"):
        RateLimit(10.0, burst=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("key", "network"),
    [
        ("2001:db8:1:2::/64", "2001:db8:1::/48"),
        ("2001:db8:1:ffff::/64", "2001:db8:1::/48"),
        ("1.2.3.4", "1.2.3.4"),
        ("unix:/tmp/s", "unix:/tmp/s"),
    ],
)
def test_the_reserves_network_is_the_ipv6_48(key: str, network: str) -> None:
    assert network_of(key) == network
