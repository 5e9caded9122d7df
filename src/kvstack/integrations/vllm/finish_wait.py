"""A bounded wait at the end of a step for an asynchronous load about to finish.

vLLM learns that a receive is over only from a step's output (``get_finished``) and schedules
the request in the step after it. A load that ends just after a step's ``get_finished`` costs
its request a whole step more: on vLLM's CPU build at 2K tokens, a fetch of ~8 ms outlasted a
6.5 ms step and the request waited for the next. Waiting at the end of that step, on the step,
costs each request stepping the wait once and saves the loading request a step. So the worker
waits, for a load this worker predicts will end within the wait, at most

    min(cap x a typical step, a typical step / max(1, requests stepping))

The second term is ``load_mode=auto``'s rule (:mod:`.load_cost`): what the batch pays, the wait
times the requests stepping, is at most what the loading request saves. A load is waited for at
most once, so a wrong prediction costs one bounded wait; none is made until this worker has
timed its own steps and loads. A typical step is the median of the recent ones with requests
stepping, timed from the step's metadata to its ``get_finished`` (scheduling excluded: shorter
than the step saved). A load's predicted end is its start plus its chunks times the median
seconds per chunk of this worker's recent asynchronous fetches.

The cap is ``load_finish_wait``: 0.25 bounds any one step to 1.25 times its usual time, the
bound kvstack sets for decode ITL while loads run. It is 0 by default, so the wait is opt-in:
it stalls the batch, if boundedly. Measured on vLLM's CPU build (2 cores, the interference
bench at 8,192 tokens with 0.25, ``vllm-interference-2026-12-07T0336.json``): 5 waits of about
1 ms over 24 measured asynchronous loads and their warm-ups, and none caught its load. There a
fetch shares a core with the engine core and the API server, and its time varies by far more
than a quarter step. Where fetches are steadier (cores to spare, a GPU's copy engines) it may
pay; that is not measured yet.
"""

from __future__ import annotations

import statistics
from collections import deque

__all__ = ["FinishWait"]

WINDOW = 32  # recent samples each median is taken over


class FinishWait:
    def __init__(self, cap: float, window: int = WINDOW) -> None:
        self.cap = cap
        self._steps: deque[float] = deque(maxlen=window)
        self._per_chunk: deque[float] = deque(maxlen=window)
        self._began: float | None = None
        self._stepping = 0

    def step_began(self, stepping: int, now: float) -> None:
        """A step's metadata arrived: ``stepping`` requests have tokens scheduled in it."""
        self._began, self._stepping = now, stepping

    def step_ended(self, now: float) -> None:
        """The step's ``get_finished``: a step with requests stepping is timed."""
        if self._began is not None and self._stepping and now >= self._began:
            self._steps.append(now - self._began)
        self._began = None

    def observe_fetch(self, chunks: int, seconds: float) -> None:
        """An asynchronous load's thread was done with ``chunks`` chunks after ``seconds``."""
        if chunks > 0 and seconds >= 0:
            self._per_chunk.append(seconds / chunks)

    @property
    def step_seconds(self) -> float | None:
        return statistics.median(self._steps) if self._steps else None

    @property
    def seconds_per_chunk(self) -> float | None:
        return statistics.median(self._per_chunk) if self._per_chunk else None

    def budget(self) -> float:
        """Seconds this step may wait for a load about to finish; 0: none."""
        step = self.step_seconds
        if self.cap <= 0 or step is None or self.seconds_per_chunk is None:
            return 0.0
        return min(self.cap * step, step / max(1, self._stepping))
