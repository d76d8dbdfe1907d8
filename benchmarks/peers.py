"""Adapters for the peer LDP libraries ``pure-ldp`` and ``multi-freq-ldpy``.

Each peer is driven through its own per-user client API, one report at a time in a
Python loop (neither library has a batch client), and through its own server-side
estimator. Peers are imported lazily, so this module imports without them; install
them with the ``bench`` extra.

Conventions:

* Cells are calmkit's 0-based indices ``c`` in ``[0, L)``.
* :func:`peer_server` returns *fractions* (length ``L``, summing to about 1) for both
  peers. pure-ldp's estimator produces unbiased counts, which are divided by ``n``
  here and may be negative; multi-freq-ldpy's estimator clips negatives to 0 and
  renormalises to sum 1 (biased, never negative). Neither is post-processed further.

Peer quirks handled here:

* pure-ldp numbers items from 1 (its default ``index_mapper`` is ``x - 1``); item 0
  maps to index -1 and silently lands on the last item. Cells are sent as ``c + 1``.
* pure-ldp's ``DEClient.privatise`` returns a 0-based *index*, which ``DEServer``
  aggregates directly; pure-ldp draws from Python's ``random`` and numpy's global
  state.
* multi-freq-ldpy's clients are numba ``@jit`` functions: the first call for a new
  argument-type signature compiles (about 2 s for GRR, 0.3 s for OUE), so
  :func:`peer_client` warms the client up before returning, and always passes
  arguments of the same types (``int``, ``int``, ``float``[, ``bool``]). Numba keeps
  its own random state, which ``np.random.seed`` from Python does not touch; use
  :func:`seed_peers`.
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Callable
from functools import cache, partial
from typing import Any, cast

import numpy as np
import numpy.typing as npt

__all__ = ["PEERS", "available_peers", "peer_client", "peer_server", "seed_peers"]

PEERS: tuple[str, ...] = ("pure-ldp", "multi-freq-ldpy")
ORACLES: tuple[str, ...] = ("GRR", "OUE")

# Modules each adapter imports; pure_ldp.frequency_oracles also pulls in sklearn/statsmodels.
_PEER_MODULES: dict[str, tuple[str, ...]] = {
    "pure-ldp": (
        "pure_ldp.frequency_oracles.direct_encoding",
        "pure_ldp.frequency_oracles.unary_encoding",
    ),
    "multi-freq-ldpy": (
        "multi_freq_ldpy.pure_frequency_oracles.GRR",
        "multi_freq_ldpy.pure_frequency_oracles.UE",
    ),
}

Client = Callable[[npt.NDArray[np.integer[Any]]], list[Any]]
Server = Callable[[list[Any]], npt.NDArray[np.float64]]


def available_peers() -> list[str]:
    """Names of the peers in :data:`PEERS` whose modules import successfully."""
    found = []
    for name in PEERS:
        try:
            for module in _PEER_MODULES[name]:
                importlib.import_module(module)
        except Exception:  # any import failure means "not available"
            continue
        found.append(name)
    return found


@cache
def _numba_seeder() -> Callable[[int], None] | None:
    """A jitted ``np.random.seed`` (seeds numba's own state), or None without numba."""
    try:
        import numba
    except ImportError:
        return None

    def seed(s: int) -> None:
        np.random.seed(s)  # noqa: NPY002 - inside njit this seeds numba's own state

    return cast(Callable[[int], None], numba.njit(seed))


def seed_peers(seed: int) -> None:
    """Seed every random state the peers draw from (Python, numpy global, numba)."""
    random.seed(seed)
    np.random.seed(seed)  # noqa: NPY002 - pure-ldp uses numpy's legacy global state
    seeder = _numba_seeder()
    if seeder is not None:
        seeder(seed)


def _check(name: str, oracle: str, L: int, epsilon: float) -> None:
    if name not in PEERS:
        raise ValueError(f"unknown peer {name!r}; expected one of {PEERS}")
    if oracle not in ORACLES:
        raise ValueError(f"unknown oracle {oracle!r}; expected one of {ORACLES}")
    if L < 2:
        raise ValueError(f"L must be >= 2, got {L}")
    if not epsilon > 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon}")


def _cells_list(cells: npt.NDArray[np.integer[Any]], L: int) -> list[int]:
    """Validate 0-based cells and return them as Python ints."""
    arr = np.asarray(cells)
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError("cells must be a 1-D integer array")
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= L):
        raise ValueError(f"cells must lie in [0, {L})")
    return [int(c) for c in arr.tolist()]


def peer_client(name: str, oracle: str, L: int, epsilon: float) -> Client:
    """Per-user perturbation with the peer's client API, one report per loop step.

    The returned callable maps 0-based cells to a list of reports (ints for GRR,
    length-``L`` 0/1 arrays for OUE) that :func:`peer_server` accepts. For
    multi-freq-ldpy, numba compilation happens here (warm-up call), not in the loop.
    """
    _check(name, oracle, L, epsilon)
    k, eps = int(L), float(epsilon)

    if name == "pure-ldp":
        if oracle == "GRR":
            from pure_ldp.frequency_oracles.direct_encoding import DEClient

            pl_client: Any = DEClient(epsilon=eps, d=k)
        else:
            from pure_ldp.frequency_oracles.unary_encoding import UEClient

            pl_client = UEClient(epsilon=eps, d=k, use_oue=True)
        privatise = pl_client.privatise

        def run_pure_ldp(cells: npt.NDArray[np.integer[Any]]) -> list[Any]:
            # pure-ldp items are 1-based: send c + 1.
            return [privatise(c + 1) for c in _cells_list(cells, k)]

        return run_pure_ldp

    if oracle == "GRR":
        from multi_freq_ldpy.pure_frequency_oracles.GRR import GRR_Client

        GRR_Client(0, k, eps)  # warm-up: numba compiles for (int64, int64, float64)

        def run_mfl_grr(cells: npt.NDArray[np.integer[Any]]) -> list[Any]:
            return [GRR_Client(c, k, eps) for c in _cells_list(cells, k)]

        return run_mfl_grr

    from multi_freq_ldpy.pure_frequency_oracles.UE import UE_Client

    UE_Client(0, k, eps, True)  # warm-up: numba compiles for (int64, int64, float64, bool)

    def run_mfl_oue(cells: npt.NDArray[np.integer[Any]]) -> list[Any]:
        return [UE_Client(c, k, eps, True) for c in _cells_list(cells, k)]

    return run_mfl_oue


def peer_server(name: str, oracle: str, L: int, epsilon: float) -> Server:
    """Estimate with the peer's aggregator: reports -> frequency *fractions*, length ``L``.

    pure-ldp: ``aggregate_all`` then ``estimate_all`` over items ``1..L`` (unbiased counts,
    divided by ``n``; may be negative). multi-freq-ldpy: ``*_Aggregator_MI`` (clipped at 0
    and renormalised to sum 1).
    """
    _check(name, oracle, L, epsilon)
    k, eps = int(L), float(epsilon)

    if name == "pure-ldp":
        if oracle == "GRR":
            from pure_ldp.frequency_oracles.direct_encoding import DEServer

            make_server: Callable[[], Any] = partial(DEServer, epsilon=eps, d=k)
        else:
            from pure_ldp.frequency_oracles.unary_encoding import UEServer

            make_server = partial(UEServer, epsilon=eps, d=k, use_oue=True)

        def run_pure_ldp(reports: list[Any]) -> npt.NDArray[np.float64]:
            server = make_server()
            server.aggregate_all(reports)
            counts = server.estimate_all(range(1, k + 1), suppress_warnings=True)
            n = max(int(server.n), 1)
            freqs: npt.NDArray[np.float64] = np.asarray(counts, dtype=np.float64) / n
            return freqs

        return run_pure_ldp

    if oracle == "GRR":
        from multi_freq_ldpy.pure_frequency_oracles.GRR import GRR_Aggregator_MI

        def run_mfl_grr(reports: list[Any]) -> npt.NDArray[np.float64]:
            return np.asarray(GRR_Aggregator_MI(reports, k, eps), dtype=np.float64)

        return run_mfl_grr

    from multi_freq_ldpy.pure_frequency_oracles.UE import UE_Aggregator_MI

    def run_mfl_oue(reports: list[Any]) -> npt.NDArray[np.float64]:
        return np.asarray(UE_Aggregator_MI(reports, eps, True), dtype=np.float64)

    return run_mfl_oue
