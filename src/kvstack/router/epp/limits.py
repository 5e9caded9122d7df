"""The bounds on the EPP's streams: how many requests may wait for a pick, how long a stream
may stay silent.

``DecisionGate``: past saturation a Python EPP cannot keep up, and without a bound every new
stream queued behind the others: decision latency grew to seconds and gRPC core cancelled the
calls that had waited longest in its queue of calls the server had not yet taken (the gateway
saw ``CANCELLED``, or ``INTERNAL`` when its write raced the cancellation). The gate admits at
most ``limit`` streams between their start and their pick; the next one is refused at once
with ``RESOURCE_EXHAUSTED``, a refusal that costs almost nothing, so the EPP keeps pace with
the streams it admits. When the event loop itself is saturated, new calls wait in gRPC core
before any handler sees them; the server bounds that queue at the same size
(``grpc.server.max_pending_requests``), and core ends the calls past it at once. The gateway
then applies its failure mode: fail-open (Envoy's
``failure_mode_allow``, GIE's ``FailOpen``) routes the request without the EPP, fail-closed
answers the client with an error at once. The default bound follows Envoy's default
``message_timeout`` of 200 ms: 64 picks of the ~3 ms one costs in Python fit in it; a request
queued deeper would outwait the gateway anyway.

``IdleWatchdog``: a stream on which the gateway sends nothing for ``timeout_s`` (a proxy that
vanished without closing its connection, a reset that never arrived) is cancelled, so that
its request's load lease and admission permit are released instead of counting against its
backend forever. One timer per stream, re-armed only when it fires: a message costs one clock
read.
"""

from __future__ import annotations

import asyncio

__all__ = ["DecisionGate", "IdleWatchdog"]


class DecisionGate:
    """At most ``limit`` requests waiting for their pick at once."""

    __slots__ = ("limit", "pending")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.pending = 0

    def enter(self) -> bool:
        """Take a place (False: the gate is full, refuse the stream)."""
        if self.pending >= self.limit:
            return False
        self.pending += 1
        return True

    def leave(self) -> None:
        self.pending -= 1


class IdleWatchdog:
    """Cancels the task that created it when no :meth:`touch` came for ``timeout_s`` while
    that task was waiting for the gateway (``waiting``); ``expired`` says it did."""

    __slots__ = ("_handle", "_loop", "_task", "expired", "last_s", "timeout_s", "waiting")

    def __init__(self, timeout_s: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        self.timeout_s = timeout_s
        self.last_s = self._loop.time()
        self.waiting = False
        self.expired = False
        self._handle: asyncio.TimerHandle | None = None
        if timeout_s > 0:
            self._handle = self._loop.call_at(self.last_s + timeout_s, self._check)

    def touch(self) -> None:
        """A message came."""
        self.last_s = self._loop.time()

    def _check(self) -> None:
        due = self.last_s + self.timeout_s
        if self._loop.time() < due or not self.waiting:  # busy answering is not idle
            self._handle = self._loop.call_at(max(due, self._loop.time() + 0.1), self._check)
            return
        self.expired = True
        self._handle = None
        if self._task is not None:
            self._task.cancel()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
