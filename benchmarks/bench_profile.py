"""What the pilot tells the planner about the data's dependence, against the previous rule.

    python benchmarks/bench_profile.py [--reps 20] [--data-dir DIR]

For each setting of the planner benchmark (``calmkit experiment planner``: dataset, d, n,
eps) and repetition: the pilot of the default planner (20% of the users on a random
perfect matching of the attributes, the repetition's seed), its estimated views, and the
posterior of the mean pair dependence from them, two ways on the same reports:

- **current**: ``estimate_profile`` (calmkit_aggregator/planning/profile.py and dependence.py):
  every pilot pair's own likelihood (its noise simulated under independence with
  margins read without a prior's pull), pooled over the pairs with their heterogeneity;
- **baseline**: the rule up to commit f78fe53 (the pairs' ratio estimate sum x / sum w
  taken as normal, margins shrunk by a Dirichlet(1) prior), loaded from the
  repository's history (``git show``; the script needs the git checkout).

Printed per setting: the true mean dependence, how often the true value lies inside the
posterior's 10-90% range (a calibrated posterior: 80%), below its 10% quantile, above
its 90% quantile, and the median of |log(posterior median / truth)|. Then, per dataset,
how heterogeneous the pairs are: alpha by moments of dependence / (D x weight) over all
pairs, and the ratio estimate of d/2 random pairs against the truth (2,000 draws: its
median and 10-90% range; exact data, no noise). Writes ``docs/profile.md``.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import math
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from calmkit_aggregator.planning.pilot import pilot_plan, pilot_size
from calmkit_aggregator.planning.profile import (
    estimate_profile,
    marginal_pair_weights,
    pair_dependence,
)
from calmkit_aggregator.reconstruction.estimate import estimate_views
from calmkit_simulator import collect_support
from calmkit_simulator.datasets import DatasetError, load_dataset
from calmkit_simulator.planner_bench import SETTINGS

ROOT = Path(__file__).resolve().parents[1]
BASELINE = "f78fe53"  # the last commit of the previous rule


def baseline_module() -> ModuleType:
    """``calmkit_aggregator/profile.py`` as of :data:`BASELINE` (since moved to
    ``planning/``), loaded as a module of the installed package: its one relative
    import, ``.marginal``, resolves in ``reconstruction/`` where that module now is."""
    path = f"{BASELINE}:aggregator/calmkit_aggregator/profile.py"
    source = subprocess.run(
        ["git", "show", path], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    name = "calmkit_aggregator._profile_baseline"
    spec = importlib.util.spec_from_loader(name, loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "calmkit_aggregator.reconstruction"
    sys.modules[name] = module
    exec(compile(source, f"{BASELINE}:profile.py", "exec"), module.__dict__)
    return module


def true_pairs(pop) -> tuple[float, np.ndarray, np.ndarray]:  # type: ignore[no-untyped-def]
    """Mean pair dependence, every pair's dependence and its marginal weight."""
    sizes = pop.schema.sizes
    margs = [pop.marginal((a,)).reshape(-1) for a in range(pop.d)]
    weight = marginal_pair_weights(margs)
    deps, ws = [], []
    for a, b in itertools.combinations(range(pop.d), 2):
        if sizes[a] > 1 and sizes[b] > 1:
            deps.append(pair_dependence(pop.marginal((a, b)).reshape(sizes[a], sizes[b])))
            ws.append(weight[a, b])
    dep, w = np.array(deps), np.array(ws)
    return float(dep.mean()), dep, w / w.mean()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--out", default=str(ROOT / "docs" / "profile.md"))
    args = parser.parse_args()
    old_rule = baseline_module()
    rows, shapes = [], {}
    seen = set()
    for s in SETTINGS:
        if (s.dataset, s.d, s.n, s.max_categories) in seen:
            continue  # the same data under another workload: the same pilots
        seen.add((s.dataset, s.d, s.n, s.max_categories))
        try:
            pop = load_dataset(s.dataset, args.data_dir, s.d, s.max_categories, rng=0)
        except DatasetError as exc:
            print(f"skip {s.label}: {exc}")
            continue
        if s.n is not None and s.n != pop.n:
            pop = pop.resample(s.n, rng=0)
        truth, deps, weights = true_pairs(pop)
        shapes[s.label] = (pop.d, deps, weights)
        for eps in s.epsilons:
            stats: dict[str, list[tuple[bool, bool, bool, float]]] = {}
            for rep in range(args.reps):
                gen = np.random.default_rng([0, rep])
                seed = int(gen.integers(2**31))
                plan = pilot_plan(pop.schema, eps, seed=seed, users=pilot_size(pop.n))
                rows_ = np.sort(gen.permutation(pop.n)[: pilot_size(pop.n)])
                support = collect_support(pop, plan, gen, path="fast", rows=rows_)
                views = estimate_views(support)
                profile = estimate_profile(pop.schema, views, plan.view_oracles)
                current = profile.dependence_quantiles or (profile.dependence,)
                before = old_rule.estimate_profile(pop.schema, views, plan.view_oracles)
                old = before.dependence_quantiles or (before.dependence,)
                for name, q in (("current", current), ("baseline", old)):
                    inside = q[0] <= truth <= q[-1]
                    stats.setdefault(name, []).append(
                        (inside, truth < q[0], truth > q[-1], abs(math.log(q[2] / truth)))
                    )
            row: dict[str, Any] = {"setting": s.label, "eps": eps, "truth": truth}
            for name, vals in stats.items():
                arr = np.array(vals, dtype=float)
                row[name] = (
                    arr[:, 0].mean(),
                    arr[:, 1].mean(),
                    arr[:, 2].mean(),
                    float(np.median(arr[:, 3])),
                )
            rows.append(row)
            c, b = row["current"], row["baseline"]
            print(
                f"{s.label:28s} eps {eps:<4g} truth {truth:.5f} | inside 10-90%: "
                f"current {c[0]:.2f} baseline {b[0]:.2f} | median |log ratio| "
                f"current {c[3]:.2f} baseline {b[3]:.2f}",
                flush=True,
            )
    text = _report(rows, shapes, args.reps)
    Path(args.out).write_text(text)
    print(f"wrote {args.out}")
    return 0


def _report(rows, shapes, reps: int) -> str:  # type: ignore[no-untyped-def]
    lines = [
        "# What the pilot tells the planner about the data",
        "",
        "Generated by `python benchmarks/bench_profile.py` (do not edit by hand). The default "
        "planner predicts the error of a design from a data profile "
        "(`calmkit_aggregator/planning/profile.py`); its least certain part is the mean pair "
        "dependence, which the pilot (20% of the users on disjoint pairs) estimates. For each "
        f"setting of `docs/planner.md` and each of {reps} repetitions (the same pilot "
        "reports for both): the posterior of the **current** rule (every pilot pair's own "
        "likelihood, its noise simulated under independence with margins read without a "
        "prior's pull and the signal added to that noise at a random angle (since "
        "2026-11-28; before, the noise's law shifted by the signal and widened by a "
        "normal), pooled over the pairs with their heterogeneity: each pair's "
        "dependence a Gamma-distributed multiple of its marginal weight, its shape alpha "
        "log-uniform on [1/64, 4]) and of the **baseline**, the rule up to commit f78fe53 "
        "(the pairs' ratio estimate sum x / sum w taken as normal, margins shrunk by a "
        "Dirichlet(1) prior). The pilot is the default's: where its pair views cannot tell "
        "a typical dependence from none (small epsilon, large tables), it measures the "
        "attributes alone and both rules give the prior. "
        "*inside*: how often the true mean dependence lies in the posterior's 10-90% range "
        "(80% if calibrated); *below* / *above*: under its 10% / over its 90% quantile; "
        "*|log|*: median of |log(posterior median / truth)|.",
        "",
        "| setting | eps | true dependence | current: inside | below | above | \\|log\\| | "
        "baseline: inside | below | above | \\|log\\| |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        c, b = r["current"], r["baseline"]
        lines.append(
            f"| {r['setting']} | {r['eps']:g} | {r['truth']:.2e} | {c[0]:.2f} | {c[1]:.2f} | "
            f"{c[2]:.2f} | {c[3]:.2f} | {b[0]:.2f} | {b[1]:.2f} | {b[2]:.2f} | {b[3]:.2f} |"
        )
    if rows:
        cur = np.array([r["current"] for r in rows])
        base = np.array([r["baseline"] for r in rows])
        lines += [
            "",
            f"Mean over settings: inside {cur[:, 0].mean():.2f} (baseline "
            f"{base[:, 0].mean():.2f}), median |log| {np.median(cur[:, 3]):.2f} "
            f"(baseline {np.median(base[:, 3]):.2f}).",
        ]
    lines += [
        "",
        "## How unevenly the pairs depend",
        "",
        "Per dataset, over all pairs: *alpha*, the shape of a Gamma law fitted by moments "
        "to each pair's dependence over the mean times its marginal weight (1 / variance; "
        "small: a few pairs hold most of the dependence), and the ratio estimate of d/2 "
        "random pairs (sum of dependences over sum of weights, exact tables, 2,000 draws) "
        "over the true mean: what a perfect pilot of d/2 pairs would see.",
        "",
        "| setting | d | pairs | alpha | ratio estimate / truth: median | 10% | 90% |",
        "|---|---|---|---|---|---|---|",
    ]
    gen = np.random.default_rng(0)
    for label, (d, deps, weights) in shapes.items():
        ratio = deps / (deps.mean() * weights)
        alpha = 1.0 / float(ratio.var()) if ratio.var() > 0 else math.inf
        count = max(1, d // 2)
        est = []
        for _ in range(2000):
            idx = gen.choice(deps.size, count, replace=False)
            est.append(deps[idx].sum() / weights[idx].sum() / deps.mean())
        q = np.quantile(est, [0.5, 0.1, 0.9])
        lines.append(
            f"| {label} | {d} | {deps.size} | {alpha:.2f} | {q[0]:.2f} | {q[1]:.2f} | {q[2]:.2f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
