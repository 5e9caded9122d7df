"""A circuit breaker for one remote tier.

States: **closed** (calls go through), **open** (calls are refused without touching the network,
for ``reset_after_s``), **half-open** (one trial call is let through; success closes the breaker,
failure opens it again). ``failure_threshold`` consecutive failures open a closed breaker.

Opening is logged once per incident (a warning naming the cause), closing once (an info line
with the incident's length); each trip is counted in ``kvstack_kv_tier_breaker_trips_total`` and
the state is exported as ``kvstack_kv_tier_breaker_state`` (0 closed, 1 open, 2 half-open).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Literal

from kvstack.errors import ConfigError
from kvstack.metrics import counter, gauge

__all__ = ["CircuitBreaker"]

log = logging.getLogger(__name__)

State = Literal["closed", "open", "half-open"]
_STATE_CODES: dict[State, int] = {"closed": 0, "open": 1, "half-open": 2}

_TRIPS = counter(
    "kvstack_kv_tier_breaker_trips_total", "Times a remote tier's circuit breaker opened", ["tier"]
)
_REFUSED = counter(
    "kvstack_kv_tier_breaker_refused_total",
    "Calls not made because the tier's circuit breaker was open",
    ["tier"],
)
_STATE = gauge(
    "kvstack_kv_tier_breaker_state",
    "Circuit breaker state: 0 closed, 1 open, 2 half-open",
    ["tier"],
    multiprocess_mode="max",
)


class CircuitBreaker:
    """Thread-safe. Callers ask :meth:`allow` before a call and report :meth:`success` or
    :meth:`failure` after it."""

    def __init__(
        self,
        name: str,
        failure_threshold: int = 3,
        reset_after_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if failure_threshold < 1:
            raise ConfigError(f"breaker failure threshold must be >= 1, got {failure_threshold}")
        if reset_after_s <= 0:
            raise ConfigError(f"breaker reset time must be > 0 s, got {reset_after_s}")
        self.name = name
        self.failure_threshold = failure_threshold
        self.reset_after_s = reset_after_s
        self._clock = clock
        self._lock = threading.Lock()
        self._state: State = "closed"
        self._failures = 0
        self._opened_at = 0.0
        self._incident_start = 0.0
        self._trial_in_flight = False
        self._trial_started = 0.0
        self.trips = 0
        self.refused = 0
        _STATE.labels(name).set(0)

    @property
    def state(self) -> State:
        with self._lock:
            self._maybe_half_open()
            return self._state

    def allow(self) -> bool:
        """Whether a call may go to the remote now (counts a refusal when not)."""
        with self._lock:
            self._maybe_half_open()
            if self._state == "closed":
                return True
            if self._state == "half-open" and self._trial_allowed():
                self._trial_in_flight = True
                self._trial_started = self._clock()
                return True
            self.refused += 1
        _REFUSED.labels(self.name).inc()
        return False

    def success(self) -> None:
        with self._lock:
            self._failures = 0
            self._trial_in_flight = False
            if self._state == "closed":
                return
            down_s = self._clock() - self._incident_start
            self._set_state("closed")
        log.info("KV tier %s recovered after %.1f s; circuit breaker closed", self.name, down_s)

    def failure(self, cause: BaseException | str) -> None:
        with self._lock:
            self._failures += 1
            self._trial_in_flight = False
            if self._state == "open":
                return
            reopened = self._state == "half-open"
            if not reopened and self._failures < self.failure_threshold:
                return
            self._opened_at = self._clock()
            if not reopened:
                self._incident_start = self._opened_at
                self.trips += 1
            self._set_state("open")
        if reopened:
            log.debug("KV tier %s still failing (%s); breaker stays open", self.name, cause)
            return
        _TRIPS.labels(self.name).inc()
        log.warning(
            "KV tier %s failing (%s); circuit breaker open, retrying every %.1f s "
            "(reads are misses meanwhile)",
            self.name,
            cause,
            self.reset_after_s,
        )

    def _maybe_half_open(self) -> None:
        """Under the lock."""
        if self._state == "open" and self._clock() - self._opened_at >= self.reset_after_s:
            self._set_state("half-open")

    def _trial_allowed(self) -> bool:
        """Under the lock. A trial whose caller never reported back is given up after a while,
        so a lost report cannot keep the breaker open forever."""
        stale = self._clock() - self._trial_started >= self.reset_after_s
        return not self._trial_in_flight or stale

    def _set_state(self, state: State) -> None:
        """Under the lock."""
        self._state = state
        _STATE.labels(self.name).set(_STATE_CODES[state])
