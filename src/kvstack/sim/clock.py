"""Simulated time: the wall clock times ``time_scale``, from the clock's creation."""

from __future__ import annotations

import asyncio
import time

__all__ = ["ScaledClock"]


class ScaledClock:
    def __init__(self, time_scale: float) -> None:
        self.time_scale = time_scale
        self._t0 = time.monotonic()

    def now(self) -> float:
        """Simulated seconds since the clock started."""
        return (time.monotonic() - self._t0) * self.time_scale

    def wall_s(self, sim_s: float) -> float:
        """Wall-clock seconds that ``sim_s`` simulated seconds take."""
        return sim_s / self.time_scale

    async def sleep_until(self, sim_s: float) -> None:
        delay = (sim_s - self.now()) / self.time_scale
        if delay > 0:
            await asyncio.sleep(delay)
