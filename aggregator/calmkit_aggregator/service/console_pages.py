"""The web console's pages as HTML text: login, the collections, one collection (its
progress, reports per view, ingest rate, flags and a marginal chosen from its schema).
No script anywhere; every value that comes from a schema, a collection id or a flag is
HTML-escaped here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from urllib.parse import quote, urlencode

import numpy as np

from calmkit_client.wire import CollectionInfo, MarginalAnswer

from .answer_format import unresolved_note
from .console_svg import bars, heatmap, heatmap_panels, rate_line

__all__ = [
    "CSS",
    "Row",
    "collection_page",
    "collections_page",
    "error_page",
    "login_page",
    "marginal_section",
    "uniform_error",
]

CSS = b"""
body{font-family:sans-serif;margin:0;color:#111;background:#fafafa}
header{background:#1a365d;color:#fff;padding:8px 16px;display:flex;gap:16px;align-items:center}
header a{color:#fff} header form{margin-left:auto}
main{padding:16px;max-width:1200px}
table{border-collapse:collapse;margin:8px 0} td,th{border:1px solid #ccc;padding:3px 8px}
th{background:#edf2f7;text-align:left} td.n{text-align:right;font-variant-numeric:tabular-nums}
progress{width:160px} .flag{color:#9b2c2c;font-weight:bold} .error{color:#9b2c2c}
.note{color:#555;font-size:90%} fieldset{display:inline-block;margin:4px 0}
.box{background:#fff;border:1px solid #ddd;padding:8px 12px;margin:12px 0}
figure.panel{display:inline-block;margin:4px 16px 4px 0} figcaption{font-weight:bold}
"""


@dataclass(frozen=True)
class Row:
    """A collection as the console shows it: what ``GetCollection`` answers, the
    number of users expected (None when not stored) and its ingest-rate samples."""

    info: CollectionInfo
    expected: int | None
    rates: Sequence[tuple[float, float]]


def _page(title: str, body: str, logout: bool = True) -> bytes:
    out = (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<title>{escape(title)} \u2014 calmkit</title>"
        '<link rel=stylesheet href="/console.css"></head><body><header>'
        '<strong>calmkit console</strong><a href="/">collections</a>'
        + (
            '<form method=post action="/logout"><button type=submit>log out</button></form>'
            if logout
            else ""
        )
        + f"</header><main><h1>{escape(title)}</h1>{body}</main></body></html>"
    )
    return out.encode("utf-8")


def error_page(message: str) -> bytes:
    body = f'<p class="error" id=error>{escape(message)}</p><p><a href="/">collections</a></p>'
    return _page("not found", body)


def login_page(error: str = "") -> bytes:
    shown = f'<p class="error" id="login-error">{escape(error)}</p>' if error else ""
    form = (
        f"{shown}<form method=post action=/login autocomplete=off>"
        "<label>admin token <input type=password name=token id=token "
        "autocomplete=current-password required></label> "
        "<button type=submit id=login>log in</button></form>"
        '<p class="note">The admin token of <code>calmkit serve --token-file</code>. It is '
        "sent once, in this form's body; the console then keeps a session cookie.</p>"
    )
    return _page("log in", form, logout=False)


def _link(collection_id: str) -> str:
    return f"/collections/{quote(collection_id, safe='')}"


def _progress(row: Row) -> str:
    info = row.info
    target, what = row.expected, "expected users (--n)"
    if (
        target is None and info.max_reports
    ):  # --n not given (or a collection from before it was stored)
        target, what = info.max_reports, "the report cap"
    if not target:
        return f'<span class="reports">{info.reports:,}</span>'
    share = min(info.reports / target, 1.0)
    return (
        f'<progress max="{target}" value="{min(info.reports, target)}"></progress> '
        f'<span class="reports">{info.reports:,}</span> of {target:,} ({what}): '
        f"{100 * share:.1f}%"
    )


def _pilot(info: CollectionInfo) -> str:
    if not info.pilot_target:
        return "no pilot"
    check = f"; check: {info.pilot_check}" if info.pilot_check else ""
    if info.in_pilot:
        rounds = f" (round {info.phase + 1})" if info.phase else ""
        return f"pilot{rounds}: {info.reports:,} of {info.pilot_target:,} reports{check}"
    return f"pilot done ({info.pilot_reports:,} reports){check}"


def collections_page(rows: Sequence[Row]) -> bytes:
    lines = [
        "<table id=collections><tr><th>collection</th><th>state</th><th>progress</th>"
        "<th>phase</th><th>pilot</th><th>reports/s</th><th>flags</th></tr>"
    ]
    for row in rows:
        info = row.info
        rate = f"{row.rates[-1][1]:,.0f}" if row.rates else "\u2013"
        flags = f'<span class="flag">{len(info.flags)}</span>' if info.flags else "0"
        lines.append(
            f'<tr><td><a href="{_link(info.collection_id)}">{escape(info.collection_id)}</a>'
            f"</td><td>{escape(info.state)}</td><td>{_progress(row)}</td>"
            f"<td>{info.phase}</td><td>{escape(_pilot(info))}</td>"
            f'<td class="n">{rate}</td><td>{flags}</td></tr>'
        )
    lines.append("</table>")
    if not rows:
        lines = ["<p>No collections yet (<code>calmkit collection create</code>).</p>"]
    lines.append('<p class="note">Reload for fresh numbers.</p>')
    return _page("collections", "".join(lines))


def _views(info: CollectionInfo) -> str:
    names = info.plan.schema.names
    lines = ["<table id=views><tr><th>view</th><th>oracle</th><th>reports</th></tr>"]
    oracles = info.plan.oracles or ("",) * info.plan.m
    for view, oracle, count in zip(info.plan.views, oracles, info.view_reports):
        label = " \u00d7 ".join(names[a] for a in view)
        lines.append(
            f'<tr><td>{escape(label)}</td><td>{escape(str(oracle))}</td><td class="n">'
            f"{count:,}</td></tr>"
        )
    lines.append("</table>")
    return "".join(lines)


def _picker(info: CollectionInfo, chosen: Sequence[str], reconstruct: str) -> str:
    boxes = []
    for attr in info.plan.schema.attributes:
        on = " checked" if attr.name in chosen else ""
        boxes.append(
            f'<label><input type=checkbox name=attr value="{escape(attr.name)}"{on}> '
            f"{escape(attr.name)} ({len(attr.categories)})</label> "
        )
    options = "".join(
        f'<option value="{r}"{" selected" if r == reconstruct else ""}>{r}</option>'
        for r in ("local", "global")
    )
    return (
        "<form method=get id=pick><fieldset><legend>marginal: choose attributes</legend>"
        + "".join(boxes)
        + f" <label>reconstruction <select name=reconstruct>{options}</select></label> "
        "<button type=submit id=show>show</button></fieldset></form>"
    )


def collection_page(row: Row, chosen: Sequence[str], reconstruct: str, marginal: str) -> bytes:
    info = row.info
    flags = "".join(f'<li class="flag">{escape(f)}</li>' for f in info.flags)
    body = (
        f'<div class="box" id=status><p>state <strong id=state>{escape(info.state)}'
        f"</strong>; {_progress(row)}</p><p>phase {info.phase}; {escape(_pilot(info))}; "
        f"plan {escape(info.plan.digest[:16])}: {info.plan.m} views, k = {info.k}; "
        f"\u03b5 = {info.plan.epsilon:g}</p>"
        + (f"<p>manipulation flags:</p><ul id=flags>{flags}</ul>" if flags else "<p>no flags</p>")
        + "</div><h2>ingest rate (reports/s)</h2>"
        + rate_line(row.rates)
        + "<h2>reports per view (current phase)</h2>"
        + _views(info)
        + "<h2>marginal</h2>"
        + _picker(info, chosen, reconstruct)
        + marginal
    )
    return _page(f"collection {info.collection_id}", body)


def uniform_error(values: np.ndarray, variance: np.ndarray) -> tuple[float, float]:
    """``(this answer's expected squared error, Uniform's)`` summed over cells.

    The answer's is the sum of its per-cell mean squared total error. Uniform (every
    cell ``1/cells``, the reference point of the CALM paper, section 5.1) is off by
    ``||P - u||^2``; since ``E||answer - u||^2 = ||P - u||^2 + (the answer's error)``
    for an unbiased answer, Uniform's is estimated as the difference (at least 0).
    When the answer's error is not below Uniform's, the answer is mostly noise."""
    ours = float(np.nansum(variance))
    spread = float(np.sum((values - 1.0 / values.size) ** 2))
    return ours, max(spread - ours, 0.0)


def _cells_table(answer: MarginalAnswer, labels: Sequence[Sequence[str]]) -> str:
    values, se = answer.values, np.sqrt(answer.variance)
    head = "".join(f"<th>{escape(a)}</th>" for a in answer.attributes)
    lines = [
        f"<table id=cells><tr>{head}<th>fraction</th><th>total error</th>"
        "<th>Uniform's error</th></tr>"
    ]
    uniform = 1.0 / values.size
    for cell in np.ndindex(values.shape):
        names = "".join(f"<td>{escape(labels[i][c])}</td>" for i, c in enumerate(cell))
        s = "n/a" if np.isnan(se[cell]) else f"{se[cell]:.6g}"
        lines.append(
            f'<tr>{names}<td class="n">{values[cell]:.6g}</td><td class="n">{s}</td>'
            f'<td class="n">{abs(values[cell] - uniform):.6g}</td></tr>'
        )
    lines.append("</table>")
    return "".join(lines)


def marginal_section(
    collection_id: str, answer: MarginalAnswer, labels: Sequence[Sequence[str]], reconstruct: str
) -> str:
    """The chosen marginal: its chart (bars for 1 attribute, a heatmap for 2, a heatmap
    of the last two per category combination of the others for more), the
    errors against Uniform's, the method, downloads, and every cell in a table."""
    values, se = answer.values, np.sqrt(answer.variance)
    if values.ndim == 2:
        chart = heatmap(
            values, se, (answer.attributes[0], answer.attributes[1]), labels[0], labels[1]
        )
    elif values.ndim == 1:
        chart = bars(values, se, answer.attributes[0], labels[0])
    else:
        chart = heatmap_panels(values, se, answer.attributes, labels)
    ours, uni = uniform_error(answer.values, answer.variance)
    verdict = (
        '<p class="flag" id=noise>Mostly noise: this answer is expected to be no closer '
        "to the truth than Uniform's.</p>"
        if ours >= uni
        else ""
    )
    provisional = " (collection open: provisional)" if answer.state != "closed" else ""
    note = unresolved_note(answer)
    unresolved = f'<p class="note" id=unresolved>{escape(note)}.</p>' if note else ""
    query = urlencode([*(("attr", a) for a in answer.attributes), ("reconstruct", reconstruct)])
    base = _link(collection_id)
    title = " \u00d7 ".join(answer.attributes)
    return (
        f'<div class="box" id=marginal><p>{escape(title)}: '
        f"method <strong id=method>{escape(answer.method)}</strong>, "
        f"{answer.reports:,} reports{provisional}</p>"
        f"<p>expected squared error, summed over cells: this answer <strong id=err>"
        f"{ours:.4g}</strong>; Uniform (1/cells everywhere, reads nothing) "
        f"<strong id=uniform>{uni:.4g}</strong></p>{verdict}"
        f'<p class="note">total error: root of the {escape(answer.variance_method)}; '
        "fraction \u00b1 1.96 total error is a ~95% interval.</p>"
        f"{unresolved}"
        f'<p>download: <a id=csv href="{base}/marginal.csv?{escape(query)}">CSV</a> '
        f'<a id=json href="{base}/marginal.json?{escape(query)}">JSON</a> (what '
        "<code>calmkit query --format csv|json</code> prints)</p>"
        f"{chart}{_cells_table(answer, labels)}</div>"
    )
