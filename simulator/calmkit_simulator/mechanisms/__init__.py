"""Mechanisms the harness compares: CALM, the paper's LDP baselines and the
central references, all behind :class:`Mechanism`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from calmkit_client import CalmkitError

from .am import AllMarginals
from .base import Mechanism, NotScalable, Release
from .binary import BinaryEncoded
from .calm import Calm
from .datacube import Datacube
from .em import ExpectationMaximization
from .fc import FullContingency
from .ft import Fourier
from .mwem import Mwem
from .priview import PriView
from .uniform import Uniform
from .wff import WeightedFourier

__all__ = [
    "MECHANISMS",
    "AllMarginals",
    "BinaryEncoded",
    "Calm",
    "Datacube",
    "ExpectationMaximization",
    "Fourier",
    "FullContingency",
    "Mechanism",
    "Mwem",
    "NotScalable",
    "PriView",
    "Release",
    "Uniform",
    "WeightedFourier",
    "make_mechanism",
    "task_mechanism",
    "unused_options",
]

# command-line name -> (class, the options it takes: ``calmkit simulate``'s and, for
# CALM, ``replan``, which the planner benchmark's tasks set)
MECHANISMS: dict[str, tuple[type[Mechanism], tuple[str, ...]]] = {
    "calm": (
        Calm,
        ("theta", "m", "l", "path", "shrink", "planner", "pilot", "reconstruction", "replan"),
    ),
    "uni": (Uniform, ()),
    "fc": (FullContingency, ("path",)),
    "am": (AllMarginals, ("path",)),
    "ft": (Fourier, ()),
    "em": (ExpectationMaximization, ()),
    "be": (
        BinaryEncoded,
        ("theta", "m", "l", "path", "shrink", "planner", "pilot", "reconstruction"),
    ),
    "priview": (PriView, ("theta", "m", "l", "shrink")),
    # central-DP references
    "mwem": (Mwem, ("rounds",)),
    "datacube": (Datacube, ("strategy", "budgets", "noise", "delta")),
    "wff": (WeightedFourier, ("delta", "workload")),
}


def make_mechanism(name: str, **options: Any) -> Mechanism:
    """The mechanism called ``name``, given the options it understands; others are
    ignored (``calmkit simulate`` passes every flag to every mechanism, and warns of
    those the user set that :func:`unused_options` names)."""
    cls, accepted = _registered(name)
    return cls(**{k: v for k, v in options.items() if k in accepted and v is not None})


# options of the mechanisms that take a planner, which apply under one planner only
PLANNER_OPTIONS = {"theta": "paper", "pilot": "pipeline"}
DEFAULT_PLANNER = "pipeline"


def unused_options(name: str, options: Mapping[str, Any]) -> list[str]:
    """Which of ``options`` (those a user set) mechanism ``name`` will not use: the
    ones it does not take, and, when it takes a planner, those of another planner
    (:data:`PLANNER_OPTIONS`: ``theta`` is Algorithm 1's, ``pilot`` the pipeline's)."""
    _, accepted = _registered(name)
    planner = options.get("planner") or DEFAULT_PLANNER
    return [
        k
        for k in options
        if k not in accepted
        or ("planner" in accepted and PLANNER_OPTIONS.get(k, planner) != planner)
    ]


def task_mechanism(name: str, options: Mapping[str, Any]) -> Mechanism:
    """:func:`make_mechanism` for an experiment's task, whose options name its
    mechanism's own: one it does not take is an error (dropped in silence, the task
    would measure another experiment than the one reported)."""
    _, accepted = _registered(name)
    unknown = sorted(k for k in options if k not in accepted)
    if unknown:
        raise CalmkitError(
            f"options {unknown} are not options of mechanism {name!r} (it takes {list(accepted)})"
        )
    return make_mechanism(name, **options)


def _registered(name: str) -> tuple[type[Mechanism], tuple[str, ...]]:
    try:
        return MECHANISMS[name]
    except KeyError:
        raise CalmkitError(f"mechanism ({name!r}) must be one of {sorted(MECHANISMS)}") from None
