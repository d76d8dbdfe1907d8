"""The device side against a real server: a plan whose epsilon the device's budget
does not allow is refused before anything is made or sent; the default state makes a
relaunched app re-send its one report; the device API takes no seed."""

from __future__ import annotations

import numpy as np
import pytest

from calmkit_aggregator.service.admin import AdminClient
from calmkit_client import BudgetExceeded, CalmkitError, Collector, DeviceState, PrivacyBudget
from calmkit_simulator import synthetic_population
from tests.integration.servers import Server

POP = synthetic_population(n=400, sizes=(2, 3, 2), strength=1.0, rng=4)


@pytest.fixture
def address(server: Server) -> str:
    return server.address


def _create(address: str, cid: str, epsilon: float) -> str:
    with AdminClient(address) as admin:
        info = admin.create_collection(
            POP.schema, epsilon, POP.n, 2, collection_id=cid, seed=1, pilot=0.0
        )
    return info.submit_token


def test_a_plan_with_epsilon_20_is_refused_and_nothing_is_sent(
    address: str, entropy_draws: list[int]
) -> None:
    token = _create(address, "greedy", 20.0)
    record = POP.schema.decode_record(POP.codes[0])
    with Collector(address, "greedy", token) as client:
        assert client.plan().epsilon == 20.0
        with pytest.raises(BudgetExceeded, match=r"epsilon \(20.0\) of collection 'greedy'"):
            client.submit(record)
        with pytest.raises(BudgetExceeded, match=r"epsilon \(20.0\)"):
            client.submit_many(POP.codes[:10], np.arange(10))
    assert entropy_draws == [32]  # the new device's secret only: no report was even made
    with AdminClient(address) as admin:
        assert admin.get_collection("greedy").reports == 0
    with DeviceState() as state:
        assert state.ledger() == {}


def test_the_budget_is_configurable_and_spans_collections(address: str) -> None:
    tokens = {c: _create(address, c, 2.0) for c in ("one", "two", "three")}
    record = POP.schema.decode_record(POP.codes[0])
    budget = PrivacyBudget(per_collection=2.0, total=4.0)
    for cid in ("one", "two"):
        with Collector(address, cid, tokens[cid], budget=budget) as client:
            assert client.submit(record).accepted == 1
    with Collector(address, "three", tokens["three"], budget=budget) as client:
        with pytest.raises(BudgetExceeded, match=r"spent 4.0 of the total budget \(4.0\)"):
            client.submit(record)
    with Collector(address, "one", tokens["one"], budget=budget) as client:
        ack = client.submit(record)  # a relaunch re-sends the stored report: spends nothing
        assert (ack.accepted, ack.duplicates) == (0, 1)
    with DeviceState() as state:
        assert state.ledger() == {"one": 2.0, "two": 2.0}


def test_relaunched_apps_without_a_state_argument_report_once(address: str) -> None:
    token = _create(address, "launches", 1.0)
    record = POP.schema.decode_record(POP.codes[1])
    acks = []
    for _ in range(4):  # four launches of an app that passes no state
        with Collector(address, "launches", token) as client:
            acks.append(client.submit(record))
    assert [(a.accepted, a.duplicates) for a in acks] == [(1, 0), (0, 1), (0, 1), (0, 1)]
    with AdminClient(address) as admin:
        assert admin.get_collection("launches").reports == 1


def test_the_collector_takes_no_seed(address: str) -> None:
    token = _create(address, "seeds", 1.0)
    record = POP.schema.decode_record(POP.codes[2])
    with Collector(address, "seeds", token, state=DeviceState.in_memory()) as client:
        with pytest.raises(TypeError):
            client.submit(record, None, 3)  # type: ignore[call-arg]
        with pytest.raises(TypeError):
            client.submit(record, rng=np.random.default_rng(3))  # type: ignore[call-arg]
        with pytest.raises(CalmkitError, match=r"progress \(int\) must be callable"):
            client.submit_many(POP.codes[:5], np.arange(5), 3)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            client.submit_many(POP.codes[:5], np.arange(5), rng=3)  # type: ignore[call-arg]
    with AdminClient(address) as admin:
        assert admin.get_collection("seeds").reports == 0
    with pytest.raises(CalmkitError, match=r"budget \(float\) must be a PrivacyBudget"):
        Collector(address, "seeds", token, budget=4.0)  # type: ignore[arg-type]
