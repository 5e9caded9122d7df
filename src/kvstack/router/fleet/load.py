"""Router-side load accounting, updated at decision time.

A burst of requests must not pile onto one backend just because its scraped metrics are a few
hundred milliseconds old, so the router counts what it sent itself: ``acquire`` at the routing
decision adds one in-flight request and the request's prompt tokens (its pending prefill); the
lease gives the prefill tokens back at the first token and the request at completion, error or
cancel. ``release`` is idempotent, so every exit path can call it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LoadCounters", "LoadLease"]


@dataclass(slots=True)
class LoadCounters:
    in_flight: int = 0
    in_flight_prefill_tokens: int = 0
    pending: int = 0  # requests sent and not yet at their first token (queued or prefilling)
    dispatched_total: int = 0

    def acquire(self, prefill_tokens: int) -> LoadLease:
        """Count one request (and its pending prefill) against this backend."""
        self.in_flight += 1
        self.in_flight_prefill_tokens += prefill_tokens
        self.pending += 1
        self.dispatched_total += 1
        return LoadLease(self, prefill_tokens)


class LoadLease:
    """One request's share of a backend's load."""

    __slots__ = ("_counters", "_prefill_tokens", "_released", "_started")

    def __init__(self, counters: LoadCounters, prefill_tokens: int) -> None:
        self._counters = counters
        self._prefill_tokens = prefill_tokens
        self._released = False
        self._started = False

    @property
    def released(self) -> bool:
        return self._released

    def first_token(self) -> None:
        """The prefill is done: its tokens no longer queue on the backend."""
        if self._started:
            return
        self._started = True
        self._counters.pending -= 1
        if self._prefill_tokens:
            self._counters.in_flight_prefill_tokens -= self._prefill_tokens
            self._prefill_tokens = 0

    def release(self) -> None:
        """The request finished, failed or was cancelled (idempotent)."""
        if self._released:
            return
        self.first_token()
        self._counters.in_flight -= 1
        self._released = True
