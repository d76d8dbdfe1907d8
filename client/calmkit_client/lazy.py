"""Lazy package exports (PEP 562, module ``__getattr__``).

A package names the module that defines each of its exports; a name's module is
imported on first use. So importing one light module (the aggregator's storage
backends, :mod:`calmkit_aggregator.phases`) does not run the planner's or the
reconstruction's imports (scipy), and the ``calmkit`` command starts without numpy,
while ``from calmkit_aggregator import plan_collection`` works as it would with eager
imports. Every calmkit package's ``__init__`` uses it.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, sources: Mapping[str, Sequence[str]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of ``package``, whose exports are
    ``sources``: module (relative to ``package``, e.g. ``".pilot"``) -> the names it
    defines.

    An export is imported on first access and then kept in the package's namespace.
    Another public name that is a submodule of the package is imported as one (as
    ``package.submodule`` worked after eager imports); anything else is an
    :class:`AttributeError`. ``__dir__`` lists the exports with what is loaded.
    """
    where: dict[str, str] = {}
    for module, names in sources.items():
        for name in names:
            if name in where:
                raise ValueError(f"sources name {name!r} twice ({where[name]}, {module})")
            where[name] = module

    def __getattr__(name: str) -> Any:
        value: Any
        if name in where:
            value = getattr(importlib.import_module(where[name], package), name)
        elif not name.startswith("_") and importlib.util.find_spec(f"{package}.{name}"):
            value = importlib.import_module(f"{package}.{name}")
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *where})

    return __getattr__, __dir__
