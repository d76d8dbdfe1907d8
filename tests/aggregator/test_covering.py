"""Covering designs: CALM's CoverDesign(d, k, l) (the CALM paper, Zhang et al., CCS
2018, §4.3).

The shared covering folder (best-known sizes and block lists) is read from
``../shared/covering`` next to the repository (or ``$CALMKIT_SHARED/covering``); the
tests that need it skip when it is absent.
"""

from __future__ import annotations

import itertools
import math
import os
import re
from pathlib import Path

import numpy as np
import pytest

from calmkit_aggregator.planning import covering
from calmkit_aggregator.planning.covering import (
    CoveringError,
    best_known_size,
    construct_cover,
    cover_lower_bound,
    read_cover,
    verify_cover,
)
from calmkit_client import CalmkitError

ROOT = Path(__file__).resolve().parents[2]
COVERING_DIR = Path(os.environ.get("CALMKIT_SHARED", ROOT.parent / "shared")) / "covering"

# (d, l, k, best-known size): the quality targets, from the La Jolla Covering
# Repository as listed in ../shared/covering/README.md.
TARGETS = [(8, 4, 3, 14), (16, 4, 3, 140), (16, 6, 3, 38), (32, 4, 2, 88), (32, 8, 3, 106)]
TOLERANCE = 1.15


@pytest.fixture(scope="module")
def covering_dir() -> Path:
    if not (COVERING_DIR / "covering_numbers.csv").is_file():
        pytest.skip(f"shared covering folder not found at {COVERING_DIR} (set CALMKIT_SHARED)")
    return COVERING_DIR


def brute_force_covers(blocks: object, d: int, k: int) -> bool:
    sets = [set(b) for b in blocks]  # type: ignore[attr-defined]
    return all(any(set(s) <= b for b in sets) for s in itertools.combinations(range(d), k))


def check_cover(blocks: tuple[tuple[int, ...], ...], d: int, k: int, l: int) -> None:  # noqa: E741
    assert verify_cover(blocks, d, k)
    assert all(len(b) == min(l, d) for b in blocks)
    assert all(list(b) == sorted(set(b)) and 0 <= b[0] and b[-1] < d for b in blocks)
    assert len(set(blocks)) == len(blocks)
    assert list(blocks) == sorted(blocks)
    assert len(blocks) >= cover_lower_bound(d, k, l)


# -- verify_cover ------------------------------------------------------------------------
def test_verify_cover_agrees_with_brute_force() -> None:
    gen = np.random.default_rng(7)
    for _ in range(200):
        d = int(gen.integers(3, 9))
        k = int(gen.integers(1, 4))
        if k > d:
            continue
        blocks = [
            tuple(gen.choice(d, size=int(gen.integers(1, d + 1)), replace=False))
            for _ in range(int(gen.integers(0, 12)))
        ]
        assert verify_cover(blocks, d, k) == brute_force_covers(blocks, d, k)


def test_verify_cover_misses_a_dropped_block() -> None:
    # 14 blocks is optimal for (8, 4, 3): dropping any block uncovers a 3-set.
    blocks = construct_cover(8, 3, 4)
    assert len(blocks) == 14 and verify_cover(blocks, 8, 3)
    for j in range(len(blocks)):
        assert not verify_cover(blocks[:j] + blocks[j + 1 :], 8, 3)


def test_verify_cover_on_every_3_set() -> None:
    """4960 blocks (speed: benchmarks/bench_planner.py times cover construction)."""
    blocks = list(itertools.combinations(range(32), 3))
    assert verify_cover(blocks, 32, 3)
    assert not verify_cover(blocks[1:], 32, 3)


@pytest.mark.parametrize(
    ("blocks", "d", "k", "match"),
    [
        ([(0, 1, 8)], 8, 2, r"blocks\[0\] point \(8\) must be an int in \[0, 8\)"),
        ([(0, 1), (2, -1)], 8, 2, r"blocks\[1\] point \(-1\)"),
        ([(0, 1, 1)], 8, 2, r"blocks\[0\] \(\[0, 1, 1\]\) must not repeat a point"),
        ([(0, 1.0)], 8, 2, r"blocks\[0\] point \(1.0\)"),
        (["ab"], 8, 2, r"blocks\[0\] \('ab'\) must be a sequence of ints"),
        ("abc", 8, 2, r"blocks \('abc'\) must be a sequence"),
        ([(0, 1)], 8, 9, r"k \(9\) must be <= d \(8\)"),
        ([(0, 1)], 8, 0, r"k \(0\) must be an int >= 1"),
        ([(0, 1)], 0, 1, r"d \(0\) must be an int >= 1"),
        ([(0, 1)], True, 1, r"d \(True\) must be an int >= 1"),
    ],
)
def test_verify_cover_bad_input(blocks: object, d: object, k: object, match: str) -> None:
    with pytest.raises(CoveringError, match=match):
        verify_cover(blocks, d, k)  # type: ignore[arg-type]


# -- construct_cover -----------------------------------------------------------------------
GRID = [
    (5, 2, 3),
    (6, 3, 4),
    (7, 2, 3),
    (7, 3, 5),
    (8, 2, 4),
    (9, 3, 4),
    (9, 3, 6),
    (10, 2, 3),
    (10, 4, 6),
    (11, 3, 5),
    (12, 3, 4),
    (12, 4, 8),
    (13, 2, 5),
    (17, 3, 8),
    (20, 2, 6),
]


@pytest.mark.parametrize(("d", "k", "l"), GRID)
def test_constructed_cover_covers(d: int, k: int, l: int) -> None:  # noqa: E741
    blocks = construct_cover(d, k, l, rng=1)
    check_cover(blocks, d, k, l)
    assert brute_force_covers(blocks, d, k)


@pytest.mark.slow
def test_constructed_cover_covers_full_grid() -> None:
    for d in range(2, 13):
        for k in range(1, min(d, 4) + 1):
            for l in range(k, d + 2):  # noqa: E741
                check_cover(construct_cover(d, k, l, rng=2), d, k, l)


def test_trivial_cases() -> None:
    assert construct_cover(6, 2, 6) == ((0, 1, 2, 3, 4, 5),)
    assert construct_cover(6, 2, 9) == ((0, 1, 2, 3, 4, 5),)
    assert construct_cover(6, 3, 3) == tuple(itertools.combinations(range(6), 3))
    assert construct_cover(10, 1, 4) == ((0, 1, 2, 3), (4, 5, 6, 7), (6, 7, 8, 9))
    assert construct_cover(1, 1, 1) == ((0,),)


@pytest.mark.parametrize(
    ("d", "k", "l", "match"),
    [
        (8, 4, 3, r"k \(4\) must be <= l \(3\): 3-sets cannot cover 4-sets"),
        (8, 9, 9, r"k \(9\) must be <= d \(8\)"),
        (8, 2, 0, r"l \(0\) must be an int >= 1"),
        (8, 2, 2.5, r"l \(2.5\) must be an int >= 1"),
        (0, 1, 1, r"d \(0\) must be an int >= 1"),
    ],
)
def test_construct_cover_bad_input(d: object, k: object, l: object, match: str) -> None:  # noqa: E741
    with pytest.raises(CoveringError, match=match):
        construct_cover(d, k, l)  # type: ignore[arg-type]
    assert issubclass(CoveringError, CalmkitError)


def test_construct_cover_is_deterministic() -> None:
    covering._construct.cache_clear()
    first = construct_cover(11, 3, 5, rng=3)
    covering._construct.cache_clear()
    assert construct_cover(11, 3, 5, rng=3) == first
    covering._construct.cache_clear()
    assert construct_cover(11, 3, 5, rng=np.random.default_rng(3)) == first
    other = construct_cover(11, 3, 5, rng=4)
    check_cover(other, 11, 3, 5)


def test_blow_up_doubles_a_cover() -> None:
    # Every point of the 14-block (8, 4, 3) cover doubled: 14 blocks for (16, 8, 3),
    # which meets the lower bound.
    blocks = construct_cover(16, 3, 8)
    check_cover(blocks, 16, 3, 8)
    assert len(blocks) == cover_lower_bound(16, 3, 8) == 14


@pytest.mark.parametrize(("d", "l", "k", "best"), TARGETS)
def test_sizes_near_best_known(d: int, l: int, k: int, best: int) -> None:  # noqa: E741
    blocks = construct_cover(d, k, l, rng=0)
    check_cover(blocks, d, k, l)
    assert len(blocks) <= TOLERANCE * best, (len(blocks), best)


def test_lower_bound_values() -> None:
    assert cover_lower_bound(8, 3, 4) == 14
    assert cover_lower_bound(32, 2, 4) == 88
    assert cover_lower_bound(32, 3, 8) == 92
    assert cover_lower_bound(6, 2, 6) == 1
    assert cover_lower_bound(7, 3, 3) == math.comb(7, 3)
    assert cover_lower_bound(10, 1, 4) == 3


# -- the shared covering folder -----------------------------------------------------------
def test_best_known_sizes_match_targets(covering_dir: Path) -> None:
    for d, l, k, best in TARGETS:  # noqa: E741
        assert best_known_size(d, k, l, covering_dir) == best
        assert len(construct_cover(d, k, l, rng=0)) <= TOLERANCE * best


def test_lower_bound_below_every_best_known_size(covering_dir: Path) -> None:
    import csv

    with (covering_dir / "covering_numbers.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) > 1000
    for row in rows:
        v, block, t, size = (int(row[c]) for c in ("v", "k", "t", "size"))
        assert cover_lower_bound(v, t, block) <= size, row


def test_folder_block_lists_are_covers(covering_dir: Path) -> None:
    files = sorted((covering_dir / "blocks").glob("C_*_*_*.txt"))
    assert len(files) >= 60
    for path in files:
        match = re.fullmatch(r"C_(\d+)_(\d+)_(\d+)\.txt", path.name)
        assert match is not None, path.name
        v, block, t = (int(x) for x in match.groups())
        blocks = read_cover(covering_dir, v, t, block)  # verified on reading
        assert blocks is not None
        assert len(blocks) == best_known_size(v, t, block, covering_dir), path.name
    assert read_cover(covering_dir, 9, 2, 4) is None  # no such file


def test_construct_from_folder(covering_dir: Path) -> None:
    # The folder's record is used as is.
    assert construct_cover(16, 3, 4, covering_dir=covering_dir) == read_cover(
        covering_dir, 16, 3, 4
    )
    assert len(construct_cover(12, 3, 6, covering_dir=covering_dir)) == 15
    # Its C(16,4,3) blown up competes with the constructions for (32, 8, 3).
    blocks = construct_cover(32, 3, 8, covering_dir=covering_dir)
    check_cover(blocks, 32, 3, 8)
    assert len(blocks) <= 140
    # No C(15,8,3) list: the C(16,8,3) one with point 16 deleted is a candidate.
    blocks = construct_cover(15, 3, 8, covering_dir=covering_dir)
    check_cover(blocks, 15, 3, 8)
    assert len(blocks) <= 14


def test_folder_errors(tmp_path: Path) -> None:
    with pytest.raises(CoveringError, match=r"covering_dir \('.*nowhere'\) must be an existing"):
        best_known_size(8, 3, 4, tmp_path / "nowhere")
    with pytest.raises(CoveringError, match=r"must hold covering_numbers\.csv"):
        best_known_size(8, 3, 4, tmp_path)
    (tmp_path / "covering_numbers.csv").write_text("v,k,t,size\n5,3,2,4\n")
    assert best_known_size(5, 2, 3, tmp_path) == 4
    assert best_known_size(6, 2, 3, tmp_path) is None

    blocks = tmp_path / "blocks"
    blocks.mkdir()
    path = blocks / "C_5_3_2.txt"
    path.write_text("# C(5,3,2) 4 blocks, 1-based\n1 2 3\n1 4 5\n2 4 5\n\n3 4 5\n")
    assert read_cover(tmp_path, 5, 2, 3) == ((0, 1, 2), (0, 3, 4), (1, 3, 4), (2, 3, 4))
    assert construct_cover(5, 2, 3, covering_dir=tmp_path) == read_cover(tmp_path, 5, 2, 3)
    path.write_text("1 2 3\n1 4 5\n2 4 5\n")
    with pytest.raises(CoveringError, match="must cover every 2-set of 5 points"):
        read_cover(tmp_path, 5, 2, 3)
    path.write_text("1 2 x\n")
    with pytest.raises(CoveringError, match=r"C_5_3_2.txt:1 \('1 2 x'\) must be integers"):
        read_cover(tmp_path, 5, 2, 3)
    path.write_text("1 2 6\n")
    with pytest.raises(CoveringError, match=r"point \(5\) must be an int in \[0, 5\)"):
        read_cover(tmp_path, 5, 2, 3)
    path.write_text("1 2 3 4\n")
    with pytest.raises(CoveringError, match="must have <= 3 points"):
        read_cover(tmp_path, 5, 2, 3)
