"""Loaders that turn real datasets into populations (CALM paper §5).

- Adult (UCI): adult.data + adult.test, rows with missing values dropped, numeric
  attributes bucketized (fixed cut points below), all 15 attributes (d = 15 as in
  the paper), optional cap at c categories.
- NLTCS: 16 binary attributes, CSV + JSON of domain sizes.
- ACS: 23 binary attributes (PrivBayes binarization), CSV.
- Transactions (retail, Kosarak): the d most frequent items as binary attributes;
  attribute i of a user is 1 iff the transaction contains item i.
- Wide binary data (plants, dna): ``wide/<name>.csv``, read as a CSV.
- Any CSV of categorical columns (header row), with an optional JSON of domains
  ``{column: [labels..] or count}``, so users can bring their own data.

The data folder is ``$CALMKIT_DATA`` if set, else the per-user folder that ``calmkit
datasets fetch`` fills (:func:`user_data_dir`) if it exists; :func:`default_data_dir`
returns ``None`` when there is none (the synthetic population is then the default).
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import platformdirs

from calmkit_client import Attribute, CalmkitError, Schema

from .population import Population
from .synthetic import demo_population, synthetic_population

__all__ = [
    "DATASETS",
    "MISSING_LABEL",
    "DatasetError",
    "DatasetMissing",
    "bin_numeric",
    "default_data_dir",
    "load_acs",
    "load_adult",
    "load_csv",
    "load_dataset",
    "load_kosarak",
    "load_nltcs",
    "load_retail",
    "load_transactions",
    "load_wide",
    "user_data_dir",
]


# What an empty CSV field means (load_csv's ``missing``), and its category's label.
MISSING = ("drop", "category")
MISSING_LABEL = "(missing)"


class DatasetError(CalmkitError):
    """A dataset is missing or malformed."""


class DatasetMissing(DatasetError):
    """A dataset's file, or any data folder, is not on this machine (the other
    :class:`DatasetError` s: it is there and malformed, or does not fit the request)."""


def user_data_dir() -> Path:
    """The per-user folder ``calmkit datasets fetch`` writes to: Linux
    ``~/.local/share/calmkit/datasets`` ($XDG_DATA_HOME), macOS
    ``~/Library/Application Support/calmkit/datasets``, Windows
    ``%LOCALAPPDATA%\\calmkit\\datasets``."""
    return platformdirs.user_data_path("calmkit", appauthor=False) / "datasets"


def fetch_dir() -> Path:
    """Where ``calmkit datasets fetch`` writes without ``--data-dir``: ``$CALMKIT_DATA``
    when set (the folder the loaders then read), else :func:`user_data_dir`."""
    env = os.environ.get("CALMKIT_DATA")
    return Path(env) if env else user_data_dir()


def default_data_dir() -> Path | None:
    """``$CALMKIT_DATA``, else the per-user folder :func:`user_data_dir` if it exists
    (what ``calmkit datasets fetch`` fills), else ``None``."""
    env = os.environ.get("CALMKIT_DATA")
    if env:
        return Path(env)
    return user_data_dir() if user_data_dir().is_dir() else None


def _need(path: Path, what: str = "dataset file", hint: str = "") -> Path:
    if path.is_dir():
        raise DatasetError(f"{what} ({path}) is a directory, not a file{hint}")
    if not path.is_file():
        raise DatasetMissing(f"{what} ({path}) does not exist{hint}")
    return path


def _need_data(path: Path) -> Path:
    """A file of a named dataset: the message says how to get it."""
    name = path.parent.name if path.parent.name != "wide" else path.stem
    return _need(
        path,
        hint=f": run `calmkit datasets fetch {name}` (or pass --data-dir / set CALMKIT_DATA "
        "to a folder that has it)",
    )


def _population_from_labels(
    name: str,
    names: Sequence[str],
    rows: list[list[str]],
    orders: dict[str, list[str]],
    ordered: set[str],
    notes: tuple[str, ...],
) -> Population:
    """Codes from label rows; categories in ``orders[name]`` or :func:`_sorted_labels`."""
    columns = np.array(rows, dtype=object).reshape(len(rows), len(names))
    attrs = []
    for j, col in enumerate(names):
        cats = orders.get(col) or _sorted_labels(set(columns[:, j].tolist()))
        attrs.append(Attribute(col, tuple(cats), ordered=col in ordered))
    schema = Schema(tuple(attrs))
    codes = schema.encode_columns({col: columns[:, j] for j, col in enumerate(names)})
    return Population(schema, codes, name, notes)


def _sorted_labels(labels: set[str]) -> list[str]:
    """Labels in numeric order when every one is a finite number (``2`` before ``10``;
    equal numbers such as ``1`` and ``1.0`` by their text), else in text order."""
    try:
        values = {v: float(v) for v in labels}
    except ValueError:
        return sorted(labels)
    if not all(math.isfinite(x) for x in values.values()):
        return sorted(labels)
    return sorted(labels, key=lambda v: (values[v], v))


# --- Adult --------------------------------------------------------------------------
ADULT_COLUMNS = (
    "age",
    "workclass",
    "fnlwgt",
    "education",
    "education-num",
    "marital-status",
    "occupation",
    "relationship",
    "race",
    "sex",
    "capital-gain",
    "capital-loss",
    "hours-per-week",
    "native-country",
    "income",
)
# numeric attribute -> (right-open cut points, labels)
ADULT_BUCKETS: dict[str, tuple[list[float], list[str]]] = {
    "age": ([25, 35, 45, 55, 65], ["<25", "25-34", "35-44", "45-54", "55-64", "65+"]),
    "fnlwgt": (
        [100_000, 150_000, 200_000, 300_000],
        ["<100k", "100k-150k", "150k-200k", "200k-300k", "300k+"],
    ),
    "education-num": ([9, 10, 11, 13, 14], ["<=8", "9", "10", "11-12", "13", "14+"]),
    "capital-gain": ([1, 5000], ["0", "1-4999", "5000+"]),
    "capital-loss": ([1, 2000], ["0", "1-1999", "2000+"]),
    "hours-per-week": ([35, 41, 51], ["<35", "35-40", "41-50", "51+"]),
}


def load_adult(data_dir: Path | str, max_categories: int | None = None) -> Population:
    """UCI Adult: adult.data and adult.test, missing rows dropped, numeric attributes
    bucketized by :data:`ADULT_BUCKETS`, test labels' trailing "." removed."""
    folder = Path(data_dir) / "adult"
    rows: list[list[str]] = []
    total = 0
    for fname in ("adult.data", "adult.test"):
        for line in _need_data(folder / fname).read_text().splitlines():
            if not line.strip() or line.startswith("|"):
                continue
            total += 1
            fields = [f.strip() for f in line.split(",")]
            if len(fields) != len(ADULT_COLUMNS):
                raise DatasetError(f"{fname} line ({line[:40]!r}) must have 15 fields")
            if "?" in fields:
                continue
            fields[-1] = fields[-1].rstrip(".")
            rows.append(fields)
    table = np.array(rows, dtype=object)
    for col, (cuts, labels) in ADULT_BUCKETS.items():
        j = ADULT_COLUMNS.index(col)
        values = table[:, j].astype(np.float64)
        table[:, j] = np.asarray(labels, dtype=object)[np.searchsorted(cuts, values, "right")]
    orders = {col: labels for col, (_, labels) in ADULT_BUCKETS.items()}
    note = f"adult: {len(rows)} of {total} rows kept (rows with missing values dropped)"
    pop = _population_from_labels(
        "adult", ADULT_COLUMNS, table.tolist(), orders, set(ADULT_BUCKETS), (note,)
    )
    return pop.cap_categories(max_categories) if max_categories else pop


# --- CSV datasets ---------------------------------------------------------------------
def load_csv(
    path: Path | str,
    domains: Path | str | dict[str, int | list[str]] | None = None,
    name: str | None = None,
    bins: dict[str, int] | None = None,
    missing: str = "drop",
) -> Population:
    """Any CSV of categorical columns with a header row.

    ``domains`` (a JSON file or dict) fixes each column's categories: a list of
    labels, or a count c meaning labels ``"0".."c-1"``; columns absent from it take
    their sorted distinct values. ``bins`` (``{column: B}``) cuts a numeric column into
    at most B ordered ranges holding about equal numbers of rows
    (:func:`bin_numeric`). ``missing`` says what an empty field means: ``"drop"``
    (default) drops its row (counted in ``notes``; when that drops most rows, the
    population's ``warnings`` say so), ``"category"`` keeps the row with the field in a
    category of its own, :data:`MISSING_LABEL` (last in a binned or given domain).
    A value outside a given domain is an error naming column and value. A column that
    looks numeric with many distinct values and is not binned gets a note saying how.
    """
    if missing not in MISSING:
        raise DatasetError(f"missing ({missing!r}) must be one of {list(MISSING)}")
    path = _need(Path(path), "CSV file")
    try:
        with path.open(newline="", encoding="utf-8-sig") as fh:
            reader = csv.reader(fh)
            try:
                header = [h.strip() for h in next(reader)]
            except StopIteration:
                raise DatasetError(f"CSV ({path}) must have a header row") from None
            rows = [[v.strip() for v in row] for row in reader if row]
    except UnicodeDecodeError as exc:
        raise DatasetError(
            f"CSV ({path}) must be UTF-8 text: byte {exc.object[exc.start]:#04x} at offset "
            f"{exc.start} is not (re-save it as UTF-8, e.g. iconv -f latin1 -t utf-8)"
        ) from None
    except csv.Error as exc:
        raise DatasetError(f"CSV ({path}) cannot be parsed: {exc}") from None
    if not rows:
        raise DatasetError(f"CSV ({path}) must have a data row below its header (it has none)")
    bad = [i for i, r in enumerate(rows) if len(r) != len(header)]
    if bad:
        raise DatasetError(
            f"CSV row {bad[0] + 2} ({len(rows[bad[0]])} fields) must have {len(header)} fields"
        )
    empties = _empty_fields(header, rows)
    if missing == "category":
        rows = [[v or MISSING_LABEL for v in r] for r in rows]
    kept = [r for r in rows if all(v != "" for v in r)]
    binned = _bin_columns(header, kept, bins or {})
    if rows and not kept:
        raise DatasetError(
            f"CSV ({path}) has no row without an empty field, and such rows are dropped: "
            f"{empties}; fill or drop those columns"
        )
    if isinstance(domains, (str, Path)):
        domains = _read_domains(_need(Path(domains), "domains file"))
    orders: dict[str, list[str]] = {}
    for col, dom in (domains or {}).items():
        if col not in header:
            raise DatasetError(f"domain column ({col!r}) must be a CSV column {header}")
        if isinstance(dom, int) and not isinstance(dom, bool) and dom >= 1:
            orders[col] = [str(i) for i in range(dom)]
        elif isinstance(dom, list) and dom and all(isinstance(v, (str, int)) for v in dom):
            orders[col] = [str(v) for v in dom]
        else:
            raise DatasetError(
                f"domain of {col!r} ({str(dom)[:60]}) must be a count >= 1 or a non-empty "
                "list of labels"
            )
    _missing_last(header, kept, orders)
    dropped = f" ({empties})" if len(kept) < len(rows) else ""
    if missing == "category":
        how = f"empty fields kept as the category {MISSING_LABEL!r}" + (
            f" ({empties})" if empties else ""
        )
    else:
        how = f"rows with empty fields dropped{dropped}"
    notes = (
        f"{path.name}: {len(kept)} of {len(rows)} rows kept ({how})",
        *_numeric_hints(header, kept, set(orders) | set(binned)),
    )
    orders.update(binned)
    pop = _population_from_labels(name or path.stem, header, kept, orders, set(binned), notes)
    if len(kept) * 2 < len(rows):
        lost = (
            f"{len(rows) - len(kept)} of {len(rows)} CSV rows were dropped for empty fields "
            f"({empties}): answers rest on the {len(kept)} left; --missing category keeps "
            "them, an empty field a category of its own (or drop the column)"
        )
        pop = replace(pop, warnings=(*pop.warnings, lost))
    return pop


def _missing_last(header: list[str], rows: list[list[str]], orders: dict[str, list[str]]) -> None:
    """Give each column of a given domain that holds :data:`MISSING_LABEL` that label
    last (in place), unless the domain lists it."""
    for col, order in orders.items():
        j = header.index(col)
        if MISSING_LABEL not in order and any(r[j] == MISSING_LABEL for r in rows):
            order.append(MISSING_LABEL)


NUMERIC_HINT_VALUES = 20  # a numeric-looking column with more distinct values gets a hint


def bin_numeric(values: np.ndarray, bins: int) -> tuple[np.ndarray, list[str]]:
    """Cut numbers (n,) float into at most ``bins`` ranges of about equal counts (cut
    points at quantiles, repeated ones merged): codes (n,) int64 and labels
    ``["[18, 25)", ..., "[65, 90]"]`` in order. A value that holds several quantiles'
    mass (90% zeros) is a range of its own (``[0, 0]``, then ``(0, 498]``), so numbers
    of two or more distinct values never make one range; a range that holds no value
    is merged into the next."""
    cuts, repeats = np.unique(np.quantile(values, np.linspace(0, 1, bins + 1)), return_counts=True)
    low, high = f"{cuts[0]:.6g}", f"{cuts[-1]:.6g}"
    if len(cuts) == 1:
        return np.zeros(len(values), np.int64), [f"[{low}, {low}]"]
    points = _cut_points(cuts, repeats > 1)
    filled = np.bincount(_bin_codes(values, points), minlength=len(points) + 1)
    points = [p for p, count in zip(points, filled) if count]  # empty range: into the next
    labels = []
    for lo, hi in zip([None, *points], [*points, None]):
        start = f"[{low}" if lo is None else f"{'[' if lo[1] else '('}{lo[0]:.6g}"
        end = f"{high}]" if hi is None else f"{hi[0]:.6g}{')' if hi[1] else ']'}"
        labels.append(f"{start}, {end}")
    return _bin_codes(values, points), labels


def _cut_points(cuts: np.ndarray, heavy: np.ndarray) -> list[tuple[float, bool]]:
    """The cut points between the ranges, in order, as ``(value, below)``: ``below`` when
    a number equal to it starts the next range (``[c, ...``), else it ends the range
    before (``..., c]``). Every distinct quantile inside the numbers starts a range; a
    ``heavy`` one (repeated quantiles: much mass at one value) is also a range alone."""
    starts = [(float(c), True) for c in cuts[1:-1]]
    if heavy[-1]:
        starts.append((float(cuts[-1]), True))
    ends = [(float(c), False) for c in cuts[:-1][heavy[:-1]]]
    return sorted([*starts, *ends], key=lambda p: (p[0], not p[1]))


def _bin_codes(values: np.ndarray, points: list[tuple[float, bool]]) -> np.ndarray:
    """Each number's range: how many of ``points`` (:func:`_cut_points`) it has passed."""
    starts = np.array([v for v, below in points if below], dtype=np.float64)
    ends = np.array([v for v, below in points if not below], dtype=np.float64)
    passed = np.searchsorted(starts, values, side="right") + np.searchsorted(ends, values)
    return passed.astype(np.int64)


def _bin_columns(
    header: list[str], rows: list[list[str]], bins: dict[str, int]
) -> dict[str, list[str]]:
    """Replace each binned column's values in ``rows`` by their range's label (in
    place; :data:`MISSING_LABEL` stays, the last label); returns ``{column: labels in
    order}``."""
    out: dict[str, list[str]] = {}
    for col, count in bins.items():
        if col not in header:
            raise DatasetError(f"bins column ({col!r}) must be a CSV column {header}")
        if isinstance(count, bool) or not isinstance(count, int) or count < 2:
            raise DatasetError(f"bins of {col!r} ({count!r}) must be an int >= 2")
        j = header.index(col)
        known = [r for r in rows if r[j] != MISSING_LABEL]
        values = np.array([_number(col, r[j]) for r in known], dtype=np.float64)
        codes, labels = bin_numeric(values, count) if known else (np.zeros(0, np.int64), [])
        for r, c in zip(known, codes.tolist()):
            r[j] = labels[c]
        out[col] = labels + ([MISSING_LABEL] if len(known) < len(rows) else [])
    return out


def _number(col: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise DatasetError(f"value of {col!r} ({text[:40]!r}) must be a number to bin") from None
    if not np.isfinite(value):
        raise DatasetError(f"value of {col!r} ({text[:40]!r}) must be a finite number to bin")
    return value


def _numeric_hints(header: list[str], rows: list[list[str]], fixed: set[str]) -> list[str]:
    """A note per column that looks numeric with many distinct values."""
    hints = []
    for j, col in enumerate(header):
        distinct = {r[j] for r in rows} if col not in fixed else set()
        if len(distinct) <= NUMERIC_HINT_VALUES:
            continue
        try:
            [float(v) for v in distinct]
        except ValueError:
            continue
        hints.append(
            f"column {col!r} looks numeric ({len(distinct)} distinct values, each a "
            f"category): bin it, e.g. --bins {col}=8 (ranges of about equal counts), or "
            "give its categories in a domains file"
        )
    return hints


def _empty_fields(header: list[str], rows: list[list[str]]) -> str:
    """Which columns have empty fields, most first: ``'note' empty in all 200 rows,
    'age' in 3``."""
    if not rows:
        return ""
    counts = (np.array(rows, dtype=object) == "").sum(axis=0)
    order = [j for j in np.argsort(-counts, kind="stable") if counts[j] > 0]
    parts = [
        f"{header[j]!r} empty in {'all ' if counts[j] == len(rows) else ''}{counts[j]} "
        f"row{'' if counts[j] == 1 else 's'}"
        for j in order[:5]
    ]
    more = f", and {len(order) - 5} more columns" if len(order) > 5 else ""
    return ", ".join(parts) + more


def _read_domains(path: Path) -> dict[str, int | list[str]]:
    """A ``*.domains.json``: ``{column: count or [labels]}``, or a clear error."""
    try:
        domains = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DatasetError(f"domains file ({path}) must be JSON: {exc}") from None
    if not isinstance(domains, dict):
        raise DatasetError(
            f"domains file ({path}) must hold an object {{column: count or [labels]}}, "
            f"not a {type(domains).__name__}"
        )
    return domains


def load_nltcs(data_dir: Path | str) -> Population:
    """NLTCS: 16 binary disability items (nltcs.csv with nltcs-domain.json)."""
    folder = Path(data_dir) / "nltcs"
    _need_data(folder / "nltcs.csv")
    return load_csv(folder / "nltcs.csv", folder / "nltcs-domain.json", name="nltcs")


def load_acs(data_dir: Path | str) -> Population:
    """ACS: 23 binary attributes as binarized by PrivBayes (acs.csv)."""
    path = Path(data_dir) / "acs" / "acs.csv"
    with _need_data(path).open() as fh:
        header = fh.readline().strip().split(",")
    return load_csv(path, {col: 2 for col in header}, name="acs")


def load_wide(data_dir: Path | str, name: str) -> Population:
    """A wide binary dataset of ``wide/`` (plants: 69 attributes, dna: 180): many
    attributes, few users each. Categories are the values seen, so a column that never
    varies has one category."""
    return load_csv(_need_data(Path(data_dir) / "wide" / f"{name}.csv"), name=name)


# --- transactions -----------------------------------------------------------------------
def load_transactions(path: Path | str, d: int, name: str | None = None) -> Population:
    """Transactions (one line per user, space-separated item ids) -> the ``d`` most
    frequent items as binary attributes ``item<id>`` (ties: smaller id first)."""
    if isinstance(d, bool) or not isinstance(d, int) or d < 1:
        raise DatasetError(f"d ({d!r}) must be an int >= 1")
    lines = _need(Path(path)).read_text().splitlines()
    tokens = [line.split() for line in lines]
    lengths = np.fromiter((len(t) for t in tokens), dtype=np.int64, count=len(tokens))
    items = np.array([int(x) for t in tokens for x in t], dtype=np.int64)
    users = np.repeat(np.arange(len(tokens)), lengths)
    # count each item once per user (a transaction is a set)
    pairs = np.unique(np.stack([users, items], axis=1), axis=0)
    ids, freq = np.unique(pairs[:, 1], return_counts=True)
    if ids.size < d:
        raise DatasetError(f"d ({d}) must be at most the {ids.size} distinct items of {path}")
    top = ids[np.lexsort((ids, -freq))[:d]]
    column = np.full(int(ids.max()) + 1, -1, dtype=np.int64)
    column[top] = np.arange(d)
    codes = np.zeros((len(tokens), d), dtype=np.uint8)
    hit = column[pairs[:, 1]] >= 0
    codes[pairs[hit, 0], column[pairs[hit, 1]]] = 1
    schema = Schema(tuple(Attribute(f"item{int(i)}", ("0", "1")) for i in top))
    note = f"{Path(path).name}: {len(tokens)} transactions, top {d} of {ids.size} items"
    return Population(schema, codes, name or Path(path).stem, (note,))


def load_retail(data_dir: Path | str, d: int = 16) -> Population:
    """FIMI retail (retail.dat): one binary attribute per item, the ``d`` most
    frequent items."""
    path = _need_data(Path(data_dir) / "retail" / "retail.dat")
    return load_transactions(path, d, name="retail")


def load_kosarak(data_dir: Path | str, d: int = 16) -> Population:
    """FIMI Kosarak (its prefix, kosarak_prefix.dat): one binary attribute per item,
    the ``d`` most frequent items."""
    path = _need_data(Path(data_dir) / "kosarak" / "kosarak_prefix.dat")
    return load_transactions(path, d, name="kosarak")


# --- one entry point ------------------------------------------------------------------------
DATASETS: dict[str, str] = {
    "synthetic": "random Bayesian network, d binary attributes (default, needs no files)",
    "synthetic:LO-HI": "the same with LO to HI categories per attribute (drawn uniformly)",
    "synthetic[:LO-HI]:strength=S": "either with network strength S (default 1.5; 0: "
    "independent; 4 on 3-12 categories: 2 in 5 of a triple's cells near empty)",
    "demo": "the population of `calmkit demo`: 100,000 users, 8 attributes of 2-4 categories",
    "adult": "UCI Adult, 15 attributes, numeric ones bucketized",
    "nltcs": "NLTCS, 16 binary attributes",
    "acs": "ACS (PrivBayes binarization), 23 binary attributes",
    "retail": "FIMI retail transactions, top-d items as binary attributes",
    "kosarak": "FIMI kosarak prefix, top-d items as binary attributes",
    "plants": "USDA plants presence by state, 69 binary attributes (wide: 23,215 users)",
    "dna": "DNA splice-junction features, 180 binary attributes (wide: 3,186 users)",
    "csv:PATH": "your CSV of categorical columns (optional PATH.domains.json beside it)",
}


_SYNTHETIC = re.compile(r"synthetic(?::(\d+)-(\d+))?(?::strength=(\d+(?:\.\d*)?))?")


def _synthetic_spec(name: str, d: int, rng: int | None) -> tuple[tuple[int, ...], float]:
    """Category counts and network strength of ``synthetic`` (binary, strength 1.5),
    ``synthetic:LO-HI`` (each count drawn uniformly from LO..HI, seeded by ``rng``) and
    either with ``:strength=S`` (:class:`~.synthetic.BayesianNetwork`: 0 independent,
    larger sharper and more dependent)."""
    match = _SYNTHETIC.fullmatch(name)
    if match is None or (match[1] is not None and not 2 <= int(match[1]) <= int(match[2])):
        raise DatasetError(
            f"dataset ({name!r}) must be synthetic, synthetic:LO-HI with 2 <= LO <= HI, "
            "or either with :strength=S (S >= 0)"
        )
    strength = 1.5 if match[3] is None else float(match[3])
    if match[1] is None:
        return (2,) * d, strength
    gen = np.random.default_rng([0 if rng is None else rng, 1])
    sizes = tuple(int(x) for x in gen.integers(int(match[1]), int(match[2]) + 1, size=d))
    return sizes, strength


def _csv_path(name: str) -> Path:
    """The file a ``csv:PATH`` dataset names (an empty PATH is an error)."""
    if not name[4:].strip():
        raise DatasetError(
            f"dataset ({name!r}) must name a CSV file after csv: (e.g. csv:people.csv)"
        )
    return Path(name[4:])


def load_dataset(
    name: str,
    data_dir: Path | str | None = None,
    d: int | None = None,
    max_categories: int | None = None,
    rng: int | None = 0,
    bins: dict[str, int] | None = None,
    missing: str = "drop",
) -> Population:
    """The population called ``name`` (see :data:`DATASETS`).

    ``d``: number of attributes (top-d items for transactions, first d attributes
    otherwise, d binary attributes for synthetic; default: all / 16 / 8).
    ``max_categories``: cap every attribute at that many categories.
    ``bins``: numeric columns of a ``csv:`` dataset to cut into ranges, and ``missing``:
    what its empty fields mean (:func:`load_csv`).
    """
    if bins and not name.startswith("csv:"):
        raise DatasetError(f"bins ({bins!r}) apply to a csv: dataset only, not {name!r}")
    if missing != "drop" and not name.startswith("csv:"):
        raise DatasetError(f"missing ({missing!r}) applies to a csv: dataset only, not {name!r}")
    loaders: dict[str, Callable[[Path], Population]] = {
        "adult": load_adult,
        "nltcs": load_nltcs,
        "acs": load_acs,
        "retail": lambda p: load_retail(p, d or 16),
        "kosarak": lambda p: load_kosarak(p, d or 16),
        "plants": lambda p: load_wide(p, "plants"),
        "dna": lambda p: load_wide(p, "dna"),
    }
    if name == "synthetic" or name.startswith("synthetic:"):
        sizes, strength = _synthetic_spec(name, d or 8, rng)
        pop = synthetic_population(n=1 << 16, sizes=sizes, strength=strength, rng=rng)
    elif name == "demo":
        pop = demo_population(100_000, rng=0 if rng is None else rng)
    elif name.startswith("csv:"):
        path = _csv_path(name)
        sidecar = path.with_suffix(".domains.json")
        pop = load_csv(path, sidecar if sidecar.is_file() else None, bins=bins, missing=missing)
    elif name in loaders:
        folder = Path(data_dir) if data_dir is not None else default_data_dir()
        if folder is None:
            raise DatasetMissing(
                f"dataset ({name!r}) is not on this machine: run `calmkit datasets fetch "
                f"{name}` (or pass --data-dir / set CALMKIT_DATA)"
            )
        pop = loaders[name](folder)
    else:
        raise DatasetError(f"dataset ({name!r}) must be one of {list(DATASETS)}")
    if d is not None and name not in ("retail", "kosarak") and not name.startswith("synthetic"):
        if not 1 <= d <= pop.d:
            raise DatasetError(f"d ({d}) must be in [1, {pop.d}] for {name}")
        pop = pop.select(list(range(d)))
    if max_categories:
        pop = pop.cap_categories(max_categories)
    return pop
