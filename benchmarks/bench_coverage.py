"""Coverage of the served error bars: how often estimate +- 1.96 std.err holds the truth.

    python benchmarks/bench_coverage.py [--reps 5] [--queries 20] [--settings demo,nltcs]
        [--epsilon 1]

Each setting is collected ``--reps`` times (seeds 1..reps) as the service collects
it: a pilot of 20% of the users on pairs (in two rounds where half of it can measure
pairs), then the views the pipeline planner chooses for 3-way marginals from the
pilot's reports (at ``--epsilon``), every report drawn from the oracles' exact law.
Per run, up to ``--queries`` 2- and 3-way queries of each answer kind (projection of a
view, maximum entropy) are drawn at random, and every cell of their answers is checked
against the population's true marginal:

- *old*: the noise-only bootstrap (replicates drawn from the served reconstruction,
  ``bootstrap(..., plug_in="served")``, per-cell variance over the replicates);
- *new*: the total-error bound the service serves
  (``bootstrap(...).mean_squared_error``: noise and bias of the unshrunk pipeline,
  the shrinkage's displacement, and for max-ent answers the interactions no view holds).

Both use 32 replicates (the service's default) and the same seed. *median |z|* is the
median over the cells of |error| / served std.err: 0.67 for a normal error of that
std.err, well below for a bound that is wide; *zero-width misses*: cells whose served
std.err is 0 but whose error is not.

Settings: ``demo`` (the ``calmkit demo`` population: 100,000 synthetic users, 8
attributes of 2-4 categories, a new population per seed), ``adult3`` (Adult, at most 3
categories per attribute), ``adult`` (Adult uncapped), ``nltcs`` (16 binary
attributes), ``kosarak`` (its 16 most frequent items, 2^16 users), ``acs`` (23 binary
attributes) and ``plants`` (69 binary attributes); held-out shapes no part of the bound
was tuned on: ``strong12`` (12 attributes of 3-12 categories, network strength 4: 42% of
a triple's cells hold under 1e-4 of the users; n = 50,000), ``wide16`` (16 attributes of
2-20 categories, strength 3, n = 30,000), ``binary120`` (120 binary attributes,
strength 4, n = 20,000) and ``tree12`` (12 attributes of 3-12 categories, each category
of a parent taking one category of its child with probability 0.85: 57% of a triple's
cells hold under 1e-4 of the users; n = 50,000), ``independent24`` (24 independent
binary attributes, n = 47,000: at eps 2 the planner sets the pilot's tables aside),
``kosarak100`` (Kosarak's 100 most frequent items, 17,000 users) and ``retail64``
(retail's 64 most frequent items, 2^16 users): sparse items, half of them held by at
most 1-1.5% of the users;
``csv:PATH`` reads any CSV. Only the
first four run by default. The datasets are read from ``CALMKIT_DATA`` (or
``--data-dir``); a setting whose data is absent is
skipped with the reason.
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from calmkit_aggregator.phases import PhasedDesign, answer_support
from calmkit_aggregator.planning.pilot import plan_next_phase, start_pilot
from calmkit_aggregator.reconstruction.pipeline import Estimator, reconstruct_by
from calmkit_aggregator.reconstruction.support import SupportCounts
from calmkit_aggregator.reconstruction.uncertainty import bootstrap
from calmkit_client import Schema
from calmkit_simulator import (
    DatasetError,
    Population,
    collect_support,
    load_dataset,
    synthetic_population,
)
from calmkit_simulator.mechanisms.calm import collect_pilot

K, REPLICATES = 3, 32
TREE_SIZES = (9, 8, 3, 3, 11, 10, 11, 8, 11, 6, 7, 10)
DEMO_SIZES = (2, 3, 2, 2, 4, 2, 3, 2)
KINDS = ("projection", "maxent")


def populations(data_dir: str | None) -> dict[str, Callable[[int], Population]]:
    return {
        "demo": lambda s: synthetic_population(n=100_000, sizes=DEMO_SIZES, strength=1.5, rng=s),
        "adult3": lambda s: load_dataset("adult", data_dir, max_categories=3),
        "adult": lambda s: load_dataset("adult", data_dir),
        "nltcs": lambda s: load_dataset("nltcs", data_dir),
        "kosarak": lambda s: load_dataset("kosarak", data_dir, d=16).resample(1 << 16, rng=0),
        "acs": lambda s: load_dataset("acs", data_dir),
        "plants": lambda s: load_dataset("plants", data_dir),
        # held-out shapes: populations no part of the planner or the bound was tuned on
        "strong12": lambda s: held_out("synthetic:3-12:strength=4", 12, 50_000, s),
        "wide16": lambda s: held_out("synthetic:2-20:strength=3", 16, 30_000, s),
        "binary120": lambda s: held_out("synthetic:strength=4", 120, 20_000, s),
        "tree12": lambda s: tree(TREE_SIZES, 50_000, 0.85, 0.5, 12),
        "independent24": lambda s: synthetic_population(
            n=47_000, sizes=(2,) * 24, max_parents=0, rng=s
        ),
        # sparse items: half of them held by at most 1-1.5% of the users
        "kosarak100": lambda s: sparse("kosarak", data_dir, 100, 17_000),
        "retail64": lambda s: sparse("retail", data_dir, 64, 1 << 16),
    }


def sparse(name: str, data_dir: str | None, d: int, n: int) -> Population:
    """``name``'s ``d`` most frequent items, ``n`` users resampled from its rows."""
    return load_dataset(name, data_dir, d=d).resample(n, rng=7)


def tree(sizes: tuple[int, ...], n: int, strength: float, skew: float, seed: int) -> Population:
    """A tree: each attribute after the first has one earlier attribute as its parent,
    and each category of the parent takes one category of the child (its own, drawn at
    random) with probability ``strength``, else the child's Dirichlet(``skew``) margin."""
    gen = np.random.default_rng(seed)
    cols = np.zeros((n, len(sizes)), dtype=np.int64)
    for j, size in enumerate(sizes):
        margin = gen.dirichlet(np.full(size, skew))
        if j == 0:
            cols[:, j] = gen.choice(size, size=n, p=margin)
            continue
        parent = int(gen.integers(0, j))
        prefers = gen.integers(0, size, size=sizes[parent])
        table = (1 - strength) * margin[None, :] + strength * np.eye(size)[prefers]
        cdf = np.cumsum(table, axis=1)[cols[:, parent]]
        cols[:, j] = np.minimum((gen.random(n)[:, None] > cdf).sum(axis=1), size - 1)
    return Population(Schema.from_sizes(list(sizes)), cols.astype(np.uint64), name="tree12")


def held_out(spec: str, d: int, n: int, seed: int) -> Population:
    """``spec``'s population of ``d`` attributes (a new network per seed), ``n`` users
    drawn from it."""
    return load_dataset(spec, d=d, rng=seed).resample(n, rng=seed)


def collect(pop: Population, seed: int, epsilon: float = 1.0) -> SupportCounts:
    """The service's phases: a pilot on pairs (one round or two), then the planner's
    views; the pilot's tables are left out where the planner sets them aside, and its
    reports then count in the attributes' margins only."""
    start = start_pilot(pop.schema, epsilon, pop.n, seed=seed)
    design = PhasedDesign(pop.n, start.reports, K, seed, first_round=start.first_round)
    order = np.random.default_rng(seed + 1000).permutation(pop.n)
    pilot = collect_pilot(pop, start, design, order, rng=seed)
    main = plan_next_phase(design, pilot)
    rest = collect_support(pop, main.plan, rng=seed + 1, rows=order[start.reports :])
    return answer_support(pilot, rest, main.keeps_pilot)


def draw_queries(pop: Population, est: Estimator, per_kind: int, seed: int) -> list[tuple]:
    every = [q for r in range(2, K + 1) for q in itertools.combinations(range(pop.d), r)]
    chosen: dict[str, list[tuple[int, ...]]] = {kind: [] for kind in KINDS}
    for i in np.random.default_rng(seed).permutation(len(every)):
        kind = est.answer(every[i]).method
        if kind in chosen and len(chosen[kind]) < per_kind:
            chosen[kind].append(every[i])
    return [(kind, q) for kind in KINDS for q in chosen[kind]]


@dataclass
class Tally:
    """Cells, cells covered by each method, the new/old std.err ratios, the errors in
    units of the new std.err and the cells the new one misses with width 0."""

    cells: int = 0
    old: int = 0
    new: int = 0
    ratios: list[float] = field(default_factory=list)
    z: list[float] = field(default_factory=list)
    zero_width: int = 0

    def add(self, err: np.ndarray, old_var: np.ndarray, new_var: np.ndarray) -> None:
        self.cells += err.size
        self.old += int((np.abs(err) <= 1.96 * np.sqrt(old_var)).sum())
        self.new += int((np.abs(err) <= 1.96 * np.sqrt(new_var)).sum())
        with np.errstate(divide="ignore", invalid="ignore"):
            self.ratios.extend(np.sqrt(new_var / old_var).reshape(-1).tolist())
            self.z.extend((np.abs(err) / np.sqrt(new_var)).reshape(-1).tolist())
        self.zero_width += int(((new_var <= 0) & (np.abs(err) > 1e-12)).sum())


def run(
    pop: Population, seed: int, per_kind: int, tallies: dict[str, Tally], epsilon: float
) -> float:
    """One collection; adds its cells to ``tallies``; returns the new bootstrap's
    seconds (replicates and every answer's bound)."""
    support = collect(pop, seed, epsilon)
    est = reconstruct_by(support)
    old = bootstrap(support, est, REPLICATES, rng=seed, plug_in="served")
    t0 = time.perf_counter()
    new = bootstrap(support, est, REPLICATES, rng=seed)
    queries = draw_queries(pop, est, per_kind, seed)
    bounds = {q: new.mean_squared_error(q, est) for _, q in queries}
    seconds = time.perf_counter() - t0
    for kind, q in queries:
        err = est.answer(q).values - pop.marginal(q)
        tallies[kind].add(err, old.variance(q), bounds[q])
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--queries", type=int, default=20, help="queries per answer kind per run")
    ap.add_argument("--settings", default="demo,adult3,adult,nltcs")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--epsilon", type=float, default=1.0)
    args = ap.parse_args()
    loaders = populations(args.data_dir)
    for name in args.settings.split(","):
        if name not in loaders and not name.startswith("csv:"):
            ap.error(f"setting ({name!r}) must be one of {sorted(loaders)} or csv:PATH")
    print(
        f"# coverage of estimate +- 1.96 std.err ({args.reps} runs per setting, seeds "
        f"1..{args.reps}, eps {args.epsilon:g}, {REPLICATES} replicates)\n"
    )
    print(
        "| setting | answer | cells | old (noise only) | new (total error) | "
        "std.err new/old (median) | median \\|z\\| | zero-width misses | new bootstrap s/run |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.settings.split(","):
        tallies = {kind: Tally() for kind in KINDS}
        seconds = []
        try:
            for seed in range(1, args.reps + 1):
                pop = load_dataset(name) if name.startswith("csv:") else loaders[name](seed)
                seconds.append(run(pop, seed, args.queries, tallies, args.epsilon))
        except DatasetError as exc:
            print(f"| {name} | skipped: {exc} | | | | | | | |")
            continue
        for kind, t in tallies.items():
            if t.cells:
                print(
                    f"| {name} | {kind} | {t.cells} | {t.old / t.cells:.3f} | "
                    f"{t.new / t.cells:.3f} | {np.nanmedian(t.ratios):.2f} | "
                    f"{np.nanmedian(t.z):.2f} | {t.zero_width} | {np.mean(seconds):.1f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
