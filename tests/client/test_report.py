"""Reports: one record in, one perturbed report out, nothing else leaves the client."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pytest

import calmkit_client.randomness as randomness
from calmkit_client import (
    CalmkitError,
    Plan,
    PlanError,
    Report,
    SchemaError,
    make_report,
    make_reports,
)
from tests.client.survey import PLAN, RECORD, SCHEMA


def _cell(plan: Plan, record: dict[str, str], view: int) -> int:
    codes = np.array([plan.schema.encode_record(record)])
    return int(plan.schema.cell_index(codes, plan.views[view])[0])


def test_report_carries_only_digest_view_payload_and_id() -> None:
    assert [f.name for f in dataclasses.fields(Report)] == [
        "plan_digest",
        "view",
        "payload",
        "report_id",
    ]


@pytest.mark.parametrize("user", ["alice", "bob", 12345, "carol"])
def test_payload_is_exactly_the_oracles_output(
    user: str | int, seeded_entropy: Callable[[int], None]
) -> None:
    seeded_entropy(3)
    report = make_report(PLAN, RECORD, user)
    view = PLAN.assign(user)
    assert report.view == view and report.plan_digest == PLAN.digest
    expected = PLAN.oracle(view).perturb_one(_cell(PLAN, RECORD, view), np.random.default_rng(3))
    assert report.payload == expected
    report.check(PLAN)


def test_view_and_report_id_do_not_depend_on_the_record(
    seeded_entropy: Callable[[int], None],
) -> None:
    other = {"age": "<30", "smoker": "no", "region": "N", "income": "q0"}
    for user in ["u1", "u2", "u3", "u4", "u5", "u6"]:
        seeded_entropy(8)
        a = make_report(PLAN, RECORD, user)
        seeded_entropy(8)
        b = make_report(PLAN, other, user)
        assert a.view == b.view and a.report_id == b.report_id


def test_default_randomness_is_the_os_entropy_source(monkeypatch: pytest.MonkeyPatch) -> None:
    def os_bytes(seed: int, calls: list[int]) -> object:
        stream = np.random.default_rng(seed)

        def urandom(n: int) -> bytes:
            calls.append(n)
            return stream.bytes(n)

        return urandom

    for user in ["dana", "eve", "frank", "gus"]:  # both GRR and OUE views
        calls: list[int] = []
        monkeypatch.setattr(randomness.os, "urandom", os_bytes(77, calls))
        report = make_report(PLAN, RECORD, user)
        assert calls and calls[-1] == 16  # the oracle's randomness, then the report id
        # replaying the same OS bytes through the oracle alone reproduces the report
        monkeypatch.setattr(randomness.os, "urandom", os_bytes(77, []))
        oracle = PLAN.oracle(report.view)
        assert report.payload == oracle.perturb_one(_cell(PLAN, RECORD, report.view))
        assert report.report_id == randomness.random_bytes(randomness.OsEntropy(), 16)


def test_production_reports_differ_between_calls() -> None:
    ids = {make_report(PLAN, RECORD, "erin").report_id for _ in range(20)}
    assert len(ids) == 20


def test_bad_record_is_a_schema_error_naming_the_field() -> None:
    with pytest.raises(SchemaError, match=r"value of 'region' \('X'\)"):
        make_report(PLAN, {**RECORD, "region": "X"}, "u")


def test_report_check_rejects_foreign_or_malformed_reports() -> None:
    good = make_report(PLAN, RECORD, "alice")
    with pytest.raises(PlanError, match="plan_digest"):
        dataclasses.replace(good, plan_digest="0" * 64).check(PLAN)
    with pytest.raises(PlanError, match=r"view \(7\)"):
        dataclasses.replace(good, view=7).check(PLAN)
    grr_view = PLAN.oracles.index("GRR")  # type: ignore[union-attr]
    with pytest.raises(PlanError, match=r"payload of view 0 \(6\)"):
        Report(PLAN.digest, grr_view, 6, b"x" * 16).check(PLAN)
    oue_view = PLAN.oracles.index("OUE")  # type: ignore[union-attr]
    with pytest.raises(PlanError, match="payload of view 1"):
        Report(PLAN.digest, oue_view, b"\xff\xff", b"x" * 16).check(PLAN)
    with pytest.raises(PlanError, match="report_id"):
        Report(PLAN.digest, 0, 1, b"short")
    with pytest.raises(PlanError, match="plan_digest"):
        Report("abc", 0, 1, b"x" * 16)


def test_batch_reports_follow_the_same_assignment_and_projection() -> None:
    rng = np.random.default_rng(4)
    n = 5000
    codes = np.stack([rng.integers(0, s, n) for s in SCHEMA.sizes], axis=1)
    ids = np.arange(n, dtype=np.uint64) * 7919
    batches = make_reports(PLAN, codes, ids, rng=np.random.default_rng(5))
    assert [b.view for b in batches] == [0, 1, 2]
    rows = np.concatenate([b.rows for b in batches])
    assert sorted(rows.tolist()) == list(range(n))
    views = PLAN.assign_many(ids)
    for b in batches:
        assert np.all(views[b.rows] == b.view)
        oracle = PLAN.oracle(b.view)
        oracle.check_payloads(b.payloads)
        assert b.payloads.shape[0] == b.n and b.report_ids.shape == (b.n, 16)
    with pytest.raises(PlanError, match=r"user_ids \(3 given\)"):
        make_reports(PLAN, codes, ids[:3])


@pytest.mark.parametrize("rng", [3, np.random.default_rng(3), np.random.SeedSequence(3)])
def test_the_device_api_takes_no_seed(rng: object) -> None:
    # a report made from a guessable seed is a report anyone can re-derive
    with pytest.raises(TypeError, match="rng"):
        make_report(PLAN, RECORD, "u", rng=rng)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        make_report(PLAN, RECORD, "u", rng)  # type: ignore[call-arg]


@pytest.mark.parametrize("seed", [0, 3, np.int64(7), np.random.SeedSequence(1)])
def test_batch_primitives_refuse_seeds_and_name_the_fix(seed: object) -> None:
    codes = np.zeros((3, SCHEMA.d), dtype=np.int64)
    with pytest.raises(CalmkitError, match=r"rng \(.*\) must be None .*default_rng\(seed\)"):
        make_reports(PLAN, codes, [1, 2, 3], seed)  # type: ignore[arg-type]
    with pytest.raises(CalmkitError, match=r"rng \(.*\) must be None"):
        PLAN.oracle(0).perturb(np.array([0, 1]), seed)  # type: ignore[arg-type]
    with pytest.raises(CalmkitError, match=r"rng \(.*\) must be None"):
        PLAN.oracle(0).perturb_one(0, seed)  # type: ignore[arg-type]
