"""How ``calmkit query`` prints a marginal (table, CSV, JSON); the web console's
downloads are the same text."""

from __future__ import annotations

import json
from itertools import product

import numpy as np

from calmkit_client.wire import MarginalAnswer

__all__ = ["FORMATS", "format_answer", "unresolved_note"]

FORMATS = ("table", "csv", "json")


def format_answer(answer: MarginalAnswer, fmt: str) -> str:
    """``answer`` as ``fmt``: "table" (for people), "csv" (one row per cell: the
    attributes' category indices, fraction, total error) or "json"."""
    values, variance = answer.values, answer.variance
    cells = list(product(*(range(s) for s in values.shape)))
    if fmt == "json":
        return json.dumps(
            {
                "attributes": list(answer.attributes),
                "shape": list(values.shape),
                "values": values.reshape(-1).tolist(),
                "variance": [None if np.isnan(v) else v for v in variance.reshape(-1).tolist()],
                "method": answer.method,
                "reports": answer.reports,
                "state": answer.state,
                "variance_method": answer.variance_method,
                "replicates": answer.replicates,
            }
        )
    if fmt == "csv":
        lines = [",".join([*answer.attributes, "fraction", "total_error"])]
        for c in cells:
            se = "" if np.isnan(variance[c]) else f"{np.sqrt(variance[c]):.6g}"
            lines.append(",".join([*map(str, c), f"{values[c]:.6g}", se]))
        return "\n".join(lines)
    header = "  ".join(f"{a:>10s}" for a in answer.attributes) + "    fraction  total.err"
    lines = [header]
    for c in cells:
        se = "        n/a" if np.isnan(variance[c]) else f"{np.sqrt(variance[c]):11.4f}"
        lines.append("  ".join(f"{x:>10d}" for x in c) + f"  {values[c]:10.4f}{se}")
    note = "" if answer.state == "closed" else " (collection open: provisional)"
    lines.append(f"{answer.method}, {answer.reports} reports{note}")
    if answer.variance_method:
        lines.append(
            f"total.err: root of the {answer.variance_method}; fraction +- 1.96 "
            "total.err is a ~95% interval"
        )
    note = unresolved_note(answer)
    return "\n".join([*lines, note] if note else lines)


def unresolved_note(answer: MarginalAnswer) -> str:
    """What cells served as 0 with a total error of 0 mean ("" if there are none):
    Norm-Sub set a rare cell to 0, in the answer and in every bootstrap replicate, so
    the error bars cannot see that the truth is not 0 (a category held at 0 gets a
    floor, :func:`~..reconstruction.unseen.unresolved_floor`; a single cell does not)."""
    count = int(((answer.values == 0) & (answer.variance == 0)).sum())
    if not count:
        return ""
    return (
        f"{count} cell(s) at 0 with total.err 0: below what the reports can resolve "
        "(the estimate set them to 0), not known to be empty"
    )
