"""Schema: label <-> code encoding, mixed-radix cells, and clear errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calmkit_client import Attribute, Schema, SchemaError

sizes_st = st.lists(st.integers(1, 5), min_size=1, max_size=6)


@st.composite
def schema_and_codes(draw: st.DrawFn) -> tuple[Schema, np.ndarray]:
    sizes = draw(sizes_st)
    n = draw(st.integers(0, 20))
    codes = np.array(
        [[draw(st.integers(0, c - 1)) for c in sizes] for _ in range(n)], dtype=np.int64
    ).reshape(n, len(sizes))
    return Schema.from_sizes(sizes), codes


@given(schema_and_codes())
def test_columns_round_trip(data: tuple[Schema, np.ndarray]) -> None:
    schema, codes = data
    labels = schema.decode_columns(codes)
    np.testing.assert_array_equal(schema.encode_columns(labels), codes)


@given(schema_and_codes(), st.data())
def test_cell_index_round_trip_and_agrees_with_numpy(
    data: tuple[Schema, np.ndarray], draw: st.DataObject
) -> None:
    schema, codes = data
    attrs = draw.draw(st.permutations(range(schema.d)).map(lambda p: p[: len(p) // 2 + 1]))
    cells = schema.cell_index(codes, attrs)
    np.testing.assert_array_equal(schema.cell_codes(cells, attrs), codes[:, list(attrs)])
    if codes.shape[0]:
        expected = np.ravel_multi_index(tuple(codes[:, list(attrs)].T), schema.shape(attrs))
        np.testing.assert_array_equal(cells, expected)
        assert cells.max() < schema.cells(attrs)


@settings(max_examples=50)
@given(sizes_st, st.data())
def test_record_round_trip(sizes: list[int], draw: st.DataObject) -> None:
    schema = Schema.from_sizes(sizes)
    codes = tuple(draw.draw(st.integers(0, c - 1)) for c in sizes)
    record = schema.decode_record(codes)
    assert schema.encode_record(record) == codes
    assert schema.encode_record([record[n] for n in schema.names]) == codes


def test_dict_round_trip_keeps_order_and_flags() -> None:
    schema = Schema(
        (Attribute("age", ("<30", "30-49", "50+"), ordered=True), Attribute("sex", ("F", "M")))
    )
    assert Schema.from_dict(schema.to_dict()) == schema
    assert schema.sizes == (3, 2) and schema.names == ("age", "sex")
    assert schema.encode_record({"sex": "M", "age": "50+"}) == (2, 1)


def test_ints_stand_for_their_decimal_labels() -> None:
    schema = Schema.from_sizes([2, 3])
    assert schema.encode_record([1, 2]) == (1, 2)
    np.testing.assert_array_equal(
        schema.encode_columns({"a0": np.array([0, 1]), "a1": np.array([2, 0])}), [[0, 2], [1, 0]]
    )


def test_empty_marginal_has_one_cell() -> None:
    schema = Schema.from_sizes([2, 3])
    assert schema.cells([]) == 1
    np.testing.assert_array_equal(schema.cell_index(np.zeros((3, 2), int), []), [0, 0, 0])


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Attribute("x", ()), r"categories of 'x' \(\(\)\) must not be empty"),
        (lambda: Attribute("x", ("a", "a")), r"categories of 'x' \('a'\) must not repeat"),
        (lambda: Attribute("", ("a",)), r"attribute name \(''\) must be a non-empty str"),
        (lambda: Attribute("x", "ab"), r"categories of 'x' \('ab'\) must be a sequence"),
        (lambda: Attribute("x", (1.5,)), r"category of 'x' \(1.5\) must be a str label"),
        (
            lambda: Schema((Attribute("x", ("a",)), Attribute("x", ("b",)))),
            r"attribute name \('x'\) must be unique",
        ),
        (lambda: Schema(()), r"attributes \(\(\)\) must not be empty"),
        (lambda: Schema.from_sizes([2, 0]), r"size of 'a1' \(0\) must be an int >= 1"),
    ],
)
def test_bad_definitions(make: object, message: str) -> None:
    with pytest.raises(SchemaError, match=message):
        make()  # type: ignore[operator]


def test_bad_records_name_field_and_value() -> None:
    schema = Schema((Attribute("smoker", ("no", "yes")), Attribute("age", ("young", "old"))))
    with pytest.raises(SchemaError, match=r"value of 'smoker' \('maybe'\) must be one of"):
        schema.encode_record({"smoker": "maybe", "age": "old"})
    with pytest.raises(SchemaError, match=r"record \('age' missing\)"):
        schema.encode_record({"smoker": "no"})
    with pytest.raises(SchemaError, match=r"record field \('height'\)"):
        schema.encode_record({"smoker": "no", "age": "old", "height": "tall"})
    with pytest.raises(SchemaError, match="2 labels"):
        schema.encode_record(["no"])
    with pytest.raises(SchemaError, match=r"value of 'age' \('ancient'\)"):
        schema.encode_columns({"smoker": ["no", "yes"], "age": ["old", "ancient"]})
    with pytest.raises(SchemaError, match=r"column lengths \(\[1, 2\]\)"):
        schema.encode_columns({"smoker": ["no", "yes"], "age": ["old"]})


def test_out_of_range_codes_name_attribute_row_and_value() -> None:
    schema = Schema.from_sizes([2, 3])
    with pytest.raises(SchemaError, match=r"code of 'a1' \(3, row 1\) must be in \[0, 3\)"):
        schema.validate_codes([[0, 0], [1, 3]])
    with pytest.raises(SchemaError, match=r"code of 'a0' \(-1, row 0\)"):
        schema.cell_index([[-1, 0]], [0, 1])
    with pytest.raises(SchemaError, match=r"cell \(6\) must be an int in \[0, 6\)"):
        schema.cell_codes([6], [0, 1])
    # checked in blocks of rows: the first bad code of a later block, with its real row
    many = np.zeros((200_000, 2), dtype=np.uint8)
    many[150_001, 1], many[190_000, 0] = 3, 2
    with pytest.raises(SchemaError, match=r"code of 'a1' \(3, row 150001\) must be in"):
        schema.validate_codes(many)
    signed = np.zeros((100_000, 2), dtype=np.int16)
    signed[70_000, 0] = -2
    with pytest.raises(SchemaError, match=r"code of 'a0' \(-2, row 70000\)"):
        schema.validate_codes(signed)
    with pytest.raises(SchemaError, match=r"attribute \('a9'\) must be one of"):
        schema.shape(["a9"])
    with pytest.raises(SchemaError, match="must not repeat"):
        schema.cell_index([[0, 0]], [1, 1])
