"""The ``calmkit`` command line, run in process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calmkit_simulator.cli import main


def test_demo_json_reports_every_user_and_a_sane_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--n", "20000", "--d", "5", "--epsilon", "1.0", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["reports"] == 20000 and out["views"] == 10 and out["oracles"] == ["GRR"]
    # 10 views x 4 cells: the mean SSE is an average of 40 squared errors with the
    # stated expectation; it cannot be 10x off unless estimation is broken
    assert 0.1 < out["sse_per_view_mean"] / out["sse_per_view_expected"] < 10


def test_population_describes_own_csv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "mine.csv"
    path.write_text("a,b\nx,1\ny,2\nx,2\n")
    assert main(["population", "--dataset", f"csv:{path}", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["n"] == 3 and out["sizes"] == [2, 2]


def test_bad_input_is_a_clear_error_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--epsilon", "-1"]) == 2
    assert "epsilon (-1.0) must be finite and > 0" in capsys.readouterr().err
    assert main(["population", "--dataset", "nope"]) == 2
    assert "dataset ('nope') must be one of" in capsys.readouterr().err
