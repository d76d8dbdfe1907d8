"""Timing side channel of one-at-a-time perturbation: can the time a report takes
tell what was reported?

    python benchmarks/timing_channel.py [--samples 40000] [--reps 5]

An observer who sees when a report is made and how long it took (a co-resident
process, a network peer timing the request) learns from the time as much as a
distinguisher can separate two classes of calls. For each case this measures
``time.perf_counter_ns`` around single calls, in random interleaved order (OS
entropy, as on a device), and prints the Mann-Whitney AUC of the two classes'
times, folded to ``max(AUC, 1 - AUC)`` (0.5: nothing to learn; 1: perfect):

- GRR kept vs flipped (the true cell reported or not), and true cell 0 vs L-1 (the
  wrap step of the old code);
- OUE true bit kept (1) vs dropped (0), and true cell 0 vs L-1;
- ``make_report`` on a GRR view, kept vs flipped.

Baseline: the branching one-report code calmkit shipped before (GRR returned early
when the cell was kept and wrapped with a test; OUE drew extra words on top-byte
ties), reimplemented here. Target: AUC <= 0.55 for the current code. Medians and
maxima over ``--reps`` repetitions, same cases for both. The garbage collector is
paused while timing so that the numbers show the code, not the collector.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
from scipy.stats import mannwhitneyu

from calmkit_client import GRR, OUE, Plan, Schema, make_report
from calmkit_client.oracles import _bernoulli
from calmkit_client.randomness import as_random_source, random_byte_array, random_word

EPSILON = 1.0
TARGET = 0.55


# -- the baseline: the branching one-report code --------------------------------------------
def branching_grr(self: GRR, cell: int, rng: Any = None) -> int:
    v = self._cell(cell)
    w = random_word(as_random_source(rng))
    if w < self._words_keep:
        return v
    y = v + 1 + (w - self._words_keep) // self._words_other
    return y - self.L if y >= self.L else y


def branching_oue(self: OUE, cell: int, rng: Any = None) -> bytes:
    v, L = self._cell(cell), self.L
    src = as_random_source(rng)
    head = random_byte_array(src, L + 1)
    bits = _bernoulli(head[:L], src, self._t_flip)
    bits[v] = head[L] < 128
    return np.packbits(bits).tobytes()


@contextmanager
def code(version: str) -> Iterator[None]:
    """Run the block with the current one-report code or the branching baseline."""
    saved = GRR.perturb_one, OUE.perturb_one
    if version == "baseline":
        GRR.perturb_one, OUE.perturb_one = branching_grr, branching_oue  # type: ignore[method-assign]
    try:
        yield
    finally:
        GRR.perturb_one, OUE.perturb_one = saved  # type: ignore[method-assign]


# -- measurement ------------------------------------------------------------------------------
def timed_calls(
    call: Callable[[int], Any], inputs: np.ndarray, label: Callable[[int, Any], int]
) -> tuple[np.ndarray, np.ndarray]:
    """(times ns, labels) of ``call(x)`` for each x in ``inputs`` (in that order)."""
    times = np.empty(inputs.size, dtype=np.int64)
    labels = np.empty(inputs.size, dtype=np.int8)
    clock = time.perf_counter_ns
    for _ in range(200):  # warm caches and branch predictors on both classes
        call(int(inputs[_ % inputs.size]))
    gc.disable()
    try:
        for i, x in enumerate(inputs.tolist()):
            t0 = clock()
            out = call(x)
            times[i] = clock() - t0
            labels[i] = label(x, out)
    finally:
        gc.enable()
    return times, labels


def auc(times: np.ndarray, labels: np.ndarray) -> float:
    """max(AUC, 1 - AUC) of the times of label 1 against label 0."""
    a, b = times[labels == 1], times[labels == 0]
    if a.size == 0 or b.size == 0:
        return float("nan")
    u = mannwhitneyu(a, b).statistic / (a.size * b.size)
    return max(u, 1 - u)


def cases(samples: int, rng: np.random.Generator) -> list[tuple[str, Callable[[], float]]]:
    grr, oue = GRR(EPSILON, 4), OUE(EPSILON, 64)
    bits = 3
    schema = Schema.from_sizes([2] * bits)
    plan = Plan(schema, EPSILON, [list(range(bits))], oracles=["GRR"])
    record = ["1"] * bits
    record_cell = int(sum(2 ** (bits - 1 - i) for i in range(bits)))

    def grr_kept() -> float:
        cells = rng.integers(0, grr.L, samples)
        return auc(*timed_calls(grr.perturb_one, cells, lambda x, y: int(y == x)))

    def grr_values() -> float:
        cells = rng.choice([0, grr.L - 1], samples)
        return auc(*timed_calls(grr.perturb_one, cells, lambda x, y: int(x == 0)))

    def oue_bit() -> float:
        cells = rng.integers(0, oue.L, samples)

        def kept(x: int, y: bytes) -> int:
            return (y[x // 8] >> (7 - x % 8)) & 1

        return auc(*timed_calls(oue.perturb_one, cells, kept))

    def oue_values() -> float:
        cells = rng.choice([0, oue.L - 1], samples)
        return auc(*timed_calls(oue.perturb_one, cells, lambda x, y: int(x == 0)))

    def report_kept() -> float:
        users = rng.integers(0, 2**62, samples)
        return auc(
            *timed_calls(
                lambda u: make_report(plan, record, u),
                users,
                lambda u, r: int(r.payload == record_cell),
            )
        )

    return [
        (f"GRR L={grr.L} kept vs flipped", grr_kept),
        (f"GRR L={grr.L} cell 0 vs {grr.L - 1}", grr_values),
        (f"OUE L={oue.L} true bit 1 vs 0", oue_bit),
        (f"OUE L={oue.L} cell 0 vs {oue.L - 1}", oue_values),
        (f"make_report GRR L={2**bits} kept vs flipped", report_kept),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=40_000, help="calls per case and rep")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)  # picks inputs only; reports draw from the OS
    names = [name for name, _ in cases(1, rng)]
    results: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.reps):
        for version in ("baseline", "current"):  # same cases, alternating
            with code(version):
                for name, run in cases(args.samples, rng):
                    results.setdefault((name, version), []).append(run())
    print(
        f"timing distinguisher AUC, {args.samples} calls per case, {args.reps} reps, "
        f"eps={EPSILON}; median (max) over reps; target <= {TARGET}"
    )
    print(f"| case | baseline (branching) | current | current <= {TARGET} |")
    print("|---|---|---|---|")
    for name in names:
        base, cur = results[(name, "baseline")], results[(name, "current")]
        ok = "yes" if max(cur) <= TARGET else "NO"
        print(
            f"| {name} | {statistics.median(base):.3f} ({max(base):.3f}) | "
            f"{statistics.median(cur):.3f} ({max(cur):.3f}) | {ok} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
