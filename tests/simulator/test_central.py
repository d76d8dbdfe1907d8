"""Issue 6 wiring: the central references run through ``calmkit simulate`` and
``calmkit experiment central`` with their privacy units stated."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from calmkit_client import cli
from calmkit_simulator.figures import build_figure
from calmkit_simulator.mechanisms import MECHANISMS, make_mechanism


@pytest.mark.parametrize(
    ("name", "label", "unit"),
    [
        ("mwem", "MWEM", "central epsilon-DP"),
        ("datacube", "DC-F+", "central epsilon-DP"),
        ("wff", "WFF", "central (epsilon, delta)-DP via mu-GDP, delta=1e-06"),
        ("priview", "PriView", "central epsilon-DP"),
    ],
)
def test_simulate_runs_each_central_mechanism(
    name: str, label: str, unit: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "simulate",
        "--mechanism",
        name,
        "--dataset",
        "synthetic",
        "--d",
        "6",
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
    assert cli.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mechanism"] == label and out["privacy_unit"].startswith(unit)
    assert "trusted curator" in out["privacy_unit"]
    assert 0 <= out["sse_mean"] < out["uniform_sse_mean"]


def test_registry_options_reach_the_mechanisms() -> None:
    assert {"mwem", "datacube", "wff"} <= set(MECHANISMS)
    dc = make_mechanism("datacube", strategy="marginals", budgets="uniform", delta=None)
    assert dc.name == "DC-Q"
    wff = make_mechanism("wff", delta=1e-9, theta=0.5)  # options it does not take are ignored
    assert "delta=1e-09" in wff.privacy_unit
    mwem = make_mechanism("mwem", rounds=3)
    assert mwem.rounds == 3  # type: ignore[attr-defined]


def test_central_cli_errors_name_the_value(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "simulate",
        "--mechanism",
        "mwem",
        "--dataset",
        "synthetic",
        "--d",
        "6",
        "--k",
        "2",
        "--epsilon",
        "1",
        "--rounds",
        "0",
    ]
    assert cli.main(argv) == 2
    assert "rounds (0)" in capsys.readouterr().err


def test_quick_central_figure_reports_the_local_central_ratio(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "experiment",
        "central",
        "--quick",
        "--dataset",
        "synthetic",
        "--out",
        str(tmp_path),
        "--jobs",
        "1",
        "--json",
    ]
    assert cli.main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["status"] == {"ok": summary["tasks"]}
    rows = list(csv.DictReader((tmp_path / "data" / "central.csv").open()))
    units = {r["series"]: r["privacy_unit"] for r in rows}
    assert units["CALM"].startswith("epsilon-LDP")
    assert all("trusted curator" in units[s] for s in ("PriView", "MWEM", "DC-F+", "WFF"))
    report = (tmp_path / "results.md").read_text()
    assert "| CALM / best of PriView, MWEM, DC-F+, WFF |" in report
    # the ratio row is the CALM mean over the best central mean, per epsilon
    mean = {(r["series"], r["x"]): float(r["mean"]) for r in rows if r["panel"] == "a"}
    best = min(mean[(s, "0.5")] for s in ("PriView", "MWEM", "DC-F+", "WFF"))
    assert f"**{mean[('CALM', '0.5')] / best:.3g}**" in report
    assert "| CALM / best of PriView, MWEM, DC-F+ |" in report  # pure epsilon-DP ones
    fig = build_figure("central")
    assert len(fig.panels) == 8 and {t.k for t in fig.tasks()} == {2, 3}
    adult_dc = {
        t.options for t in fig.tasks() if t.mechanism == "datacube" and t.dataset == "adult"
    }
    assert adult_dc == {(("strategy", "marginals"),)}  # Fourier is for binary attributes
