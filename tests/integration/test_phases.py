"""A collection with a pilot phase, end to end over gRPC with the real client: the plan
a client fetches changes once the pilot has its reports, every user still reports
once (a device that reported in the pilot keeps its report), answers use both phases,
and a restart keeps the phases."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from calmkit_aggregator import reconstruct
from calmkit_aggregator.pilot import pilot_size
from calmkit_aggregator.service.admin import AdminClient
from calmkit_aggregator.service.server import create_server, graceful_stop
from calmkit_aggregator.service.storage import Storage
from calmkit_client.collector import Collector
from calmkit_client.device import DeviceState
from calmkit_simulator import synthetic_population

POP = synthetic_population(n=6000, sizes=(2, 3, 2, 2, 4), strength=1.5)
IDS = np.arange(POP.n, dtype=np.uint64)


def test_the_plan_changes_after_the_pilot_and_users_report_once(tmp_path: Path) -> None:
    storage = Storage(tmp_path / "agg.db")
    server, port = create_server("127.0.0.1:0", storage)
    address = f"127.0.0.1:{port}"
    try:
        with AdminClient(address) as admin:
            info = admin.create_collection(POP.schema, 1.0, POP.n, 3, collection_id="p",
                                           seed=5, pilot=0.1)  # fmt: skip
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
    finally:
        graceful_stop(server, 2.0)
        storage.close()
    with Storage(tmp_path / "agg.db") as reopened:  # restart: both phases and counts
        record = reopened.get_collection("p")
        assert record.plans == (pilot_plan, current)
        assert record.phase_reports == (target, POP.n - target)


def test_paper_planner_and_no_pilot_make_one_phase(tmp_path: Path) -> None:
    storage = Storage(tmp_path / "agg.db")
    server, port = create_server("127.0.0.1:0", storage)
    try:
        with AdminClient(f"127.0.0.1:{port}") as admin:
            paper = admin.create_collection(POP.schema, 1.0, POP.n, 3, collection_id="a",
                                            planner="paper")  # fmt: skip
            single = admin.create_collection(POP.schema, 1.0, POP.n, 3, collection_id="b",
                                             pilot=0.0)  # fmt: skip
        assert paper.pilot_target == single.pilot_target == 0
        assert paper.phase == single.phase == 0
    finally:
        graceful_stop(server, 2.0)
        storage.close()
