"""Covering designs: CALM's ``CoverDesign(d, k, l)`` (Zhang et al., "CALM: Consistent
Adaptive Local Marginal for Marginal Release under Local Differential Privacy", CCS
2018, §4.3, Algorithm 1, which chooses m and l).

A *cover* here is a set of l-subsets ("blocks", the views) of the d attributes
``0..d-1`` such that every k-subset of attributes lies inside at least one block, so
every k-way marginal can be read off one view. In design-theory notation it is a
covering design C(v, k', t) with v = d points, block size k' = l and strength t = k;
the La Jolla Covering Repository (and the ``covering_numbers.csv`` of a covering
folder) uses that notation: columns ``v,k,t,size`` mean ``d, l, k, size``.

:func:`construct_cover` builds covers itself and keeps the smallest of:

- **greedy**: repeatedly add the l-set covering the most uncovered k-sets (all
  l-sets when there are few, else a random pool whose best member is improved by
  point swaps);
- **blow-up**: a cover of ``ceil(d/r)`` points by ``l // r``-sets with every point
  replaced by r copies. A k-set of copies maps onto at most k original points, which
  lie in one original block, so the blown-up blocks cover every k-set (this turns a
  140-block C(16,4,3) into a 140-block cover of 32 attributes by 8-sets);
- **affine**: identify the attributes with vectors of GF(2)^n (n = ceil(log2 d)).
  Any k points lie in a coset of a (k-1)-dimensional subspace, so if every
  (k-1)-dimensional subspace lies in one of a chosen set of s-dimensional subspaces
  (2^s <= l), the cosets of the chosen subspaces cover every k-set. The chosen subspaces are found
  by greedy set cover and annealing; e.g. 27 subspaces of GF(2)^5 give 4 * 27 = 108
  blocks for d = 32, l = 8, k = 3 (best known: 106), and 11 lines give the optimal
  88 blocks for d = 32, l = 4, k = 2;
- **a block list from a covering folder** (``blocks/C_{d}_{l}_{k}.txt``, layout of
  ``../shared/covering``), when one is given: the list for (d, l, k) itself is the
  starting point; else a list for more points, with the extra points deleted,
  competes;

then removes redundant blocks and runs the simulated-annealing local search of
Nurmela & Östergård (remove a block, re-cover its k-sets by point swaps) on the
smallest, with fixed iteration budgets, so the result depends only on the arguments
and ``rng``, never on timing.
"""

from __future__ import annotations

import csv
import functools
import itertools
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from random import Random  # seeded local instances only (no global state)

import numpy as np

from calmkit_client import CalmkitError
from calmkit_client.randomness import RngLike
from calmkit_client.validation import check_int, is_int

__all__ = [
    "Blocks",
    "CoveringError",
    "best_known_size",
    "construct_cover",
    "cover_lower_bound",
    "greedy_cover",
    "read_cover",
    "verify_cover",
]

Blocks = tuple[tuple[int, ...], ...]
"""A cover: sorted blocks of sorted 0-based attribute positions."""

PathLike = str | Path

# Greedy pool: every l-set when there are at most this many ...
_FULL_POOL = 60_000
# ... and the pool's (candidates x k-subsets) rank matrix stays below this size.
_MAX_INCIDENCES = 2_000_000
# Largest number of k-sets held in memory (verification and construction).
_MAX_KSETS = 1 << 27
# Affine construction: at most this many (s-subspace, (k-1)-subspace inside) pairs.
_MAX_SUBSPACE_INCIDENCES = 40_000
# Restarts of the greedy subspace cover (cheap: the subspace problem is small).
_AFFINE_RESTARTS = 24
# Local search budgets (iterations): per attempt at removing one block, and in total.
_ANNEAL_LEVEL_ITERS = 40_000
_ANNEAL_TOTAL_ITERS = 400_000
# Local search only when the cover's (blocks x k-subsets per block) is at most this.
_ANNEAL_MAX_INCIDENCES = 200_000


class CoveringError(CalmkitError):
    """Bad covering parameters, or a block list that is malformed or not a cover."""


# -- validation ----------------------------------------------------------------------
def _int(name: str, value: object, low: int) -> int:
    return check_int(name, int(value) if is_int(value) else value, low, CoveringError)


def _check_dk(d: object, k: object) -> tuple[int, int]:
    d_, k_ = _int("d", d, 1), _int("k", k, 1)
    if k_ > d_:
        raise CoveringError(f"k ({k_}) must be <= d ({d_})")
    return d_, k_


def _check_dkl(d: object, k: object, l: object) -> tuple[int, int, int]:  # noqa: E741
    d_, k_ = _check_dk(d, k)
    l_ = _int("l", l, 1)
    if k_ > l_:
        raise CoveringError(
            f"k ({k_}) must be <= l ({l_}): {l_}-sets cannot cover {k_}-sets "
            "(Algorithm 1 chooses views without a cover when l < k)"
        )
    return d_, k_, l_


# -- k-set ranks (colex) ---------------------------------------------------------------
@functools.lru_cache(maxsize=64)
def _binom_table(d: int, k: int) -> np.ndarray:
    """(d, k + 1) int64: ``T[x, j] = C(x, j)``."""
    return np.array([[math.comb(x, j) for j in range(k + 1)] for x in range(d)], np.int64)


@functools.lru_cache(maxsize=64)
def _combos(size: int, k: int) -> np.ndarray:
    """(C(size, k), k) intp: the k-subsets of positions ``0..size-1``, sorted."""
    out = np.array(list(itertools.combinations(range(size), k)), dtype=np.intp)
    return out.reshape(-1, k)


def _ranks(blocks: np.ndarray, d: int, k: int) -> np.ndarray:
    """Colex ranks (b, C(size, k)) int64 of the k-subsets of row-sorted ``blocks``
    (b, size), each rank in [0, C(d, k))."""
    table = _binom_table(d, k)
    sub = blocks[:, _combos(blocks.shape[1], k)]  # (b, c, k), increasing along the last
    ranks: np.ndarray = table[sub, np.arange(1, k + 1)].sum(axis=-1)
    return ranks


def _unrank(rank: int, k: int) -> list[int]:
    """The sorted k-set of colex ``rank``."""
    out = []
    for j in range(k, 0, -1):
        x = j - 1
        while math.comb(x + 1, j) <= rank:
            x += 1
        out.append(x)
        rank -= math.comb(x, j)
    return out[::-1]


def _n_ksets(d: int, k: int) -> int:
    n = math.comb(d, k)
    if n > _MAX_KSETS:
        raise CoveringError(f"C(d, k) ({n}, d={d}, k={k}) must be <= {_MAX_KSETS} k-sets")
    return n


# -- verification ----------------------------------------------------------------------
def _blocks_arrays(blocks: Iterable[Iterable[int]], d: int) -> dict[int, np.ndarray]:
    """Validated blocks grouped by size: {size: (b, size) int64 row-sorted}."""
    if isinstance(blocks, (str, bytes)) or not isinstance(blocks, Iterable):
        raise CoveringError(f"blocks ({blocks!r}) must be a sequence of attribute sets")
    groups: dict[int, list[list[int]]] = {}
    for j, block in enumerate(blocks):
        if isinstance(block, (str, bytes)) or not isinstance(block, Iterable):
            raise CoveringError(f"blocks[{j}] ({block!r}) must be a sequence of ints")
        pts = []
        for p in block:
            if not is_int(p) or not 0 <= p < d:
                raise CoveringError(f"blocks[{j}] point ({p!r}) must be an int in [0, {d})")
            pts.append(int(p))
        if len(set(pts)) != len(pts):
            raise CoveringError(f"blocks[{j}] ({pts}) must not repeat a point")
        groups.setdefault(len(pts), []).append(sorted(pts))
    return {
        size: np.array(rows, np.int64).reshape(len(rows), size) for size, rows in groups.items()
    }


def _covered(groups: dict[int, np.ndarray], d: int, k: int) -> np.ndarray:
    """(C(d, k),) bool: which k-sets lie in some block."""
    covered = np.zeros(_n_ksets(d, k), bool)
    for size, arr in groups.items():
        if size < k:
            continue
        step = max(1, (1 << 20) // math.comb(size, k))
        for start in range(0, len(arr), step):
            covered[_ranks(arr[start : start + step], d, k)] = True
    return covered


def verify_cover(blocks: Iterable[Iterable[int]], d: int, k: int) -> bool:
    """True iff every k-subset of ``0..d-1`` lies inside some block.

    Args:
        blocks: attribute sets (0-based positions in [0, d)); sizes may differ.
        d: number of attributes.
        k: size of the subsets to cover (1 <= k <= d).

    Each block's k-subsets are ranked in colexicographic order, vectorised over all
    blocks, and marked in one (C(d, k),) bool array.
    """
    d, k = _check_dk(d, k)
    return bool(_covered(_blocks_arrays(blocks, d), d, k).all())


# -- the covering folder -----------------------------------------------------------------
def _folder(covering_dir: PathLike) -> Path:
    path = Path(covering_dir)
    if not path.is_dir():
        raise CoveringError(f"covering_dir ({str(path)!r}) must be an existing folder")
    return path


def best_known_size(d: int, k: int, l: int, covering_dir: PathLike) -> int | None:  # noqa: E741
    """Best-known number of l-sets covering every k-set of d attributes, from
    ``covering_dir/covering_numbers.csv`` (columns ``v,k,t,size`` = d, l, k, size);
    ``None`` when the file lists no such row."""
    d, k, l = _check_dkl(d, k, l)  # noqa: E741
    return _best_known(covering_dir, d, k, l, missing_ok=False)


def _best_known(
    covering_dir: PathLike,
    d: int,
    k: int,
    l: int,  # noqa: E741
    missing_ok: bool = True,
) -> int | None:
    path = _folder(covering_dir) / "covering_numbers.csv"
    if not path.is_file():
        if missing_ok:
            return None
        raise CoveringError(f"covering_dir ({str(path.parent)!r}) must hold covering_numbers.csv")
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            try:
                if (int(row["v"]), int(row["k"]), int(row["t"])) == (d, l, k):
                    return int(row["size"])
            except (KeyError, TypeError, ValueError):
                raise CoveringError(
                    f"{path} row ({row!r}) must have integer columns v,k,t,size"
                ) from None
    return None


def read_cover(covering_dir: PathLike, d: int, k: int, l: int) -> Blocks | None:  # noqa: E741
    """The block list ``covering_dir/blocks/C_{d}_{l}_{k}.txt`` (one block per line,
    1-based points, ``#`` comments), 0-based and verified; ``None`` if absent.

    Raises :class:`CoveringError` if the file is malformed or not a cover.
    """
    d, k, l = _check_dkl(d, k, l)  # noqa: E741
    path = _folder(covering_dir) / "blocks" / f"C_{d}_{l}_{k}.txt"
    if not path.is_file():
        return None
    blocks = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        try:
            pts = [int(tok) - 1 for tok in text.split()]
        except ValueError:
            raise CoveringError(f"{path}:{lineno} ({text!r}) must be integers") from None
        if len(pts) > l:
            raise CoveringError(f"{path}:{lineno} ({text!r}) must have <= {l} points")
        blocks.append(pts)
    try:
        groups = _blocks_arrays(blocks, d)
    except CoveringError as exc:
        raise CoveringError(f"{path}: {exc}") from None
    if not _covered(groups, d, k).all():
        raise CoveringError(f"{path} must cover every {k}-set of {d} points (it does not)")
    return _canonical(_pad([np.array(b, np.int64) for b in blocks], d, l, None))


def _read_shortened(folder: PathLike, d: int, k: int, l: int) -> Blocks | None:  # noqa: E741
    """The folder's cover of the fewest points v > d (same l, k) with the points >= d
    deleted: still covers every k-set of ``0..d-1``."""
    sizes = []
    for path in (Path(folder) / "blocks").glob(f"C_*_{l}_{k}.txt"):
        v = path.name.split("_")[1]
        if v.isdigit() and int(v) > d:
            sizes.append(int(v))
    if not sizes:
        return None
    cover = read_cover(folder, min(sizes), k, l)
    if cover is None:
        return None
    return tuple(t for t in (tuple(p for p in b if p < d) for b in cover) if len(t) >= k)


# -- bounds ------------------------------------------------------------------------------
def cover_lower_bound(d: int, k: int, l: int) -> int:  # noqa: E741
    """Schönheim's lower bound on the number of l-sets covering every k-set of d points:
    ``ceil(d/l * ceil((d-1)/(l-1) * ... ceil((d-k+1)/(l-k+1))))``; 1 when l >= d."""
    d, k, l = _check_dkl(d, k, l)  # noqa: E741
    if l >= d:
        return 1
    bound = 1
    for i in range(k - 1, -1, -1):
        bound = -((-(d - i) * bound) // (l - i))  # ceil((d-i)/(l-i) * bound), exact
    return bound


# -- construction ------------------------------------------------------------------------
def construct_cover(
    d: int,
    k: int,
    l: int,  # noqa: E741 (the paper's name)
    rng: RngLike = 0,
    covering_dir: PathLike | None = None,
) -> Blocks:
    """A small set of l-subsets of ``0..d-1`` covering every k-subset.

    Args:
        d: number of attributes.
        k: size of the attribute sets to cover (the query size), 1 <= k <= min(d, l).
        l: block (view) size. ``l >= d`` gives the single block of all attributes;
            ``l == k`` all C(d, k) k-sets; ``k == 1`` ``ceil(d/l)`` blocks.
        rng: seed or generator (``numpy.random.default_rng``); the result is a
            deterministic function of the arguments and the seed.
        covering_dir: optional folder laid out like ``../shared/covering``. Its block
            list for (d, l, k), if any, is the starting point (returned as is when it
            matches the best-known size of ``covering_numbers.csv`` or the lower
            bound, else improved by local search); otherwise its list for the fewest
            v > d points, with the extra points deleted, competes with the
            constructions, and its lists serve the blow-ups' smaller covers.

    Returns:
        Sorted tuple of sorted l-tuples (every block has exactly ``min(l, d)`` points).

    Cost grows with the cover size: about 1 s for the 108 blocks of (d, l, k) =
    (32, 8, 3) on one core, minutes for tens of thousands of blocks. Results are
    cached per (d, k, l, seed, folder path).
    """
    d, k, l = _check_dkl(d, k, l)  # noqa: E741
    if l >= d:
        return (tuple(range(d)),)
    if k == l:
        _n_ksets(d, k)
        return tuple(itertools.combinations(range(d), k))
    if k == 1:
        starts = [min(i * l, d - l) for i in range(-(-d // l))]
        return _canonical([np.arange(s, s + l) for s in starts])
    seed = int(np.random.default_rng(rng).integers(1 << 62))
    folder = None if covering_dir is None else str(_folder(covering_dir).resolve())
    return _construct(d, k, l, seed, folder)


@functools.lru_cache(maxsize=128)
def _construct(d: int, k: int, l: int, seed: int, folder: str | None) -> Blocks:  # noqa: E741
    if l >= d:
        return (tuple(range(d)),)
    if k == l:
        return tuple(itertools.combinations(range(d), k))
    if k == 1:
        return construct_cover(d, k, l)
    _n_ksets(d, k)
    seeds = np.random.SeedSequence(seed).generate_state(8, np.uint64)
    gen = np.random.default_rng(int(seeds[0]))
    lower = cover_lower_bound(d, k, l)
    candidates: list[list[np.ndarray]] = []
    if folder is not None:
        known = read_cover(folder, d, k, l)
        if known is not None:  # the folder's cover is the start; a record is kept as is
            record = _best_known(folder, d, k, l)
            if len(known) <= lower or (record is not None and len(known) <= record):
                return known
            return _canonical(_improve([np.array(b, np.int64) for b in known], d, k, l, seeds))
        shortened = _read_shortened(folder, d, k, l)
        if shortened is not None:
            candidates.append([np.array(b, np.int64) for b in shortened])
    candidates.append(greedy_cover(d, k, l, gen))
    for r in range(2, l // k + 1):
        inner_d, inner_l = -(-d // r), l // r
        if inner_l < inner_d:
            inner = _construct(inner_d, k, inner_l, int(seeds[1]) + r, folder)
            candidates.append(_blow_up(inner, r, d))
    affine = _affine(d, k, l, gen)
    if affine is not None:
        candidates.append(affine)
    candidates = [_prune(_pad(c, d, l, gen), d, k) for c in candidates]
    return _canonical(_improve(min(candidates, key=len), d, k, l, seeds))


def _improve(
    blocks: list[np.ndarray],
    d: int,
    k: int,
    l: int,  # noqa: E741
    seeds: np.ndarray,
) -> list[np.ndarray]:
    """Local search on a cover unless it is provably optimal or too large."""
    if len(blocks) > cover_lower_bound(d, k, l) and (
        len(blocks) * math.comb(l, k) <= _ANNEAL_MAX_INCIDENCES
    ):
        return _anneal(d, k, blocks, Random(int(seeds[2])))
    return blocks


def _canonical(blocks: Sequence[np.ndarray]) -> Blocks:
    return tuple(sorted({tuple(int(p) for p in np.sort(b)) for b in blocks}))


def _pad(
    blocks: Sequence[np.ndarray],
    d: int,
    l: int,  # noqa: E741
    gen: np.random.Generator | None,
) -> list[np.ndarray]:
    """Blocks grown to ``min(l, d)`` points: random extra points, or the lowest when
    ``gen`` is None."""
    size = min(l, d)
    out = []
    for b in blocks:
        b = np.unique(b)
        if len(b) < size:
            rest = np.setdiff1d(np.arange(d), b)
            extra = rest[: size - len(b)] if gen is None else gen.permutation(rest)[: size - len(b)]
            b = np.sort(np.concatenate([b, extra]))
        out.append(b)
    return out


def _prune(blocks: list[np.ndarray], d: int, k: int) -> list[np.ndarray]:
    """Drop blocks whose k-sets are all covered by other blocks, those with the fewest
    uniquely covered k-sets first."""
    if not blocks:
        return blocks
    arr = np.array(blocks, np.int64)
    ranks = _ranks(arr, d, k)  # (b, c)
    counts = np.bincount(ranks.ravel(), minlength=math.comb(d, k))
    unique = (counts[ranks] == 1).sum(axis=1)
    keep = np.ones(len(blocks), bool)
    for j in np.argsort(unique, kind="stable"):
        if (counts[ranks[j]] >= 2).all():
            keep[j] = False
            counts[ranks[j]] -= 1
    return [b for b, kept in zip(blocks, keep) if kept]


def greedy_cover(
    d: int,
    k: int,
    l: int,  # noqa: E741
    gen: np.random.Generator,
    max_blocks: int | None = None,
) -> list[np.ndarray]:
    """Greedy cover: each step adds the l-set covering the most uncovered k-sets.

    With at most ``_FULL_POOL`` l-sets all are candidates (ties broken by a random
    order); otherwise a random pool is kept and its best member is improved by single
    point swaps before it is added. Stops early after ``max_blocks`` blocks (a
    partial cover of maximum greedy coverage).
    """
    n_k = _n_ksets(d, k)
    c = math.comb(l, k)
    total = math.comb(d, l)
    full = total <= _FULL_POOL and total * c <= _MAX_INCIDENCES
    if full:
        pool = np.array(list(itertools.combinations(range(d), l)), np.int64).reshape(-1, l)
        pool = pool[gen.permutation(len(pool))]
    else:
        size = max(16, min(20_000, _MAX_INCIDENCES // c))
        pool = np.sort(np.argsort(gen.random((size, d)), axis=1)[:, :l], axis=1)
    ranks = _ranks(pool, d, k)  # (P, c)
    flat = ranks.ravel()
    order = np.argsort(flat, kind="stable")
    owners = order // c
    starts = np.searchsorted(flat[order], np.arange(n_k + 1))
    gains = np.full(len(pool), c, np.int64)
    uncovered = np.ones(n_k, bool)
    left = n_k
    blocks: list[np.ndarray] = []
    while left and (max_blocks is None or len(blocks) < max_blocks):
        j = int(np.argmax(gains))
        if full:
            block = pool[j]
        else:
            if gains[j] > 0:
                block = pool[j]
            else:  # the pool is spent: grow a block around an uncovered k-set
                seed_set = _unrank(int(np.flatnonzero(uncovered)[0]), k)
                rest = gen.permutation(np.setdiff1d(np.arange(d), seed_set))[: l - k]
                block = np.sort(np.concatenate([np.array(seed_set, np.int64), rest]))
            block = _hill_climb(block, uncovered, d, k)
        r = _ranks(block[None, :], d, k)[0]
        newly = r[uncovered[r]]
        uncovered[newly] = False
        left -= len(newly)
        if len(newly):
            hit = np.concatenate([owners[starts[x] : starts[x + 1]] for x in newly])
            np.subtract.at(gains, hit, 1)
        blocks.append(block)
    return blocks


def _hill_climb(block: np.ndarray, uncovered: np.ndarray, d: int, k: int) -> np.ndarray:
    """Best-improvement single point swaps maximising the uncovered k-sets in ``block``."""
    size = len(block)
    gain = int(uncovered[_ranks(block[None, :], d, k)].sum())
    while True:
        outside = np.setdiff1d(np.arange(d), block)
        if not len(outside):
            return block
        variants = np.broadcast_to(block, (size, len(outside), size)).copy()
        variants[np.arange(size), :, np.arange(size)] = outside
        variants = np.sort(variants.reshape(-1, size), axis=1)
        g = uncovered[_ranks(variants, d, k)].sum(axis=1)
        j = int(np.argmax(g))
        if g[j] <= gain:
            return block
        block, gain = variants[j], int(g[j])


def _blow_up(inner: Blocks, r: int, d: int) -> list[np.ndarray]:
    """Replace original point i by the points ``r*i .. r*i + r - 1`` (those < d)."""
    out = []
    for b in inner:
        pts = (r * np.array(b, np.int64)[:, None] + np.arange(r)).ravel()
        out.append(pts[pts < d])
    return out


# -- affine construction over GF(2) ------------------------------------------------------
def _gaussian_binomial(n: int, s: int) -> int:
    num = den = 1
    for i in range(s):
        num *= (1 << (n - i)) - 1
        den *= (1 << (i + 1)) - 1
    return num // den


def _subspace_bases(n: int, s: int) -> list[list[int]]:
    """Bases of all s-dimensional subspaces of GF(2)^n (reduced row echelon form)."""
    out = []
    for pivots in itertools.combinations(range(n), s):
        free = [[q for q in range(p) if q not in pivots] for p in pivots]
        n_free = sum(len(f) for f in free)
        for bits in range(1 << n_free):
            basis, used = [], 0
            for p, f in zip(pivots, free):
                v = 1 << p
                for q in f:
                    if (bits >> used) & 1:
                        v |= 1 << q
                    used += 1
                basis.append(v)
            out.append(basis)
    return out


def _span_mask(basis: Sequence[int]) -> int:
    """The subspace spanned by ``basis`` as a bit mask over the 2^n vectors."""
    vectors = [0]
    for b in basis:
        vectors += [v ^ b for v in vectors]
    mask = 0
    for v in vectors:
        mask |= 1 << v
    return mask


def _affine(d: int, k: int, l: int, gen: np.random.Generator) -> list[np.ndarray] | None:  # noqa: E741
    """Cosets of s-dimensional subspaces of GF(2)^n that contain every (k-1)-dimensional
    subspace, restricted to the vectors ``0..d-1``; None when not applicable."""
    n = max(1, (d - 1).bit_length())
    s = l.bit_length() - 1  # 2^s <= l
    t = k - 1
    if not t <= s < n:
        return None
    if _gaussian_binomial(n, s) * _gaussian_binomial(s, t) > _MAX_SUBSPACE_INCIDENCES:
        return None
    index = {_span_mask(b): i for i, b in enumerate(_subspace_bases(n, t))}
    inside = _subspace_bases(s, t)  # coordinates of the t-subspaces of an s-space
    bases = _subspace_bases(n, s)
    incidence = []
    for basis in bases:
        rows = []
        for coords in inside:
            sub = []
            for c in coords:
                v = 0
                for i, u in enumerate(basis):
                    if (c >> i) & 1:
                        v ^= u
                sub.append(v)
            rows.append(index[_span_mask(sub)])
        incidence.append(rows)
    inc = np.array(incidence, np.int64)  # (subspaces, t-subspaces inside each)
    best: list[int] | None = None
    for _ in range(_AFFINE_RESTARTS):
        order = gen.permutation(len(inc))
        chosen = [int(order[j]) for j in _set_cover(inc[order], len(index))]
        if best is None or len(chosen) < len(best):
            best = chosen
    assert best is not None
    best = _anneal_sets(inc, len(index), best, Random(int(gen.integers(1 << 62))))
    points = (1 << d) - 1
    cosets = set()
    for j in best:
        vectors = [0]
        for b in bases[j]:
            vectors += [v ^ b for v in vectors]
        seen = 0
        for x in range(1 << n):
            if (seen >> x) & 1:
                continue
            coset = 0
            for v in vectors:
                coset |= 1 << (v ^ x)
            seen |= coset
            coset &= points
            if coset.bit_count() >= k:
                cosets.add(coset)
    return [np.array([p for p in range(d) if (mask >> p) & 1], np.int64) for mask in sorted(cosets)]


def _set_cover(sets: np.ndarray, universe: int) -> list[int]:
    """Greedy set cover: indices of rows of ``sets`` (rows of element ids) covering
    ``0..universe-1`` (first maximum on ties)."""
    uncovered = np.ones(universe, bool)
    chosen = []
    while uncovered.any():
        g = uncovered[sets].sum(axis=1)
        j = int(np.argmax(g))
        chosen.append(j)
        uncovered[sets[j]] = False
    return chosen


def _anneal_sets(
    sets: np.ndarray,
    universe: int,
    chosen: list[int],
    rnd: Random,
    level_iters: int = 50_000,
    total_iters: int = 500_000,
    temperature: float = 0.5,
) -> list[int]:
    """Shrink a set cover (rows of ``sets`` covering ``0..universe-1``) by the same
    drop-and-repair annealing as :func:`_anneal`: a move swaps a chosen row for a row
    holding a random uncovered element."""
    rows = [[int(e) for e in r] for r in sets]
    holders: list[list[int]] = [[] for _ in range(universe)]
    for j, r in enumerate(rows):
        for e in r:
            holders[e].append(j)
    count = [0] * universe
    current = list(chosen)
    for j in current:
        for e in rows[j]:
            count[e] += 1
    best = list(current)
    weights = [math.exp(-delta / temperature) for delta in range(64)]
    spent = 0
    while spent < total_iters and len(current) > 1:
        uniq = [sum(1 for e in rows[j] if count[e] == 1) for j in current]
        drop = min(range(len(current)), key=lambda i: (uniq[i], rnd.random()))
        for e in rows[current.pop(drop)]:
            count[e] -= 1
        uncovered = {e for e in range(universe) if count[e] == 0}
        it = 0
        while uncovered and it < level_iters:
            it += 1
            e = rnd.choice(sorted(uncovered)) if len(uncovered) < 8 else rnd.choice(list(uncovered))
            add = rnd.choice(holders[e])
            i = rnd.randrange(len(current))
            out = current[i]
            if out == add:
                continue
            add_set = set(rows[add])
            delta = sum(1 for x in rows[out] if count[x] == 1 and x not in add_set)
            delta -= sum(1 for x in rows[add] if count[x] == 0)
            if delta > 0 and (delta >= 64 or rnd.random() >= weights[delta]):
                continue
            for x in rows[out]:
                count[x] -= 1
                if count[x] == 0:
                    uncovered.add(x)
            for x in rows[add]:
                count[x] += 1
                uncovered.discard(x)
            current[i] = add
        spent += it
        if uncovered:
            break
        best = list(current)
    return best


# -- local search ------------------------------------------------------------------------
def _anneal(
    d: int,
    k: int,
    blocks: list[np.ndarray],
    rnd: Random,
    level_iters: int = _ANNEAL_LEVEL_ITERS,
    total_iters: int = _ANNEAL_TOTAL_ITERS,
    temperature: float = 0.2,
) -> list[np.ndarray]:
    """Shrink a cover by simulated annealing (Nurmela & Östergård 1993).

    Repeatedly drop the block covering the fewest k-sets alone, then move points to
    re-cover what it left: pick an uncovered k-set T and a block B meeting T in k-1
    points, swap a point of B outside T for the missing point of T; accept when the
    number of uncovered k-sets does not grow, else with probability exp(-delta / temp).
    Stops when a level fails within ``level_iters`` or ``total_iters`` are spent, and
    returns the smallest cover reached. Sets are bit masks over the d attributes; an
    index from each (k-1)-set to the blocks holding it finds the blocks meeting T.
    Requires k >= 2.
    """
    state = _Annealing(d, k, blocks, temperature)
    best = state.blocks()
    spent = 0
    while spent < total_iters and len(state.points) > 1:
        state.drop_weakest(rnd)
        it = 0
        while state.ulist and it < level_iters:
            it += 1
            state.move(rnd)
        spent += it
        if state.ulist:
            break
        best = state.blocks()
    return [np.array(sorted(p), np.int64) for p in best]


class _Annealing:
    """The state of :func:`_anneal`: the blocks as point lists and bit masks, how often
    each k-set is covered, the blocks holding each (k-1)-set, and the uncovered
    k-sets (``ulist``, with their positions in ``upos``)."""

    def __init__(self, d: int, k: int, blocks: list[np.ndarray], temperature: float) -> None:
        self.d, self.k = d, k
        self.bits = [1 << p for p in range(d)]
        self.points = [[int(p) for p in b] for b in blocks]
        self.masks = [sum(self.bits[p] for p in pts) for pts in self.points]
        self.count: dict[int, int] = {}
        self.holders: dict[int, set[int]] = {}
        for i, pts in enumerate(self.points):
            for key in self.subsets(pts, k):
                self.count[key] = self.count.get(key, 0) + 1
            for key in self.subsets(pts, k - 1):
                self.holders.setdefault(key, set()).add(i)
        self.ulist: list[int] = []
        self.upos: dict[int, int] = {}
        self.weights = [math.exp(-delta / temperature) for delta in range(64)]

    def subsets(self, pts: list[int], size: int) -> list[int]:
        return [sum(c) for c in itertools.combinations([self.bits[p] for p in pts], size)]

    def blocks(self) -> list[list[int]]:
        return [list(p) for p in self.points]

    def _uncover(self, key: int) -> None:
        self.upos[key] = len(self.ulist)
        self.ulist.append(key)

    def _cover(self, key: int) -> None:
        pos = self.upos.pop(key)
        moved = self.ulist.pop()
        if moved != key:
            self.ulist[pos] = moved
            self.upos[moved] = pos

    def drop_weakest(self, rnd: Random) -> None:
        """Drop the block with the fewest uniquely covered k-sets (the last block takes
        its index)."""
        points, masks, k = self.points, self.masks, self.k
        uniq = [sum(1 for key in self.subsets(pts, k) if self.count[key] == 1) for pts in points]
        j = min(range(len(points)), key=lambda i: (uniq[i], rnd.random()))
        last = len(points) - 1
        for key in self.subsets(points[j], k - 1):
            self.holders[key].discard(j)
        if j != last:
            for key in self.subsets(points[last], k - 1):
                self.holders[key].discard(last)
                self.holders[key].add(j)
        pts = points[j]
        points[j], masks[j] = points[last], masks[last]
        points.pop()
        masks.pop()
        for key in self.subsets(pts, k):
            self.count[key] -= 1
            if self.count[key] == 0:
                self._uncover(key)

    def move(self, rnd: Random) -> None:
        """One move: an uncovered k-set T, a block B meeting it in k-1 points (any block
        if none does), a point of B outside T swapped for T's missing one; kept when
        the uncovered count does not grow, else with probability exp(-delta / temp)."""
        target = self.ulist[rnd.randrange(len(self.ulist))]
        cands: list[int] = []
        rest_t = target
        while rest_t:
            low = rest_t & -rest_t
            rest_t ^= low
            cands.extend(self.holders.get(target ^ low, ()))
        i = rnd.choice(cands) if cands else rnd.randrange(len(self.points))
        pts, missing = self.points[i], target & ~self.masks[i]
        x = rnd.choice([p for p in pts if not (target >> p) & 1])
        if cands:
            y = missing.bit_length() - 1
        else:
            y = rnd.choice([p for p in range(self.d) if (missing >> p) & 1])
        rest = [self.bits[p] for p in pts if p != x]
        subs = rest if self.k == 2 else [sum(c) for c in itertools.combinations(rest, self.k - 1)]
        bx, by = self.bits[x], self.bits[y]
        delta = 0
        for sub in subs:
            if self.count[sub | bx] == 1:
                delta += 1
            if self.count.get(sub | by, 0) == 0:
                delta -= 1
        if delta > 0 and (delta >= 64 or rnd.random() >= self.weights[delta]):
            return
        self._swap(i, x, y, rest, subs)

    def _swap(self, i: int, x: int, y: int, rest: list[int], subs: list[int]) -> None:
        """Replace point x of block i by y, updating every count and index."""
        bx, by = self.bits[x], self.bits[y]
        for sub in subs:
            key = sub | bx
            self.count[key] -= 1
            if self.count[key] == 0:
                self._uncover(key)
            key = sub | by
            self.count[key] = self.count.get(key, 0) + 1
            if self.count[key] == 1:
                self._cover(key)
        for c in itertools.combinations(rest, self.k - 2):
            sub = sum(c)
            self.holders[sub | bx].discard(i)
            self.holders.setdefault(sub | by, set()).add(i)
        self.masks[i] = (self.masks[i] ^ bx) | by
        pts = self.points[i]
        pts[pts.index(x)] = y
