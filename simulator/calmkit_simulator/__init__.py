"""calmkit_simulator: datasets, populations, mechanisms and experiments.

The names below load on first use (PEP 562), so the ``calmkit`` command line starts
without importing numpy, gRPC or the aggregator.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .collect import PATHS, collect_support, true_view_counts
    from .datasets import (
        DATASETS,
        DatasetError,
        default_data_dir,
        load_acs,
        load_adult,
        load_csv,
        load_dataset,
        load_kosarak,
        load_nltcs,
        load_retail,
        load_transactions,
    )
    from .population import Population
    from .synthetic import BayesianNetwork, synthetic_population

_WHERE = {
    "PATHS": "collect", "collect_support": "collect", "true_view_counts": "collect",
    "DATASETS": "datasets", "DatasetError": "datasets", "default_data_dir": "datasets",
    "load_acs": "datasets", "load_adult": "datasets", "load_csv": "datasets",
    "load_dataset": "datasets", "load_kosarak": "datasets", "load_nltcs": "datasets",
    "load_retail": "datasets", "load_transactions": "datasets",
    "Population": "population",
    "BayesianNetwork": "synthetic", "synthetic_population": "synthetic",
}  # fmt: skip

__all__ = [
    "DATASETS",
    "PATHS",
    "BayesianNetwork",
    "DatasetError",
    "Population",
    "collect_support",
    "default_data_dir",
    "load_acs",
    "load_adult",
    "load_csv",
    "load_dataset",
    "load_kosarak",
    "load_nltcs",
    "load_retail",
    "load_transactions",
    "synthetic_population",
    "true_view_counts",
]
assert sorted(__all__) == sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'calmkit_simulator' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})
