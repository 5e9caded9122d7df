"""The waiting queue: first come first served, or by priority (lower value first, then
arrival), as vLLM's ``--scheduling-policy fcfs | priority``."""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Iterator

from kvstack.sim.request import SimRequest

__all__ = ["WaitQueue"]


class WaitQueue:
    def __init__(self, policy: str) -> None:
        self.by_priority = policy == "priority"
        self._fifo: deque[SimRequest] = deque()
        self._heap: list[tuple[int, float, int, SimRequest]] = []
        self._seq = itertools.count()

    def push(self, req: SimRequest) -> None:
        """Enqueue a new request (at the back, or by its priority)."""
        if self.by_priority:
            heapq.heappush(self._heap, (req.priority, req.arrival_s, next(self._seq), req))
        else:
            self._fifo.append(req)

    def push_front(self, req: SimRequest) -> None:
        """Put back a request taken by :meth:`pop` or preempted: it keeps its place."""
        if self.by_priority:
            self.push(req)
        else:
            self._fifo.appendleft(req)

    def pop(self) -> SimRequest:
        if self.by_priority:
            return heapq.heappop(self._heap)[3]
        return self._fifo.popleft()

    def __len__(self) -> int:
        return len(self._heap) if self.by_priority else len(self._fifo)

    def __iter__(self) -> Iterator[SimRequest]:
        if self.by_priority:
            return (entry[3] for entry in self._heap)
        return iter(self._fifo)
