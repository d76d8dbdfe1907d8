"""calmkit_simulator: datasets, populations, mechanisms and experiments.

The names below load on first use (PEP 562), so the ``calmkit`` command line starts
without importing numpy, gRPC or the aggregator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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
else:
    from calmkit_client.lazy import lazy_exports

    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            ".collect": ("PATHS", "collect_support", "true_view_counts"),
            ".datasets": (
                "DATASETS",
                "DatasetError",
                "default_data_dir",
                "load_acs",
                "load_adult",
                "load_csv",
                "load_dataset",
                "load_kosarak",
                "load_nltcs",
                "load_retail",
                "load_transactions",
            ),
            ".population": ("Population",),
            ".synthetic": ("BayesianNetwork", "synthetic_population"),
        },
    )
    del lazy_exports

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
