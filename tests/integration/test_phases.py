"""A collection with a pilot phase, end to end over gRPC with the real client: the plan
a client fetches changes once the pilot has its reports, every user still reports
once (a device that reported in the pilot keeps its report), answers use both phases,
a restart keeps the phases, and the phases are planned for the reconstruction the
collection was created for."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import grpc
import numpy as np
import pytest

from calmkit_aggregator import plan_collection, reconstruct
from calmkit_aggregator.phases import PILOT_SET_ASIDE, PhasedDesign, combine_phases
from calmkit_aggregator.planning.error_model import Workload
from calmkit_aggregator.planning.pilot import (
    pilot_size,
    plan_after_pilot,
    plan_next_phase,
    plan_pilot_round,
    start_pilot,
)
from calmkit_aggregator.planning.search import choose_plan
from calmkit_aggregator.service.admin import AdminClient
from calmkit_aggregator.service.storage import Storage
from calmkit_client import CalmkitError
from calmkit_client import wire as client_wire
from calmkit_client.collector import Collector, open_channel
from calmkit_client.device import DeviceState
from calmkit_simulator import synthetic_population
from tests.integration.servers import Server

POP = synthetic_population(n=6000, sizes=(2, 3, 2, 2, 4), strength=1.5)
IDS = np.arange(POP.n, dtype=np.uint64)
# 10 dependent binary attributes: the planner chooses other views for global
# reconstruction than for local, after this pilot and from the prior alike
WIDE = synthetic_population(n=6000, sizes=(2,) * 10, strength=1.5, rng=3)
# 8 dependent binary attributes, 20,000 users: half the pilot (2,000 reports over 4
# pairs) measures pairs, so the pilot takes two rounds
TWO = synthetic_population(n=20_000, sizes=(2,) * 8, strength=1.5, rng=4)
# 12 independent binary attributes, 20,000 users, eps 2: the pilot's two rounds of
# small pair tables hold nothing but noise, and the planner leaves them out
LOOSE = synthetic_population(n=20_000, sizes=(2,) * 12, max_parents=0, rng=3)
LOOSE_SEED = 2  # the devices' entropy (secrets, hence views, and reports): a reproducible plan


@contextmanager
def _serving(tmp_path: Path) -> Iterator[tuple[str, Storage]]:
    """A real server on a free port over a fresh store; stopped and closed after."""
    with Server(tmp_path) as server:
        yield server.address, server.storage


def test_the_plan_changes_after_the_pilot_and_users_report_once(tmp_path: Path) -> None:
    with _serving(tmp_path) as (address, storage):
        with AdminClient(address) as admin:
            info = admin.create_collection(
                POP.schema, 1.0, POP.n, 3, collection_id="p", seed=5, pilot=0.1
            )
        target = pilot_size(POP.n, 0.1)
        assert info.phase == 0 and info.pilot_target == target == 600
        pilot_plan = info.plan
        assert {a for v in pilot_plan.views for a in v} == set(range(5))
        state = DeviceState(tmp_path / "devices.db")
        with Collector(address, "p", info.submit_token, state, batch_size=250) as client:
            first = client.submit_many(POP.codes[:target], IDS[:target])
            assert first.accepted == target
            current = client.plan(refresh=True)
            assert current.digest != pilot_plan.digest  # the server planned phase 1
            rest = client.submit_many(POP.codes[target:], IDS[target:])
            assert rest.accepted == POP.n - target
            # pilot users asking again get their pilot report back: duplicates only
            again = client.submit_many(POP.codes[:50], IDS[:50])
            assert (again.accepted, again.duplicates) == (0, 50)
        state.close()
        with AdminClient(address) as admin:
            status = admin.get_collection("p")
            assert status.phase == 1 and status.phase_reports == (target, POP.n - target)
            assert status.reports == POP.n and status.plan.digest == current.digest
            assert sum(status.view_reports) == POP.n - target  # the current phase's views
            closed = admin.close_collection("p")
            answer = admin.query("p", ["a0", "a1", "a4"])
        in_process = reconstruct(storage.support("p")).answer(["a0", "a1", "a4"])
        np.testing.assert_allclose(answer.values, in_process.values, rtol=0, atol=1e-12)
        truth = POP.marginal([0, 1, 4])
        assert ((answer.values - truth) ** 2).sum() < ((truth - 1 / truth.size) ** 2).sum()
        assert closed.state == "closed"
    with Storage(tmp_path / "agg.db") as reopened:  # restart: both phases and counts
        record = reopened.get_collection("p")
        assert record.plans == (pilot_plan, current)
        assert record.phase_reports == (target, POP.n - target)


def test_paper_planner_and_no_pilot_make_one_phase(tmp_path: Path) -> None:
    with _serving(tmp_path) as (address, _storage):
        with AdminClient(address) as admin:
            paper = admin.create_collection(
                POP.schema, 1.0, POP.n, 3, collection_id="a", planner="paper"
            )
            single = admin.create_collection(
                POP.schema, 1.0, POP.n, 3, collection_id="b", pilot=0.0
            )
        assert paper.pilot_target == single.pilot_target == 0
        assert paper.phase == single.phase == 0


def test_the_phases_are_planned_for_the_reconstruction_asked_for(
    tmp_path: Path, seeded_entropy: Callable[[int], None]
) -> None:
    seeded_entropy(1)  # the devices' reports, hence the pilot's counts, are reproducible
    with _serving(tmp_path) as (address, storage):
        with AdminClient(address) as admin:
            info = admin.create_collection(
                WIDE.schema, 1.0, WIDE.n, 3, collection_id="g", seed=5, reconstruction="global"
            )
            one = admin.create_collection(
                WIDE.schema,
                1.0,
                WIDE.n,
                3,
                collection_id="one",
                seed=5,
                pilot=0.0,
                reconstruction="global",
            )
        # one phase: plan_collection's plan for global, not the one for local
        want_one = plan_collection(
            WIDE.schema, 1.0, WIDE.n, 3, rng=5, seed=5, reconstruction="global"
        )
        assert one.plan == want_one and one.pilot_target == 0
        # (predicted for global: the same search scores its designs otherwise)
        sizes, work = WIDE.schema.sizes, Workload(k=3)
        glob = choose_plan(sizes, 1.0, WIDE.n, work, rng=5, reconstruction="global")
        assert glob.candidates != choose_plan(sizes, 1.0, WIDE.n, work, rng=5).candidates
        # a pilot, then the second phase planned for global from the pilot's reports
        target = pilot_size(WIDE.n)
        assert info.phase == 0 and info.pilot_target == target
        ids = np.arange(WIDE.n, dtype=np.uint64)
        with Collector(
            address, "g", info.submit_token, DeviceState.in_memory(), batch_size=400
        ) as client:
            assert client.submit_many(WIDE.codes[:target], ids[:target]).accepted == target
            served = client.plan(refresh=True)
        pilot = storage.phase_support("g", 0)
        assert int(pilot.n.sum()) == target and pilot.plan == info.plan
        remaining = WIDE.n - target
        want = plan_after_pilot(pilot, remaining, Workload(k=3), seed=6, reconstruction="global")
        local = plan_after_pilot(pilot, remaining, Workload(k=3), seed=6)
        assert served == want.plan and storage.get_collection("g").plans == (info.plan, want.plan)
        # the same pilot, its designs predicted for local otherwise
        assert want.choice.candidates != local.choice.candidates
    with Storage(tmp_path / "agg.db") as reopened:  # restart: the design keeps it
        design = reopened.get_collection("g").design
        assert design is not None and design.reconstruction == "global"


def test_a_pilot_of_two_rounds_plans_its_second_round_then_the_main_phase(
    tmp_path: Path, seeded_entropy: Callable[[int], None]
) -> None:
    seeded_entropy(2)  # the devices' reports, hence the rounds' counts, are reproducible
    start = start_pilot(TWO.schema, 1.0, TWO.n, seed=2)
    assert (start.reports, start.first_round) == (4_000, 2_000)  # 500 reports per pair
    design = PhasedDesign(TWO.n, 4_000, 3, 2, first_round=2_000)
    ids = np.arange(TWO.n, dtype=np.uint64)
    with _serving(tmp_path) as (address, storage):
        with AdminClient(address) as admin:
            info = admin.create_collection(TWO.schema, 1.0, TWO.n, 3, collection_id="t", seed=2)
            assert info.plan == start.plan and info.pilot_target == 4_000 and info.in_pilot
            token = info.submit_token
            assert token is not None
            with Collector(address, "t", token, DeviceState.in_memory(), batch_size=500) as c:
                assert c.submit_many(TWO.codes[:2_000], ids[:2_000]).accepted == 2_000
                second = c.plan(refresh=True)
                status = admin.get_collection("t")
                assert status.phase == 1 and status.in_pilot and status.pilot_check == "passed"
                # the second round: what the planner makes of the first round's counts
                first = storage.phase_support("t", 0)
                assert second == plan_pilot_round(design, first)
                assert all(len(v) == 2 for v in second.views)
                assert not set(second.views) & set(start.plan.views)
                assert c.submit_many(TWO.codes[2_000:4_000], ids[2_000:4_000]).accepted == 2_000
                main = c.plan(refresh=True)
                pilot = combine_phases([first, storage.phase_support("t", 1)])
                assert main == plan_next_phase(design, pilot).plan
                rest = c.submit_many(TWO.codes[4_000:], ids[4_000:])
                assert rest.accepted == TWO.n - 4_000
            status = admin.get_collection("t")
            assert status.phase == 2 and status.phase_reports == (2_000, 2_000, TWO.n - 4_000)
            assert not status.in_pilot and status.pilot_reports == 4_000
            answer = admin.query("t", ["a0", "a1", "a2"])
        in_process = reconstruct(storage.support("t")).answer(["a0", "a1", "a2"])
        np.testing.assert_allclose(answer.values, in_process.values, rtol=0, atol=1e-12)
        assert answer.reports == TWO.n
    with Storage(tmp_path / "agg.db") as reopened:  # restart: three phases, one design
        record = reopened.get_collection("t")
        assert record.plans == (start.plan, second, main) and record.design == design


def test_a_pilot_the_planner_sets_aside_is_left_out_of_the_answers(
    tmp_path: Path, seeded_entropy: Callable[[int], None]
) -> None:
    seeded_entropy(LOOSE_SEED)
    start = start_pilot(LOOSE.schema, 2.0, LOOSE.n, seed=2)
    target = start.reports
    assert start.first_round == target // 2  # two rounds
    design = PhasedDesign(LOOSE.n, target, 3, 2, first_round=start.first_round)
    ids = np.arange(LOOSE.n, dtype=np.uint64)
    with _serving(tmp_path) as (address, storage):
        with AdminClient(address) as admin:
            info = admin.create_collection(LOOSE.schema, 2.0, LOOSE.n, 3, collection_id="s", seed=2)
            token = info.submit_token
            assert token is not None
            half = start.first_round
            with Collector(address, "s", token, DeviceState.in_memory(), batch_size=500) as c:
                for lo, hi in ((0, half), (half, target), (target, LOOSE.n)):
                    c.plan(refresh=True)  # each round's users report under its plan
                    assert c.submit_many(LOOSE.codes[lo:hi], ids[lo:hi]).accepted == hi - lo
            status = admin.get_collection("s")
            assert status.phase == 2 and not status.in_pilot
            assert status.pilot_check == f"passed; {PILOT_SET_ASIDE}"
            pilot = combine_phases([storage.phase_support("s", i) for i in range(2)])
            main = plan_next_phase(design, pilot)
            assert not main.keeps_pilot and status.plan == main.plan
            answer = admin.query("s", ["a0", "a1", "a2"])
        # the answers rest on the main phase's views, and on the pilot's reports only
        # through the attributes' margins
        assert answer.reports == LOOSE.n
        main_only = storage.phase_support("s", 2)
        alone = reconstruct(replace(main_only, margins_from=pilot)).answer(["a0", "a1", "a2"])
        np.testing.assert_allclose(answer.values, alone.values, rtol=0, atol=1e-12)
        without = reconstruct(main_only).answer(["a0", "a1", "a2"])
        assert np.abs(answer.values - without.values).max() > 1e-4
    with Storage(tmp_path / "agg.db") as reopened:  # the decision survives a restart
        assert reopened.get_collection("s").pilot_check == status.pilot_check


def test_one_batch_past_the_whole_pilot_starts_the_main_phase(tmp_path: Path) -> None:
    # 5,000 reports in one batch end both rounds of a 4,000-report pilot: the second
    # round is planned (it holds no report) and the main phase right after it, from
    # the first round's counts
    ids = np.arange(TWO.n, dtype=np.uint64)
    with _serving(tmp_path) as (address, storage):
        with AdminClient(address) as admin:
            info = admin.create_collection(TWO.schema, 1.0, TWO.n, 3, collection_id="b", seed=2)
            token = info.submit_token
            assert token is not None
            with Collector(address, "b", token, DeviceState.in_memory(), batch_size=5_000) as c:
                assert c.submit_many(TWO.codes[:5_000], ids[:5_000]).accepted == 5_000
            status = admin.get_collection("b")
            assert status.phase == 2 and status.phase_reports == (5_000, 0, 0)
            assert not status.in_pilot and status.pilot_check == "passed"
        design = PhasedDesign(TWO.n, 4_000, 3, 2, first_round=2_000)
        first = storage.phase_support("b", 0)
        second = plan_pilot_round(design, first)
        record = storage.get_collection("b")
        assert record.plans[1] == second
        pilot = combine_phases([first, storage.phase_support("b", 1)])
        assert record.plans[2] == plan_next_phase(design, pilot).plan


def test_an_unknown_reconstruction_is_refused_and_creates_nothing(tmp_path: Path) -> None:
    with _serving(tmp_path) as (address, storage):
        with AdminClient(address) as admin:
            kept = admin.create_collection(POP.schema, 1.0, POP.n, 3, collection_id="kept")
            message = r"^reconstruction \('nearest'\) must be one of \['local', 'global'\]$"
            for options in ({}, {"pilot": 0.0}, {"planner": "paper"}):
                with pytest.raises(CalmkitError, match=message):
                    admin.create_collection(
                        POP.schema,
                        1.0,
                        POP.n,
                        3,
                        collection_id="bad",
                        reconstruction="nearest",
                        **options,
                    )
            assert [c.collection_id for c in admin.list_collections()] == ["kept"]
            assert admin.get_collection("kept").plan == kept.plan
        request = client_wire.create_request(
            POP.schema, 1.0, POP.n, 3, collection_id="bad", reconstruction="x" * 100
        )
        stub = client_wire.aggregator_stub(open_channel(address))
        with pytest.raises(grpc.RpcError) as err:
            stub.CreateCollection(request, timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details() == (  # the value echoed bounded
            f"reconstruction ({'x' * 32!r}) must be one of ['local', 'global']"
        )
        assert [r.collection_id for r in storage.list_collections()] == ["kept"]
