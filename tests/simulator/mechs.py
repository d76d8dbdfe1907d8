"""Test doubles for the mechanism interface."""

from __future__ import annotations

from calmkit_simulator.mechanisms import Mechanism, NotScalable


class Refuses(Mechanism):
    """Refuses every setting in :meth:`check`; fails loudly if :meth:`run` starts."""

    name = "refuses"
    ran = False

    def check(self, schema, n, epsilon, k):  # type: ignore[no-untyped-def]
        raise NotScalable(f"n ({n}) is too small for this test mechanism")

    def run(self, population, epsilon, k, rng=None):  # type: ignore[no-untyped-def]
        self.ran = True
        raise AssertionError("run must not start after check refused")
