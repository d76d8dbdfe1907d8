"""Whether a collection is still in its pilot, read from what the server describes:
a pilot of one phase or two, a failed pilot check, no pilot."""

from __future__ import annotations

import pytest

from calmkit_client import Plan, Schema
from calmkit_client.wire import CollectionInfo

PLAN = Plan(Schema.from_sizes([2, 2]), 1.0, ((0, 1),))


def _info(phase_reports: tuple[int, ...], target: int, check: str = "") -> CollectionInfo:
    return CollectionInfo(
        "c",
        "open",
        PLAN,
        2,
        sum(phase_reports),
        (sum(phase_reports),),
        0.0,
        None,
        None,
        phase=len(phase_reports) - 1,
        phase_reports=phase_reports,
        pilot_target=target,
        pilot_check=check,
    )


@pytest.mark.parametrize(
    ("phase_reports", "target", "check", "in_pilot", "pilot_reports"),
    [
        ((0,), 0, "", False, 0),  # no pilot
        ((700,), 2_000, "", True, 700),  # one round, under way
        ((2_003, 50), 2_000, "passed", False, 2_003),  # one round, done
        ((1_000, 400), 2_000, "passed", True, 1_400),  # the second round, under way
        ((1_000, 1_001, 9), 2_000, "passed", False, 2_001),  # two rounds, done
        ((1_000, 30), 2_000, "failed: view 0; phase 1 planned", False, 1_000),  # left out
    ],
)
def test_the_pilot_is_under_way_until_its_phases_hold_its_reports(
    phase_reports: tuple[int, ...], target: int, check: str, in_pilot: bool, pilot_reports: int
) -> None:
    info = _info(phase_reports, target, check)
    assert info.in_pilot is in_pilot
    assert info.pilot_reports == pilot_reports
