"""Attributes, schemas, and the mixed-radix cell indices of marginal tables.

A record is a tuple of category *codes* (0-based ints), one per attribute. A marginal
over attributes ``A = (a_1, .., a_k)`` is a dense table of shape
``(|a_1|, .., |a_k|)``; the cell of a record in it is the C-order (row-major,
first attribute most significant) flat index of its codes on ``A``, so
``table.reshape(schema.shape(A))`` and :func:`numpy.unravel_index` agree with
:meth:`Schema.cell_index`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

from .errors import SchemaError
from .validation import check_int, is_int

__all__ = ["AttrRef", "Attribute", "Schema"]

_VALIDATE_ROWS = 1 << 16  # rows per block when codes are range-checked

AttrRef = int | str
Label = str | int


def _label(value: object, where: str) -> str:
    """Labels are strings; ints (not bools or floats) are accepted as their decimal text."""
    if isinstance(value, str):
        return value
    if is_int(value):
        return str(int(value))
    raise SchemaError(f"{where} ({value!r}) must be a str label (or an int standing for one)")


@dataclass(frozen=True)
class Attribute:
    """One categorical attribute: a name and its ordered categories (labels).

    ``ordered`` marks categories with a natural order (buckets of a numeric value);
    it only changes how categories are merged when capping a domain.
    """

    name: str
    categories: tuple[str, ...]
    ordered: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise SchemaError(f"attribute name ({self.name!r}) must be a non-empty str")
        if isinstance(self.categories, (str, bytes)) or not isinstance(self.categories, Iterable):
            raise SchemaError(
                f"categories of {self.name!r} ({self.categories!r}) must be a sequence of labels"
            )
        cats = tuple(_label(c, f"category of {self.name!r}") for c in self.categories)
        if not cats:
            raise SchemaError(f"categories of {self.name!r} (()) must not be empty")
        seen: set[str] = set()
        for c in cats:
            if c in seen:
                raise SchemaError(f"categories of {self.name!r} ({c!r}) must not repeat")
            seen.add(c)
        object.__setattr__(self, "categories", cats)
        object.__setattr__(self, "ordered", bool(self.ordered))

    @property
    def size(self) -> int:
        """Number of categories."""
        return len(self.categories)

    @cached_property
    def _codes(self) -> dict[str, int]:
        return {c: i for i, c in enumerate(self.categories)}

    def code(self, label: Label) -> int:
        """The code of ``label``; :class:`SchemaError` if it is not a category."""
        text = _label(label, f"value of {self.name!r}")
        try:
            return self._codes[text]
        except KeyError:
            raise SchemaError(
                f"value of {self.name!r} ({text!r}) must be one of {list(self.categories)}"
            ) from None

    def label(self, code: int) -> str:
        """The label of ``code``; :class:`SchemaError` if out of range."""
        if not (isinstance(code, (int, np.integer)) and 0 <= int(code) < self.size):
            raise SchemaError(
                f"code of {self.name!r} ({code!r}) must be an int in [0, {self.size})"
            )
        return self.categories[int(code)]


@dataclass(frozen=True)
class Schema:
    """Ordered attributes of a record (the domain of the data).

    ``Schema.from_sizes([2, 3])`` builds anonymous attributes ``a0, a1`` with labels
    ``"0", "1", ..``.
    """

    attributes: tuple[Attribute, ...]
    _index: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        attrs = tuple(self.attributes)
        if not attrs:
            raise SchemaError("attributes (()) must not be empty")
        index: dict[str, int] = {}
        for i, a in enumerate(attrs):
            if not isinstance(a, Attribute):
                raise SchemaError(f"attributes[{i}] ({a!r}) must be an Attribute")
            if a.name in index:
                raise SchemaError(f"attribute name ({a.name!r}) must be unique in a schema")
            index[a.name] = i
        object.__setattr__(self, "attributes", attrs)
        object.__setattr__(self, "_index", index)

    # -- construction -------------------------------------------------------------
    @classmethod
    def from_sizes(cls, sizes: Sequence[int], names: Sequence[str] | None = None) -> Schema:
        """Attributes with ``sizes[i]`` categories labelled ``"0".."c-1"``."""
        sizes = list(sizes)
        if names is None:
            names = [f"a{i}" for i in range(len(sizes))]
        if len(names) != len(sizes):
            raise SchemaError(f"names ({len(names)} given) must match sizes ({len(sizes)} given)")
        attrs = []
        for name, c in zip(names, sizes):
            size = check_int(f"size of {name!r}", c, 1, SchemaError)
            attrs.append(Attribute(name, tuple(str(i) for i in range(size))))
        return cls(tuple(attrs))

    @classmethod
    def from_domains(cls, domains: Mapping[str, int | Sequence[Label]]) -> Schema:
        """From ``{name: categories}`` or ``{name: count}`` (labels ``"0".."c-1"``)."""
        attrs = []
        for name, dom in domains.items():
            if is_int(dom):
                size = check_int(f"size of {name!r}", dom, 1, SchemaError)
                attrs.append(Attribute(name, tuple(str(i) for i in range(size))))
            else:
                attrs.append(Attribute(name, tuple(dom)))  # type: ignore[arg-type]
        return cls(tuple(attrs))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the plan digest hashes it)."""
        return {
            "attributes": [
                {"name": a.name, "categories": list(a.categories), "ordered": a.ordered}
                for a in self.attributes
            ]
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Schema:
        try:
            items = data["attributes"]
            return cls(
                tuple(
                    Attribute(a["name"], tuple(a["categories"]), bool(a.get("ordered", False)))
                    for a in items
                )
            )
        except (KeyError, TypeError) as exc:
            raise SchemaError(
                f"schema dict ({exc!r}) must have attributes with name, categories"
            ) from None

    # -- shape ---------------------------------------------------------------------
    @property
    def d(self) -> int:
        """Number of attributes."""
        return len(self.attributes)

    def __len__(self) -> int:
        return len(self.attributes)

    @cached_property
    def names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.attributes)

    @cached_property
    def sizes(self) -> tuple[int, ...]:
        """Category counts, one per attribute."""
        return tuple(a.size for a in self.attributes)

    def index(self, attr: AttrRef) -> int:
        """Position of an attribute given by name or position."""
        if isinstance(attr, str):
            try:
                return self._index[attr]
            except KeyError:
                raise SchemaError(
                    f"attribute ({attr!r}) must be one of {list(self.names)}"
                ) from None
        if is_int(attr):
            if 0 <= int(attr) < self.d:
                return int(attr)
        raise SchemaError(f"attribute ({attr!r}) must be a name or an index in [0, {self.d})")

    def resolve(self, attrs: Iterable[AttrRef]) -> tuple[int, ...]:
        """Positions of ``attrs`` in the order given; repeats are an error."""
        out = tuple(self.index(a) for a in attrs)
        if len(set(out)) != len(out):
            raise SchemaError(f"attributes ({list(attrs)!r}) must not repeat")
        return out

    def shape(self, attrs: Iterable[AttrRef]) -> tuple[int, ...]:
        """Shape of the marginal table over ``attrs``."""
        return tuple(self.sizes[i] for i in self.resolve(attrs))

    def cells(self, attrs: Iterable[AttrRef]) -> int:
        """Number of cells of the marginal over ``attrs`` (1 for no attributes)."""
        return int(np.prod(self.shape(attrs), dtype=np.int64))

    # -- records -------------------------------------------------------------------
    def encode_record(self, record: Mapping[str, Label] | Sequence[Label]) -> tuple[int, ...]:
        """Codes of one record given as ``{name: label}`` (exactly the schema's names)
        or as a sequence of labels in schema order."""
        if isinstance(record, Mapping):
            extra = [k for k in record if k not in self._index]
            if extra:
                raise SchemaError(f"record field ({extra[0]!r}) must be one of {list(self.names)}")
            missing = [n for n in self.names if n not in record]
            if missing:
                raise SchemaError(f"record ({missing[0]!r} missing) must give every attribute")
            return tuple(a.code(record[a.name]) for a in self.attributes)
        if isinstance(record, (str, bytes)) or len(record) != self.d:
            raise SchemaError(f"record ({record!r}) must have {self.d} labels in schema order")
        return tuple(a.code(v) for a, v in zip(self.attributes, record))

    def decode_record(self, codes: Sequence[int] | npt.ArrayLike) -> dict[str, str]:
        """``{name: label}`` of one record's codes."""
        arr = self.validate_codes(np.asarray(codes).reshape(1, -1))[0]
        return {a.name: a.categories[int(c)] for a, c in zip(self.attributes, arr)}

    def encode_columns(self, columns: Mapping[str, Sequence[Label] | npt.ArrayLike]) -> np.ndarray:
        """Codes of n records given column-wise as ``{name: labels (n,)}``.

        Returns shape (n, d), the smallest unsigned dtype that holds every code.
        Vectorised: one ``np.unique`` per attribute, not a loop over records.
        """
        missing = [n for n in self.names if n not in columns]
        if missing:
            raise SchemaError(f"columns ({missing[0]!r} missing) must give every attribute")
        extra = [k for k in columns if k not in self._index]
        if extra:
            raise SchemaError(f"column ({extra[0]!r}) must be one of {list(self.names)}")
        lengths = {len(columns[n]) for n in self.names}  # type: ignore[arg-type]
        if len(lengths) != 1:
            raise SchemaError(f"column lengths ({sorted(lengths)}) must all be equal")
        n = lengths.pop()
        out = np.empty((n, self.d), dtype=self.code_dtype)
        for j, a in enumerate(self.attributes):
            col = np.asarray(columns[a.name])
            if col.dtype.kind in "iu":
                col = col.astype(str)
            uniq, inverse = np.unique(col.astype(object), return_inverse=True)
            lut = np.array([a.code(u) for u in uniq], dtype=np.int64)
            out[:, j] = lut[inverse.reshape(-1)]
        return out

    def decode_columns(self, codes: npt.ArrayLike) -> dict[str, np.ndarray]:
        """``{name: labels (n,) object array}`` of codes (n, d)."""
        arr = self.validate_codes(codes)
        return {
            a.name: np.asarray(a.categories, dtype=object)[arr[:, j]]
            for j, a in enumerate(self.attributes)
        }

    @cached_property
    def code_dtype(self) -> np.dtype[Any]:
        """Smallest unsigned dtype holding every code of this schema."""
        return np.min_scalar_type(max(self.sizes) - 1)

    def validate_codes(self, codes: npt.ArrayLike) -> np.ndarray:
        """Check codes (n, d) are ints within each attribute's range; returns them as an
        array. The error names the first offending attribute, row and value."""
        arr = np.asarray(codes)
        if arr.ndim != 2 or arr.shape[1] != self.d:
            raise SchemaError(f"codes (shape {arr.shape}) must have shape (n, {self.d})")
        if arr.size and arr.dtype.kind not in "iu":
            raise SchemaError(f"codes (dtype {arr.dtype}) must be integers")
        sizes = np.asarray(self.sizes)
        signed = arr.dtype.kind == "i"
        # checked in row blocks: the temporaries stay small next to the codes themselves
        for start in range(0, arr.shape[0], _VALIDATE_ROWS):
            block = arr[start : start + _VALIDATE_ROWS]
            bad = block >= sizes
            if signed:
                bad |= block < 0
            if bad.any():
                row, j = (int(x[0]) for x in np.nonzero(bad))
                a = self.attributes[j]
                raise SchemaError(
                    f"code of {a.name!r} ({int(block[row, j])}, row {start + row}) "
                    f"must be in [0, {a.size})"
                )
        return arr

    # -- mixed-radix cells -----------------------------------------------------------
    def strides(self, attrs: Iterable[AttrRef]) -> np.ndarray:
        """C-order place values of ``attrs`` (int64, shape (len(attrs),))."""
        shape = self.shape(attrs)
        strides = np.ones(len(shape), dtype=np.int64)
        for i in range(len(shape) - 2, -1, -1):
            strides[i] = strides[i + 1] * shape[i + 1]
        return strides

    def cell_index(self, codes: npt.ArrayLike, attrs: Iterable[AttrRef]) -> np.ndarray:
        """Cell of each record (codes (n, d)) in the marginal over ``attrs``: int64 (n,)."""
        idx = self.resolve(attrs)
        arr = self.validate_codes(codes)
        if not idx:
            return np.zeros(arr.shape[0], dtype=np.int64)
        cells: np.ndarray = arr[:, list(idx)].astype(np.int64) @ self.strides(idx)
        return cells

    def cell_codes(self, cells: npt.ArrayLike, attrs: Iterable[AttrRef]) -> np.ndarray:
        """Inverse of :meth:`cell_index`: codes (n, len(attrs)) int64 of cells (n,)."""
        idx = self.resolve(attrs)
        arr = np.asarray(cells)
        total = self.cells(idx)
        if arr.size and arr.dtype.kind not in "iu":
            raise SchemaError(f"cells (dtype {arr.dtype}) must be integers")
        if arr.size and (arr.min() < 0 or arr.max() >= total):
            bad = int(arr.min()) if arr.min() < 0 else int(arr.max())
            raise SchemaError(f"cell ({bad}) must be an int in [0, {total})")
        if not idx:
            return np.zeros((arr.size, 0), dtype=np.int64)
        return np.stack(np.unravel_index(arr.reshape(-1), self.shape(idx)), axis=1).astype(np.int64)
