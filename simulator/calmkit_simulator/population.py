"""Populations: a schema plus one record (row of codes) per simulated user."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from calmkit_client import Attribute, CalmkitError, Schema, SchemaError
from calmkit_client.randomness import RngLike
from calmkit_client.schema import AttrRef
from calmkit_client.validation import check_int

__all__ = ["Population"]

_BLOCK = 1 << 18  # users per block when counting


def cells_of(schema: Schema, codes: np.ndarray, attrs: tuple[int, ...]) -> np.ndarray:
    """:meth:`Schema.cell_index` for codes already validated (a :class:`Population`'s,
    checked once when it was made): only the ``attrs`` columns are read. int64 (n,)."""
    cells = np.zeros(codes.shape[0], dtype=np.int64)
    # one column at a time: the temporaries are (n,), not (n, len(attrs))
    for a, stride in zip(attrs, schema.strides(attrs).tolist()):
        cells += codes[:, a] if stride == 1 else codes[:, a] * np.int64(stride)
    return cells


@dataclass(frozen=True)
class Population:
    """n users' records: ``codes`` (n, d) unsigned ints under ``schema``.

    ``notes`` say how the population was made (source rows, rows dropped, resampling
    with replacement), so experiment output can state it; ``warnings``, what in that
    will make answers poor (most of a file's rows dropped), so commands can warn.
    """

    schema: Schema
    codes: np.ndarray
    name: str = "population"
    notes: tuple[str, ...] = field(default=())
    warnings: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        codes = self.schema.validate_codes(self.codes)
        object.__setattr__(self, "codes", codes.astype(self.schema.code_dtype, copy=False))
        object.__setattr__(self, "notes", tuple(self.notes))
        object.__setattr__(self, "warnings", tuple(self.warnings))

    @property
    def n(self) -> int:
        """Number of users."""
        return int(self.codes.shape[0])

    @property
    def d(self) -> int:
        """Number of attributes."""
        return self.schema.d

    def counts(self, attrs: Iterable[AttrRef]) -> np.ndarray:
        """Exact marginal counts over ``attrs``: int64 of shape ``schema.shape(attrs)``."""
        idx = self.schema.resolve(attrs)
        flat = np.zeros(self.schema.cells(idx), dtype=np.int64)
        for lo in range(0, self.n, _BLOCK):  # in blocks: O(block) temporaries
            cells = cells_of(self.schema, self.codes[lo : lo + _BLOCK], idx)
            flat += np.bincount(cells, minlength=flat.size)
        return flat.reshape(self.schema.shape(idx))

    def marginal(self, attrs: Iterable[AttrRef]) -> np.ndarray:
        """Exact marginal over ``attrs`` as fractions (float64, sums to 1)."""
        if self.n == 0:
            raise CalmkitError("population (n=0) must have users to take a marginal")
        return self.counts(attrs) / self.n

    def resample(self, n: int, rng: RngLike = None) -> Population:
        """n users drawn uniformly **with replacement** (stated in ``notes``)."""
        check_int("n", n, 1)
        if self.n == 0:
            raise CalmkitError("population (n=0) must have users to resample")
        gen = np.random.default_rng(None if rng is None else rng)
        rows = gen.integers(0, self.n, size=int(n))
        note = f"resampled {n} users with replacement from {self.n}"
        return replace(self, codes=self.codes[rows], notes=(*self.notes, note))

    def take(self, rows: np.ndarray) -> Population:
        """The users at positions ``rows`` (an int array), same schema; the codes are
        already valid, so they are not checked again."""
        out = object.__new__(Population)
        for name, value in (
            ("schema", self.schema),
            ("codes", self.codes[np.asarray(rows)]),
            ("name", self.name),
            ("notes", self.notes),
            ("warnings", self.warnings),
        ):
            object.__setattr__(out, name, value)
        return out

    def select(self, attrs: Sequence[AttrRef]) -> Population:
        """The same users restricted to ``attrs`` (in the order given)."""
        idx = self.schema.resolve(attrs)
        schema = Schema(tuple(self.schema.attributes[i] for i in idx))
        return replace(self, schema=schema, codes=self.codes[:, list(idx)])

    def cap_categories(self, c: int) -> Population:
        """Every attribute with more than ``c`` categories merged down to ``c``.

        Ordered attributes (buckets) merge adjacent categories into ``c`` groups of
        about equal frequency; nominal ones keep the ``c - 1`` most frequent categories
        and merge the rest into ``"other"`` (the paper caps Adult and US at 3).
        """
        check_int("max_categories", c, 2, SchemaError)
        attrs: list[Attribute] = []
        codes = np.empty_like(self.codes)
        for j, attr in enumerate(self.schema.attributes):
            col = self.codes[:, j].astype(np.int64)
            if attr.size <= c:
                attrs.append(attr)
                codes[:, j] = col
                continue
            freq = np.bincount(col, minlength=attr.size)
            lut, labels = (_merge_ordered if attr.ordered else _merge_nominal)(attr, freq, c)
            attrs.append(Attribute(attr.name, labels, ordered=attr.ordered))
            codes[:, j] = lut[col]
        return Population(
            Schema(tuple(attrs)),
            codes,
            self.name,
            (*self.notes, f"attributes capped at {c} categories"),
            self.warnings,
        )

    def describe(self) -> str:
        """One line of name, users and domain sizes, then the notes."""
        sizes = ",".join(str(s) for s in self.schema.sizes)
        lines = [f"{self.name}: n={self.n}, d={self.d}, domain sizes [{sizes}]"]
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)


def _merge_ordered(attr: Attribute, freq: np.ndarray, c: int) -> tuple[np.ndarray, tuple[str, ...]]:
    """Adjacent categories into c contiguous groups cut at the cumulative quantiles."""
    cum = np.cumsum(freq) / max(1, freq.sum())
    # group of category i: how many of the cut points j/c (j = 1..c-1) lie before its
    # cumulative mass midpoint; forced non-empty and increasing by clipping.
    mid = cum - freq / max(1, freq.sum()) / 2
    group = np.searchsorted(np.arange(1, c) / c, mid, side="right")
    # every group must be non-empty: fall back to equal-size runs where it is not
    if len(np.unique(group)) < c:
        group = (np.arange(attr.size) * c) // attr.size
    labels = []
    for g in range(c):
        members = np.flatnonzero(group == g)
        first, last = attr.categories[members[0]], attr.categories[members[-1]]
        labels.append(first if first == last else f"{first}..{last}")
    return group.astype(np.int64), tuple(labels)


def _merge_nominal(attr: Attribute, freq: np.ndarray, c: int) -> tuple[np.ndarray, tuple[str, ...]]:
    """The c-1 most frequent categories (ties: first listed) plus "other"."""
    keep = np.argsort(-freq, kind="stable")[: c - 1]
    keep.sort()
    lut = np.full(attr.size, c - 1, dtype=np.int64)
    lut[keep] = np.arange(c - 1)
    other = "other"
    while other in attr.categories:
        other = "_" + other
    return lut, (*(attr.categories[i] for i in keep), other)
