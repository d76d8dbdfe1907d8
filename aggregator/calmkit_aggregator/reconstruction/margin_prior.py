"""How far from uniform the attributes' margins are, learnt from all of them at once: an
empirical-Bayes prior for the margins' shrinkage (:func:`~.shrinkage.shrink_margins`).

Each attribute's centred margin estimate ``z_a`` (``D_a = L_a - 1`` contrast
dimensions, noise ``nu_a`` per dimension) is modelled as the normal means problem

    z_a = mu_a + e_a,   e_a ~ N(0, nu_a I),   mu_a ~ N(0, t_a I),   t_a ~ g,

so ``||z_a||^2 / (t_a + nu_a)`` is chi-square with ``D_a`` degrees of freedom. The
law ``g`` of the signal per dimension is estimated from every attribute's
``||z_a||^2`` by nonparametric maximum likelihood on a fixed grid (Kiefer and
Wolfowitz 1956; the EM iteration of Laird 1978), and each margin is scaled by the
posterior mean of ``t_a / (t_a + nu_a)``: the Bayes factor of the linear shrinkage
``mu_a = lambda z_a`` under that law.

Why pooled, not per attribute. James-Stein's factor ``1 - D nu / ||z||^2`` (Stein
1956) estimates one margin's signal from that margin alone; on a margin that is all
noise its risk is still about twice the noise of two dimensions. Where many attributes
carry little signal (few users per category) those errors add up: 30 attributes of 2-20
categories at 10,000 users and epsilon 1, one attribute per view, measured 1.81e-3 with
James-Stein's factor per margin and 1.49e-3 with this law, against 1.36e-3 for
answering uniform (docs/margin-shrinkage.md). The law lets each margin borrow how flat
its peers are, and keeps a margin whose reports stand far above the noise (its
likelihood dominates any law on the grid). Only margins of 4 or more categories are
shrunk (and fitted): in fewer dimensions Norm-Sub is left alone, as before.
Post-processing only: no privacy is
spent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
from scipy.special import gammaln

from calmkit_client import CalmkitError

__all__ = ["JamesStein", "Shrinker", "SignalPrior", "fit_signal_prior"]

# Grid of the signal per dimension: 0 and this many log-spaced points between the
# smallest noise / 1e4 and 4 x the largest observed spread per dimension.
_GRID = 60
# EM iterations of the grid weights (the NPMLE's likelihood is concave in them), and
# the change in log-likelihood per attribute below which they stop early.
_EM_STEPS = 500
_EM_TOL = 1e-9


class Shrinker(Protocol):
    """A margin's shrinkage factor from its spread ``||z||^2`` in ``dim`` contrast
    dimensions with ``noise`` per dimension (arrays broadcast together)."""

    def factors(self, spread: np.ndarray, dim: np.ndarray, noise: np.ndarray) -> np.ndarray: ...


class JamesStein:
    """The positive-part James-Stein factor ``max(0, 1 - dim noise / spread)`` (Stein
    1956): the margin's signal estimated from that margin alone."""

    def factors(self, spread: np.ndarray, dim: np.ndarray, noise: np.ndarray) -> np.ndarray:
        out: np.ndarray = np.clip(1.0 - dim * noise / np.maximum(spread, 1e-300), 0.0, None)
        return out


@dataclass(frozen=True)
class SignalPrior:
    """A discrete law of the signal per dimension ``t``: ``weights[j]`` on ``grid[j]``
    (float64 arrays of one length, weights summing to 1, grid >= 0)."""

    grid: np.ndarray
    weights: np.ndarray

    def factors(self, spread: np.ndarray, dim: np.ndarray, noise: np.ndarray) -> np.ndarray:
        """Posterior mean of ``t / (t + noise)`` given ``||z||^2 = spread`` in ``dim``
        dimensions (arrays broadcast together; float64 result of their shape)."""
        s, d, nu = np.broadcast_arrays(
            *(np.asarray(x, dtype=np.float64) for x in (spread, dim, noise))
        )
        post, var = _posterior(self, s.ravel(), d.ravel(), nu.ravel())
        out: np.ndarray = (post * (self.grid[None, :] / var)).sum(axis=1).reshape(s.shape)
        return out


def _log_density(spread: np.ndarray, dim: np.ndarray, var: np.ndarray) -> np.ndarray:
    """log density of ``||z||^2 = spread`` when ``z ~ N(0, var I_dim)`` (rows: spread
    and dim (n, 1); columns: var (n, grid)), up to terms the same for every var."""
    half = dim / 2.0
    out: np.ndarray = (
        (half - 1.0) * np.log(np.maximum(spread, 1e-300))
        - spread / (2.0 * var)
        - half * np.log(var)
        - gammaln(half)
    )
    return out


def _posterior(
    prior: SignalPrior, spread: np.ndarray, dim: np.ndarray, noise: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Each row's posterior weights over the grid, and ``t + noise`` per grid point."""
    var = prior.grid[None, :] + noise[:, None]
    ll = _log_density(spread[:, None], dim[:, None], var)
    ll = ll - ll.max(axis=1, keepdims=True)  # max shift: exp never overflows
    post = np.exp(ll) * prior.weights[None, :]
    return post / post.sum(axis=1, keepdims=True), var


def fit_signal_prior(spread: np.ndarray, dim: np.ndarray, noise: np.ndarray) -> SignalPrior:
    """The nonparametric maximum-likelihood law of the signal per dimension (module
    docstring) from ``n`` margins: ``spread`` (n,) their ``||z||^2``, ``dim`` (n,) their
    contrast dimensions (>= 1), ``noise`` (n,) their noise per dimension (> 0, finite)."""
    s, d, nu = _margins(spread, dim, noise)
    top = max(4.0 * float(np.max(s / d)), float(np.max(nu)))
    grid = np.concatenate([[0.0], np.geomspace(float(np.min(nu)) * 1e-4, top, _GRID)])
    ll = _log_density(s[:, None], d[:, None], grid[None, :] + nu[:, None])
    weights = _em_weights(np.exp(ll - ll.max(axis=1, keepdims=True)))
    return SignalPrior(grid, weights)


def _margins(
    spread: np.ndarray, dim: np.ndarray, noise: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The three as flat float64 arrays, checked (a clear error naming the first bad
    margin)."""
    s, d, nu = (np.asarray(x, dtype=np.float64).ravel() for x in (spread, dim, noise))
    if not (s.size == d.size == nu.size) or s.size == 0:
        raise CalmkitError(
            f"spread, dim and noise (sizes {s.size}, {d.size}, {nu.size}) must be one "
            "non-empty entry per margin"
        )
    bad = ~(np.isfinite(nu) & (nu > 0) & (d >= 1) & (s >= 0))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise CalmkitError(
            f"margin {i} (spread {s[i]}, dim {d[i]}, noise {nu[i]}): noise must be finite "
            "and > 0, dim >= 1 and spread >= 0"
        )
    return s, d, nu


def _em_weights(lik: np.ndarray) -> np.ndarray:
    """The grid weights maximising the mean log of ``lik @ weights`` (``lik`` (n, grid):
    each margin's likelihood at each grid point), by EM from uniform weights."""
    weights, last = np.full(lik.shape[1], 1.0 / lik.shape[1]), -np.inf
    for _ in range(_EM_STEPS):
        mix = lik @ weights
        weights = weights * (lik / mix[:, None]).mean(axis=0)
        value = float(np.mean(np.log(mix)))
        if value - last < _EM_TOL:
            break
        last = value
    out: np.ndarray = weights / weights.sum()
    return out
