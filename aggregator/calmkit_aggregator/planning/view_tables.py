"""Representative true tables of views under a data profile, for the error model's
simulation of Norm-Sub (:mod:`.error_model`, step 2).

Norm-Sub clips a view's noise where its true cells are small, so how much it removes
(and how much it biases) depends on how concentrated the true table is. The product
of the margins is the flattest table with those margins: on dependent data a view of
5-7 attributes holds many more near-empty cells than the product, and its error after
Norm-Sub was measured 1.4-2x above what the product predicts (a synthetic population
of 8 attributes of 2-4 categories, strong dependence, 16,000 users, eps 1; within
0.75-1.2x of the measured with the true tables).

The tables here keep the profile's margins exactly and carry its pair dependence,
through one binary latent class (a two-component mixture):

    T(x) = prod_a P_a(x_a) * (prod_a (1 + d_a z_a(x_a)) + prod_a (1 - d_a z_a(x_a))) / 2

where ``z_a`` is a standardised one-vs-rest score of attribute a's most frequent
category (mean 0, variance 1 under ``P_a``). Each margin is ``P_a`` (the tilts
average out), and pair (a, b)'s departure from independence is ``d_a d_b (P_a z_a)
(x) (P_b z_b)``, so its dependence in the profile's unit (:func:`.profile.pair_dependence`)
is ``d_a^2 c_a d_b^2 c_b`` with ``c_a = ||P_a z_a||^2 L_a / (L_a - 1)``. The ``x_a =
d_a^2 c_a`` are a rank-one fit of the view's pair dependences (the profile's own
weights are rank one, products of the margins' concentration, before their caps).
Each ``d_a`` stays below ``1 / max |z_a|``, so every cell is >= 0.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from .profile import DataProfile

__all__ = ["view_tables"]

_FIT_ROUNDS = 12  # rank-one fit: alternate the imputed diagonal and the top eigenpair
_INSIDE = 0.999  # d_a at most this share of the largest tilt that keeps cells >= 0
# Results kept by view_tables, at most this many bytes of tables (least recently used
# out first): the service plans for many collections in one process.
_KEPT_BYTES = 1 << 27


class _Kept:
    """Tables by key with the profile they were made from, within a byte budget;
    safe to share between threads."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.items: OrderedDict[tuple[object, ...], tuple[DataProfile, np.ndarray]] = OrderedDict()
        self.bytes = 0
        self.lock = threading.Lock()

    def get(self, key: tuple[object, ...], profile: DataProfile) -> np.ndarray | None:
        with self.lock:
            kept = self.items.get(key)
            if kept is None or kept[0] is not profile:
                return None
            self.items.move_to_end(key)
            return kept[1]

    def put(self, key: tuple[object, ...], profile: DataProfile, table: np.ndarray) -> None:
        with self.lock:
            old = self.items.pop(key, None)
            self.bytes += table.nbytes - (old[1].nbytes if old else 0)
            self.items[key] = (profile, table)  # the profile held: its id is not reused
            while self.bytes > self.budget and len(self.items) > 1:
                self.bytes -= self.items.popitem(last=False)[1][1].nbytes


_KEPT = _Kept(_KEPT_BYTES)


def view_tables(
    profile: DataProfile, views: np.ndarray, shape: tuple[int, ...], dependence: float
) -> np.ndarray:
    """True tables (B, L) of B views of one shape (their attributes ``views``, (B, l)
    int) under ``profile`` at mean pair dependence ``dependence``: the margins'
    product when it is 0, else the latent-class tables of the module docstring.
    Float64, read-only, each row sums to 1, cells in C order of ``shape``.

    The planner scores many designs under one profile, and the same views in several
    of them (the main phase with and without a pilot's tables): the latest results
    are kept (:data:`_KEPT_BYTES`), for the very profile object they were made from."""
    views = np.ascontiguousarray(views, dtype=np.int64)
    key = (id(profile), views.shape, views.tobytes(), tuple(shape), float(dependence))
    out = _KEPT.get(key, profile)
    if out is None:
        out = _view_tables(profile, views, shape, dependence)
        out.setflags(write=False)
        _KEPT.put(key, profile, out)
    return out


def _view_tables(
    profile: DataProfile, views: np.ndarray, shape: tuple[int, ...], dependence: float
) -> np.ndarray:
    margins = _padded(profile, views, shape)  # (B, l, Lmax)
    if dependence <= 0 or len(shape) < 2:
        return _product(margins, shape)
    scores, power, reach = _scores(margins, shape)
    target = profile.pair_dependence(dependence)[views[:, :, None], views[:, None, :]]
    x = _rank_one(target)
    tilt = np.sqrt(np.divide(x, power, out=np.zeros_like(x), where=power > 0))
    tilt = np.minimum(tilt, _INSIDE / np.maximum(reach, 1e-300))
    plus = _product(margins * (1.0 + tilt[:, :, None] * scores), shape)
    minus = _product(margins * (1.0 - tilt[:, :, None] * scores), shape)
    out: np.ndarray = 0.5 * (plus + minus)
    return out


def _padded(profile: DataProfile, views: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """(B, l, Lmax): each view's attributes' representative margins, zero-padded."""
    width = max(shape)
    table = np.zeros((len(profile.marginals), width))
    for a, p in enumerate(profile.marginals):
        table[a, : min(p.size, width)] = p[:width]
    out: np.ndarray = table[views]
    return out


def _scores(
    margins: np.ndarray, shape: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per view and attribute: the standardised one-vs-rest score of the most frequent
    category (B, l, Lmax; 0 on padding), ``c_a`` (B, l) and ``max |z_a|`` (B, l)."""
    cols = np.arange(margins.shape[2])
    live = cols[None, None, :] < np.array(shape)[None, :, None]
    mode = np.argmax(margins, axis=2)
    top = np.take_along_axis(margins, mode[:, :, None], axis=2)[:, :, 0]
    sd = np.sqrt(np.maximum(top * (1.0 - top), 1e-300))
    indicator = (cols[None, None, :] == mode[:, :, None]).astype(np.float64)
    scores = np.where(live, (indicator - top[:, :, None]) / sd[:, :, None], 0.0)
    scores = np.where(top[:, :, None] >= 1.0, 0.0, scores)  # one category holds it all
    sizes = np.array(shape, dtype=np.float64)[None, :]
    per_dof = np.divide(sizes, sizes - 1.0, out=np.zeros_like(sizes), where=sizes > 1)
    power = ((margins * scores) ** 2).sum(axis=2) * per_dof  # 0 for one category
    reach = np.where(margins > 0, np.abs(scores), 0.0).max(axis=2)
    return scores, power, reach


def _rank_one(target: np.ndarray) -> np.ndarray:
    """(B, l) non-negative ``x`` with ``x_a x_b`` close to the off-diagonal of each
    (B, l, l) ``target`` (its diagonal ignored)."""
    size = target.shape[1]
    off = target * (1.0 - np.eye(size))[None]
    x: np.ndarray = np.sqrt(np.maximum(off.sum(axis=2) / max(size - 1, 1), 0.0))
    if size <= 2:  # x_a = x_b = sqrt(t_ab) fits exactly: the rounds' fixed point
        return x
    for _ in range(_FIT_ROUNDS):
        full = off + np.einsum("bi,ij->bij", x**2, np.eye(size))
        values, vectors = np.linalg.eigh(full)
        x = np.abs(vectors[:, :, -1]) * np.sqrt(np.maximum(values[:, -1], 0.0))[:, None]
    return x


def _product(factors: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """(B, L): the outer product over each view's attributes of ``factors`` (B, l,
    Lmax), cut to ``shape``, in C order."""
    out = np.ones((factors.shape[0], 1))
    for col, size in enumerate(shape):
        out = (out[:, :, None] * factors[:, col, None, :size]).reshape(factors.shape[0], -1)
    return out
