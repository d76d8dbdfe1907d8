"""Plans (validation, digest, serialisation) and the assignment of users to views."""

from __future__ import annotations

import numpy as np
import pytest
import xxhash
from hypothesis import given
from hypothesis import strategies as st

from calmkit_client import Plan, PlanError, Schema
from calmkit_client.assignment import hash_user_id, hash_user_ids, xxh64_u64, xxh64_u128
from tests.stats import assert_chisquare


def _plan(**kw: object) -> Plan:
    args: dict[str, object] = {
        "schema": Schema.from_sizes([2, 2, 3, 4]),
        "epsilon": 1.0,
        "views": [[0, 1], ["a2", "a3"], [3, 0]],
        "seed": 42,
    }
    args.update(kw)
    return Plan(**args)  # type: ignore[arg-type]


def test_views_are_normalised_and_oracles_chosen_by_variance() -> None:
    plan = _plan()
    assert plan.views == ((0, 1), (2, 3), (0, 3))
    # L = 4, 12, 8 at eps = 1: GRR iff L < 3e + 2 = 10.15
    assert plan.oracles == ("GRR", "OUE", "GRR")
    assert [o.L for o in plan.view_oracles] == [4, 12, 8]
    assert plan.shares == pytest.approx((1 / 3,) * 3)


def test_digest_is_stable_and_content_addressed() -> None:
    plan = _plan()
    # pinned: a change to the canonical form must be deliberate (bump PLAN_FORMAT)
    assert plan.digest == _plan().digest
    assert plan.digest == "60d3d844f8e1005c0e7bd96ccb9b076c820b34813c4678bdcc37c0b7c0069605"
    assert _plan(seed=43).digest != plan.digest
    assert _plan(epsilon=1.0000000001).digest != plan.digest
    assert _plan(shares=[1, 1, 2]).digest != plan.digest


def test_json_round_trip() -> None:
    plan = _plan(shares=[0.2, 0.3, 0.5], oracles=["OUE", "OUE", "GRR"])
    back = Plan.from_json(plan.to_json())
    assert back == plan and back.digest == plan.digest


def test_tampered_plan_is_rejected() -> None:
    data = _plan().to_dict()
    data["epsilon"] = 8.0
    with pytest.raises(PlanError, match="digest"):
        Plan.from_dict(data)
    with pytest.raises(PlanError, match=r"plan field \('views'\) is missing"):
        Plan.from_dict({k: v for k, v in data.items() if k not in ("views", "digest")})
    with pytest.raises(PlanError, match="must parse"):
        Plan.from_json("{not json")


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"epsilon": -1.0}, r"epsilon \(-1.0\) must be finite and > 0"),
        ({"views": []}, r"views \(\[\]\) must hold at least one view"),
        ({"views": [[0], []]}, r"views\[0\] \(\[0\]\) must have >= 2 cells|views\[1\]"),
        ({"views": [[0, 7]]}, r"views\[0\]: attribute \(7\)"),
        ({"views": [[0, 0]]}, r"views\[0\]: attributes .* must not repeat"),
        ({"oracles": ["GRR"]}, r"oracles \(1 given\) must name one oracle per view \(3\)"),
        ({"oracles": ["GRR", "XYZ", "GRR"]}, r"oracles\[1\]: oracle \('XYZ'\)"),
        ({"shares": [1, 0, 1]}, r"shares\[1\] \(0.0\) must be finite and > 0"),
        ({"shares": [1, 1]}, r"shares \(2 given\)"),
        ({"seed": -1}, r"seed \(-1\) must be an int in \[0, 2\*\*64\)"),
    ],
)
def test_bad_plans(kw: dict[str, object], message: str) -> None:
    with pytest.raises(PlanError, match=message):
        _plan(**kw)


def test_huge_view_is_refused() -> None:
    with pytest.raises(PlanError, match="must have <= 1048576 cells"):
        Plan(Schema.from_sizes([2] * 21), 1.0, [list(range(21))])


@given(st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=50), st.integers(0, 2**64 - 1))
def test_vectorised_xxh64_equals_the_library(ids: list[int], seed: int) -> None:
    expected = [xxhash.xxh64_intdigest(i.to_bytes(8, "little"), seed=seed) for i in ids]
    assert xxh64_u64(np.array(ids, dtype=np.uint64), seed).tolist() == expected


def test_assignment_is_deterministic_for_every_id_type() -> None:
    plan = _plan()
    ids: list[int | str | bytes] = [0, 7, 2**64 - 1, "alice", "Ünïcode", b"\x00raw"]
    first = [plan.assign(u) for u in ids]
    assert first == [Plan.from_json(plan.to_json()).assign(u) for u in ids]
    assert first == plan.assign_many(ids).tolist()
    ints = np.arange(1000, dtype=np.uint64)
    assert plan.assign_many(ints).tolist() == [plan.assign(int(u)) for u in ints]
    assert hash_user_ids(["a", "b"], 5).tolist() == [hash_user_id("a", 5), hash_user_id("b", 5)]


@pytest.mark.parametrize("shares", [None, [0.5, 0.3, 0.2], [1, 1, 8]])
def test_assignment_respects_shares(shares: list[float] | None) -> None:
    plan = _plan(shares=shares)
    # expected from the shares asked for (view j gets shares[j]), not from the plan
    asked = np.ones(plan.m) if shares is None else np.asarray(shares, dtype=float)
    expected = asked / asked.sum()
    n = 200_000
    counts = np.bincount(plan.assign_many(np.arange(n, dtype=np.uint64)), minlength=plan.m)
    assert_chisquare(counts, n * expected)
    str_counts = np.bincount(plan.assign_many([f"user-{i}" for i in range(30_000)]), minlength=3)
    assert_chisquare(str_counts, 30_000 * expected)


def test_bad_user_ids() -> None:
    plan = _plan()
    with pytest.raises(PlanError, match=r"user_id \(-5\)"):
        plan.assign(-5)
    with pytest.raises(PlanError, match=r"user_id \(1.5\)"):
        plan.assign(1.5)  # type: ignore[arg-type]
    with pytest.raises(PlanError, match=r"user_id \(-1\)"):
        plan.assign_many(np.array([3, -1]))


@given(st.integers(0, 2**32 - 1), st.integers(1, 200), st.integers(0, 2**64 - 1))
def test_vectorised_xxh64_of_16_byte_keys_equals_the_library(
    rng_seed: int, n: int, seed: int
) -> None:
    keys = np.random.default_rng(rng_seed).integers(0, 256, (n, 16), dtype=np.uint8)
    expected = [xxhash.xxh64_intdigest(k.tobytes(), seed=seed) for k in keys]
    assert xxh64_u128(keys, seed).tolist() == expected
    assert hash_user_ids(keys, seed).tolist() == expected  # pseudonyms as an array


def test_pseudonyms_are_assigned_as_their_bytes() -> None:
    plan = _plan()
    keys = np.random.default_rng(5).integers(0, 256, (500, 16), dtype=np.uint8)
    views = plan.assign_pseudonyms(keys)
    assert views.tolist() == [plan.assign(k.tobytes()) for k in keys]
    assert set(views.tolist()) == set(range(plan.m))
    with pytest.raises(PlanError, match=r"keys \(shape \(3, 8\)\) must have shape \(n, 16\)"):
        plan.assign_pseudonyms(np.zeros((3, 8), np.uint8))
