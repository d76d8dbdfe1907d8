"""The paper's evaluation figures as task grids (CALM, CCS 2018, §5).

Each figure is a list of :class:`Panel` s; a panel is a set of :class:`Point` s (a
series label, an x value, a row value for heatmaps, and the :class:`~.tasks.Task`).
``quick=True`` gives a reduced grid of the same shape (a few settings, small n, 2
repetitions) that runs in seconds: the smoke test and a first look.

Where the paper's POS dataset is used we use FIMI retail (the datasets README), and
the Kosarak prefix resampled with replacement to n users; the US census extract is
replaced by the binarized ACS extract (binary already, so "capped at 3" changes nothing
there and BE equals CALM on it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from calmkit_client import CalmkitError

from .paper_values import PAPER_VALUES
from .tasks import Task

__all__ = ["FIGURES", "Figure", "Panel", "Point", "build_figure"]

EPSILONS = tuple(round(0.2 * i, 1) for i in range(1, 11))  # 0.2, 0.4, ..., 2.0
QUICK_EPSILONS = (0.5, 2.0)
QUICK_N = 1 << 13
LABELS = {
    "kosarak": "Kosarak",
    "retail": "retail (POS stand-in)",
    "adult": "Adult",
    "acs": "ACS (US stand-in)",
    "synthetic": "synthetic",
    "nltcs": "NLTCS",
}


@dataclass(frozen=True)
class Point:
    series: str
    x: Any
    task: Task
    row: Any = None  # heatmaps: the row value (m or epsilon)


@dataclass(frozen=True)
class Panel:
    label: str
    title: str
    kind: str  # "lines" | "heatmap" | "classify"
    xlabel: str
    points: tuple[Point, ...]
    ylabel: str = "SSE"
    rowlabel: str = ""
    # (series, x) or (row, x) -> the paper's printed value
    paper: dict[tuple[Any, Any], float] = field(default_factory=dict)
    # rows "series / best of others" per x (e.g. CALM against the central ones)
    ratios: tuple[tuple[str, tuple[str, ...]], ...] = ()


@dataclass(frozen=True)
class Figure:
    name: str
    title: str
    panels: tuple[Panel, ...]
    notes: tuple[str, ...] = ()

    def tasks(self) -> list[Task]:
        return [p.task for panel in self.panels for p in panel.points]


@dataclass(frozen=True)
class _Opts:
    quick: bool
    seed: int
    reps: int | None
    queries: int
    n: int | None  # only panels with this n (None: all)
    dataset: str | None  # run every panel on this dataset instead

    def reps_or(self, default: int) -> int:
        return self.reps if self.reps is not None else (2 if self.quick else default)

    def size(self, n: int) -> int:
        return min(n, QUICK_N) if self.quick else n

    def eps(self) -> tuple[float, ...]:
        return QUICK_EPSILONS if self.quick else EPSILONS

    def data(self, dataset: str) -> str:
        return self.dataset or dataset


def _label(o: _Opts, dataset: str) -> str:
    return LABELS.get(o.data(dataset), o.data(dataset))


def _n(o: _Opts, n: int) -> str:
    size = o.size(n)
    return f"n = 2^{size.bit_length() - 1}" if size & (size - 1) == 0 else f"n = {size}"


def _task(
    o: _Opts,
    dataset: str,
    mechanism: str,
    eps: float,
    k: int,
    query_k: int | None = None,
    d: int | None = None,
    n: int | None = None,
    max_categories: int | None = None,
    options: Sequence[tuple[str, Any]] = (),
    reps: int = 20,
) -> Task:
    return Task(
        dataset=o.data(dataset),
        mechanism=mechanism,
        epsilon=float(eps),
        k=k,
        query_k=k if query_k is None else query_k,
        d=d,
        n=None if n is None else o.size(n),
        max_categories=max_categories,
        options=tuple(options),
        reps=o.reps_or(reps),
        queries=min(o.queries, 10) if o.quick else o.queries,
        seed=o.seed,
    )


def _comparison(
    o: _Opts,
    fig: str,
    dataset: str,
    label: str,
    n: int,
    d: int,
    k: int,
    mechanisms: Sequence[str],
    max_categories: int | None = None,
) -> Panel:
    from .mechanisms import make_mechanism

    points = []
    for mech in mechanisms:
        name = make_mechanism(mech).name
        for eps in o.eps():
            t = _task(o, dataset, mech, eps, k, d=d, n=n, max_categories=max_categories)
            points.append(Point(name, eps, t))
    title = f"{_label(o, dataset)}, {_n(o, n)}, d = {d}, k = {k}"
    return Panel(
        label, title, "lines", "epsilon", tuple(points), paper=PAPER_VALUES.get((fig, label), {})
    )


# -- Fig. 4: binary datasets ----------------------------------------------------------
FIG4_SETTINGS = (
    (1 << 16, 8, 3),
    (1 << 16, 16, 3),
    (1 << 16, 32, 3),
    (1 << 18, 16, 6),
    (1 << 18, 32, 6),
    (1 << 18, 32, 8),
)


def _fig4(o: _Opts) -> Figure:
    panels = []
    for offset, dataset in ((0, "kosarak"), (6, "retail")):
        for i, (n, d, k) in enumerate(FIG4_SETTINGS):
            if (o.quick and i > 0) or (o.n is not None and n != o.n):
                continue
            mechs = ["calm", "fc", "am", "ft", *(["em"] if k == 3 else []), "uni"]
            label = "abcdefghijkl"[offset + i]
            panels.append(_comparison(o, "fig4", dataset, label, n, d, k, mechs))
    notes = ("EM only at k = 3, as in the paper (its k = 6, 8 runs took 20 minutes a query).",)
    return Figure("fig4", "Fig. 4: binary datasets", tuple(panels), notes)


# -- Fig. 5: non-binary datasets, capped at 3 categories --------------------------------
def _fig5(o: _Opts) -> Figure:
    panels = []
    settings = (
        ("adult", "abc", ((8, 3), (15, 3), (15, 6))),
        ("acs", "def", ((8, 3), (16, 3), (16, 6))),
    )
    for dataset, labels, dks in settings:
        for i, (label, (d, k)) in enumerate(zip(labels, dks)):
            if o.quick and i > 0:
                continue
            mechs = ["calm", "fc", "am", "ft", "be", "uni"]
            panels.append(_comparison(o, "fig5", dataset, label, 1 << 16, d, k, mechs, 3))
    notes = (
        "Attributes capped at 3 categories (Population.cap_categories), n = 2^16 resampled.",
        "ACS is the binarized PrivBayes extract: binary already, so BE coincides with CALM.",
    )
    return Figure("fig5", "Fig. 5: non-binary datasets", tuple(panels), notes)


# -- Fig. 6: classification -----------------------------------------------------------
FIG6_SETTINGS = (("adult-binary", "adult", 2), ("adult", "adult", 3), ("acs", "acs", None))


def _fig6(o: _Opts) -> Figure:
    from .mechanisms import make_mechanism

    panels = []
    letters = iter("abcdefghi")
    for setting, dataset, cap in FIG6_SETTINGS:
        for dup in (1, 4, 16):
            label = next(letters)
            if o.quick and (setting != "adult" or dup != 1):
                continue
            points = []
            for mech in ("calm", "fc", "am", "ft"):
                for eps in o.eps():
                    t = Task(
                        dataset=dataset,
                        mechanism=mech,
                        epsilon=eps,
                        k=6,
                        query_k=6,
                        max_categories=cap,
                        reps=o.reps_or(5),
                        queries=0,
                        seed=o.seed,
                        kind="classify",
                        classify=setting,
                        duplicate=dup,
                    )
                    points.append(Point(make_mechanism(mech).name, eps, t))
            title = f"{setting}, training records x{dup}"
            panels.append(
                Panel(
                    label,
                    title,
                    "classify",
                    "epsilon",
                    tuple(points),
                    ylabel="misclassification rate",
                )
            )
    notes = (
        "Linear SVM on records sampled from each mechanism's 6-way marginal (5 features + "
        "label); 80/20 split, the same records for every mechanism in each repetition; "
        "NoNoise trains on the real training records, Majority predicts the training "
        "majority label.",
        "Each mechanism collects only the six attributes (so FC holds 2^6 or 3^6 cells); "
        "Adult uses the paper's features; ACS columns are unnamed, so its label is the most "
        "balanced column and its features the five with the highest mutual information "
        "(see `calmkit_simulator.classify`). With x4/x16 the training records are repeated, "
        "so each real person's guarantee is 4 or 16 epsilon, as in the paper's duplication.",
        "Adult capped at 2 categories leaves no cell with P(income > 50K) above 1/2: "
        "NoNoise equals Majority there, so that row cannot separate the methods.",
    )
    return Figure("fig6", "Fig. 6: classification", tuple(panels), notes)


# -- Fig. 7: heatmaps of l x m and l x epsilon (CALM with fixed m, l) ---------------------
def _fig7_panel(
    o: _Opts,
    label: str,
    dataset: str,
    d: int,
    rows: Sequence[tuple[Any, float, int]],
    rowlabel: str,
    title: str,
) -> Panel:
    """One heatmap: CALM with fixed (l, m) at each (row, l); ``rows`` holds
    ``(row value, epsilon, m)``."""
    ls = (1, 2, 3) if o.quick else tuple(range(1, 9))
    points = tuple(
        Point(
            "CALM",
            l_,
            _task(o, dataset, "calm", eps, 3, d=d, n=1 << 16, options=(("l", l_), ("m", m))),
            row=row,
        )
        for row, eps, m in rows
        for l_ in ls
    )
    return Panel(
        label,
        f"{_label(o, dataset)}: {title}",
        "heatmap",
        "view size l",
        points,
        rowlabel=rowlabel,
        paper=PAPER_VALUES.get(("fig7", label), {}),
    )


def _fig7(o: _Opts) -> Figure:
    panels = []
    ms = (4, 8) if o.quick else tuple(range(31, 0, -2))
    for offset, dataset in ((0, "retail"), (3, "kosarak")):
        if o.quick and dataset == "retail":
            continue
        by_m = [(m, 0.6, m) for m in ms]
        panels.append(
            _fig7_panel(
                o, "abcdef"[offset], dataset, 8, by_m, "m", "l vs m, d = 8, k = 3, eps = 0.6"
            )
        )
        for j, d in enumerate((8, 16)):
            if o.quick and d == 16:
                continue
            by_eps = [(eps, eps, 16) for eps in o.eps()]
            panels.append(
                _fig7_panel(
                    o,
                    "abcdef"[offset + 1 + j],
                    dataset,
                    d,
                    by_eps,
                    "epsilon",
                    f"l vs eps, d = {d}, k = 3, m = 16",
                )
            )
    notes = (
        "CALM with m and l fixed (Algorithm 1 bypassed). `invalid` cells ask for more views "
        "than there are distinct l-subsets (m > C(d, l), e.g. l = 1 or l >= 7 at d = 8): "
        "calmkit's plans hold distinct views, while the paper repeats views there.",
        "Paper values (in italics) are read from the PDF's heatmaps; rows m <= 7 of (a) and "
        "(d) lost cells in the text extraction and are not shown.",
    )
    return Figure(
        "fig7", "Fig. 7: view size l, number of views m and epsilon", tuple(panels), notes
    )


# -- Fig. 8: planning for k' != k, and PriView; Fig. 9: k-way error for k' = 3 vs k' = k ---
FIG8_SETTINGS = (("a", 1 << 16, 16, 3), ("b", 1 << 18, 16, 6), ("c", 1 << 18, 32, 8))


def _fig8(o: _Opts) -> Figure:
    panels = []
    for i, (label, n, d, k) in enumerate(FIG8_SETTINGS):
        if o.quick and i > 0:
            continue
        k_primes = (3, 6) if o.quick else (3, 6, 8)
        points = [
            Point(f"k'={kp}", eps, _task(o, "kosarak", "calm", eps, kp, query_k=k, d=d, n=n))
            for kp in k_primes
            for eps in o.eps()
        ]
        points += [
            Point("PriView", eps, _task(o, "kosarak", "priview", eps, k, d=d, n=n))
            for eps in o.eps()
        ]
        title = f"{_label(o, 'kosarak')}, {_n(o, n)}, d = {d}, k = {k}: vary epsilon"
        panels.append(Panel(label, title, "lines", "epsilon", tuple(points)))
    for i, (_, n, d, k) in enumerate(FIG8_SETTINGS):
        if o.quick and i > 0:
            continue
        row2 = "def"[i]
        eps_set = (0.5, 2.0) if o.quick else (0.5, 1.0, 1.5, 2.0)
        kps = (2, 4) if o.quick else tuple(range(2, 17))
        points = [
            Point(f"eps={eps}", kp, _task(o, "kosarak", "calm", eps, kp, query_k=k, d=d, n=n))
            for eps in eps_set
            for kp in kps
            if kp <= d
        ]
        title = f"{_label(o, 'kosarak')}, {_n(o, n)}, d = {d}, k = {k}: vary k'"
        panels.append(Panel(row2, title, "lines", "k' (planned for)", tuple(points)))
    notes = (
        "CALM plans m and l for k' (Algorithm 1) and answers k-way queries; PriView "
        "is the central reference (Laplace(m/eps) on views planned for k).",
    )
    return Figure("fig8", "Fig. 8: planning for k' and the central PriView", tuple(panels), notes)


def _fig9(o: _Opts) -> Figure:
    n, d = 1 << 18, 16
    ks = (2, 3) if o.quick else tuple(range(1, 11))
    eps_set = (0.5, 2.0) if o.quick else (0.5, 1.0, 1.5, 2.0)
    points = []
    for eps in eps_set:
        for k in ks:
            points.append(
                Point(
                    f"eps={eps}, k'=3", k, _task(o, "kosarak", "calm", eps, 3, query_k=k, d=d, n=n)
                )
            )
            points.append(
                Point(f"eps={eps}, k'=k", k, _task(o, "kosarak", "calm", eps, k, d=d, n=n))
            )
    title = f"{_label(o, 'kosarak')}, {_n(o, n)}, d = {d}"
    panel = Panel("a", title, "lines", "k (query size)", tuple(points))
    return Figure("fig9", "Fig. 9: k-way marginals planned for k' = 3 or k' = k", (panel,))


# -- local vs central DP --------------------------------------------------------------
CENTRAL_MECHANISMS = ("calm", "priview", "mwem", "datacube", "wff", "uni")


def _central(o: _Opts) -> Figure:
    from .mechanisms import make_mechanism

    panels = []
    letters = iter("abcdefgh")
    for n in (None, 1 << 16):
        for dataset, d, cap in (("nltcs", None, None), ("adult", 8, 3)):
            for k in (2, 3):
                label = next(letters)
                if o.quick and (n is not None or k != 2):
                    continue
                points = []
                names = []
                for mech in CENTRAL_MECHANISMS:
                    # the datacube's Fourier strategy is for binary attributes
                    opts = (("strategy", "marginals"),) if mech == "datacube" and cap else ()
                    name = make_mechanism(mech, **dict(opts)).name
                    names.append(name)
                    for eps in o.eps():
                        t = _task(
                            o, dataset, mech, eps, k, d=d, n=n, max_categories=cap, options=opts
                        )
                        if o.quick and n is None:
                            t = replace(t, n=QUICK_N)
                        points.append(Point(name, eps, t))
                size = "all records" if n is None and not o.quick else _n(o, n or QUICK_N)
                cat = f", capped at {cap}, d = {d}" if cap else ""
                title = f"{_label(o, dataset)}{cat}, {size}, k = {k}"
                central = tuple(x for x in names if x not in ("CALM", "Uni"))
                pure = tuple(x for x in central if x != "WFF")  # WFF is (eps, delta)-DP
                panels.append(
                    Panel(
                        label,
                        title,
                        "lines",
                        "epsilon",
                        tuple(points),
                        ratios=(("CALM", central), ("CALM", pure)),
                    )
                )
    notes = (
        "CALM is epsilon-LDP (each user's record, on the device); PriView, MWEM, the "
        "datacube allocation and WFF are central DP (a trusted curator holds every "
        "record); WFF is (epsilon, delta)-DP through mu-GDP. The CSV's `privacy_unit` "
        "column states each exactly.",
        "Adult: the first 8 attributes capped at 3 categories, so MWEM can hold the "
        "full domain (3^8 cells).",
    )
    return Figure(
        "central", "Local vs central DP: CALM against central references", tuple(panels), notes
    )


FIGURES = {
    "fig4": _fig4,
    "fig5": _fig5,
    "fig6": _fig6,
    "fig7": _fig7,
    "fig8": _fig8,
    "fig9": _fig9,
    "central": _central,
}


def build_figure(
    name: str,
    quick: bool = False,
    seed: int = 0,
    reps: int | None = None,
    queries: int = 50,
    n: int | None = None,
    dataset: str | None = None,
) -> Figure:
    """The grid of figure ``name`` (see :data:`FIGURES`)."""
    if name not in FIGURES:
        raise CalmkitError(f"figure ({name!r}) must be one of {sorted(FIGURES)}")
    if reps is not None and (isinstance(reps, bool) or reps < 1):
        raise CalmkitError(f"reps ({reps!r}) must be an int >= 1")
    if isinstance(queries, bool) or queries < 1:
        raise CalmkitError(f"queries ({queries!r}) must be an int >= 1")
    return FIGURES[name](_Opts(quick, seed, reps, queries, n, dataset))
