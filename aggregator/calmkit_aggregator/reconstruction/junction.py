"""Junction trees over the views' attribute sets: a compact joint distribution that
answers any marginal by exact inference (Lauritzen & Spiegelhalter 1988; Jensen,
Lauritzen & Olesen 1990, the HUGIN architecture).

A distribution that factorises over attribute sets ``V_1..V_m`` (here: the maximum-
entropy distribution given the views' marginals, a log-linear model with one factor
per view) is a product over the cliques of any chordal graph whose cliques contain
every ``V_j``. Such a graph comes from eliminating the attributes one at a time
(greedy min-fill, ties by the clique's cell count); its maximal cliques, joined by a
maximum-weight spanning tree on separator sizes, form a junction tree. The joint is
then ``P(x) = prod_C beta_C(x_C) / prod_S beta_S(x_S)`` with ``beta`` the clique and
separator marginals, held as dense tables: memory is the sum of the cliques' cells,
never the product of all the attributes' sizes.

Everything here works on attribute positions (sorted tuples) and the category counts
``sizes`` of all attributes; tables have one axis per attribute in sorted order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import breadth_first_order, minimum_spanning_tree

from calmkit_client import CalmkitError

__all__ = [
    "JunctionTree",
    "TableTooLarge",
    "TreeModel",
    "cells_of",
    "fit_maxent",
    "junction_tree",
    "project",
    "triangulate",
]


class TableTooLarge(CalmkitError):
    """A dense table would exceed the cell budget; the message gives its size."""


def cells_of(attrs: Sequence[int], sizes: Sequence[int]) -> int:
    """Cells of a dense table over ``attrs`` (a Python int: no overflow)."""
    out = 1
    for a in attrs:
        out *= int(sizes[a])
    return out


def project(attrs: tuple[int, ...], values: np.ndarray, onto: tuple[int, ...]) -> np.ndarray:
    """The marginal of a table over sorted ``attrs`` onto the sorted subset ``onto``."""
    drop = tuple(i for i, a in enumerate(attrs) if a not in onto)
    return values.sum(axis=drop) if drop else values


def _bshape(attrs: tuple[int, ...], sub: tuple[int, ...], shape: Sequence[int]) -> tuple[int, ...]:
    """Shape that broadcasts a table over the sorted subset ``sub`` onto ``attrs``."""
    return tuple(n if a in sub else 1 for a, n in zip(attrs, shape))


def _ratio(target: np.ndarray, current: np.ndarray) -> np.ndarray:
    """``target / current`` (same shape) with 0/0 = 0 (and x/0 = 0: a cell the model
    holds at 0 stays there)."""
    out = np.zeros(current.shape)
    np.divide(target, current, out=out, where=current > 0)
    return out


def triangulate(cover: Sequence[Sequence[int]], sizes: Sequence[int]) -> list[tuple[int, ...]]:
    """Maximal cliques of a chordal graph over all ``len(sizes)`` attributes that
    contains every set of ``cover`` as a clique: greedy elimination, each step taking
    the attribute whose elimination adds the fewest edges (min-fill), ties broken by
    the cells of the clique it forms. An attribute in no set is a clique of its own.
    Vectorised over attributes (one (d, d) boolean adjacency, triangles by matmul)."""
    d = len(sizes)
    adj = np.zeros((d, d), dtype=np.float64)
    for s in cover:
        idx = np.asarray(sorted(set(s)), dtype=np.int64)
        adj[np.ix_(idx, idx)] = 1.0
    np.fill_diagonal(adj, 0.0)
    logsize = np.log(np.asarray(sizes, dtype=np.float64))
    dead = np.zeros(d, dtype=bool)
    cliques: list[frozenset[int]] = []
    for _ in range(d):
        deg = adj.sum(axis=1)
        triangles = ((adj @ adj) * adj).sum(axis=1) / 2.0
        fill = deg * (deg - 1) / 2.0 - triangles
        key = fill * 1e6 + logsize + adj @ logsize  # fill first, then cells
        key[dead] = np.inf
        v = int(np.argmin(key))
        nbrs = np.flatnonzero(adj[v])
        cliques.append(frozenset([v, *nbrs.tolist()]))
        adj[np.ix_(nbrs, nbrs)] = 1.0
        adj[nbrs, nbrs] = 0.0
        adj[v, :] = 0.0  # eliminated: out of the graph
        adj[:, v] = 0.0
        dead[v] = True
    maximal = [c for c in cliques if not any(c < o for o in cliques)]
    unique = sorted({tuple(sorted(c)) for c in maximal})
    return unique


@dataclass(frozen=True)
class JunctionTree:
    """A junction tree: ``cliques`` (sorted attribute tuples) in breadth-first order
    from the root (clique 0), ``parent[i]`` the parent of clique i (-1 for the root;
    cliques of separate components hang off the root with an empty separator), and
    ``sizes`` the category counts of every attribute."""

    sizes: tuple[int, ...]
    cliques: tuple[tuple[int, ...], ...]
    parent: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.parent) != len(self.cliques) or (self.cliques and self.parent[0] != -1):
            raise CalmkitError("parent must list one parent per clique, -1 for clique 0")
        if any(not 0 <= p < i for i, p in enumerate(self.parent) if i):
            raise CalmkitError("parent[i] must be an earlier clique (breadth-first order)")

    @property
    def separators(self) -> tuple[tuple[int, ...], ...]:
        """``separators[i]``: clique i's attributes shared with its parent (root: ())."""
        return tuple(
            () if p < 0 else tuple(a for a in self.cliques[i] if a in self.cliques[p])
            for i, p in enumerate(self.parent)
        )

    @property
    def largest(self) -> int:
        """Cells of the largest clique."""
        return max((cells_of(c, self.sizes) for c in self.cliques), default=1)

    def children(self) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in self.cliques]
        for i, p in enumerate(self.parent):
            if p >= 0:
                out[p].append(i)
        return out

    def home(self, attrs: Sequence[int]) -> int | None:
        """The smallest clique containing every attribute of ``attrs`` (None if none)."""
        s = set(attrs)
        best = [i for i, c in enumerate(self.cliques) if s <= set(c)]
        return min(best, key=lambda i: cells_of(self.cliques[i], self.sizes)) if best else None


def junction_tree(cover: Sequence[Sequence[int]], sizes: Sequence[int]) -> JunctionTree:
    """A junction tree whose cliques contain every set of ``cover`` (:func:`triangulate`,
    then a maximum spanning tree on separator sizes; Jensen & Jensen 1994)."""
    sizes_t = tuple(int(s) for s in sizes)
    cliques = triangulate(cover, sizes_t)
    k = len(cliques)
    member = np.zeros((k, len(sizes_t)), dtype=np.float64)
    for i, c in enumerate(cliques):
        member[i, list(c)] = 1.0
    shared = member @ member.T
    np.fill_diagonal(shared, 0.0)
    top = float(shared.max()) + 1.0
    weights = np.where(shared > 0, top - shared, 0.0)  # minimum of (top - |S|): maximum |S|
    forest = minimum_spanning_tree(csr_matrix(np.triu(weights)))
    sym = forest + forest.T
    parent = np.full(k, -2, dtype=np.int64)
    order: list[int] = []
    for root in range(k):
        if parent[root] != -2:
            continue
        nodes, preds = breadth_first_order(sym, root, directed=False, return_predecessors=True)
        for v in nodes:
            parent[v] = preds[v] if v != root else (-1 if not order else 0)
            order.append(int(v))
        if root != order[0]:
            parent[root] = order[0]  # another component: empty separator to the root
    position = {v: i for i, v in enumerate(order)}
    new_parent = tuple(-1 if parent[v] < 0 else position[int(parent[v])] for v in order)
    return JunctionTree(sizes_t, tuple(cliques[v] for v in order), new_parent)


@dataclass(frozen=True)
class TreeModel:
    """A calibrated junction-tree distribution: ``beliefs[i]`` is the marginal (sums to
    1, float64, one axis per attribute of ``tree.cliques[i]``) of clique i."""

    tree: JunctionTree
    beliefs: tuple[np.ndarray, ...]

    def marginal(self, attrs: Sequence[int], max_cells: int) -> np.ndarray:
        """The model's marginal over sorted ``attrs`` (shape: their sizes), by
        projection from a clique that holds them all, else by variable elimination
        over the smallest subtree whose cliques hold them, keeping the query's
        attributes (:class:`TableTooLarge` when the answer or an intermediate table
        would exceed ``max_cells`` cells, before allocating it)."""
        query = tuple(sorted({int(a) for a in attrs}))
        tree = self.tree
        cells = cells_of(query, tree.sizes)
        if cells > max_cells:
            raise TableTooLarge(
                f"marginal over {len(query)} attributes ({cells} cells) must have at most "
                f"max_cells ({max_cells}) cells"
            )
        home = tree.home(query)
        if home is None:
            return self._eliminate(query, max_cells)
        out = project(tree.cliques[home], self.beliefs[home], query)
        total = float(out.sum())
        return out / total if total > 0 else out

    def _steiner(self, query: tuple[int, ...]) -> tuple[int, list[int]]:
        """(root, nodes in breadth-first order) of a small subtree of cliques that
        together hold every attribute of ``query``."""
        tree = self.tree
        parent = tree.parent
        depth = [0] * len(parent)
        for i, p in enumerate(parent):
            if p >= 0:
                depth[i] = depth[p] + 1
        chosen: set[int] = set()
        for a in query:
            holders = [i for i, c in enumerate(tree.cliques) if a in c]
            if not holders:
                raise CalmkitError(f"attribute ({a}) must be in the model")
            if chosen & set(holders):
                continue
            chosen.add(min(holders, key=lambda i: (depth[i], i)))
        # union of the paths between the chosen cliques: climb to their common ancestor
        nodes = set(chosen)
        frontier = sorted(chosen, key=lambda i: -depth[i])
        while len({*frontier}) > 1:
            deepest = max(frontier, key=lambda i: depth[i])
            frontier.remove(deepest)
            up = parent[deepest]
            nodes.add(up)
            if up not in frontier:
                frontier.append(up)
        root = frontier[0]
        ordered = sorted(nodes)  # breadth-first order of the whole tree restricted
        return root, ordered

    def _eliminate(self, query: tuple[int, ...], max_cells: int) -> np.ndarray:
        tree = self.tree
        root, nodes = self._steiner(query)
        seps = tree.separators
        inside = set(nodes)
        msgs: dict[int, tuple[tuple[int, ...], np.ndarray]] = {}
        qset = set(query)
        children = tree.children()
        for i in reversed(nodes):  # children before parents
            attrs = tree.cliques[i]
            factors: list[tuple[tuple[int, ...], np.ndarray]] = [(attrs, self.beliefs[i])]
            if i != root:
                sep = seps[i]
                belief = self.beliefs[i]
                margin = project(attrs, belief, sep).reshape(_bshape(attrs, sep, belief.shape))
                cond = np.zeros(belief.shape)  # P(clique | separator), 0/0 = 0
                np.divide(belief, margin, out=cond, where=np.broadcast_to(margin > 0, belief.shape))
                factors = [(attrs, cond)]
            factors += [msgs.pop(c) for c in children[i] if c in inside]
            union = tuple(sorted({a for f, _ in factors for a in f}))
            size = cells_of(union, tree.sizes)
            if size > max_cells:
                raise TableTooLarge(
                    f"an intermediate table of the marginal over {len(query)} attributes "
                    f"({size} cells over {len(union)} attributes) must have at most "
                    f"max_cells ({max_cells}) cells"
                )
            shape = tuple(tree.sizes[a] for a in union)
            table = np.ones(shape)
            for fa, fv in factors:
                table = table * fv.reshape(_bshape(union, fa, shape))
            keep = tuple(a for a in union if a in qset or (i != root and a in seps[i]))
            msgs[i] = (keep, project(union, table, keep))
        attrs, values = msgs[root]
        out = project(attrs, values, query)
        total = float(out.sum())
        return out / total if total > 0 else out


@dataclass(frozen=True)
class FitResult:
    """A fitted model, the largest constraint residual of its last sweep and the
    sweeps run."""

    model: TreeModel
    residual: float
    iterations: int


def _euler_moves(tree: JunctionTree) -> list[tuple[int, int]]:
    """The walk of a depth-first tour from the root and back: (from, to) moves."""
    children = tree.children()
    moves: list[tuple[int, int]] = []
    stack: list[tuple[int, int]] = [(0, 0)]
    while stack:
        node, k = stack.pop()
        if k < len(children[node]):
            stack.append((node, k + 1))
            child = children[node][k]
            moves.append((node, child))
            stack.append((child, 0))
        elif node != 0:
            moves.append((node, tree.parent[node]))
    return moves


def fit_maxent(
    tree: JunctionTree,
    targets: Sequence[tuple[tuple[int, ...], np.ndarray]],
    tol: float = 1e-9,
    max_iter: int = 1000,
) -> FitResult:
    """The maximum-entropy distribution on ``tree`` matching each target marginal
    ``(attrs, values)`` (every ``attrs`` inside some clique): iterative proportional
    fitting on the joint, ``P *= t_j / P_{V_j}`` (0/0 = 0), run on the cliques'
    marginals (HUGIN representation). Each target scales the smallest clique holding
    it; a depth-first tour visits the cliques, each move absorbing the separator
    marginal of the clique just left, so the clique being scaled always holds the
    joint's current marginal and every step is exact IPF on the whole distribution.
    Stops when every target's residual in a sweep is below ``tol``, or when no
    target's marginal moved by more than ``tol`` since the previous sweep (constraints
    no distribution meets: IPF's limit cycle), or after ``max_iter`` sweeps; the
    beliefs are then calibrated by one pass from the root."""
    k = len(tree.cliques)
    sizes = tree.sizes
    beliefs = [np.full(tuple(sizes[a] for a in c), 1.0 / cells_of(c, sizes)) for c in tree.cliques]
    seps = tree.separators
    sep_tables = [np.full(tuple(sizes[a] for a in s), 1.0 / cells_of(s, sizes)) for s in seps]
    Scaling = tuple[tuple[int, ...], np.ndarray, tuple[int, ...]]
    assigned: list[list[Scaling]] = [[] for _ in range(k)]
    for attrs, values in targets:
        home = tree.home(attrs)
        if home is None:
            raise CalmkitError(f"target over {list(attrs)} must lie inside one clique")
        clique = tree.cliques[home]
        t = np.asarray(values, dtype=np.float64)
        assigned[home].append((attrs, t, _bshape(clique, attrs, beliefs[home].shape)))
    moves = _euler_moves(tree)
    previous: list[np.ndarray] | None = None
    residual, it = np.inf, 0

    def absorb(src: int, dst: int) -> None:
        edge = dst if tree.parent[dst] == src else src  # the child end names the edge
        sep = seps[edge]
        new = project(tree.cliques[src], beliefs[src], sep)
        beliefs[dst] = beliefs[dst] * _ratio(new, sep_tables[edge]).reshape(
            _bshape(tree.cliques[dst], sep, beliefs[dst].shape)
        )
        sep_tables[edge] = new

    def scale(i: int, seen: list[np.ndarray]) -> float:
        worst = 0.0
        clique = tree.cliques[i]
        for attrs, t, bshape in assigned[i]:
            current = project(clique, beliefs[i], attrs)
            seen.append(current)
            worst = max(worst, float(np.abs(current - t).max()))
            beliefs[i] = beliefs[i] * _ratio(t, current).reshape(bshape)
        return worst

    while it < max_iter:
        it += 1
        seen: list[np.ndarray] = []
        residual = scale(0, seen)
        for src, dst in moves:
            absorb(src, dst)
            if tree.parent[dst] == src:  # going down: first visit of dst
                residual = max(residual, scale(dst, seen))
        if residual <= tol:
            break
        if (
            previous is not None
            and max((float(np.abs(a - b).max()) for a, b in zip(seen, previous)), default=0.0)
            <= tol
        ):
            break
        previous = seen
    for i in range(1, k):  # distribute from the root: every clique calibrated
        absorb(tree.parent[i], i)
    return FitResult(TreeModel(tree, tuple(beliefs)), residual, it)
