"""``calmkit evaluate``: every method on the same queries and seeds, at each epsilon,
as a table, a CSV and a plot."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from calmkit_client.cli import main
from calmkit_simulator import synthetic_population


@pytest.fixture(scope="module")
def survey(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pop = synthetic_population(n=6000, sizes=(3, 2, 5, 2, 4), strength=1.5, rng=4)
    path = tmp_path_factory.mktemp("data") / "survey.csv"
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow([a.name for a in pop.schema.attributes])
        writer.writerows([f"v{c}" for c in row] for row in pop.codes)
    return path


def _evaluate(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    assert main(["evaluate", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_every_method_at_every_epsilon_on_the_same_queries(
    survey: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _evaluate(
        [
            "--dataset",
            f"csv:{survey}",
            "--epsilon",
            "0.5,2",
            "--k",
            "2",
            "--reps",
            "3",
            "--queries",
            "10",
            "--mechanism",
            "fc",
            "--out",
            str(tmp_path),
        ],
        capsys,
    )
    methods = ["default planner", "Algorithm 1", "l = 1", "Uniform", "fc"]
    assert [(r["epsilon"], r["method"]) for r in out["rows"]] == [
        (e, m) for e in (0.5, 2.0) for m in methods
    ]
    for eps in (0.5, 2.0):
        here = [r for r in out["rows"] if r["epsilon"] == eps]
        # Uniform's error depends only on the queries: equal for all, so all answered the same
        assert len({round(r["uniform_sse"], 15) for r in here}) == 1
        for r in here:
            assert len(r["sse"]) == 3 and r["low"] <= r["sse_mean"] <= r["high"]
    l1 = [r for r in out["rows"] if r["method"] == "l = 1"]
    assert all(r["l"] == 1 and r["m"] == 5 for r in l1)
    with Path(out["files"]["table"]).open() as fh:
        assert len(list(csv.DictReader(fh))) == 10
    assert Path(out["files"]["plot"]).stat().st_size > 10_000


def test_a_row_is_what_simulate_gives_with_the_same_options(
    survey: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common = [
        "--dataset",
        f"csv:{survey}",
        "--k",
        "3",
        "--reps",
        "2",
        "--queries",
        "8",
        "--seed",
        "5",
    ]
    out = _evaluate([*common, "--epsilon", "1", "--no-plot", "--out", str(tmp_path)], capsys)
    # "l = 1" is the plain design: one attribute per view for every user, no pilot
    variants = (
        ("default planner", []),
        ("Algorithm 1", ["--planner", "paper"]),
        ("l = 1", ["--l", "1", "--pilot", "0"]),
    )
    for method, extra in variants:
        assert main(["simulate", *common, "--epsilon", "1", *extra, "--json"]) == 0
        sim = json.loads(capsys.readouterr().out)
        row = next(r for r in out["rows"] if r["method"] == method)
        assert row["sse_mean"] == pytest.approx(sim["sse_mean"], rel=1e-12)
        assert np.isclose(row["uniform_sse"], sim["uniform_sse_mean"])


def test_text_output_marks_the_best_and_names_the_plans(
    survey: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "evaluate",
        "--dataset",
        f"csv:{survey}",
        "--epsilon",
        "1",
        "--k",
        "2",
        "--reps",
        "2",
        "--queries",
        "5",
        "--no-plot",
        "--out",
        str(tmp_path),
    ]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "every method answers the same queries" in text
    assert "(m = 5, l = 1)" in text and "*" in text  # ties are all marked
    uniform = next(line for line in text.splitlines() if line.strip().startswith("Uniform "))
    assert "*" not in uniform  # Uniform (SSE ~0.25 here) is far from the best
    assert "evaluate.csv" in text


def test_one_repetition_prints_the_mean_without_an_interval(
    survey: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a single repetition says nothing of the spread: no "0.118 [0.118, 0.118]"
    argv = ["--dataset", f"csv:{survey}", "--epsilon", "1", "--k", "2", "--reps", "1"]
    argv += ["--queries", "3", "--out", str(tmp_path)]
    assert main(["evaluate", *argv]) == 0
    text = capsys.readouterr().out
    assert "mean SSE per query (one repetition: no interval; --reps 2 or more" in text
    uniform = next(line for line in text.splitlines() if line.strip().startswith("Uniform "))
    assert "[" not in uniform and "95%" not in text
    out = _evaluate(argv, capsys)
    assert all(r["low"] is None and r["high"] is None for r in out["rows"])
    assert Path(out["files"]["plot"]).stat().st_size > 10_000
    with Path(out["files"]["table"]).open() as fh:
        assert {r["low"] for r in csv.DictReader(fh)} == {""}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--epsilon", "0,1"], "must be numbers in (0, 44]"),
        (["--epsilon", "one"], "must be numbers separated by commas"),
        (["--k", "9"], "k (9) must be at most the attributes (5)"),
        (["--mechanism", "nope"], "mechanism ('nope') must be one of"),
    ],
)
def test_bad_options_are_one_line_errors(
    survey: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code = main(["evaluate", "--dataset", f"csv:{survey}", "--out", str(tmp_path), *argv])
    assert code == 2 and message in capsys.readouterr().err
