"""When is a backend saturated? One definition shared by filters and scorers.

A backend is saturated when its engine queue is long (``waiting``), its KV cache is nearly full
(``kv_usage``), or this router has too many requests in flight on it. Scraped figures count only
while fresh; with stale metrics only the router's own in-flight count is trusted.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvstack.router.backends import BackendView

__all__ = ["SaturationLimits"]


@dataclass(frozen=True, slots=True)
class SaturationLimits:
    max_waiting: float | None = 5.0  # engine-queued requests (llm-d's default)
    max_kv_usage: float | None = 0.9  # fraction of KV blocks in use
    max_in_flight: int | None = None  # this router's requests on the backend

    def __post_init__(self) -> None:
        if self.max_kv_usage is not None and not 0 < self.max_kv_usage <= 1:
            raise ValueError(f"max_kv_usage must be in (0, 1], got {self.max_kv_usage}")
        if self.max_waiting is not None and self.max_waiting < 0:
            raise ValueError(f"max_waiting must be >= 0, got {self.max_waiting}")
        if self.max_in_flight is not None and self.max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {self.max_in_flight}")

    def reason(self, backend: BackendView) -> str | None:
        """Why ``backend`` is saturated ("waiting", "kv_usage", "in_flight"), or None."""
        if self.max_in_flight is not None and backend.in_flight >= self.max_in_flight:
            return "in_flight"
        engine = backend.engine
        if engine is None:
            return None
        if self.max_waiting is not None and (engine.waiting or 0) > self.max_waiting:
            return "waiting"
        if self.max_kv_usage is not None and (engine.kv_usage or 0) >= self.max_kv_usage:
            return "kv_usage"
        return None
