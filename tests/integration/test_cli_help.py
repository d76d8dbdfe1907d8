"""The command line a newcomer meets: help for every option, one-line errors naming
the option and value (exit 2), warnings instead of silence, and a parser that loads
without numpy, gRPC or the aggregator's numerics."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from calmkit_client.cli import build_parser, commands, main
from calmkit_client.commands import CommandParser

INTERNAL = ("issue ", "expected_n", "``", ":func:", ":class:", "DESIGN.md", "../shared")


def _subparsers() -> dict[str, CommandParser]:
    return commands(build_parser())


@pytest.mark.parametrize("command", sorted(_subparsers()))
def test_every_option_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    parser = _subparsers()[command]
    parser.load_options()
    for action in parser._actions:
        if action.help == argparse.SUPPRESS:  # an old name kept as a hidden alias
            assert action.option_strings == ["--id"], action
            continue
        assert action.help and len(action.help) >= 8, f"{command} {action.option_strings}"
        assert not any(word in action.help for word in INTERNAL), action.help
    assert main([command, "--help"]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"usage: calmkit {command}")
    assert not any(word in text for word in INTERNAL)
    assert "--id" not in text  # the hidden alias


def test_defaults_are_shown(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for shown in (
        "repetitions (fresh reports each); the SSE is their mean ± sd (default: 20)",
        "random k-way queries per repetition (default: 50)",
        "(default: fast)",
        "same queries on the same users (default: 0)",
    ):
        assert shown in text


def test_query_help_says_what_it_prints(capsys: pytest.CaptureFixture[str]) -> None:
    # the table's column is total.err, noise and estimated bias: not a standard error
    parser = _subparsers()["query"]
    parser.load_options()
    assert parser.description == (
        "a marginal table of a collection, each cell with its total error (noise + estimated bias)"
    )
    (replicates,) = [a for a in parser._actions if "--replicates" in a.option_strings]
    assert replicates.help is not None and "or 2 to 1000" in replicates.help  # 1 is refused
    assert main(["--help"]) == 0
    assert "standard error" not in capsys.readouterr().out


@pytest.mark.parametrize("command", sorted(_subparsers()))
def test_every_option_states_its_default_or_that_it_is_required(command: str) -> None:
    from calmkit_client.commands import HelpFormatter

    parser = _subparsers()[command]
    parser.load_options()
    formatter = HelpFormatter(prog="calmkit")
    for action in parser._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS:
            continue
        if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            continue
        text = formatter._get_help_string(action)
        assert "default" in text or "required" in text, f"{command} {action.option_strings}"


@pytest.mark.parametrize("command", ["demo", "collection", "simulate", "experiment"])
def test_a_default_of_zero_is_shown(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([command, "--help"]) == 0
    lines = capsys.readouterr().out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("  --seed SEED"))
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("  -"))
    assert "(default: 0)" in " ".join(" ".join(lines[start:end]).split())


def test_help_loads_nothing_heavy() -> None:
    code = (
        "import sys\nfrom calmkit_client.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = ('numpy', 'grpc', 'scipy', 'calmkit_aggregator.planning',\n"
        "         'calmkit_aggregator.reconstruction', 'calmkit_simulator.datasets')\n"
        "print(sorted(m for m in heavy if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["simulate", "--k", "2", "--epsilon", "1", "--n", "0"], "n (0) must be an int >= 1"),
        (["simulate", "--k", "2", "--epsilon", "1", "--d", "0"], "d (0) must be an int >= 1"),
        (["simulate", "--k", "2", "--epsilon", "1", "--reps", "0"], "reps (0) must be an int >= 1"),
        (
            ["simulate", "--k", "2", "--epsilon", "1", "--queries", "0"],
            "queries (0) must be an int >= 1",
        ),
        (["simulate", "--k", "2", "--epsilon", "nan"], "epsilon (nan) must be finite and > 0"),
        (
            ["simulate", "--k", "2", "--epsilon", "1", "--max-categories", "1"],
            "max_categories (1) must be an int >= 2",
        ),
        (
            ["simulate", "--k", "2", "--epsilon", "1", "--pilot", "1"],
            "pilot (1.0) must be in [0, 1)",
        ),
        (["demo", "--users", "-5"], "users (-5) must be an int >= 1"),
        (["demo", "--users", "many"], "users ('many') must be an int >= 1"),
        (
            ["simulate", "--k", "2", "--epsilon", "1", "--mechanism", "nope"],
            "mechanism ('nope') must be one of ['calm', 'uni'",
        ),
        (
            ["simulate", "--k", "2", "--epsilon", "710", "--reps", "1"],
            "epsilon (710.0) must be <= 44",
        ),
        (
            ["plan", "--domain", "2,2,2", "--n", "1000", "--k", "2", "--epsilon", "710"],
            "epsilon (710.0) must be <= 44",
        ),
        (["serve", "--db", "x.db", "--rate-limit", "0"], "rate_limit (0.0) must be finite and > 0"),
        (
            "plan --domain 2,2,2 --n 1000 --k 2 --epsilon 1 --theta 5".split(),
            "theta (5.0) must go with --planner paper: the pipeline planner has no threshold",
        ),
        (
            "plan --domain 2,2,2 --n 1000 --k 2 --epsilon 1 --planner paper --pilot 0.1".split(),
            "pilot (0.1) must go with the pipeline planner: Algorithm 1 plans in one phase",
        ),
        (
            "query --collection c --attrs a --replicates 1".split(),
            "replicates (1) must be 0 (the server's default) or in [2, 1000]",
        ),
        (
            "query --collection c --attrs a --replicates 1001".split(),
            "replicates (1001) must be 0 (the server's default) or in [2, 1000]",
        ),
        (["population", "--bins", "age"], "bins ('age') must be COLUMN=B with B an int >= 2"),
        (
            ["serve", "--db", "x.db", "--rate-burst", "50"],
            "rate_burst (50) must go with --rate-limit",
        ),
        (
            ["collection", "create", "--domain", "2,2", "--epsilon", "1"],
            "n (none given) must be set for 'create'",
        ),
        (
            ["collection", "create", "--schema", "s.json", "--domain", "2,2", "--epsilon", "1"],
            "schema ('s.json') must not go with --domain ('2,2'): both give the attributes",
        ),
        (
            "collection create --domain 2,2 --epsilon 1 --views 0,1 --planner pipeline".split(),
            "views ('0,1') must not go with --planner (pipeline): explicit views are not planned",
        ),
        (
            "collection create --domain 2,2 --epsilon 1 --views 0;1 --m 2 --l 1".split(),
            "views ('0;1') must not go with --l (1), --m (2): explicit views",
        ),
        (
            [
                "collection",
                "create",
                "--domain",
                "2,2",
                "--epsilon",
                "1",
                "--n",
                "100",
                "--reconstruct",
                "nearest",
            ],
            "reconstruct ('nearest') must be one of ['local', ",
        ),
    ],
)
def test_bad_values_are_one_line_naming_option_and_value(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize(
    "content, domains, message",
    [
        (b"a,b\n\xe9,1\n", None, "must be UTF-8 text: byte 0xe9 at offset 4"),
        (b"a,b\nx,1\n", "[1, 2]", "must hold an object {column: count or [labels]}, not a list"),
        (b"a,b\nx,1\n", '{"a": ', "must be JSON"),
        (b"a,b\nx,1\n", '{"a": 0}', "domain of 'a' (0) must be a count >= 1"),
        (b"a,b\nx,1\n", '{"c": 2}', "domain column ('c') must be a CSV column"),
    ],
)
def test_bad_csv_inputs_are_one_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    content: bytes,
    domains: str | None,
    message: str,
) -> None:
    (tmp_path / "data.csv").write_bytes(content)
    if domains is not None:
        (tmp_path / "data.domains.json").write_text(domains)
    assert main(["population", "--dataset", f"csv:{tmp_path / 'data.csv'}"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message in err, err


def test_missing_csv_advice_fits_a_local_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["population", "--dataset", f"csv:{tmp_path / 'nope.csv'}"]) == 2
    err = capsys.readouterr().err
    assert f"CSV file ({tmp_path / 'nope.csv'}) does not exist" in err
    assert "CALMKIT_DATA" not in err


def test_shapes_that_spoil_answers_are_warned(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [f"{i % 2},same,v{i % 200}" for i in range(2000)]
    (tmp_path / "d.csv").write_text("a,one,wide\n" + "\n".join(rows) + "\n")
    dataset = f"csv:{tmp_path / 'd.csv'}"
    assert (
        main(
            [
                "simulate",
                "--dataset",
                dataset,
                "--k",
                "2",
                "--epsilon",
                "1",
                "--reps",
                "2",
                "--queries",
                "2",
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert "warning: attribute 'one' has one category ('same'): its marginal is known" in err
    assert "warning: attribute 'wide' has 200 categories" in err and "--max-categories" in err
    assert "'a'" not in err
    assert (
        main(
            [
                "simulate",
                "--dataset",
                dataset,
                "--k",
                "2",
                "--epsilon",
                "1",
                "--reps",
                "2",
                "--queries",
                "2",
                "--max-categories",
                "8",
            ]
        )
        == 0
    )
    assert "200 categories" not in capsys.readouterr().err


def test_collection_create_takes_collection_and_the_old_id() -> None:
    parser = _subparsers()["collection"]
    assert parser.parse_args(["create", "--collection", "s-1"]).collection == "s-1"
    assert parser.parse_args(["create", "--id", "s-1"]).collection == "s-1"


def test_collection_create_plans_for_local_unless_told() -> None:
    parser = _subparsers()["collection"]
    assert parser.parse_args(["create"]).reconstruct == "local"
    assert parser.parse_args(["create", "--reconstruct", "global"]).reconstruct == "global"


def test_the_cli_bounds_replicates_as_the_server_does() -> None:
    from calmkit_aggregator.reconstruction.uncertainty import MAX_REPLICATES
    from calmkit_aggregator.service import cli as service_cli

    assert service_cli._MAX_REPLICATES == MAX_REPLICATES
