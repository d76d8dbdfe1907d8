"""The shared int check: ints and numpy integers pass; bools, floats and the rest fail."""

from __future__ import annotations

import numpy as np
import pytest

from calmkit_client.errors import CalmkitError, PlanError
from calmkit_client.validation import check_int, is_int


@pytest.mark.parametrize("value", [0, -3, 7, 1 << 70, np.int64(5), np.uint8(2), np.int32(-1)])
def test_is_int_accepts_python_and_numpy_integers(value: object) -> None:
    assert is_int(value)


@pytest.mark.parametrize(
    "value", [True, False, np.True_, 3.0, np.float64(3.0), "3", None, [3], np.array([3])]
)
def test_is_int_rejects_bools_floats_and_others(value: object) -> None:
    assert not is_int(value)


def test_check_int_returns_a_python_int() -> None:
    out = check_int("n", np.int64(5), 1)
    assert out == 5 and type(out) is int


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (-3, "n (-3) must be an int >= 1"),
        (True, "n (True) must be an int >= 1"),
        (2.0, "n (2.0) must be an int >= 1"),
        ("4", "n ('4') must be an int >= 1"),
    ],
)
def test_check_int_message_names_field_and_value(value: object, message: str) -> None:
    with pytest.raises(CalmkitError) as info:
        check_int("n", value, 1)
    assert str(info.value) == message


def test_check_int_raises_the_given_error_type() -> None:
    with pytest.raises(PlanError, match=r"^m \(0\) must be an int >= 1$"):
        check_int("m", 0, 1, PlanError)
    assert check_int("m", 0, 0, PlanError) == 0
