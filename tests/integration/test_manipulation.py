"""Fake reports against a real server (docs/security.md "Manipulation"): a 5% attack on
one cell is flagged in status, logs and answers and moves the served cell by no more
than the served bound; a flood stops at the report cap with CollectionFull (not
retried) while retries stay acknowledged; a fake pilot is flagged and phase 1 is
planned by Algorithm 1 instead, while a genuine pilot passes and is used."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from calmkit_aggregator import plan_collection
from calmkit_aggregator.integrity import max_shift_per_share
from calmkit_aggregator.phases import PhasedDesign
from calmkit_aggregator.planning.pilot import pilot_size, plan_next_phase, start_pilot
from calmkit_aggregator.service.admin import AdminClient
from calmkit_aggregator.service.storage import Storage
from calmkit_client import CollectionFull, DeviceState, Plan, PlanMismatch, make_reports
from calmkit_client import wire as client_wire
from calmkit_client.collector import Collector, RetryPolicy, call_with_retry
from calmkit_simulator import synthetic_population
from tests.integration.servers import Server, sample, scrape

# 8 disjoint views of 2 x 4 = 8 cells: GRR at epsilon 1 (L < 3 e + 2)
SIZES = (2, 4) * 8
VIEWS = [(2 * i, 2 * i + 1) for i in range(8)]
N = 16_000
POP = synthetic_population(n=N, sizes=SIZES, strength=1.5, rng=11)


def _columns(cid: str, plan: Plan, views: np.ndarray, payloads: list[np.ndarray], seed: int) -> Any:
    """A ColumnarBatch of reports in view order: ``payloads[j]`` the reports of view
    ``j`` (GRR cells, or OUE packed bits), with fresh ids from ``seed``."""
    rng = np.random.default_rng(seed)
    n = len(views)
    ids, pseudonyms = rng.bytes(16 * n), rng.bytes(16 * n)
    return client_wire.columnar_batch_from_arrays(cid, plan, views, payloads, ids, pseudonyms)


def honest_batch(cid: str, plan: Plan, codes: np.ndarray, seed: int) -> Any:
    """Honest reports of ``codes`` (make_reports with a seeded Generator)."""
    ids = np.arange(seed * 10**6, seed * 10**6 + len(codes), dtype=np.uint64)
    batches = make_reports(plan, codes, ids, rng=np.random.default_rng(seed))
    views = np.concatenate([np.full(b.n, b.view) for b in batches])
    return _columns(cid, plan, views, [b.payloads for b in batches], seed)


def fake_batch(cid: str, plan: Plan, per_view: dict[int, int], seed: int) -> Any:
    """Fakes: ``per_view[j]`` reports on view j, all claiming cell 0 (GRR) or all
    ones (OUE)."""
    views, payloads = [], []
    for j, o in enumerate(plan.view_oracles):
        k = per_view.get(j, 0)
        views.append(np.full(k, j))
        if o.name == "GRR":
            payloads.append(np.zeros(k, np.int64))
        else:
            ones = np.unpackbits(np.full((k, (o.L + 7) // 8), 255, np.uint8), axis=1)[:, : o.L]
            payloads.append(np.packbits(ones, axis=1))
    return _columns(cid, plan, np.concatenate(views), payloads, seed)


def submit(address: str, token: str, batch: Any) -> Any:
    with grpc.insecure_channel(address) as channel:
        stub = client_wire.aggregator_stub(channel)
        return call_with_retry(
            stub.SubmitColumnar,
            batch,
            RetryPolicy(attempts=1),
            [("authorization", f"Bearer {token}")],
        )


def _events(caplog: pytest.LogCaptureFixture, event: str) -> list[dict[str, Any]]:
    out = []
    for r in caplog.records:
        if r.name == "calmkit.aggregator" and r.getMessage().startswith("{"):
            line = json.loads(r.getMessage())
            if line["event"] == event:
                out.append(line)
    return out


def test_a_five_percent_attack_on_one_cell_is_flagged_and_bounded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="calmkit.aggregator")
    fakes = round(0.05 * N / 0.95)  # 5% of all reports, all on view 0's cell 0
    with (
        Server(tmp_path, metrics_address="127.0.0.1:0") as server,
        AdminClient(server.address) as admin,
    ):
        made = {
            cid: admin.create_collection(
                POP.schema, 1.0, N, 2, collection_id=cid, views=VIEWS, seed=3
            )
            for cid in ("honest", "attacked")
        }
        plan = made["honest"].plan
        assert set(plan.oracles or ()) == {"GRR"}
        for cid, info in made.items():  # the same honest reports in both
            for half in (0, 1):
                codes = POP.codes[half * N // 2 : (half + 1) * N // 2]
                batch = honest_batch(cid, plan, codes, 1 + half)
                assert submit(server.address, info.submit_token, batch).accepted == N // 2
        clean = admin.get_collection("honest")
        assert clean.flags == () and _events(caplog, "manipulation") == []
        batch = fake_batch("attacked", plan, {0: fakes}, 9)
        assert submit(server.address, made["attacked"].submit_token, batch).accepted == fakes
        status = admin.get_collection("attacked")
        assert len(status.flags) == 2, status.flags  # the counts now, and the batch
        assert status.flags[0].startswith("collection counts: view 0 (a0 x a1) (GRR): cell 0")
        assert status.flags[1].startswith(f"batch of {fakes} reports from ipv4:127.0.0.1:")
        names = ["a0", "a1"]
        honest, attacked = admin.query("honest", names), admin.query("attacked", names)
        assert honest.flags == () and attacked.flags == status.flags
        admin.query("attacked", names)
        admin.get_collection("attacked")
        assert server.metrics_port is not None  # the flags counted (once each) and stored
        counted = scrape(server.metrics_port)
        flags = "calmkit_manipulation_flags_total"
        assert (
            sample(counted, flags, scope="batch") == sample(counted, flags, scope="collection") == 1
        )
        assert sample(counted, "calmkit_collection_flags", collection="attacked") == 1
        assert sample(counted, "calmkit_collection_flags", collection="honest") == 0
    logged = _events(caplog, "manipulation")
    # the batch once, the collection's flagged state once (not per query or status)
    assert sorted(e["scope"] for e in logged) == ["batch", "collection"]
    # the served cell moved, but by no more than the bound at the view's fake share
    o = plan.view_oracles[0]
    share = fakes / (fakes + int(clean.view_reports[0]))
    assert attacked.max_shift_per_share == pytest.approx(max_shift_per_share(o))
    shift = attacked.values.reshape(-1)[0] - honest.values.reshape(-1)[0]
    assert 0.5 * share * max_shift_per_share(o) < shift <= share * attacked.max_shift_per_share
    with Storage(tmp_path / "agg.db") as reopened:  # the batch's flag survives a restart
        assert reopened.get_collection("attacked").flags == (status.flags[1],)


def test_flags_and_the_pilot_check_are_for_the_admin_token_only(tmp_path: Path) -> None:
    # Flag texts name a cell's count of reports (fakes added to one cell until it is
    # flagged, less the fakes, read that count) and the addresses batches came from:
    # GetCollection without the admin token serves neither, only the check's verdict.
    n = PILOT_POP.n
    with (
        Server(tmp_path, admin_token="admin-secret") as server,
        AdminClient(server.address, token="admin-secret") as admin,
        AdminClient(server.address) as anyone,
    ):
        info = admin.create_collection(PILOT_POP.schema, 1.0, n, 3, collection_id="p", pilot=0.2)
        pilot, target = info.plan, info.pilot_target
        per_view = {j: target // pilot.m + (j < target % pilot.m) for j in range(pilot.m)}
        assert submit(server.address, info.submit_token, fake_batch("p", pilot, per_view, 7))
        full, public = admin.get_collection("p"), anyone.get_collection("p")
        assert full.flags and any("reports from ipv4:127.0.0.1:" in f for f in full.flags)
        assert full.pilot_check.startswith("failed: view ")
        assert public.flags == () and public.pilot_check == "failed"
        assert (public.plan.digest, public.reports, public.phase) == (
            full.plan.digest,
            full.reports,
            full.phase,
        )
        assert public.view_reports == full.view_reports


def test_a_flood_stops_at_the_cap_and_retries_stay_acknowledged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="calmkit.aggregator")
    n = 1000
    with Server(tmp_path) as server, AdminClient(server.address) as admin:
        info = admin.create_collection(POP.schema, 1.0, n, 2, collection_id="c", views=VIEWS)
        assert info.max_reports == 2 * n  # the default cap
        plan, token = info.plan, info.submit_token
        genuine = honest_batch("c", plan, POP.codes[:n], 1)
        assert submit(server.address, token, genuine).accepted == n
        flood = [fake_batch("c", plan, {j: 50 for j in range(8)}, 10 + i) for i in range(4)]
        accepted = [submit(server.address, token, b).accepted for b in flood[:2]]
        assert accepted == [400, 400]  # 1800 of 2000
        slept: list[float] = []
        with grpc.insecure_channel(server.address) as channel:
            stub = client_wire.aggregator_stub(channel)
            with pytest.raises(CollectionFull, match=r"is full: it takes at most 2000 reports"):
                call_with_retry(
                    stub.SubmitColumnar,
                    flood[2],
                    RetryPolicy(attempts=5),
                    [("authorization", f"Bearer {token}")],
                    sleep=slept.append,
                )
        assert slept == []  # not retried
        again = submit(server.address, token, genuine)  # a retry, once full: duplicates
        assert (again.accepted, again.duplicates) == (0, n)
        status = admin.get_collection("c")
        assert status.reports == 1800 and status.max_reports == 2000
        capped = admin.create_collection(
            POP.schema, 1.0, n, 2, collection_id="d", views=VIEWS, max_reports=1500
        )
        assert capped.max_reports == 1500
    refused = [e for e in _events(caplog, "refused") if "is full" in e["error"]]
    assert len(refused) == 1 and refused[0]["code"] == "RESOURCE_EXHAUSTED"


PILOT_POP = synthetic_population(n=6000, sizes=(2, 3, 2, 2, 4), strength=1.5, rng=5)


def test_a_fake_pilot_is_flagged_and_phase_1_is_planned_without_it(tmp_path: Path) -> None:
    n = PILOT_POP.n
    with Server(tmp_path) as server, AdminClient(server.address) as admin:
        info = admin.create_collection(PILOT_POP.schema, 1.0, n, 3, collection_id="p", pilot=0.2)
        target = pilot_size(n, 0.2)
        assert info.pilot_target == target and info.pilot_check == ""
        pilot = info.plan
        assert "OUE" in (pilot.oracles or ()) or "GRR" in (pilot.oracles or ())
        per_view = {j: target // pilot.m + (j < target % pilot.m) for j in range(pilot.m)}
        fakes = fake_batch("p", pilot, per_view, 7)
        assert submit(server.address, info.submit_token, fakes).accepted == target
        status = admin.get_collection("p")
        assert status.phase == 1
        assert status.pilot_check.startswith("failed: view ")
        assert status.pilot_check.endswith("; phase 1 planned by Algorithm 1 without the pilot")
        design = PhasedDesign(n, target, 3, 0)
        safe = plan_collection(PILOT_POP.schema, 1.0, n - target, 3, rng=1, seed=1, planner="paper")
        assert status.plan.digest == safe.digest
        assert design.seed + 1 == 1
        # the genuine users report under phase 1; answers leave the failed pilot out
        later = honest_batch("p", status.plan, PILOT_POP.codes[:2000], 8)
        assert submit(server.address, info.submit_token, later).accepted == 2000
        answer = admin.query("p", ["a0", "a1"])
        assert answer.reports == 2000 and admin.get_collection("p").reports == target + 2000
        assert answer.flags and answer.flags[0].startswith("collection counts: view 0 (phase 0: ")
    with Storage(tmp_path / "agg.db") as reopened:  # the check survives a restart
        assert reopened.get_collection("p").pilot_check == status.pilot_check


def test_after_a_failed_pilot_its_plan_takes_no_new_reports(tmp_path: Path) -> None:
    """The cap lockout: fakes under the failed pilot's plan no longer take the cap's
    places. Retries stay acknowledged, genuine devices report under the main plan, and
    a device whose report was made under the pilot's plan gives it up (refused) rather
    than make a second one."""
    n, codes, ids = PILOT_POP.n, PILOT_POP.codes, np.arange(PILOT_POP.n, dtype=np.uint64)
    with Server(tmp_path) as server, AdminClient(server.address) as admin:
        info = admin.create_collection(PILOT_POP.schema, 1.0, n, 3, collection_id="p", pilot=0.2)
        pilot, token, target = info.plan, info.submit_token, info.pilot_target
        state = DeviceState.in_memory()
        with Collector(server.address, "p", token, state) as device:
            assert device.submit_many(codes[:50], ids[:50]).accepted == 50
        made = state.reports_for("p", pilot, codes[50:60], ids[50:60])  # made, not yet sent
        k, extra = divmod(target - 50, pilot.m)
        fakes = fake_batch("p", pilot, {j: k + (j < extra) for j in range(pilot.m)}, 7)
        assert submit(server.address, token, fakes).accepted == target - 50
        status = admin.get_collection("p")
        assert status.phase == 1 and status.pilot_check.startswith("failed: ")
        main = status.plan
        refused = (
            rf"plan_digest \({pilot.digest[:12]}\) is the pilot's, which failed its check: "
            rf"fetch the current plan \({main.digest[:12]}\); nothing of the batch was stored"
        )
        more = fake_batch("p", pilot, {0: 500}, 8)
        with pytest.raises(PlanMismatch, match=refused):
            submit(server.address, token, more)
        assert admin.get_collection("p").phase_reports == (target, 0)  # nothing stored
        again = submit(server.address, token, fakes)  # a retry of stored pilot reports
        assert (again.accepted, again.duplicates) == (0, target - 50)
        with Collector(server.address, "p", token, state) as device:
            with pytest.raises(
                PlanMismatch,
                match=rf"60 reports made under plan_digest \({pilot.digest[:12]}\) were refused "
                rf"\({refused}\)\. They are given up, not made again under the current plan: .*"
                r"\(2000 other reports accepted, 0 acknowledged as duplicates\)",
            ):  # 10 pilot reports not sent before, with 50 sent: their batch is refused
                device.submit_many(codes[:2060], ids[:2060])
            record = PILOT_POP.schema.decode_record(codes[55])
            with pytest.raises(PlanMismatch, match=r"1 reports made under plan_digest"):
                device.submit(record, user_id=55)
        # the given-up users kept their one report and were charged for it once
        assert state.reports_for("p", main, codes[50:60], ids[50:60]) == made
        assert all(state.ledger(int(u)) == {"p": 1.0} for u in ids[50:60])
        status = admin.get_collection("p")
        assert status.phase_reports == (target, 2000)
        assert admin.query("p", ["a0", "a1"]).reports == 2000


def test_a_genuine_pilot_passes_and_plans_phase_1(tmp_path: Path) -> None:
    n = PILOT_POP.n
    with Server(tmp_path) as server, AdminClient(server.address) as admin:
        info = admin.create_collection(PILOT_POP.schema, 1.0, n, 3, collection_id="p", pilot=0.2)
        target = pilot_size(n, 0.2)
        batch = honest_batch("p", info.plan, PILOT_POP.codes[:target], 4)
        assert submit(server.address, info.submit_token, batch).accepted == target
        status = admin.get_collection("p")
        assert status.phase == 1 and status.pilot_check == "passed" and status.flags == ()
        expected = plan_next_phase(
            PhasedDesign(n, target, 3, 0), server.storage.phase_support("p", 0)
        )
        assert status.plan.digest == expected.plan.digest
        # reports made under the pilot's plan before the switch are still taken
        late = honest_batch("p", info.plan, PILOT_POP.codes[target : target + 100], 5)
        assert submit(server.address, info.submit_token, late).accepted == 100
        assert admin.get_collection("p").phase_reports == (target + 100, 0)


# 8 binary attributes, 20,000 users: the pilot takes two rounds of 2,000 reports
ROUNDS_POP = synthetic_population(n=20_000, sizes=(2,) * 8, strength=1.5, rng=6)


def test_a_fake_second_pilot_round_is_flagged_and_the_main_phase_leaves_the_pilot_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from calmkit_client.cli import main

    n, codes = ROUNDS_POP.n, ROUNDS_POP.codes
    with Server(tmp_path) as server, AdminClient(server.address) as admin:
        info = admin.create_collection(ROUNDS_POP.schema, 1.0, n, 3, collection_id="r")
        start = start_pilot(ROUNDS_POP.schema, 1.0, n)
        assert (info.pilot_target, start.first_round) == (4_000, 2_000)
        token = info.submit_token
        first = honest_batch("r", info.plan, codes[:2_000], 4)
        assert submit(server.address, token, first).accepted == 2_000
        status = admin.get_collection("r")
        assert status.phase == 1 and status.pilot_check == "passed" and status.in_pilot
        cli = ["collection", "status", "--address", server.address, "--collection", "r"]
        assert main(cli) == 0
        assert "  phase 1 (pilot): 2000 of 4000 reports; then the server chooses the views " in (
            capsys.readouterr().out
        )
        second = status.plan  # the round chosen from the first: fakes fill it
        per_view = {j: 2_000 // second.m + (j < 2_000 % second.m) for j in range(second.m)}
        assert submit(server.address, token, fake_batch("r", second, per_view, 7)).accepted
        status = admin.get_collection("r")
        assert status.phase == 2 and not status.in_pilot
        assert status.pilot_check.startswith("failed: view ")
        assert status.pilot_check.endswith("; phase 2 planned by Algorithm 1 without the pilot")
        safe = plan_collection(ROUNDS_POP.schema, 1.0, n - 4_000, 3, rng=1, seed=1, planner="paper")
        assert status.plan.digest == safe.digest
        assert main(cli) == 0
        out = capsys.readouterr().out
        assert "  phase 2 (after a pilot of 4000 reports)\n" in out
        assert "  pilot check: failed: view " in out
        # answers rest on the main phase alone: both pilot rounds are left out
        later = honest_batch("r", status.plan, codes[4_000:7_000], 8)
        assert submit(server.address, token, later).accepted == 3_000
        answer = admin.query("r", ["a0", "a1"])
        assert answer.reports == 3_000 and admin.get_collection("r").reports == 7_000


def test_a_fake_first_round_puts_the_main_phase_next_and_plans_nothing_more(
    tmp_path: Path,
) -> None:
    n, codes = ROUNDS_POP.n, ROUNDS_POP.codes
    with Server(tmp_path) as server, AdminClient(server.address) as admin:
        info = admin.create_collection(ROUNDS_POP.schema, 1.0, n, 3, collection_id="f")
        token = info.submit_token
        fakes = fake_batch("f", info.plan, {j: 500 for j in range(info.plan.m)}, 9)
        assert submit(server.address, token, fakes).accepted == 500 * info.plan.m == 2_000
        status = admin.get_collection("f")
        assert status.phase == 1 and not status.in_pilot
        assert status.pilot_check.endswith("; phase 1 planned by Algorithm 1 without the pilot")
        safe = status.plan
        # the genuine users report under that plan, past the pilot's 4,000 reports: the
        # collection stays in its main phase (no second round, no replanning)
        for lo in range(0, 8_000, 2_000):
            batch = honest_batch("f", safe, codes[lo : lo + 2_000], 20 + lo)
            assert submit(server.address, token, batch).accepted == 2_000
        status = admin.get_collection("f")
        assert status.phase == 1 and status.plan == safe
        assert len(server.storage.get_collection("f").plans) == 2
        assert admin.query("f", ["a0", "a1"]).reports == 8_000


def test_the_cli_creates_with_a_cap_and_status_shows_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from calmkit_client.cli import main

    with Server(tmp_path) as server:
        base = ["--address", server.address, "--collection", "c"]
        views = ";".join(f"{a},{b}" for a, b in VIEWS)
        sizes = ",".join(map(str, SIZES))
        create = ["collection", "create", *base, "--domain", sizes, "--epsilon", "1"]
        assert main([*create, "--n", "1000", "--views", views, "--max-reports", "1500"]) == 0
        out = capsys.readouterr().out
        assert "  report cap: 1500\n" in out
        token = out.split("submit token (shown once; give it to your apps): ")[1].split()[0]
        plan = server.storage.get_collection("c").plan
        assert submit(server.address, token, fake_batch("c", plan, {0: 600}, 1)).accepted == 600
        assert main(["collection", "status", *base]) == 0
        out = capsys.readouterr().out
        assert out.count("  MANIPULATION FLAG: ") == 2
        assert "MANIPULATION FLAG: collection counts: view 0 (a0 x a1) (GRR): cell 0" in out
        assert main(["collection", "status", *base, "--json"]) == 0
        status = json.loads(capsys.readouterr().out)
        assert status["max_reports"] == 1500 and len(status["flags"]) == 2
        assert status["pilot_check"] == ""
