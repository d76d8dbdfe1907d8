"""Loaders: row counts and domain sizes of the shared datasets, and your own CSV."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from calmkit_client.errors import SchemaError
from calmkit_simulator import (
    DatasetError,
    Population,
    load_csv,
    load_dataset,
    load_transactions,
)
from calmkit_simulator.datasets import bin_numeric


@pytest.mark.parametrize(
    ("name", "n", "sizes"),
    [
        ("adult", 45_222, (6, 7, 5, 16, 6, 7, 14, 6, 5, 2, 3, 3, 4, 41, 2)),
        ("nltcs", 21_574, (2,) * 16),
        ("acs", 47_461, (2,) * 23),
        ("retail", 88_162, (2,) * 16),
        ("kosarak", 36_682, (2,) * 16),
    ],
)
def test_shared_datasets(datasets_dir: Path, name: str, n: int, sizes: tuple[int, ...]) -> None:
    pop = load_dataset(name, datasets_dir)
    assert pop.n == n and pop.schema.sizes == sizes
    assert pop.notes  # provenance is stated


def test_adult_drops_missing_rows_and_caps(datasets_dir: Path) -> None:
    pop = load_dataset("adult", datasets_dir, max_categories=3)
    assert max(pop.schema.sizes) == 3 and pop.n == 45_222
    assert pop.schema.attributes[-1].categories == ("<=50K", ">50K")  # test "." removed
    # capping merges categories; it never moves users between merged groups' totals
    full = load_dataset("adult", datasets_dir)
    assert full.counts(["sex"]).tolist() == pop.counts(["sex"]).tolist()
    income = pop.marginal(["income"])
    assert 0.2 < income[1] < 0.3  # about 24.8% earn >50K


def test_transactions_top_items(datasets_dir: Path) -> None:
    pop = load_dataset("kosarak", datasets_dir, d=8)
    assert pop.d == 8
    freq = pop.codes.mean(axis=0)
    assert np.all(np.diff(freq) <= 0)  # most frequent first


def test_transactions_semantics(tmp_path: Path) -> None:
    path = tmp_path / "t.dat"
    path.write_text("5 7 5\n7\n\n9 5\n")
    pop = load_transactions(path, d=2)
    assert pop.schema.names == ("item5", "item7")  # 5 and 7 both in 2 users; 5 < 7
    np.testing.assert_array_equal(pop.codes, [[1, 1], [0, 1], [0, 0], [1, 0]])
    with pytest.raises(DatasetError, match=r"d \(4\) must be at most the 3 distinct items"):
        load_transactions(path, d=4)


def test_own_csv_with_domains(tmp_path: Path) -> None:
    path = tmp_path / "people.csv"
    path.write_text("smoker,region\nyes,N\nno,S\n,S\nno,N\n")
    domains = tmp_path / "people.domains.json"
    domains.write_text(json.dumps({"smoker": ["no", "yes"], "region": ["N", "S", "E"]}))
    pop = load_dataset(f"csv:{path}")
    assert pop.schema.sizes == (2, 3) and pop.n == 3
    assert "3 of 4 rows kept" in pop.notes[0]
    np.testing.assert_array_equal(pop.codes, [[1, 0], [0, 1], [0, 0]])
    plain = load_csv(path)  # no domains: sorted distinct values
    assert plain.schema.attributes[1].categories == ("N", "S")
    assert "('smoker' empty in 1 row)" in pop.notes[0]  # which column cost the row


def test_a_csv_of_a_header_alone_says_so(tmp_path: Path) -> None:
    path = tmp_path / "blank.csv"
    path.write_text("age,sex\n\n")
    with pytest.raises(DatasetError, match=r"blank.csv\) must have a data row below its header"):
        load_csv(path)


def test_numeric_labels_are_in_numeric_order(tmp_path: Path) -> None:
    path = tmp_path / "households.csv"
    path.write_text("kids,size,region\n10,1.0,N\n2,1,S\n0,-3,E\n2,2.5,N\n")
    cats = [a.categories for a in load_csv(path).schema.attributes]
    assert cats == [("0", "2", "10"), ("-3", "1", "1.0", "2.5"), ("E", "N", "S")]


def test_a_column_empty_in_every_row_is_named(tmp_path: Path) -> None:
    path = tmp_path / "people.csv"
    path.write_text("age,note,sex\n" + "".join(f"{i % 3},,{'mf'[i % 2]}\n" for i in range(20)))
    with pytest.raises(DatasetError, match=r"'note' empty in all 20 rows; fill or drop"):
        load_csv(path)


def test_empty_fields_as_a_category_keep_every_row(tmp_path: Path) -> None:
    path = tmp_path / "survey.csv"
    # 'income' is optional: empty in 3 of 4 rows; 'age' is numeric, empty once
    path.write_text("age,income,region\n30,,N\n,high,S\n50,,S\n70,,N\n")
    with pytest.raises(DatasetError, match=r"no row without an empty field"):
        load_csv(path)  # dropping rows would drop them all
    kept = load_csv(path, {"region": ["N", "S"]}, bins={"age": 2}, missing="category")
    assert kept.n == 4 and not kept.warnings
    income, age, region = (kept.schema.attributes[i] for i in (1, 0, 2))
    assert income.categories == ("(missing)", "high")
    assert age.categories[-1] == "(missing)" and len(age.categories) == 3
    assert region.categories == ("N", "S")  # its given domain: nothing missing, no label
    np.testing.assert_array_equal(kept.codes[:, 1], [0, 1, 0, 0])
    np.testing.assert_array_equal(kept.codes[:, 0], [0, 2, 1, 1])  # [30, 50) [50, 70]
    assert "empty fields kept as the category '(missing)'" in kept.notes[0]
    with pytest.raises(DatasetError, match=r"missing \('zero'\) must be one of"):
        load_csv(path, missing="zero")
    with pytest.raises(DatasetError, match=r"missing \('category'\) applies to a csv"):
        load_dataset("synthetic", missing="category")


def test_dropping_most_rows_is_a_warning_naming_the_column(tmp_path: Path) -> None:
    path = tmp_path / "people.csv"
    rows = "".join(f"{i % 3},{'x' if i % 10 == 0 else ''},{'mf'[i % 2]}\n" for i in range(40))
    path.write_text("age,note,sex\n" + rows)
    pop = load_csv(path)
    assert pop.n == 4
    (warning,) = pop.warnings
    assert "36 of 40 CSV rows were dropped" in warning
    assert "'note' empty in 36 rows" in warning and "--missing category" in warning
    assert pop.resample(10, rng=0).warnings == pop.warnings  # kept through resampling
    assert pop.select(["age"]).warnings == pop.warnings
    assert pop.cap_categories(2).warnings == pop.warnings
    # a few rows dropped is a note, not a warning
    path.write_text("age,note,sex\n" + rows.replace(",,", ",y,"))
    assert load_csv(path).warnings == ()


def test_csv_errors_name_the_problem(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("a,b\n1,2\n3\n")
    with pytest.raises(DatasetError, match=r"CSV row 3 \(1 fields\) must have 2 fields"):
        load_csv(path)
    path.write_text("a,b\n1,2\n")
    with pytest.raises(SchemaError, match=r"value of 'a' \('1'\) must be one of \['x'\]"):
        load_csv(path, {"a": ["x"]})
    with pytest.raises(DatasetError, match=r"domain column \('c'\)"):
        load_csv(path, {"c": 2})
    with pytest.raises(DatasetError, match=r"CSV file \(.*missing.csv\) does not exist"):
        load_csv(tmp_path / "missing.csv")
    with pytest.raises(DatasetError, match=r"dataset \('mnist'\) must be one of"):
        load_dataset("mnist")


def test_a_csv_dataset_without_a_file_name_or_naming_a_folder_says_so(tmp_path: Path) -> None:
    for name in ("csv:", "csv: "):
        with pytest.raises(DatasetError, match=r"dataset \('csv: ?'\) must name a CSV file after"):
            load_dataset(name)
    with pytest.raises(DatasetError, match=r"CSV file \(.*\) is a directory, not a file"):
        load_dataset(f"csv:{tmp_path}")
    with pytest.raises(DatasetError, match=r"is a directory, not a file"):
        load_csv(tmp_path)


def test_numeric_columns_are_binned_into_ordered_ranges_of_about_equal_counts(
    tmp_path: Path,
) -> None:
    rng = np.random.default_rng(5)
    ages = rng.integers(18, 91, size=3000)
    path = tmp_path / "num.csv"
    path.write_text("age,sex\n" + "".join(f"{a},{'mf'[i % 2]}\n" for i, a in enumerate(ages)))
    pop = load_csv(path, bins={"age": 6})
    attr = pop.schema.attributes[0]
    assert attr.ordered and len(attr.categories) == 6
    assert attr.categories[0].startswith("[18, ") and attr.categories[-1].endswith(", 90]")
    counts = np.bincount(pop.codes[:, 0], minlength=6)
    assert counts.min() > 0.7 * 3000 / 6  # quantile cuts: about equal counts
    # each user's range holds her age
    lows = np.array([float(c[1:].split(",")[0]) for c in attr.categories])
    assert np.all(lows[pop.codes[:, 0]] <= ages)
    assert not any("looks numeric" in n for n in pop.notes)


def test_a_value_holding_most_of_a_numeric_column_is_a_range_of_its_own(
    tmp_path: Path,
) -> None:
    # 90% zeros: every quantile cut but the last is 0; merged, they made one range
    # [0, 498] and the attribute one category (dropped from every plan)
    rng = np.random.default_rng(3)
    spend = np.where(rng.random(3000) < 0.9, 0, rng.integers(1, 499, size=3000))
    spend[0] = 498
    path = tmp_path / "skew.csv"
    path.write_text("spend,sex\n" + "".join(f"{v},{'mf'[i % 2]}\n" for i, v in enumerate(spend)))
    attr = load_csv(path, bins={"spend": 4}).schema.attributes[0]
    assert attr.categories == ("[0, 0]", "(0, 498]")
    codes, labels = bin_numeric(spend.astype(float), 4)
    assert np.array_equal(codes, (spend > 0).astype(np.int64))
    # mass at the top, or inside: split off too; every range holds a value
    values = np.r_[np.arange(100.0), np.full(400, 100.0)]
    codes, labels = bin_numeric(values, 4)
    assert labels == ["[0, 100)", "[100, 100]"] and np.bincount(codes).tolist() == [100, 400]
    values = np.r_[np.arange(100.0), np.full(300, 50.0), np.arange(101.0, 200.0)]
    codes, labels = bin_numeric(values, 4)
    assert labels[1] == "[50, 50]" and np.bincount(codes)[1] == 301
    assert np.bincount(codes).min() > 0 and len(labels) <= 4
    assert bin_numeric(np.array([0.0, 0.0, 0.0, 1.0]), 2)[1] == ["[0, 0]", "(0, 1]"]
    assert bin_numeric(np.full(5, 3.0), 4)[1] == ["[3, 3]"]


def test_an_unbinned_numeric_column_gets_a_hint_and_bad_bins_are_named(tmp_path: Path) -> None:
    path = tmp_path / "num.csv"
    path.write_text("age,sex\n" + "".join(f"{18 + i % 50},{'mf'[i % 2]}\n" for i in range(200)))
    pop = load_csv(path)
    assert any(
        "column 'age' looks numeric (50 distinct values" in n and "--bins age=8" in n
        for n in pop.notes
    )
    with pytest.raises(DatasetError, match=r"value of 'sex' \('m'\) must be a number to bin"):
        load_csv(path, bins={"sex": 2})
    with pytest.raises(DatasetError, match=r"bins column \('height'\) must be a CSV column"):
        load_csv(path, bins={"height": 4})
    with pytest.raises(DatasetError, match=r"bins of 'age' \(1\) must be an int >= 2"):
        load_csv(path, bins={"age": 1})
    with pytest.raises(DatasetError, match=r"apply to a csv: dataset only"):
        load_dataset("synthetic", bins={"a0": 2})


def test_the_demo_dataset_is_the_population_the_demo_collects_from() -> None:
    # `calmkit simulate --dataset demo` (and the planner benchmark's demo settings)
    # replay exactly the users `calmkit demo` sends through the service at seed 0
    from calmkit_simulator.synthetic import DEMO_SIZES, demo_population

    pop = load_dataset("demo")
    assert pop.n == 100_000 and pop.schema.sizes == DEMO_SIZES
    np.testing.assert_array_equal(pop.codes, demo_population(100_000, rng=0).codes)
    other = load_dataset("demo", rng=1)
    assert not np.array_equal(other.codes, pop.codes)


def test_synthetic_specs_set_domains_and_strength() -> None:
    # synthetic[:LO-HI][:strength=S]: the strength is the network's (0: independent);
    # the same seed gives the same domains whatever the strength
    from calmkit_aggregator.planning.profile import pair_dependence

    def mean_dependence(pop: Population) -> float:
        s = pop.schema.sizes
        pairs = [(a, b) for a in range(pop.d) for b in range(a + 1, pop.d)]
        return float(
            np.mean([pair_dependence(pop.marginal((a, b)).reshape(s[a], s[b])) for a, b in pairs])
        )

    plain = load_dataset("synthetic:3-12", d=6)
    strong = load_dataset("synthetic:3-12:strength=5", d=6)
    flat = load_dataset("synthetic:3-12:strength=0", d=6)
    assert plain.schema.sizes == strong.schema.sizes == flat.schema.sizes
    assert all(3 <= s <= 12 for s in plain.schema.sizes)
    assert "strength 5.0" in strong.notes[0] and "strength 1.5" in plain.notes[0]
    # 65,536 users: independent attributes leave only sampling noise (about
    # dim / n per pair in the profile's unit, 1.5e-4 here)
    assert mean_dependence(flat) < 1e-3 < mean_dependence(plain) < mean_dependence(strong)
    assert load_dataset("synthetic:strength=0", d=4).schema.sizes == (2, 2, 2, 2)
    for bad in ("synthetic:strength=-1", "synthetic:12-3", "synthetic:3-12:s4"):
        with pytest.raises(DatasetError, match=r"must be synthetic, synthetic:LO-HI"):
            load_dataset(bad)
