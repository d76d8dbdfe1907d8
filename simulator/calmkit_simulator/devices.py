"""Simulated devices: many users' device state in memory, reports drawn from a seeded
generator, so a simulation or the demo is repeatable (``calmkit demo --seed``).

Never use this on a device: whoever knows the seed can re-derive every report, and
with it the true values. Real devices use :class:`calmkit_client.DeviceState`, whose
reports come from the OS entropy source.
"""

from __future__ import annotations

import numpy as np

from calmkit_client.device import SECRET_BYTES, DeviceState
from calmkit_client.randomness import RngLike, SourceLike

__all__ = ["SimulatedDevices"]


class SimulatedDevices(DeviceState):
    """An in-memory :class:`~calmkit_client.DeviceState` whose bulk reports
    (``reports_for``, hence ``Collector.submit_many``) draw from ``rng`` (a seed or a
    numpy Generator). Everything else (ledger, one report per user) is the device's."""

    @classmethod
    def seeded(cls, rng: RngLike) -> SimulatedDevices:
        """Devices whose secret (hence pseudonyms, which pick the views) and bulk
        reports all come from ``rng``: the same seed, the same reports."""
        state = cls.in_memory()
        state._generator = np.random.default_rng(rng)
        # a child stream: the reports' stream stays the generator's own
        secret = state._generator.spawn(1)[0].bytes(SECRET_BYTES)
        state._secret = secret  # in memory only: the object is the whole state
        return state

    _generator: np.random.Generator | None = None

    def _bulk_source(self) -> SourceLike:
        if self._generator is None:
            raise TypeError("SimulatedDevices must be made by SimulatedDevices.seeded(rng)")
        return self._generator
