"""``load_mode=auto``'s choice for a load from a slower tier: within the step, or off it.

An asynchronous load does not stall the batch, but its request waits: vLLM starts the load
after the current forward pass, the worker reports it done at the end of a later step, and
the request is scheduled in the step after that, so it waits for the load and for at least
about one step. A load within the step costs each request stepping alongside it (and the
loading request itself) the load's time, once. So :meth:`LoadCost.within_step` answers yes when

    chunks x seconds per chunk within a step x max(1, requests stepping)
        <= max(chunks x seconds per chunk off the step, one step)

from what this engine measured itself: the worker times every load's fetch and write (without
the waits for step boundaries; where an asynchronous load's write waits for the next step,
beside its forward pass, only its fetch), separately for loads within the step and off it,
since they need not run at the same speed (on vLLM's CPU build the load threads run on cores
other work also uses), and the scheduler times its steps (scheduled to reported). Each figure
is the median of a short window, so that one slow step or load does not swing the choice.

With nothing measured within the step yet, a small load (:data:`PROBE_CHUNKS` chunks at most)
goes there once to be measured; so does one in every :data:`PROBE_EVERY` slow-tier loads, so
that a measurement made while the engine was busy does not rule the step out for good. Until
then a load within the step is taken to be as fast per chunk as one off it (the step's thread
has at least the resources of the load threads), and with nothing measured at all a load goes
off the step, the safe choice.

Measured on vLLM's CPU build, the demo's multi-round conversations (2 cores, one engine on
each, a disk tier): 3 ms per chunk within the step, 0.3 to 1.3 s per chunk off it (the load
threads share a core with the other engine's compute threads), steps of ~15 ms: the step wins.
A GPU engine reading a large prefix for a full batch measures the opposite.
"""

from __future__ import annotations

import statistics
from collections import deque
from typing import NamedTuple

__all__ = ["PROBE_CHUNKS", "PROBE_EVERY", "LoadCost", "LoadSample"]

WINDOW = 32  # recent samples each median is taken over
MAX_PENDING_STEPS = 64  # steps scheduled but not yet reported, kept for their timing
PROBE_CHUNKS = 4  # the largest load sent into the step only to measure it
PROBE_EVERY = 64  # slow-tier loads between two such measurements


class LoadSample(NamedTuple):
    """One finished load, as the worker timed it (fetch and write, no wait for the step)."""

    req_id: str
    chunks: int
    seconds: float
    within_step: bool


def _median(samples: deque[float]) -> float | None:
    return statistics.median(samples) if samples else None


class LoadCost:
    def __init__(self, window: int = WINDOW) -> None:
        self._within: deque[float] = deque(maxlen=window)  # seconds per chunk, within a step
        self._off: deque[float] = deque(maxlen=window)  # seconds per chunk, off the step
        self._steps: deque[float] = deque(maxlen=window)
        self._started: dict[int, float] = {}
        self._since_probe = 0

    # -- measurements ----------------------------------------------------------------------
    def observe_load(self, chunks: int, seconds: float, within_step: bool) -> None:
        """A load from a slower tier: ``chunks`` fetched and written in ``seconds``."""
        if chunks > 0 and seconds >= 0:
            (self._within if within_step else self._off).append(seconds / chunks)

    def step_scheduled(self, step: int, now: float) -> None:
        """A step with work to compute was scheduled at ``now``."""
        if len(self._started) >= MAX_PENDING_STEPS:  # reports lost: start afresh
            self._started.clear()
        self._started[step] = now

    def step_reported(self, step: int, now: float) -> None:
        """The worker reported ``step`` done at ``now`` (steps without work are ignored)."""
        started = self._started.pop(step, None)
        if started is not None and now >= started:
            self._steps.append(now - started)
        for old in [s for s in self._started if s < step]:  # their reports will not come
            del self._started[old]

    # -- the choice ------------------------------------------------------------------------
    @property
    def within_seconds_per_chunk(self) -> float | None:
        return _median(self._within)

    @property
    def off_seconds_per_chunk(self) -> float | None:
        return _median(self._off)

    @property
    def step_seconds(self) -> float | None:
        return _median(self._steps)

    def within_step(self, chunks: int, stepping: int) -> bool:
        """True when loading ``chunks`` within the step costs the ``stepping`` requests (and
        itself) less than an asynchronous load costs its own request, or as a probe."""
        self._since_probe += 1
        within, off = self.within_seconds_per_chunk, self.off_seconds_per_chunk
        if (within is None or self._since_probe >= PROBE_EVERY) and chunks <= PROBE_CHUNKS:
            self._since_probe = 0
            return True
        within = within if within is not None else off  # until measured: no slower than off
        step = self.step_seconds
        if within is None or step is None:
            return False
        waiting = max(chunks * off, step) if off is not None else step
        return chunks * within * max(1, stepping) <= waiting
