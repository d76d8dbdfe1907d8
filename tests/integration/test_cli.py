"""The ``calmkit`` command line, run in process (and the demo also as a process, for
its pipe and ^C behaviour)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from calmkit_client.cli import main


def test_demo_json_counts_every_acknowledged_report(capsys: pytest.CaptureFixture[str]) -> None:
    from calmkit_aggregator.planning.pilot import start_pilot
    from calmkit_simulator.demo_cli import DEMO_QUERIES
    from calmkit_simulator.synthetic import demo_population

    # the main job as CI runs it (100,000 users)
    assert main(["demo", "--json"]) == 0
    pop = demo_population(100_000, rng=0)
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"users", "epsilon", "seed", "acknowledged", "counted", "phases", "queries"}
    assert out["acknowledged"] == out["counted"] == 100_000
    # a pilot of 20% of the expected users, then the main phase's views
    first, second, main_phase = out["phases"]  # the pilot in two rounds, then the rest
    assert first["reports"] >= 10_000 and first["reports"] + second["reports"] >= 20_000
    assert sum(p["reports"] for p in out["phases"]) == 100_000
    expected = start_pilot(pop.schema, 1.0, 100_000).plan  # the server's first round
    assert first["views"] == expected.m and main_phase["views"] >= 1
    assert [len(q["attrs"]) for q in out["queries"]] == [len(q) for q in DEMO_QUERIES]
    uniform = [((pop.marginal(q) - 1 / pop.marginal(q).size) ** 2).sum() for q in DEMO_QUERIES]
    assert np.mean([q["sse"] for q in out["queries"]]) < np.mean(uniform)
    # every table, labelled: the cells' true values are the population's marginal
    for q, query in zip(DEMO_QUERIES, out["queries"]):
        truth = pop.marginal(q)
        assert len(query["cells"]) == truth.size
        first, last = query["cells"][0], query["cells"][-1]
        assert first["labels"] == ["0"] * len(q) and first["true"] == pytest.approx(truth.flat[0])
        assert last["true"] == pytest.approx(truth.flat[-1])
        est = np.array([c["estimate"] for c in query["cells"]])
        assert est.sum() == pytest.approx(1.0) and all(c["total_error"] > 0 for c in query["cells"])


def test_demo_is_repeatable_with_seed(capsys: pytest.CaptureFixture[str]) -> None:
    runs = []
    for seed in (5, 5, 6):
        assert main(["demo", "--users", "6000", "--seed", str(seed), "--json"]) == 0
        runs.append(json.loads(capsys.readouterr().out)["queries"])
    assert runs[0] == runs[1]  # estimates, standard errors, everything
    assert runs[0] != runs[2]


def test_demo_text_labels_its_tables(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--users", "6000"]) == 0
    text = capsys.readouterr().out
    assert "'projection' sums down a view" in text and "'maxent' (no view holds them all)" in text
    assert "a0 x a1:" in text and "a0  a1    true  estimate  total.err" in text
    assert "Uniform" in text


@pytest.mark.parametrize(
    ("sse", "uniform", "words"),
    [
        (1e-3, 1.89e-2, "Uniform's error is 19x the estimate's"),
        (1e-3, 1.3e-3, "Uniform's error is 1.3x the estimate's"),
        (1e-3, 1e-3, "Uniform's error is 1.0x the estimate's"),
        (2e-3, 1e-3, "the estimate's error is 2.0x Uniform's: it does worse than knowing nothing"),
        (0.0, 1e-3, "the estimate is exact"),
    ],
)
def test_demo_compares_with_uniform_in_words_that_cannot_be_misread(
    sse: float, uniform: float, words: str
) -> None:
    from calmkit_simulator.demo_cli import compare_to_uniform

    assert compare_to_uniform(sse, uniform) == words


def test_demo_piped_shows_its_stages_as_they_happen(tmp_path: Path) -> None:
    """Off a terminal, the stages and the report count go to stderr as they happen,
    each line flushed (a reader of the pipe sees the first before the run ends)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "calmkit_client.cli", "demo", "--users", "6000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    first = proc.stderr.readline() if proc.stderr else ""
    assert proc.poll() is None  # the run is still going when its first line arrives
    assert first.startswith("calmkit demo: server on 127.0.0.1:")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0
    assert "calmkit demo: 6000 reports acknowledged; answering the queries" in err
    assert "8 views of 1 attribute\n" in out  # not "of 1 attributes"


DEMO_PILOT = 20_000  # the demo's 100,000 users: 20% report in the pilot
# the demo's pilot reports in two rounds (its first half measures pairs): the main
# phase is phase 2
DEMO_MAIN = 2


def test_the_demos_pilot_takes_two_rounds() -> None:
    from calmkit_aggregator.planning.pilot import start_pilot
    from calmkit_client import Schema
    from calmkit_simulator.synthetic import DEMO_SIZES

    pilot = start_pilot(Schema.from_sizes(DEMO_SIZES), 1.0, 100_000)
    assert (pilot.reports, pilot.first_round) == (DEMO_PILOT, DEMO_PILOT // 2)


def _demo_db_state(tmp: Path) -> tuple[dict[int, int], int] | None:
    """(reports per phase, phases planned after the first) in the running demo's
    temporary database (read-only; None until it exists)."""
    import sqlite3

    found = list(tmp.glob("calmkit-demo-*/aggregator.db"))
    if not found:
        return None
    try:
        with sqlite3.connect(f"file:{found[0]}?mode=ro", uri=True, timeout=0.1) as conn:
            rows = dict(conn.execute("SELECT phase, SUM(count) FROM batches GROUP BY phase"))
            planned = conn.execute("SELECT COUNT(*) FROM phases").fetchone()[0]
    except sqlite3.Error:  # not created yet, or busy: ask again
        return None
    return {int(p): int(c) for p, c in rows.items()}, int(planned)


def _pilot_reports(db: tuple[dict[int, int], int]) -> int:
    return sum(c for p, c in db[0].items() if p < DEMO_MAIN)


# when to press ^C: each test waits until the demo is at that point, then signals
INTERRUPT_POINTS = {
    "pilot": lambda db, err: db is not None and 0 < _pilot_reports(db) < DEMO_PILOT,
    "planning": lambda db, err: (
        db is not None and _pilot_reports(db) >= DEMO_PILOT and db[1] < DEMO_MAIN
    ),
    "main phase": lambda db, err: (
        db is not None and db[1] >= DEMO_MAIN and 0 < db[0].get(DEMO_MAIN, 0) < 60_000
    ),
    "queries": lambda db, err: "answering the queries" in err,
}


def _interrupt_demo(tmp_path: Path, point: str) -> tuple[float, str, str, int]:
    """Run the demo, press ^C at ``point``; (seconds from the signal to exit, stdout,
    stderr, exit status)."""
    import os
    import threading

    proc = subprocess.Popen(
        [sys.executable, "-m", "calmkit_client.cli", "demo"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        # as from a terminal: a shell without job control starts background commands
        # with ^C ignored, and an ignored signal stays ignored across exec
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    lines: list[str] = []
    assert proc.stderr is not None
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)  # type: ignore[arg-type]
    reader.start()
    deadline = time.monotonic() + 120
    while not INTERRUPT_POINTS[point](_demo_db_state(tmp_path), "".join(lines)):
        assert proc.poll() is None, f"the demo ended before {point}: {''.join(lines)}"
        assert time.monotonic() < deadline, f"the demo never reached {point}"
        time.sleep(0.02)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=30)
    seconds = time.monotonic() - t0
    out = proc.stdout.read() if proc.stdout else ""
    reader.join(timeout=5)
    return seconds, out, "".join(lines), proc.returncode


@pytest.mark.parametrize("point", list(INTERRUPT_POINTS))
def test_demo_interrupted_exits_within_a_second_and_keeps_nothing(
    tmp_path: Path, point: str
) -> None:
    seconds, out, err, status = _interrupt_demo(tmp_path, point)
    assert status == 130, err
    assert seconds < 1.0, f"^C during the {point}: exited {seconds:.2f} s after the signal"
    assert "interrupted; nothing is kept" in err and "Traceback" not in err
    assert out == ""
    assert list(tmp_path.iterdir()) == []  # the temporary database is gone


def test_population_describes_own_csv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "mine.csv"
    path.write_text("a,b\nx,1\ny,2\nx,2\n")
    assert main(["population", "--dataset", f"csv:{path}", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["n"] == 3 and out["sizes"] == [2, 2]


def test_a_mostly_empty_column_is_warned_of_and_can_be_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "survey.csv"
    path.write_text("a,b\n" + "".join(f"{'xy'[i % 2]},{'1' if i < 3 else ''}\n" for i in range(30)))
    assert main(["population", "--dataset", f"csv:{path}"]) == 0
    captured = capsys.readouterr()
    assert "warning: 27 of 30 CSV rows were dropped for empty fields ('b' empty" in captured.err
    assert "survey: n=3," in captured.out
    assert main(["population", "--dataset", f"csv:{path}", "--missing", "category", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["n"] == 30 and out["sizes"] == [2, 2] and out["warnings"] == []


def test_population_abbreviates_a_long_label_list(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "ids.csv"
    path.write_text("id,sex\n" + "".join(f"u{i:04d},{'mf'[i % 2]}\n" for i in range(5000)))
    assert main(["population", "--dataset", f"csv:{path}"]) == 0
    lines = capsys.readouterr().out.splitlines()
    ids = next(line for line in lines if line.startswith("  id: "))
    assert ids.endswith(", ..., u4999 (5,000 labels)") and ids.count(",") == 12
    assert "  sex: f, m" in lines


def test_bad_input_is_a_clear_error_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--epsilon", "-1"]) == 2
    assert "epsilon (-1.0) must be finite and > 0" in capsys.readouterr().err
    assert main(["population", "--dataset", "nope"]) == 2
    assert "dataset ('nope') must be one of" in capsys.readouterr().err


def test_plan_reproduces_the_papers_worked_example(capsys: pytest.CaptureFixture[str]) -> None:
    # §4.3: n = 2^16, d = 8 binary, k = 3, eps = 2 -> l = 4, m = 14
    args = [
        "plan",
        "--domain",
        "2,2,2,2,2,2,2,2",
        "--n",
        "65536",
        "--k",
        "3",
        "--epsilon",
        "2",
        "--planner",
        "paper",
        "--json",
    ]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["l"], out["m"]) == (4, 14) and len(out["views"]) == 14
    assert set(out["oracles"]) == {"GRR"}  # 16 cells < 3e^2 + 2


def test_simulate_json_has_the_documented_keys(capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "simulate",
        "--dataset",
        "synthetic",
        "--d",
        "6",
        "--n",
        "20000",
        "--k",
        "3",
        "--epsilon",
        "1",
        "--queries",
        "10",
        "--reps",
        "2",
        "--json",
    ]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {
        "mechanism",
        "dataset",
        "n",
        "d",
        "k",
        "epsilon",
        "seed",
        "m",
        "l",
        "sse_mean",
        "sse_std",
        "uniform_sse_mean",
        "seconds_per_rep",
        "privacy_unit",
        "shrink",
        "reconstruct",
        "planner",
        "chosen",
        "reps",
        "warnings",
        "seconds",
    }
    # a pilot of 20% of the users on pairs: one matching of the 6 attributes at least
    assert out["planner"] == "pipeline" and out["chosen"]["pilot_users"] == 4000
    assert out["chosen"]["pilot_m"] >= 3
    assert [set(r) for r in out["reps"]] == [{"sse", "uniform_sse", "queries"}] * 2
    assert out["sse_mean"] == pytest.approx(sum(r["sse"] for r in out["reps"]) / 2)
    assert out["n"] == 20000 and out["d"] == 6 and out["sse_mean"] < out["uniform_sse_mean"]
    assert out["reconstruct"] == "local"
    assert out["warnings"] == []  # nothing odd in the shape; CALM beats the uniform answer


def test_simulate_prints_the_plan_readably(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--d", "6", "--n", "20000", "--k", "3", "--epsilon", "1"]
    assert main([*args, "--queries", "10", "--reps", "2", "--seed", "3"]) == 0
    text = capsys.readouterr().out
    assert main([*args, "--queries", "10", "--reps", "2", "--seed", "3", "--json"]) == 0
    chosen = json.loads(capsys.readouterr().out)["chosen"]
    # floats to 3 significant digits on the terminal, whole in the JSON
    low, high = chosen["sse_range"]
    assert (
        f"  predicted SSE (the planner, first rep): {chosen['median_sse']:.3g} at the pilot's "
        f"median dependence, {low:.3g}-{high:.3g} at its 10%-90% quantiles, "
        f"{chosen['predicted_sse']:.3g} averaged over them"
    ) in text.splitlines()
    assert f"pilot_users = {chosen['pilot_users']}" in text and "predicted_sse =" not in text
    assert "(sd over reps)" in text
    assert "no pair" not in text  # 4,000 pilot users measure binary pairs at eps 1
    # at eps 0.3 they cannot: the plan's note says its prediction is the prior's
    eps = ["--epsilon", "0.3", "--queries", "10", "--reps", "1", "--seed", "3"]
    assert main([*args[:-2], *eps]) == 0
    (note,) = [x for x in capsys.readouterr().out.splitlines() if "no pair" in x]
    assert note.startswith("  note: the pilot measured no pair of attributes")
    assert main([*args[:-2], *eps, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["chosen"]["notes"] == [note[len("  note: ") :]]


def test_simulate_warns_when_the_mechanism_does_not_beat_the_uniform_answer(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # 4 attributes of 30-40 categories, 2,000 users at eps 0.2: a view's noise dwarfs
    # what its reports tell, and the answers miss by more than the uniform table does
    args = ["simulate", "--dataset", "synthetic:30-40", "--d", "4", "--n", "2000", "--k", "2"]
    args += ["--epsilon", "0.2", "--reps", "2", "--queries", "6", "--seed", "1"]
    assert main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["sse_mean"] > out["uniform_sse_mean"]
    (beaten,) = [w for w in out["warnings"] if "no better than" in w]
    assert beaten.startswith(
        f"CALM's mean SSE ({out['sse_mean']:.3g}) is no better than answering every "
        f"marginal as uniform ({out['uniform_sse_mean']:.3g}): at 2000 users and epsilon 0.2"
    )
    assert main(args) == 0
    assert f"calmkit: warning: {beaten}" in capsys.readouterr().err


def test_simulate_names_the_margins_it_pulled_towards_uniform(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # the warning's setting, one attribute per view: every margin is mostly noise and
    # the note names them; --no-shrink (the paper's pipeline) pulls none; binary
    # attributes are never pulled
    args = ["simulate", "--dataset", "synthetic:30-40", "--d", "4", "--n", "2000", "--k", "2"]
    args += ["--epsilon", "0.2", "--m", "4", "--l", "1", "--reps", "1", "--queries", "4"]
    assert main([*args, "--json"]) == 0
    (note,) = json.loads(capsys.readouterr().out)["chosen"]["notes"]
    assert note.startswith("the margins of 4 of 4 attributes (a0, a1, a2, a3) were mostly noise")
    assert main(args) == 0
    assert f"  note: {note}" in capsys.readouterr().out.splitlines()
    assert main([*args, "--no-shrink", "--json"]) == 0
    assert "notes" not in json.loads(capsys.readouterr().out)["chosen"]
    # at eps 20 the same margins are shrunk too, by factors near 1: no note
    high = [*args[: args.index("--epsilon")], "--epsilon", "20", *args[args.index("--m") :]]
    assert main([*high, "--json"]) == 0
    assert "notes" not in json.loads(capsys.readouterr().out)["chosen"]
    binary = ["simulate", "--d", "6", "--n", "2000", "--k", "2", "--epsilon", "0.2"]
    assert main([*binary, "--m", "6", "--l", "1", "--reps", "1", "--json"]) == 0
    assert "notes" not in json.loads(capsys.readouterr().out)["chosen"]


def test_simulate_reconstructs_globally_on_request(capsys: pytest.CaptureFixture[str]) -> None:
    base = [
        "simulate",
        "--dataset",
        "synthetic",
        "--d",
        "8",
        "--n",
        "20000",
        "--k",
        "3",
        "--epsilon",
        "1",
        "--planner",
        "paper",
        "--queries",
        "20",
        "--reps",
        "2",
        "--json",
    ]
    runs = {}
    for how in ("local", "global"):
        assert main([*base, "--reconstruct", how]) == 0
        runs[how] = json.loads(capsys.readouterr().out)
        assert runs[how]["reconstruct"] == how
        assert runs[how]["sse_mean"] < runs[how]["uniform_sse_mean"]
    # same seed, same reports and queries: only the reconstruction differs
    assert runs["local"]["sse_mean"] != runs["global"]["sse_mean"]
    assert main([*base, "--reconstruct", "nearest"]) == 2
    assert "reconstruct ('nearest') must be one of" in capsys.readouterr().err


def test_simulate_be_takes_the_reconstruction_and_echoes_only_what_it_took(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # BE is CALM on the bits: --reconstruct global reaches it (same seed, same reports
    # and queries: only the reconstruction differs); Uniform takes neither option and
    # its JSON echoes neither
    base = ["simulate", "--d", "5", "--n", "5000", "--k", "2", "--epsilon", "1"]
    base += ["--planner", "paper", "--reps", "2", "--queries", "5", "--json"]
    runs = {}
    for how in ("local", "global"):
        assert main([*base, "--mechanism", "be", "--reconstruct", how]) == 0
        runs[how] = json.loads(capsys.readouterr().out)
        assert (runs[how]["reconstruct"], runs[how]["shrink"]) == (how, True)
    assert runs["local"]["sse_mean"] != runs["global"]["sse_mean"]
    assert main([*base[:-3], "--reps", "1", "--queries", "2", "--mechanism", "uni", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["reconstruct"], out["shrink"], out["planner"]) == (None, None, None)


def test_simulate_warns_of_the_flags_its_mechanism_ignores(
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = ["simulate", "--d", "4", "--n", "2000", "--k", "2", "--epsilon", "1"]
    base += ["--reps", "1", "--queries", "2"]
    assert main([*base, "--mechanism", "fc", "--l", "3", "--m", "4", "--path", "faithful"]) == 0
    err = capsys.readouterr().err
    assert "calmkit: warning: --m (4), --l (3) do not apply to fc and were ignored" in err
    assert main([*base, "--mechanism", "ft", "--path", "faithful", "--no-shrink", "--json"]) == 0
    captured = capsys.readouterr()
    line = "--path (faithful), --no-shrink do not apply to ft and were ignored"
    assert f"calmkit: warning: {line}" in captured.err
    assert json.loads(captured.out)["warnings"] == [line]
    # theta is Algorithm 1's, the pilot the pipeline planner's
    assert main([*base, "--theta", "0.01"]) == 0
    assert (
        "calmkit: warning: --theta (0.01) does not apply to calm with --planner pipeline "
        "and was ignored"
    ) in capsys.readouterr().err
    assert main([*base, "--mechanism", "be", "--planner", "paper", "--pilot", "0.3"]) == 0
    assert "--pilot (0.3) does not apply to be with --planner paper" in capsys.readouterr().err
    # flags left at their defaults, or that the mechanism uses, are no warning
    assert main([*base, "--planner", "paper", "--theta", "0.01", "--l", "2"]) == 0
    assert main([*base, "--mechanism", "priview", "--theta", "0.01", "--m", "3"]) == 0
    assert main([*base, "--mechanism", "fc", "--path", "fast", "--reconstruct", "local"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_simulate_runs_any_mechanism_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    base = [
        "simulate",
        "--d",
        "5",
        "--n",
        "5000",
        "--k",
        "2",
        "--epsilon",
        "1",
        "--reps",
        "2",
        "--queries",
        "5",
        "--json",
    ]
    assert main([*base, "--mechanism", "uni"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mechanism"] == "Uni" and out["m"] is None
    assert out["sse_mean"] == pytest.approx(out["uniform_sse_mean"], rel=1e-12)
    assert main([*base, "--mechanism", "nope"]) == 2
    assert "mechanism ('nope') must be one of" in capsys.readouterr().err


def test_plan_accounts_for_the_chosen_reconstruction(capsys: pytest.CaptureFixture[str]) -> None:
    from calmkit_aggregator.planning.error_model import Workload
    from calmkit_aggregator.planning.pilot import start_pilot
    from calmkit_aggregator.planning.search import choose_plan
    from calmkit_client import Schema

    base = [
        "plan",
        "--domain",
        ",".join(["2"] * 10),
        "--n",
        "20000",
        "--k",
        "3",
        "--epsilon",
        "1",
        "--json",
    ]
    schema = Schema.from_sizes([2] * 10)
    start = start_pilot(schema, 1.0, 20000)  # one round: half of it measures no pair
    assert start.first_round == 0
    cut, first = start.reports, start.plan
    for reconstruction in ("local", "global"):
        assert main([*base, "--reconstruct", reconstruction]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["reconstruction"] == reconstruction
        direct = choose_plan(
            schema.sizes,
            1.0,
            20000 - cut,
            Workload(k=3),
            fixed_views=first.views,
            fixed_users=[cut / first.m] * first.m,
            reconstruction=reconstruction,
        )
        assert out["predicted_sse"] == pytest.approx(direct.predicted.sse, rel=1e-12)
        assert out["views"] == [list(v) for v in direct.views]
    assert main([*base, "--reconstruct", "nearest"]) == 2


@pytest.mark.parametrize(
    ("domain", "n", "says"),
    [
        # half the pilot (1,000 reports) measures binary pairs from 500 reports each
        (
            "2,2,2,2",
            10_000,
            "2000 users (20%) in two rounds: 1000 report on 2 views, 2 attribute pairs, "
            "the others on pairs chosen from their reports; the views below are chosen "
            "again from all of them",
        ),
        # half (500) cannot (250 each), the whole pilot can: one round
        (
            "2,2,2,2",
            5_000,
            "1000 users (20%) report on 2 views, 2 attribute pairs; the views below are "
            "chosen again from their reports",
        ),
        # 30 x 30 tables cannot show dependence: each attribute alone, in one round
        (
            "30,30,30,30",
            10_000,
            "2000 users (20%) report on 4 views, single attributes (margins only); the "
            "views below are chosen again from their reports",
        ),
    ],
)
def test_plan_says_what_the_pilot_measures(
    capsys: pytest.CaptureFixture[str], domain: str, n: int, says: str
) -> None:
    args = ["plan", "--domain", domain, "--n", str(n), "--k", "2", "--epsilon", "1"]
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"pilot: {says}"
    assert lines[1] == "main phase, as planned from the prior (before any report):"


def test_a_closed_pipe_ends_the_output_quietly() -> None:
    import subprocess
    import sys

    code = (
        "import sys; from calmkit_client.cli import main; "
        "sys.exit(main(['plan', '--domain', '2,2,2,2', '--n', '1000', '--k', '2', "
        "'--epsilon', '1']))"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first line (`| head -0`)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141 and err == "", err
