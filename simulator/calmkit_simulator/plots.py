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

__all__ = ["plot_figure"]


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise CalmkitError('plots need matplotlib: pip install "calmkit[figures]"') from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_figure(figure: Figure, results: dict[str, dict[str, Any]], path: Path | str) -> Path:
    """Draw every panel of ``figure`` into one PNG at ``path``; returns the path."""
    plt = _pyplot()
    panels = figure.panels
    cols = min(3, len(panels)) or 1
    rows = math.ceil(len(panels) / cols) or 1
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 4.0 * rows), squeeze=False)
    for ax, panel in zip(axes.flat, panels):
        {"lines": _lines, "heatmap": _heatmap, "classify": _classify}[panel.kind](
            ax, panel, results
        )
        ax.set_title(f"({panel.label}) {panel.title}", fontsize=9)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    fig.suptitle(figure.title)
    units = _privacy_units(figure, results)
    if len(set(units.values())) > 1:  # say what epsilon protects for each mechanism
        footer = "\n".join(f"{name}: {unit}" for name, unit in units.items())
        fig.text(0.01, 0.005, footer, fontsize=7, va="bottom")
        fig.tight_layout(rect=(0, 0.03 * (len(units) + 1) / rows, 1, 1))
    else:
        fig.tight_layout()
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
            if res.get("privacy_unit"):
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


def _lines(ax: Any, panel: Panel, results: dict[str, dict[str, Any]]) -> None:
    skipped = []
    for name, s in _series(panel, results, "sse").items():
        if not s["x"]:
            if s["status"]:
                skipped.append(f"{name}: {'/'.join(sorted(s['status'])).replace('_', ' ')}")
            continue
        ax.errorbar(s["x"], s["mean"], yerr=s["sd"], marker="o", ms=3, capsize=2, label=name)
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
        ax.text(0.02, 0.02, "\n".join(skipped), transform=ax.transAxes, fontsize=7, va="bottom")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def _classify(ax: Any, panel: Panel, results: dict[str, dict[str, Any]]) -> None:
    skipped, nonoise, majority = [], [], []
    for name, s in _series(panel, results, "error").items():
        if not s["x"]:
            if s["status"]:
                skipped.append(f"{name}: {'/'.join(sorted(s['status'])).replace('_', ' ')}")
            continue
        ax.errorbar(s["x"], s["mean"], yerr=s["sd"], marker="o", ms=3, capsize=2, label=name)
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
        ax.text(0.02, 0.02, "\n".join(skipped), transform=ax.transAxes, fontsize=7, va="bottom")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def _heatmap(ax: Any, panel: Panel, results: dict[str, dict[str, Any]]) -> None:
    xs = sorted({p.x for p in panel.points})
    rows = list(dict.fromkeys(p.row for p in panel.points))
    grid = np.full((len(rows), len(xs)), np.nan)
    for p in panel.points:
        res = results.get(p.task.key())
        if res and res["status"] == "ok":
            grid[rows.index(p.row), xs.index(p.x)] = float(np.mean(res["sse"]))
    masked = np.ma.masked_invalid(grid)
    im = ax.imshow(masked, aspect="auto", cmap="viridis_r")
    for (i, j), v in np.ndenumerate(grid):
        if np.isfinite(v):
            ax.text(j, i, f"{v:.4f}", ha="center", va="center", fontsize=5, color="white")
    ax.set_xticks(range(len(xs)), [str(x) for x in xs])
    ax.set_yticks(range(len(rows)), [str(r) for r in rows])
    ax.set_xlabel(panel.xlabel)
    ax.set_ylabel(panel.rowlabel)
    ax.figure.colorbar(im, ax=ax, fraction=0.046)
