"""PNG plots of a figure's results (matplotlib, Agg backend; the ``figures`` extra).

Lines: mean over repetitions with one standard deviation as error bars, log y for
SSE; a series that is not scalable in a panel is named in the panel instead of drawn
(the paper: "we only plot the methods that are scalable in each setting"). Heatmaps:
the mean SSE per cell, printed in the cell. Classification: misclassification rate
per mechanism, NoNoise and Majority dashed.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from calmkit_client import CalmkitError

from .figures import Figure, Panel

__all__ = ["plot_figure", "pyplot"]


def pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise CalmkitError('plots need matplotlib: pip install "calmkit[figures]"') from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_figure(figure: Figure, results: dict[str, dict[str, Any]], path: Path | str) -> Path:
    """Draw every panel of ``figure`` into one PNG at ``path``; returns the path."""
    plt = pyplot()
    panels = figure.panels
    cols = min(3, len(panels)) or 1
    rows = math.ceil(len(panels) / cols) or 1
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 4.0 * rows), squeeze=False)
    # one colour per series across the figure, so a skipped series shifts nothing
    names = list(dict.fromkeys(p.series for panel in panels for p in panel.points))
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colors = {name: cycle[i % len(cycle)] for i, name in enumerate(names)}
    for ax, panel in zip(axes.flat, panels):
        {"lines": _lines, "heatmap": _heatmap, "classify": _classify}[panel.kind](
            ax, panel, results, colors
        )
        ax.set_title(f"({panel.label}) {panel.title}", fontsize=9)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    height = 4.0 * rows
    fig.suptitle(figure.title, y=1 - 0.1 / height)
    handles: dict[str, Any] = {}  # one legend for the figure, above the panels
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    if handles:
        fig.legend(
            list(handles.values()),
            list(handles),
            loc="upper center",
            fontsize=8,
            ncol=min(8, len(handles)),
            bbox_to_anchor=(0.5, 1 - 0.35 / height),
            frameon=False,
        )
    units = _privacy_units(figure, results)
    bottom = 0.0
    if len(set(units.values())) > 1:  # say what epsilon protects for each mechanism
        footer = "\n".join(f"{name}: {unit}" for name, unit in units.items())
        fig.text(0.01, 0.005, footer, fontsize=7, va="bottom")
        bottom = (0.13 * len(units) + 0.1) / height
    top = 1 - (0.5 + 0.2 * math.ceil(len(handles) / 8)) / height
    fig.tight_layout(rect=(0, bottom, 1, top))
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _privacy_units(figure: Figure, results: dict[str, dict[str, Any]]) -> dict[str, str]:
    units: dict[str, str] = {}
    for panel in figure.panels:
        for p in panel.points:
            res = results.get(p.task.key()) or {}
            if res.get("privacy_unit") and res.get("mechanism") != "Uni":  # Uni uses no data
                units.setdefault(str(res.get("mechanism", p.series)), res["privacy_unit"])
    return units


def _series(panel: Panel, results: dict[str, dict[str, Any]], metric: str) -> dict[str, Any]:
    """series -> (xs, means, sds, status messages)."""
    out: dict[str, Any] = {}
    for p in panel.points:
        res = results.get(p.task.key())
        entry = out.setdefault(p.series, {"x": [], "mean": [], "sd": [], "status": set()})
        if res is None:
            continue
        if res["status"] != "ok":
            entry["status"].add(res["status"])
            continue
        vals = np.asarray(res[metric], dtype=float)
        entry["x"].append(p.x)
        entry["mean"].append(vals.mean())
        entry["sd"].append(vals.std(ddof=1) if vals.size > 1 else 0.0)
    return out


def _draw(
    ax: Any, name: str, s: dict[str, Any], colors: dict[str, str], skipped: list[str]
) -> None:
    """One series as points with error bars; a series without points is noted in
    ``skipped`` (with why, if known) instead."""
    if not s["x"]:
        if s["status"]:
            skipped.append(f"{name}: {'/'.join(sorted(s['status'])).replace('_', ' ')}")
        return
    ax.errorbar(
        s["x"],
        s["mean"],
        yerr=s["sd"],
        marker="o",
        ms=3,
        capsize=2,
        label=name,
        color=colors.get(name),
    )


def _lines(
    ax: Any, panel: Panel, results: dict[str, dict[str, Any]], colors: dict[str, str]
) -> None:
    skipped: list[str] = []
    for name, s in _series(panel, results, "sse").items():
        _draw(ax, name, s, colors, skipped)
    for (series, x), value in panel.paper.items():
        ax.scatter([x], [value], marker="*", s=80, color="black", zorder=5)
        ax.annotate(
            f"paper {series}", (x, value), fontsize=7, xytext=(4, 4), textcoords="offset points"
        )
    ax.set_yscale("log")
    ax.set_xlabel(panel.xlabel)
    ax.set_ylabel(panel.ylabel)
    ax.grid(True, which="both", alpha=0.3)
    if skipped:
        ax.text(
            0.98,
            0.98,
            "\n".join(skipped),
            transform=ax.transAxes,
            fontsize=7,
            va="top",
            ha="right",
            bbox={"facecolor": "white", "alpha": 0.8},
        )


def _classify(
    ax: Any, panel: Panel, results: dict[str, dict[str, Any]], colors: dict[str, str]
) -> None:
    skipped: list[str] = []
    nonoise, majority = [], []
    for name, s in _series(panel, results, "error").items():
        _draw(ax, name, s, colors, skipped)
    for p in panel.points:
        res = results.get(p.task.key())
        if res and res["status"] == "ok":
            nonoise += res["nonoise"]
            majority += res["majority"]
    if nonoise:
        ax.axhline(float(np.mean(nonoise)), ls="--", color="green", label="NoNoise")
        ax.axhline(float(np.mean(majority)), ls="--", color="gray", label="Majority")
    ax.set_xlabel(panel.xlabel)
    ax.set_ylabel(panel.ylabel)
    ax.grid(True, alpha=0.3)
    if skipped:
        ax.text(
            0.98,
            0.98,
            "\n".join(skipped),
            transform=ax.transAxes,
            fontsize=7,
            va="top",
            ha="right",
            bbox={"facecolor": "white", "alpha": 0.8},
        )


def _heatmap(
    ax: Any, panel: Panel, results: dict[str, dict[str, Any]], colors: dict[str, str]
) -> None:
    xs = sorted({p.x for p in panel.points})
    rows = list(dict.fromkeys(p.row for p in panel.points))
    grid = np.full((len(rows), len(xs)), np.nan)
    for p in panel.points:
        res = results.get(p.task.key())
        if res and res["status"] == "ok":
            grid[rows.index(p.row), xs.index(p.x)] = float(np.mean(res["sse"]))
    from matplotlib.colors import LogNorm

    masked = np.ma.masked_invalid(grid)
    positive = grid[np.isfinite(grid) & (grid > 0)]
    norm = (
        LogNorm(positive.min(), positive.max()) if positive.size > 1 else None
    )  # SSE spans decades
    im = ax.imshow(masked, aspect="auto", cmap="viridis_r", norm=norm)
    for (i, j), v in np.ndenumerate(grid):
        if np.isfinite(v):
            ax.text(j, i, f"{v:.4f}", ha="center", va="center", fontsize=5, color="white")
    ax.set_xticks(range(len(xs)), [str(x) for x in xs])
    ax.set_yticks(range(len(rows)), [str(r) for r in rows])
    ax.set_xlabel(panel.xlabel)
    ax.set_ylabel(panel.rowlabel)
    ax.figure.colorbar(im, ax=ax, fraction=0.046)
