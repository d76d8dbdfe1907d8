"""Device state: per-collection pseudonyms and memoised reports (one report per user
per collection, never a second one on retry or restart)."""

from __future__ import annotations

import hashlib
import hmac
import os
import pickle
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import calmkit_client.device as device
from calmkit_client import CalmkitError, Plan, Report, make_reports
from calmkit_client.device import PSEUDONYM_BYTES, DeviceError, DeviceState
from tests.client.survey import PLAN, RECORD, SCHEMA

OTHER_PLAN = Plan(SCHEMA, 2.0, [["age", "smoker"], ["region", "income"]], seed=9)


def _user_in(view: int, state: DeviceState) -> str:
    """A user id whose pseudonym on ``state`` is assigned to ``view``."""
    return next(f"u{i}" for i in range(1000) if PLAN.assign(state.pseudonym("c", f"u{i}")) == view)


def _rows(path: Path) -> list[tuple[object, ...]]:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT * FROM reports ORDER BY collection_id, pseudonym").fetchall()


def _codes(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack([rng.integers(0, s, n) for s in SCHEMA.sizes], axis=1)


# -- pseudonyms ---------------------------------------------------------------------------
def test_pseudonyms_are_stable_per_file_and_differ_per_collection(tmp_path: Path) -> None:
    path = tmp_path / "state" / "device.db"  # the parent folder is created too
    with DeviceState(path) as state:
        a = state.pseudonym("flu-2024")
        a_user = state.pseudonym("flu-2024", "alice")
        b = state.pseudonym("sleep-2024")
        assert len(a) == len(a_user) == len(b) == PSEUDONYM_BYTES == 16
        assert len({a, a_user, b, state.pseudonym("flu-2024", "bob")}) == 4
        assert state.pseudonym("flu-2024", "") != a  # the empty id is not "no id"
    with DeviceState(str(path)) as again:
        assert again.pseudonym("flu-2024") == a
        assert again.pseudonym("flu-2024", "alice") == a_user
        assert again.pseudonym("sleep-2024") == b


def test_two_devices_have_unrelated_pseudonyms(tmp_path: Path) -> None:
    with DeviceState(tmp_path / "a.db") as one, DeviceState(tmp_path / "b.db") as two:
        assert one.pseudonym("flu-2024") != two.pseudonym("flu-2024")
        assert one.pseudonym("flu-2024", 7) != two.pseudonym("flu-2024", 7)


def test_the_secret_comes_from_the_entropy_source_once(
    tmp_path: Path, seeded_entropy: Callable[[int], None], entropy_draws: list[int]
) -> None:
    # drawn through OsEntropy (so a seeded test reproduces a device's views), only for
    # a new file: reopening draws nothing and keeps it
    seeded_entropy(4)
    with DeviceState(tmp_path / "a.db") as one:
        assert entropy_draws == [32]
        mine = one.pseudonym("flu-2024")
    with DeviceState(tmp_path / "a.db") as again:
        assert again.pseudonym("flu-2024") == mine and entropy_draws == [32]
    seeded_entropy(4)
    with DeviceState.in_memory() as twin:
        assert twin.pseudonym("flu-2024") == mine


def test_pseudonym_is_the_documented_keyed_hash(tmp_path: Path) -> None:
    path = tmp_path / "device.db"
    with DeviceState(path) as state:
        own, alice, num = (
            state.pseudonym("c-1"),
            state.pseudonym("c-1", "alice"),
            state.pseudonym("c-1", 5),
        )
    with sqlite3.connect(path) as conn:
        (secret,) = conn.execute("SELECT secret FROM device").fetchone()
    assert isinstance(secret, bytes) and len(secret) == 32

    def mac(msg: bytes) -> bytes:
        return hmac.new(secret, msg, hashlib.sha256).digest()[:16]

    head = b"calmkit/pseudonym/v1\0c-1"
    assert own == mac(head)
    assert alice == mac(head + b"\0alice")
    assert num == mac(head + b"\0" + (5).to_bytes(8, "little"))


def test_bad_collection_ids_and_paths_are_named(tmp_path: Path) -> None:
    with DeviceState.in_memory() as state:
        rule = "must be 1-64 characters from A-Z a-z 0-9 . _ - starting with a letter or digit"
        with pytest.raises(DeviceError, match=rf"collection_id \(''\) {rule}"):
            state.pseudonym("")
        with pytest.raises(DeviceError, match=r"collection_id \(3\) must be a str"):
            state.report_for(3, PLAN, RECORD, "u")  # type: ignore[arg-type]
        with pytest.raises(DeviceError, match=rf"collection_id \('a\\x00b'\) {rule}"):
            state.forget("a\0b")
        with pytest.raises(DeviceError, match=r"plan \(dict\) must be a Plan"):
            state.report_for("c", {}, RECORD, "u")  # type: ignore[arg-type]
        with pytest.raises(CalmkitError, match=r"user_id \(-1\)"):
            state.pseudonym("c", -1)
    with pytest.raises(DeviceError, match=r"path \(''\)"):
        DeviceState("")


def test_a_foreign_file_is_refused_and_left_alone(tmp_path: Path) -> None:
    other = tmp_path / "app.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE notes (x)")
    with pytest.raises(DeviceError, match="must be a calmkit device-state file"):
        DeviceState(other)
    with sqlite3.connect(other) as conn:
        tables = conn.execute("SELECT name FROM sqlite_master").fetchall()
    assert tables == [("notes",)]
    text = tmp_path / "notes.txt"
    text.write_text("not a database at all, just some text that is long enough" * 20)
    with pytest.raises(DeviceError, match="cannot be opened"):
        DeviceState(text)


@pytest.mark.skipif(os.name != "posix", reason="file modes are POSIX")
def test_state_file_is_private(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        path = tmp_path / "new" / "device.db"
        with DeviceState(path) as state:
            state.report_for("c", PLAN, RECORD, "alice")
            for p in [path, *tmp_path.glob("new/device.db-*")]:  # -wal, -shm too
                assert p.stat().st_mode & 0o777 == 0o600, p
        assert (tmp_path / "new").stat().st_mode & 0o777 == 0o700
    finally:
        os.umask(old)


# -- memoised reports ---------------------------------------------------------------------
def test_report_for_returns_the_stored_report_and_draws_nothing(
    tmp_path: Path, entropy_draws: list[int]
) -> None:
    path = tmp_path / "device.db"
    with DeviceState(path) as state:
        pseudonym, first = state.report_for("flu", PLAN, RECORD, "alice")  # OS entropy
        assert pseudonym == state.pseudonym("flu", "alice")
        assert entropy_draws
        entropy_draws.clear()
        other_record = {"age": "<30", "smoker": "no", "region": "N", "income": "q0"}
        assert state.report_for("flu", PLAN, other_record, "alice") == (pseudonym, first)
        assert entropy_draws == []
    with DeviceState(path) as state:  # a restart
        again = state.report_for("flu", PLAN, RECORD, "alice")
        assert again == (pseudonym, first)
        assert again[1].report_id == first.report_id and again[1].payload == first.payload
        assert entropy_draws == []
    assert len(_rows(path)) == 1


def test_a_report_is_durable_without_close(tmp_path: Path) -> None:
    path = tmp_path / "device.db"
    script = (
        "import os, sys, pickle\n"
        "from calmkit_client.device import DeviceState\n"
        "from tests.client.survey import PLAN, RECORD\n"
        "state = DeviceState(sys.argv[1])\n"
        "p, r = state.report_for('flu', PLAN, RECORD, 'alice')\n"
        "sys.stdout.write(pickle.dumps((p, r)).hex())\n"
        "sys.stdout.flush()\n"
        "os._exit(0)\n"  # no close, no cleanup
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", script, str(path)],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    made = pickle.loads(bytes.fromhex(out))
    with DeviceState(path) as state:
        assert state.report_for("flu", PLAN, RECORD, "alice") == made


@pytest.mark.parametrize("view", [0, 1, 2])  # GRR, OUE, OUE
def test_reports_pass_the_plan_check_and_survive_storage(tmp_path: Path, view: int) -> None:
    path = tmp_path / "device.db"
    with DeviceState(path) as state:
        user = _user_in(view, state)
        _, report = state.report_for("c", PLAN, RECORD, user)
    assert report.view == view and report.plan_digest == PLAN.digest
    report.check(PLAN)
    assert isinstance(report.payload, int if PLAN.oracle(view).name == "GRR" else bytes)
    with DeviceState(path) as state:
        stored = state.report_for("c", PLAN, RECORD, user)[1]
    assert stored == report and type(stored.payload) is type(report.payload)
    stored.check(PLAN)


def test_a_stored_report_outlives_a_new_phase_plan(
    tmp_path: Path, entropy_draws: list[int]
) -> None:
    # a collection that moved on to another phase's plan gets the stored report back:
    # no second report, no randomness drawn
    path = tmp_path / "device.db"
    with DeviceState(path) as state:
        _, report = state.report_for("c", PLAN, RECORD, "alice")
        entropy_draws.clear()
        again = state.report_for("c", OTHER_PLAN, RECORD, "alice")
        assert again == (state.pseudonym("c", "alice"), report)
        assert again[1].plan_digest == PLAN.digest != OTHER_PLAN.digest
        assert entropy_draws == []
    assert len(_rows(path)) == 1


def test_own_user_is_assigned_by_its_pseudonym() -> None:
    with DeviceState.in_memory() as state:
        pseudonym, report = state.report_for("c", PLAN, RECORD)
        assert pseudonym == state.pseudonym("c")
        assert report.view == PLAN.assign(pseudonym)
        assert state.report_for("c", PLAN, RECORD, None) == (pseudonym, report)
    views = []
    for _ in range(60):  # fresh devices spread over the views
        with DeviceState.in_memory() as state:
            views.append(state.report_for("c", PLAN, RECORD)[1].view)
    assert set(views) == {0, 1, 2}


def test_in_memory_state_memoises_until_closed() -> None:
    state = DeviceState.in_memory()
    assert state.path is None and "in memory" in repr(state)
    pseudonym, report = state.report_for("c", PLAN, RECORD, "alice")
    assert state.report_for("c", PLAN, RECORD, "alice") == (pseudonym, report)
    state.close()
    state.close()  # idempotent
    assert state.closed and "closed" in repr(state)
    for call in (
        lambda: state.pseudonym("c"),
        lambda: state.report_for("c", PLAN, RECORD, "alice"),
        lambda: state.reports_for("c", PLAN, _codes(2, 0), [1, 2]),
        lambda: state.forget("c"),
    ):
        with pytest.raises(DeviceError, match=r"device state \(in memory\) is closed"):
            call()
    with DeviceState.in_memory() as fresh:
        assert fresh.pseudonym("c", "alice") != pseudonym
        assert fresh.report_for("c", PLAN, RECORD, "alice")[1].report_id != report.report_id


def test_forget_drops_one_collections_reports(tmp_path: Path, entropy_draws: list[int]) -> None:
    path = tmp_path / "device.db"
    with DeviceState(path) as state:
        _, a = state.report_for("c", PLAN, RECORD, "alice")
        _, keep = state.report_for("d", PLAN, RECORD, "alice")
        state.reports_for("c", PLAN, _codes(5, 1), list(range(5)))
        state.forget("c")
        state.forget("never-seen")
        assert [r[0] for r in _rows(path)] == ["d"]
        assert state.report_for("d", PLAN, RECORD, "alice") == (state.pseudonym("d", "alice"), keep)
        entropy_draws.clear()
        _, b = state.report_for("c", PLAN, RECORD, "alice")
        assert entropy_draws and b.report_id != a.report_id
    with DeviceState.in_memory() as memory:
        memory.report_for("c", PLAN, RECORD, "alice")
        memory.forget("c")
        entropy_draws.clear()
        memory.report_for("c", PLAN, RECORD, "alice")
        assert entropy_draws


def test_threads_share_one_state_and_get_one_report(tmp_path: Path) -> None:
    path = tmp_path / "device.db"
    with DeviceState(path) as state, DeviceState(path) as second_handle:
        results: list[tuple[bytes, Report]] = []

        def work(s: DeviceState) -> None:
            for _ in range(20):
                results.append(s.report_for("c", PLAN, RECORD, "alice"))

        threads = [threading.Thread(target=work, args=(s,)) for s in [state, second_handle] * 4]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(results) == 160 and len(set(results)) == 1
    assert len(_rows(path)) == 1


# -- bulk ---------------------------------------------------------------------------------
def test_reports_for_returns_stored_reports_and_makes_the_rest(
    tmp_path: Path, seeded_entropy: Callable[[int], None], entropy_draws: list[int]
) -> None:
    path = tmp_path / "device.db"
    n = 3000
    codes = _codes(n, 1)
    ids = np.arange(n, dtype=np.uint64) * 7919 + 3
    with DeviceState(path) as state:
        earlier = {
            i: state.report_for("c", PLAN, SCHEMA.decode_record(codes[i]), int(ids[i]))
            for i in (0, 5, 17, 2999)
        }
        seeded_entropy(11)  # the device's "OS entropy" is now default_rng(11)'s words
        items = state.reports_for("c", PLAN, codes, ids)
        assert len(items) == n
        for i, item in earlier.items():
            assert items[i] == item
        assert [p for p, _ in items] == [state.pseudonym("c", int(u)) for u in ids]  # order
        keys = np.frombuffer(b"".join(p for p, _ in items), np.uint8).reshape(n, 16)
        views = PLAN.assign_many(keys)  # the pseudonyms pick the views, not the user ids
        assert [r.view for _, r in items] == views.tolist()
        assert views.tolist() == [PLAN.assign(p) for p, _ in items]
        assert views.tolist() != PLAN.assign_many(ids).tolist()
        for _, r in items[:50]:
            r.check(PLAN)
        assert len({r.report_id for _, r in items}) == n
        # the new ones are make_reports' output for the new users (vectorised, same words)
        new = np.array(sorted(set(range(n)) - set(earlier)))
        expected: dict[int, Report] = {}
        for batch in make_reports(PLAN, codes[new], keys[new], np.random.default_rng(11)):
            for k, row in enumerate(batch.rows):
                payload = batch.payloads[k]
                expected[int(new[row])] = Report(
                    PLAN.digest,
                    batch.view,
                    int(payload) if payload.ndim == 0 else payload.tobytes(),
                    batch.report_ids[k].tobytes(),
                )
        assert all(items[i][1] == expected[i] for i in new.tolist())
    # asking again (also as lists, also after a restart) draws nothing and returns the same
    entropy_draws.clear()
    with DeviceState(path) as state:
        assert state.reports_for("c", PLAN, codes.tolist(), ids.tolist()) == items
        assert state.reports_for("c", PLAN, codes, ids) == items
        assert entropy_draws == []
        assert state.report_for("c", PLAN, RECORD, int(ids[100])) == items[100]
    assert len(_rows(path)) == n


def test_reports_for_does_not_loop_over_the_oracle(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("make_report called per user")

    monkeypatch.setattr(device, "make_report", refuse)
    with DeviceState.in_memory() as state:
        assert len(state.reports_for("c", PLAN, _codes(200, 2), list(range(200)))) == 200


def test_reports_for_accepts_records_and_repeated_users() -> None:
    records = [
        RECORD,
        {"age": "<30", "smoker": "no", "region": "N", "income": "q0"},
        {"age": "30-49", "smoker": "no", "region": "C", "income": "q3"},
    ]
    with DeviceState.in_memory() as state:
        items = state.reports_for("c", PLAN, records, ["a", "b", "a"])
        assert items[0] == items[2] and items[0] != items[1]
        assert state.report_for("c", PLAN, records[2], "a") == items[0]
        assert state.reports_for("c", PLAN, [], []) == []
        assert state.reports_for("c", PLAN, np.empty((0, 4), dtype=np.int64), []) == []


def test_reports_for_under_a_new_phase_plan_keeps_stored_reports(tmp_path: Path) -> None:
    path = tmp_path / "device.db"
    with DeviceState(path) as state:
        _, first = state.report_for("c", PLAN, RECORD, 3)
        items = state.reports_for("c", OTHER_PLAN, _codes(10, 3), list(range(10)))
    assert items[3][1] == first and first.plan_digest == PLAN.digest
    others = [r for i, (_, r) in enumerate(items) if i != 3]
    assert all(r.plan_digest == OTHER_PLAN.digest for r in others)
    assert len(_rows(path)) == 10


def test_reports_for_bad_input_is_named_and_stores_nothing(entropy_draws: list[int]) -> None:
    with DeviceState.in_memory() as state:
        with pytest.raises(DeviceError, match=r"user_ids \(3 given\) must match the records \(4\)"):
            state.reports_for("c", PLAN, _codes(4, 0), [1, 2, 3])
        bad = _codes(4, 0)
        bad[2, 3] = 10
        with pytest.raises(CalmkitError, match="income"):
            state.reports_for("c", PLAN, bad, [1, 2, 3, 4])
        with pytest.raises(DeviceError, match="a mix of mappings"):
            state.reports_for("c", PLAN, [RECORD, [0, 0, 0, 0]], [1, 2])
        with pytest.raises(CalmkitError, match="region"):
            state.reports_for("c", PLAN, [RECORD, {**RECORD, "region": "X"}], [1, 2])
        entropy_draws.clear()
        state.report_for("c", PLAN, RECORD, 1)  # nothing was stored for user 1: a new report
        assert entropy_draws
