"""Argument checks shared by every calmkit package.

An "int" argument is a Python ``int`` or a numpy integer (``np.int64(3)``, an element of
an integer array); ``bool`` is an ``int`` subclass but never counts as one, and numpy
bools, floats (even ``3.0``) and strings are not ints either.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import CalmkitError

if TYPE_CHECKING:  # TypeIs narrows both ways (typing has it from Python 3.13)
    from typing_extensions import TypeIs

__all__ = ["check_int", "is_int"]


def is_int(value: object) -> TypeIs[int | np.integer[Any]]:
    """True for a Python int or a numpy integer; False for bools and anything else."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def check_int(name: str, value: object, low: int, error: type[CalmkitError] = CalmkitError) -> int:
    """``int(value)`` if ``value`` is an int (:func:`is_int`) >= ``low``; otherwise
    ``error`` in the house style, ``n (-3) must be an int >= 1``."""
    if not is_int(value) or value < low:
        raise error(f"{name} ({value!r}) must be an int >= {low}")
    return int(value)
