"""Private defaults on the device: a persistent state unless the app opts out, and a
privacy ledger that refuses reports beyond the budget before any randomness is drawn."""

from __future__ import annotations

import hashlib
import hmac
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from calmkit_client import (
    DEFAULT_BUDGET,
    Attribute,
    BudgetExceeded,
    CalmkitError,
    DeviceState,
    Plan,
    PrivacyBudget,
    Schema,
    default_state_path,
)
from calmkit_client.device import STATE_ENV

SCHEMA = Schema((Attribute("a", ("x", "y", "z")), Attribute("b", ("p", "q"))))
RECORD = {"a": "y", "b": "q"}


def _plan(epsilon: float) -> Plan:
    return Plan(SCHEMA, epsilon, [["a", "b"]], seed=1)


def _codes(n: int) -> np.ndarray:
    return np.stack([np.arange(n) % 3, np.arange(n) % 2], axis=1)


# -- where the state lives -----------------------------------------------------------------
def test_default_state_persists_across_objects(device_state_path: Path) -> None:
    with DeviceState() as first:
        assert first.path == str(device_state_path)
        made = first.report_for("c", _plan(1.0), RECORD)
    assert device_state_path.is_file()
    with DeviceState() as again:  # the next launch: same pseudonym, same report
        assert again.report_for("c", _plan(1.0), RECORD) == made
        assert again.pseudonym("c") == made[0]


def test_default_path_is_the_per_user_state_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(STATE_ENV)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    path = default_state_path()
    assert path.name == "device-state.sqlite" and path.parent.name == "calmkit"
    assert str(tmp_path) in str(path)  # under the user's own folders, not a shared one
    monkeypatch.setenv(STATE_ENV, str(tmp_path / "mine.db"))
    assert default_state_path() == tmp_path / "mine.db"


def test_in_memory_is_an_explicit_opt_out(device_state_path: Path) -> None:
    with DeviceState.in_memory() as one, DeviceState.in_memory() as two:
        assert one.path is None
        assert one.pseudonym("c") != two.pseudonym("c")  # every object is a new user
    assert not device_state_path.exists()
    with DeviceState(None) as default:  # None is the default file, not memory
        assert default.path == str(device_state_path)


def test_memory_is_only_reachable_through_in_memory(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    with DeviceState(":memory:") as state:  # a file with that name, persistent
        assert state.path == str(tmp_path / ":memory:")
    assert (tmp_path / ":memory:").is_file()


# -- the budget ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"per_collection": 0.0}, r"per_collection \(0.0\) must be finite and > 0"),
        ({"total": float("inf")}, r"total \(inf\) must be finite and > 0"),
        ({"per_collection": "4"}, r"per_collection \('4'\) must be a finite number"),
        ({"per_collection": 5.0, "total": 4.0}, r"per_collection \(5.0\) must be <= total"),
    ],
)
def test_budget_is_validated_eagerly(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(CalmkitError, match=message):
        PrivacyBudget(**kwargs)  # type: ignore[arg-type]


def test_default_budget_is_documented_values() -> None:
    assert (DEFAULT_BUDGET.per_collection, DEFAULT_BUDGET.total) == (4.0, 10.0)


def test_a_plan_above_the_per_collection_cap_is_refused_before_any_draw(
    entropy_draws: list[int],
) -> None:
    with DeviceState.in_memory() as state:
        assert entropy_draws == [32]  # the new device's secret, drawn when it is opened
        entropy_draws.clear()
        cap = r"epsilon \(20.0\) of collection 'c' must be <= the per-collection cap \(4.0\)"
        with pytest.raises(BudgetExceeded, match=cap):
            state.report_for("c", _plan(20.0), RECORD)
        with pytest.raises(BudgetExceeded, match=r"epsilon \(4.5\)"):
            state.reports_for("c", _plan(4.5), _codes(3), [1, 2, 3])
        assert entropy_draws == []
        assert state.ledger() == {} and state.spent() == 0.0
        assert state.reports_for("c", _plan(4.0), _codes(3), [1, 2, 3])  # at the cap: fine


def test_the_total_budget_spans_collections_and_a_resend_spends_nothing() -> None:
    budget = PrivacyBudget(per_collection=2.0, total=5.0)
    with DeviceState.in_memory() as state:
        made = {c: state.report_for(c, _plan(2.0), RECORD, budget=budget) for c in "ab"}
        assert state.spent() == 4.0 and state.ledger() == {"a": 2.0, "b": 2.0}
        for c in "ab":  # re-sends: the stored report, nothing spent
            assert state.report_for(c, _plan(2.0), RECORD, budget=budget) == made[c]
        assert state.spent() == 4.0
        with pytest.raises(
            BudgetExceeded, match=r"the device's user has spent 4.0 of the total budget \(5.0\)"
        ):
            state.report_for("c", _plan(2.0), RECORD, budget=budget)
        state.report_for("c", _plan(1.0), RECORD, budget=budget)  # exactly 5: allowed
        assert state.spent() == 5.0
        with pytest.raises(BudgetExceeded):
            state.report_for("d", _plan(0.01), RECORD, budget=budget)
        assert set(state.ledger()) == {"a", "b", "c"}


def test_users_on_one_device_have_separate_ledgers() -> None:
    budget = PrivacyBudget(per_collection=3.0, total=3.0)
    with DeviceState.in_memory() as state:
        state.report_for("a", _plan(3.0), RECORD, "alice", budget)
        with pytest.raises(BudgetExceeded, match=r"user 'alice' has spent 3.0"):
            state.report_for("b", _plan(1.0), RECORD, "alice", budget)
        state.report_for("b", _plan(3.0), RECORD, "bob", budget)
        state.report_for("b", _plan(3.0), RECORD, None, budget)  # the device's own user
        assert state.ledger("alice") == {"a": 3.0}
        assert state.ledger("bob") == {"b": 3.0} and state.ledger() == {"b": 3.0}
        assert state.ledger("carol") == {}


def test_ledger_keys_are_the_documented_keyed_hash(tmp_path: Path) -> None:
    with DeviceState(tmp_path / "d.db") as state:
        state.report_for("c", _plan(1.0), RECORD, "alice")
        state.report_for("c", _plan(1.0), RECORD)
    with sqlite3.connect(tmp_path / "d.db") as conn:
        (secret,) = conn.execute("SELECT secret FROM device").fetchone()
        keys = {k for (k,) in conn.execute("SELECT ledger_key FROM ledger")}
    head = b"calmkit/ledger/v1\0"
    mac = lambda m: hmac.new(secret, m, hashlib.sha256).digest()[:16]  # noqa: E731
    assert keys == {mac(head), mac(head + b"\0alice")}


def test_bulk_refusal_stores_nothing_and_names_the_user() -> None:
    budget = PrivacyBudget(per_collection=2.0, total=2.0)
    with DeviceState.in_memory() as state:
        state.report_for("a", _plan(2.0), RECORD, 7, budget)
        with pytest.raises(BudgetExceeded, match=r"user 7 has spent 2.0 of the total"):
            state.reports_for("b", _plan(1.0), _codes(10), list(range(10)), budget)
        for u in range(10):  # all or nothing
            assert state.ledger(u) == ({"a": 2.0} if u == 7 else {})
        others = [u for u in range(10) if u != 7]
        items = state.reports_for("b", _plan(1.0), _codes(9), others, budget)
        assert len(items) == 9 and state.ledger(3) == {"b": 1.0}


def test_forget_keeps_the_charge(entropy_draws: list[int]) -> None:
    budget = PrivacyBudget(per_collection=2.0, total=10.0)
    with DeviceState.in_memory() as state:
        state.report_for("c", _plan(1.5), RECORD, budget=budget)
        state.forget("c")
        with pytest.raises(BudgetExceeded, match=r"has spent 1.5 in collection 'c'"):
            state.report_for("c", _plan(1.0), RECORD, budget=budget)
        state.report_for("c", _plan(0.5), RECORD, budget=budget)
        assert state.ledger() == {"c": 2.0}


# -- format 1 files -----------------------------------------------------------------------
def _format_1_file(path: Path, secret: bytes, rows: list[tuple[str, bytes]]) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TABLE device (id INTEGER PRIMARY KEY CHECK (id = 1), "
            "secret BLOB NOT NULL CHECK (length(secret) = 32))"
        )
        conn.execute(
            "CREATE TABLE reports (collection_id TEXT NOT NULL, pseudonym BLOB NOT NULL "
            "CHECK (length(pseudonym) = 16), plan_digest TEXT NOT NULL, view INTEGER NOT NULL, "
            "payload NOT NULL, report_id BLOB NOT NULL CHECK (length(report_id) = 16), "
            "PRIMARY KEY (collection_id, pseudonym)) WITHOUT ROWID"
        )
        conn.execute("INSERT INTO device VALUES (1, ?)", (secret,))
        for cid, pseudonym in rows:
            conn.execute(
                "INSERT INTO reports VALUES (?, ?, ?, 0, 1, ?)",
                (cid, pseudonym, _plan(1.0).digest, bytes(16)),
            )
        conn.execute("PRAGMA application_id=1667329133")
        conn.execute("PRAGMA user_version=1")


def test_format_1_files_are_migrated_and_old_reports_charged_at_the_cap(tmp_path: Path) -> None:
    secret = bytes(range(32))
    head = b"calmkit/pseudonym/v1\0"
    mac = lambda m: hmac.new(secret, m, hashlib.sha256).digest()[:16]  # noqa: E731
    rows = [(c, mac(head + c.encode())) for c in ("s1", "s2")]  # the device's own user
    rows.append(("s3", mac(head + b"s3\0alice")))  # a named user: not attributable yet
    path = tmp_path / "old.db"
    _format_1_file(path, secret, rows)
    budget = PrivacyBudget(per_collection=4.0, total=10.0)
    with DeviceState(path) as state:
        assert state.ledger() == {"s1": None, "s2": None}  # amount unknown
        assert state.spent() == 0.0
        with pytest.raises(BudgetExceeded, match=r"has spent 8.0 of the total budget \(10.0\)"):
            state.report_for("new", _plan(2.5), RECORD, budget=budget)  # 2 x 4 (cap) + 2.5
        state.report_for("new", _plan(2.0), RECORD, budget=budget)
        # alice's old report is recognised (and charged) once she is seen there
        assert state.ledger("alice") == {}
        pseudonym, stored = state.report_for("s3", _plan(1.0), RECORD, "alice", budget)
        assert pseudonym == rows[2][1] and stored.report_id == bytes(16)
        assert state.ledger("alice") == {"s3": None}
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 2
