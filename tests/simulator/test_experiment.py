"""The experiment harness (issue 5): figure grids, the resumable cache, parallel
runs equal serial ones, and the CSV/PNG/markdown outputs of ``calmkit experiment``."""

from __future__ import annotations

import csv
import json
import re
import sqlite3
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from calmkit_client import CalmkitError, cli
from calmkit_simulator.figures import build_figure
from calmkit_simulator.grid import ResultCache, run_tasks
from calmkit_simulator.paper_values import PAPER_VALUES
from calmkit_simulator.tasks import Task, run_task


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    assert cli.main(argv) == 0
    return dict(json.loads(capsys.readouterr().out))


def test_quick_grid_writes_csv_png_and_markdown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "res"
    argv = ["experiment", "fig4", "--quick", "--dataset", "synthetic", "--out", str(out)]
    summary = _run([*argv, "--jobs", "1", "--json"], capsys)
    figure = build_figure("fig4", quick=True, dataset="synthetic")
    # 2 panels x 6 mechanisms x 2 epsilons; both panels on the one dataset: 12 to run
    assert len(figure.tasks()) == 24 and summary["tasks"] == 12
    assert summary["status"] == {"ok": 12}
    with (out / "data" / "fig4.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 24
    assert {r["series"] for r in rows} == {"CALM", "FC", "AM", "FT", "EM", "Uni"}
    for r in rows:
        assert r["status"] == "ok" and float(r["mean"]) >= 0 and float(r["seconds_per_rep"]) > 0
        assert int(r["mechanism_seed"]) > 0 and r["seed"] == "0" and r["reps"] == "2"
    png = (out / "figures" / "fig4.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    report = (out / "results.md").read_text()
    assert "## Fig. 4: binary datasets" in report and "figures/fig4.png" in report
    assert "| CALM |" in report and "Runtime (median seconds per repetition" in report
    # CALM beats Uniform on every quick setting (a loose sanity check of the wiring)
    calm = [float(r["mean"]) for r in rows if r["series"] == "CALM"]
    assert max(calm) < min(float(r["uniform"]) for r in rows)

    # a second run finds every task in the cache: nothing is recomputed
    again = _run([*argv, "--jobs", "1", "--json"], capsys)
    assert again["status"] == {"ok": 12} and again["computed"] == 0
    # the report keeps the run that computed the tasks, with its wall time
    report = (out / "results.md").read_text()
    assert report.count("12 tasks in") == 1 and "0 tasks in" not in report
    assert "12 of 12 tasks done" in report  # distinct tasks, not panel points


def test_interrupted_grid_resumes_with_identical_results(tmp_path: Path) -> None:
    figure = build_figure("fig8", quick=True, dataset="synthetic")
    tasks = figure.tasks()
    cache = ResultCache(tmp_path / "c.sqlite")
    first = run_tasks(tasks, cache)
    cache.close()
    # "interrupt": drop half the finished tasks, as if the run had stopped midway
    db = sqlite3.connect(tmp_path / "c.sqlite")
    keys = sorted(first)
    db.executemany("DELETE FROM results WHERE key = ?", [(k,) for k in keys[::2]])
    db.commit()
    db.close()
    cache = ResultCache(tmp_path / "c.sqlite")
    ran: list[int] = []
    resumed = run_tasks(tasks, cache, progress=ran.append)
    cache.close()
    assert len(ran) == len(keys)  # every task reported, cached or not
    assert resumed.keys() == first.keys()
    for key in first:  # the recomputed half is bit-for-bit the same (but for timings)
        a, b = (dict(r, seconds=None) for r in (first[key], resumed[key]))
        assert a == b


def test_parallel_workers_give_the_serial_results(tmp_path: Path) -> None:
    tasks = build_figure("fig9", quick=True, dataset="synthetic").tasks()
    serial = run_tasks(tasks, ResultCache(tmp_path / "a.sqlite"), jobs=1)
    parallel = run_tasks(tasks, ResultCache(tmp_path / "b.sqlite"), jobs=2)
    assert serial.keys() == parallel.keys()
    for key in serial:
        assert serial[key]["sse"] == parallel[key]["sse"]


def test_not_scalable_and_invalid_settings_are_reported_not_run() -> None:
    fc32 = Task(dataset="synthetic", mechanism="fc", epsilon=1.0, k=3, query_k=3, d=32, reps=1)
    res = run_task(fc32)
    assert res["status"] == "not_scalable" and "FC" in res["message"]
    # CALM with more 1-attribute views than attributes: refused with the reason
    many = Task(
        dataset="synthetic",
        mechanism="calm",
        epsilon=1.0,
        k=3,
        query_k=3,
        d=8,
        options=(("l", 1), ("m", 16)),
        reps=1,
    )
    res = run_task(many)
    assert res["status"] == "invalid" and "m (16)" in res["message"]
    missing = Task(dataset="kosarak", mechanism="calm", epsilon=1.0, k=3, query_k=3)
    assert run_task(missing, "/nonexistent/folder")["status"] == "missing_data"


def test_queries_are_shared_across_mechanisms_and_epsilons() -> None:
    # paired comparisons: the same population and repetition give the same queries,
    # so Uniform's SSE is identical for every task of a panel
    tasks = [
        Task(
            dataset="synthetic",
            mechanism=m,
            epsilon=e,
            k=3,
            query_k=3,
            d=8,
            n=4096,
            reps=2,
            queries=5,
        )
        for m in ("uni", "calm")
        for e in (0.5, 2.0)
    ]
    uniform = {tuple(run_task(t)["uniform"]) for t in tasks}
    assert len(uniform) == 1
    # and the mechanism's own randomness differs between tasks
    a, b = (run_task(t)["sse"] for t in tasks[2:])
    assert a != b


def test_full_figure_grids_match_the_paper_settings() -> None:
    fig4 = build_figure("fig4")
    assert [p.label for p in fig4.panels] == list("abcdefghijkl")
    tasks = fig4.tasks()
    assert {t.epsilon for t in tasks} == {round(0.2 * i, 1) for i in range(1, 11)}
    assert all(t.reps == 20 and t.queries == 50 for t in tasks)
    assert {(t.n, t.d, t.k) for t in tasks} == {
        (1 << 16, 8, 3),
        (1 << 16, 16, 3),
        (1 << 16, 32, 3),
        (1 << 18, 16, 6),
        (1 << 18, 32, 6),
        (1 << 18, 32, 8),
    }
    assert all(t.k == 3 for t in tasks if t.mechanism == "em")
    assert fig4.panels[1].paper == {("CALM", 0.2): 0.0055, ("FT", 0.2): 0.2266}
    only16 = build_figure("fig4", n=1 << 16)
    assert {t.n for t in only16.tasks()} == {1 << 16} and len(only16.panels) == 6
    fig8 = build_figure("fig8")
    assert {t.query_k for t in fig8.tasks()} == {3, 6, 8}
    assert {t.k for t in fig8.tasks() if t.query_k == 3} >= {2, 3, 6, 8, 16}
    fig7 = build_figure("fig7")
    assert len(fig7.panels) == 6 and all(p.kind == "heatmap" for p in fig7.panels)
    assert len(fig7.panels[0].points) == 8 * 16  # l = 1..8 x m = 31, 29, ..., 1


def test_paper_heatmap_values_parse_as_printed() -> None:
    # spot values from the CALM paper's Fig. 7 (first and last printed cells)
    assert PAPER_VALUES[("fig7", "a")][(31, 1)] == 0.0058
    assert PAPER_VALUES[("fig7", "a")][(9, 8)] == 0.0143
    assert PAPER_VALUES[("fig7", "b")][(0.2, 8)] == 0.0770
    assert PAPER_VALUES[("fig7", "f")][(2.0, 8)] == 0.0054
    assert len(PAPER_VALUES[("fig7", "e")]) == 80


def test_bad_options_are_refused() -> None:
    with pytest.raises(CalmkitError, match="figure"):
        build_figure("fig99")
    with pytest.raises(CalmkitError, match=r"reps \(0\)"):
        build_figure("fig4", reps=0)
    with pytest.raises(CalmkitError, match=r"jobs \(0\)"):
        run_tasks([], ResultCache(":memory:"), jobs=0)


def test_quick_fig4_on_the_real_datasets(
    datasets_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "experiment",
        "fig4",
        "--quick",
        "--out",
        str(tmp_path),
        "--data-dir",
        str(datasets_dir),
        "--no-plot",
        "--json",
    ]
    summary = _run(argv, capsys)
    assert summary["status"] == {"ok": 24}
    report = (tmp_path / "results.md").read_text()
    assert "Kosarak" in report and "retail (POS stand-in)" in report
    rows = list(csv.DictReader((tmp_path / "data" / "fig4.csv").open()))
    mean = {(r["dataset"], r["series"], r["x"]): float(r["mean"]) for r in rows}
    for ds in ("kosarak", "retail"):  # the paper's ordering at eps = 2: CALM below FC, AM
        assert mean[(ds, "CALM", "2.0")] < min(mean[(ds, "FC", "2.0")], mean[(ds, "AM", "2.0")])
    assert np.isfinite(list(mean.values())).all()


def test_classification_task_runs_on_adult(datasets_dir: Path) -> None:
    task = Task(
        dataset="adult",
        mechanism="calm",
        epsilon=2.0,
        k=6,
        query_k=6,
        max_categories=3,
        reps=1,
        queries=0,
        kind="classify",
        classify="adult",
    )
    res = run_task(task, str(datasets_dir))
    assert res["status"] == "ok" and res["mechanism"] == "CALM"
    assert 0 < res["nonoise"][0] < res["majority"][0] < 0.5
    assert 0 < res["error"][0] < 0.5 and res["chosen"]["m"] >= 1
    fc = run_task(replace(task, mechanism="fc"), str(datasets_dir))
    assert fc["status"] == "ok"  # six attributes capped at 3: FC's 729 cells fit


def test_planner_experiment_writes_its_own_report(tmp_path: Path) -> None:
    from calmkit_client.cli import main

    out = tmp_path / "bench"
    assert (
        main(
            [
                "experiment",
                "planner",
                "--quick",
                "--out",
                str(out),
                "--no-plot",
                "--jobs",
                "1",
                "--json",
            ]
        )
        == 0
    )
    text = (out / "planner.md").read_text()
    assert "| synthetic d=8, n=2^12 | 3 | 0.5 |" in text and "## Planning time" in text
    # default / best with its paired-bootstrap interval around it, and the summary of
    # the settings above the target
    summary = [
        line
        for line in text.splitlines()
        if line.startswith("| synthetic d=8, n=2^12 | 3 |") and line.count("|") == 17
    ]
    assert len(summary) == 2  # eps 0.5 and 2
    for line in summary:
        found = re.search(r"\*\*([\d.]+)\*\* \(([\d.]+)-([\d.]+)\)", line)
        assert found, line
        ratio, lo, hi = map(float, found.groups())
        assert lo <= ratio <= hi
        # default / Algorithm 1: the two SSE columns' ratio, inside its own interval
        cells = [c.strip() for c in line.split("|")]
        d_sse, p_sse = float(cells[5].split(" ± ")[0]), float(cells[10])
        vs = re.fullmatch(r"([\d.]+) \(([\d.]+)-([\d.]+)\)", cells[12])
        assert vs, cells[12]
        ratio, lo, hi = map(float, vs.groups())
        assert ratio == pytest.approx(d_sse / p_sse, rel=0.02) and lo <= ratio <= hi
    assert "Above the target of 1.15 x the best grid point:" in text
    assert "Above Algorithm 1's SSE beyond the 90% interval of default / Algorithm 1:" in text
    # the default's measured SSE against its own predicted range, per setting
    within = re.search(r"own predicted range .* in (\d) of 2 settings; outside it: (.*)\.", text)
    assert within, "the range line is missing"
    outside = [] if within.group(2) == "none" else within.group(2).split("), ")
    assert int(within.group(1)) + len(outside) == 2
    with (out / "data" / "planner.csv").open() as fh:
        roles = {row["role"] for row in csv.DictReader(fh)}
    assert roles == {"default", "paper", "grid"}
    assert not (out / "results.md").exists()  # the paper's report is left alone
    # the error model from the data's own profile, beside every grid point: its
    # geometric mean ratio to the measured SSE stays within 2x (a model off by a
    # constant factor, or a broken check, fails)
    assert "## The error model with the data's own profile" in text
    rows = [
        line.split("|")
        for line in text.splitlines()
        if line.startswith("| synthetic d=8, n=2^12 |") and line.count("|") == 9
    ]
    ratios = np.array([float(cells[8]) for cells in rows])
    assert ratios.size >= 10 and np.all(np.isfinite(ratios))
    assert 0.5 <= float(np.exp(np.log(ratios).mean())) <= 2.0


def test_ratio_interval_resamples_repetitions_together() -> None:
    from calmkit_simulator.planner_bench import ratio_interval

    # SSE varies 100x between repetitions, but the default is exactly 1.2x the best
    # point in every one: resampled together the ratio never moves (resampled apart,
    # the interval would span the spread between repetitions)
    base = np.geomspace(1e-3, 1e-1, 20)
    lo, hi = ratio_interval(1.2 * base, np.array([base, 1.5 * base]))
    assert lo == pytest.approx(1.2) and hi == pytest.approx(1.2)


def test_ratio_interval_chooses_the_best_point_in_each_resample() -> None:
    from calmkit_simulator.planner_bench import ratio_interval

    # two grid points with equal means: a noisy one (1 or 3) and a steady one (2); the
    # default is 2. The best of each resample is never worse than the steady point,
    # so default / best is never below 1; a best point fixed once (the noisy one,
    # first of the tie) would put the ratio below 1 in half the resamples
    noisy = np.tile([1.0, 3.0], 10)
    steady = np.full(20, 2.0)
    lo, hi = ratio_interval(steady, np.array([noisy, steady]))
    assert lo >= 1.0 - 1e-12 and hi > 1.1
    with pytest.raises(ValueError, match=r"grid \(2, 19\) must be \(G, 20\)"):
        ratio_interval(steady, np.array([noisy[:19], steady[:19]]))


# -- a newcomer's runs (issue 13): no data, interruptions, progress off a terminal ---------
def test_a_dataset_that_does_not_fit_the_tasks_makes_them_invalid_not_absent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # fig4's panels take d = 8 attributes; a CSV of 3 is there, and does not fit them:
    # once reported as "no data: the dataset folder was absent"
    path = tmp_path / "three.csv"
    path.write_text("a,b,c\n" + "x,y,z\ny,x,z\n" * 50)
    task = Task(dataset=f"csv:{path}", mechanism="calm", epsilon=1.0, k=3, query_k=3, d=8)
    res = run_task(task)
    assert res["status"] == "invalid"
    assert (
        res["message"]
        == f"the dataset does not fit the task: d (8) must be in [1, 3] for csv:{path}"
    )
    out = tmp_path / "res"
    argv = ["experiment", "fig4", "--quick", "--out", str(out), "--no-plot", "--jobs", "1"]
    assert cli.main([*argv, "--queries", "2", "--dataset", f"csv:{path}"]) == 0
    captured = capsys.readouterr()
    assert "{'invalid': 12}" in captured.out
    assert (
        "calmkit: warning: 12 tasks were invalid for their dataset (the dataset does not "
        in captured.err
    )
    report = (out / "results.md").read_text()
    assert "| CALM | invalid | invalid |" in report and "| no data |" not in report
    assert "or the dataset does not fit it" in report


def test_no_data_exits_3_and_keeps_a_complete_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "docs"
    argv = ["experiment", "fig4", "--quick", "--out", str(out), "--no-plot", "--jobs", "1"]
    _run([*argv, "--dataset", "synthetic", "--json"], capsys)
    before = {p.name: p.read_bytes() for p in (out / "data").iterdir()}
    before["results.md"] = (out / "results.md").read_bytes()
    empty = tmp_path / "empty"
    empty.mkdir()
    code = cli.main([*argv, "--dataset", "nltcs", "--data-dir", str(empty), "--json"])
    assert code == 3
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert summary["status"] == {"missing_data": 12} and summary["kept_existing"] is True
    assert "12 tasks had no data" in captured.err and "calmkit datasets fetch" in captured.err
    after = {p.name: p.read_bytes() for p in (out / "data").iterdir()}
    after["results.md"] = (out / "results.md").read_bytes()
    assert after == before  # nothing committed was replaced by "no data"


def test_interrupted_run_leaves_a_partial_report_then_resumes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from calmkit_simulator import grid

    real, calls = grid.run_task, []

    def interrupted(task: Task, where: str | None) -> dict[str, object]:
        calls.append(task)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real(task, where)

    monkeypatch.setattr(grid, "run_task", interrupted)
    out = tmp_path / "res"
    argv = [
        "experiment",
        "fig4",
        "--quick",
        "--dataset",
        "synthetic",
        "--out",
        str(out),
        "--no-plot",
        "--jobs",
        "1",
    ]
    assert cli.main(argv) == 130
    err = capsys.readouterr().err
    assert "interrupted: 4 of 12 tasks are done and cached" in err
    report = (out / "results.md").read_text()
    assert "4 of 12 tasks done" in report
    rows = list(csv.DictReader((out / "data" / "fig4.csv").open()))
    assert 4 <= len(rows) < 24 and all(r["status"] == "ok" for r in rows)
    monkeypatch.setattr(grid, "run_task", real)
    summary = _run([*argv, "--json"], capsys)  # resumes: 8 left to compute
    assert summary["status"] == {"ok": 12} and summary["interrupted"] is False
    assert "12 of 12 tasks done" in (out / "results.md").read_text()
    assert len(list(csv.DictReader((out / "data" / "fig4.csv").open()))) == 24


def test_progress_lines_off_a_terminal() -> None:
    import io

    from calmkit_simulator.progress import Progress

    now = [0.0]
    stream = io.StringIO()  # not a terminal: lines, no bar
    progress = Progress(40, "fig4 tasks", every=30.0, stream=stream, clock=lambda: now[0])
    for _ in range(10):
        now[0] += 10.0  # a task every 10 s
        progress.update(1)
    progress.close()
    lines = stream.getvalue().splitlines()
    assert lines == [
        "fig4 tasks: 3/40 (8%), 0m30s elapsed, ETA 6m10s",
        "fig4 tasks: 6/40 (15%), 1m00s elapsed, ETA 5m40s",
        "fig4 tasks: 9/40 (22%), 1m30s elapsed, ETA 5m10s",
    ]


def _blas_threads() -> int:
    from threadpoolctl import threadpool_info

    return max((pool["num_threads"] for pool in threadpool_info()), default=1)


def test_worker_processes_run_one_blas_thread_each() -> None:
    # --jobs N puts N processes on N cores: threaded BLAS in each would oversubscribe
    from concurrent.futures import ProcessPoolExecutor

    from calmkit_simulator.grid import _one_blas_thread

    with ProcessPoolExecutor(max_workers=1, initializer=_one_blas_thread) as pool:
        assert pool.submit(_blas_threads).result() == 1


def test_a_grid_with_no_task_exits_2_saying_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "docs"
    code = cli.main(["experiment", "fig4", "--n", "8192", "--out", str(out), "--no-plot"])
    err = capsys.readouterr().err
    assert code == 2
    assert "experiment fig4 has no task with --n 8192" in err
    assert "n in [65536, 262144]" in err and "nothing was run" in err
    assert not out.exists()  # no empty report written


def test_the_held_out_shapes_stay_out_of_the_planner_benchmark() -> None:
    # benchmarks/planner_heldout.py checks the planner on shapes its rules were not
    # measured on: none of them may be a setting of the benchmark they are tuned on
    import importlib.util

    from calmkit_simulator.planner_bench import SETTINGS

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "planner_heldout.py"
    spec = importlib.util.spec_from_file_location("planner_heldout", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def shape(s: object) -> tuple[object, ...]:
        return tuple(getattr(s, f) for f in ("dataset", "d", "n", "max_categories", "k"))

    held_out = {shape(s) for s in module.HELD_OUT}
    assert len(held_out) == len(module.HELD_OUT) >= 8
    assert not held_out & {shape(s) for s in SETTINGS}


def test_reports_show_the_runs_without_this_machines_folders(tmp_path: Path) -> None:
    # a report's "runs" list is read by people without the folders the runs wrote to
    cache = ResultCache(tmp_path / "cache.sqlite")
    cache.log_run("planner", "calmkit experiment planner --out /home/a/x --reps 2", 3, 1.0, 2)
    cache.log_run("fig4", "calmkit experiment fig4 --data-dir=/data/sets --out=r", 1, 1.0, 1)
    assert cache.runs("planner")[0]["command"] == "calmkit experiment planner --out DIR --reps 2"
    assert cache.runs("fig4")[0]["command"] == ("calmkit experiment fig4 --data-dir=DIR --out=DIR")
    cache.close()
