"""calmkit_simulator: datasets, populations, mechanisms and experiments."""

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
