"""Planning a collection (DESIGN.md data flow step 1): Algorithm 1's views, the
adaptive oracle per view, equal shares."""

from __future__ import annotations

from pathlib import Path

from calmkit_client import Plan, Schema

from .choose import choose_views

__all__ = ["plan_collection"]


def plan_collection(
    schema: Schema,
    epsilon: float,
    n: int,
    k: int,
    theta: float = 0.001,
    l: int | None = None,  # noqa: E741 (the paper's name)
    m: int | None = None,
    rng: int = 0,
    seed: int = 0,
    covering_dir: Path | str | None = None,
) -> Plan:
    """The plan CALM would run for ``n`` users answering k-way queries: views chosen
    by Algorithm 1 (§4.3; ``l`` and ``m`` may be fixed), each view's oracle by the
    smaller variance (§2.2.3), users split equally, assignment hash ``seed``."""
    choice = choose_views(
        schema.sizes, epsilon, n, k, theta=theta, rng=rng, covering_dir=covering_dir, l=l, m=m
    )
    return Plan(schema, epsilon, choice.views, seed=seed)
