"""The web console's charts as plain SVG, rendered on the server (no script): a 2-way
marginal as a labelled heatmap, a 1-way marginal as bars with 95% intervals, and the
ingest rate over time as a line. Every label is HTML-escaped (they come from the
collection's schema, i.e. from whoever created it)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from html import escape

import numpy as np

__all__ = ["bars", "heatmap", "heatmap_panels", "rate_line"]

MAX_PANELS = 24  # heatmaps drawn for one marginal of 3+ attributes (the table has every cell)

CELL_W, CELL_H = 96, 44
LABEL_CHARS = 24  # longer labels are cut (the full one is the element's tooltip)
FONT = 'font-family="sans-serif" font-size="12"'


def _label(text: str) -> str:
    cut = text if len(text) <= LABEL_CHARS else text[: LABEL_CHARS - 1] + "\u2026"
    return escape(cut)


def _margin(labels: Sequence[str]) -> int:
    return 16 + 7 * min(LABEL_CHARS, max((len(s) for s in labels), default=1))


def _fill(share: float) -> tuple[str, str]:
    """A cell's colour for ``share`` in [0, 1] (white to dark blue) and its text colour."""
    share = min(max(share, 0.0), 1.0)
    low, high = np.array([247, 251, 255]), np.array([8, 69, 148])
    r, g, b = (low + share * (high - low)).round().astype(int)
    return f"rgb({r},{g},{b})", "#fff" if share > 0.55 else "#111"


def _se_text(se: float) -> str:
    return "\u00b1 n/a" if np.isnan(se) else f"\u00b1 {se:.4f}"


def heatmap(
    values: np.ndarray,
    se: np.ndarray,
    names: tuple[str, str],
    rows: Sequence[str],
    cols: Sequence[str],
    peak: float | None = None,
) -> str:
    """A 2-way marginal: rows are the first attribute's categories, columns the
    second's; each cell shows its fraction and total error (standard error). Colours
    scale to ``peak`` (default: the largest value)."""
    left, top = _margin(rows) + 18, 58
    width = left + CELL_W * len(cols) + 10
    height = top + CELL_H * len(rows) + 10
    if peak is None:
        peak = float(np.nanmax(values)) if values.size else 0.0
    peak = peak if peak > 0 else 1.0
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'role="img" aria-label="heatmap of {escape(names[0])} by {escape(names[1])}" {FONT}>',
        f'<text x="{left}" y="14" font-weight="bold">{escape(names[1])} \u2192</text>',
        f'<text x="12" y="{top + 4}" font-weight="bold" writing-mode="tb">'
        f"{escape(names[0])} \u2192</text>",
    ]
    for j, col in enumerate(cols):
        x = left + CELL_W * j + CELL_W / 2
        out.append(
            f'<text x="{x:.0f}" y="{top - 8}" text-anchor="middle">'
            f"<title>{escape(col)}</title>{_label(col)}</text>"
        )
    for i, row in enumerate(rows):
        y = top + CELL_H * i
        out.append(
            f'<text x="{left - 6}" y="{y + CELL_H / 2 + 4:.0f}" text-anchor="end">'
            f"<title>{escape(row)}</title>{_label(row)}</text>"
        )
        for j, col in enumerate(cols):
            x = left + CELL_W * j
            fill, ink = _fill(float(values[i, j]) / peak)
            tip = f"{row}, {col}: {values[i, j]:.6g} {_se_text(float(se[i, j]))}"
            out.append(
                f'<g class="cell" data-row="{i}" data-col="{j}"><title>{escape(tip)}</title>'
                f'<rect x="{x}" y="{y}" width="{CELL_W}" height="{CELL_H}" fill="{fill}" '
                'stroke="#fff"/>'
                f'<text x="{x + CELL_W / 2:.0f}" y="{y + 19}" text-anchor="middle" '
                f'fill="{ink}">{values[i, j]:.4f}</text>'
                f'<text x="{x + CELL_W / 2:.0f}" y="{y + 35}" text-anchor="middle" '
                f'fill="{ink}" font-size="10">{_se_text(float(se[i, j]))}</text></g>'
            )
    out.append("</svg>")
    return "".join(out)


def heatmap_panels(
    values: np.ndarray, se: np.ndarray, names: Sequence[str], labels: Sequence[Sequence[str]]
) -> str:
    """A marginal of 3+ attributes: one heatmap of the last two attributes per category
    combination of the others (fractions of the whole table, one colour scale), at most
    :data:`MAX_PANELS` of them."""
    lead = values.shape[:-2]
    peak = float(np.nanmax(values)) if values.size else 0.0
    out = []
    for count, index in enumerate(np.ndindex(*lead)):
        if count == MAX_PANELS:
            out.append(
                f'<p class="note">{int(np.prod(lead)) - MAX_PANELS} more panels: see the table.</p>'
            )
            break
        where = ", ".join(f"{names[a]} = {labels[a][i]}" for a, i in enumerate(index))
        chart = heatmap(
            values[index], se[index], (names[-2], names[-1]), labels[-2], labels[-1], peak
        )
        out.append(
            f'<figure class="panel"><figcaption>{escape(where)}</figcaption>{chart}</figure>'
        )
    return "".join(out)


def bars(values: np.ndarray, se: np.ndarray, name: str, labels: Sequence[str]) -> str:
    """A 1-way marginal: one horizontal bar per category with its ~95% interval
    (fraction +- 1.96 total error) as a whisker."""
    left, bar_h, span = _margin(labels) + 6, 26, 360
    top = 28
    ends = values + 1.96 * np.nan_to_num(se)
    peak = max(float(np.nanmax(ends)) if ends.size else 0.0, 1e-12)
    width = left + span + 150
    height = top + bar_h * len(labels) + 12
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'role="img" aria-label="bar chart of {escape(name)}" {FONT}>',
        f'<text x="{left}" y="16" font-weight="bold">{escape(name)}</text>',
    ]
    for i, label in enumerate(labels):
        y = top + bar_h * i
        v, s = float(values[i]), float(se[i])
        w = max(v, 0.0) / peak * span
        out.append(
            f'<g class="bar" data-cell="{i}"><title>{escape(label)}: {v:.6g} '
            f"{_se_text(s)}</title>"
            f'<text x="{left - 6}" y="{y + 17}" text-anchor="end">{_label(label)}</text>'
            f'<rect x="{left}" y="{y + 4}" width="{w:.1f}" height="{bar_h - 8}" fill="#2b6cb0"/>'
        )
        if not np.isnan(s):
            lo = max(v - 1.96 * s, 0.0) / peak * span
            hi = (v + 1.96 * s) / peak * span
            mid = y + bar_h / 2
            out.append(
                f'<line x1="{left + lo:.1f}" x2="{left + hi:.1f}" y1="{mid}" y2="{mid}" '
                'stroke="#111" stroke-width="1.5"/>'
            )
        out.append(f'<text x="{left + span + 8}" y="{y + 17}">{v:.4f} {_se_text(s)}</text></g>')
    out.append("</svg>")
    return "".join(out)


def rate_line(points: Sequence[tuple[float, float]], now: float | None = None) -> str:
    """Reports per second over time (``(unix time, rate)``, oldest first)."""
    width, height, left, bottom = 520, 160, 64, 26
    if len(points) < 1:
        return (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="40" {FONT}>'
            '<text x="4" y="24">no samples yet</text></svg>'
        )
    now = time.time() if now is None else now
    t = np.array([p[0] for p in points])
    r = np.array([p[1] for p in points])
    t0 = min(float(t[0]), now - 60.0)
    peak = max(float(r.max()), 1.0)
    xs = left + (t - t0) / max(now - t0, 1e-9) * (width - left - 10)
    ys = 10 + (1 - r / peak) * (height - bottom - 10)
    line = " ".join(f"{x:.1f},{y:.1f}" for x, y in zip(xs, ys))
    minutes = (now - t0) / 60
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'role="img" aria-label="ingest rate" {FONT}>'
        f'<line x1="{left}" y1="{height - bottom}" x2="{width - 10}" y2="{height - bottom}" '
        'stroke="#999"/>'
        f'<line x1="{left}" y1="10" x2="{left}" y2="{height - bottom}" stroke="#999"/>'
        f'<text x="{left - 4}" y="16" text-anchor="end">{peak:,.0f}/s</text>'
        f'<text x="{left - 4}" y="{height - bottom}" text-anchor="end">0</text>'
        f'<text x="{left}" y="{height - 8}">{minutes:.1f} min ago</text>'
        f'<text x="{width - 10}" y="{height - 8}" text-anchor="end">now</text>'
        f'<polyline points="{line}" fill="none" stroke="#2b6cb0" stroke-width="2"/>'
        "</svg>"
    )
