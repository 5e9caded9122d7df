"""When is a backend saturated? One definition shared by filters, scorers and admission.

A backend is saturated when its engine queue is long (``waiting``), its KV cache is nearly full
(``kv_usage``), this router has too many requests in flight on it (``in_flight``) or waiting
for their first token there (``pending``: the engine's queue as the router sees it, without a
scrape's delay), or — when asked to treat it so — its metrics went stale (``stale``: it was
scraped before and no longer answers in time, so nothing says it is not overloaded; a backend
never scraped, e.g. one without ``/metrics``, is not). Scraped figures count only while fresh.

:class:`FleetSaturation` answers for a set of backends (the candidates of one model): how
many more requests they can take right now, and, when none, why.

A leaf: it reads backends through the small protocols below and imports nothing of the router,
so config modules (the priority admission's ``saturation``) build limits without importing the
fleet's runtime modules.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = ["EngineLoad", "FleetSaturation", "LoadView", "SaturationLimits"]


class EngineLoad(Protocol):
    """The scraped engine figures saturation reads (see ``ScrapedMetrics``)."""

    @property
    def waiting(self) -> float | None: ...
    @property
    def kv_usage(self) -> float | None: ...


class LoadView(Protocol):
    """The backend figures saturation reads (a ``BackendView`` has them)."""

    @property
    def in_flight(self) -> int: ...
    @property
    def pending(self) -> int: ...
    @property
    def engine(self) -> EngineLoad | None: ...
    @property
    def metrics_age_s(self) -> float | None: ...


@dataclass(frozen=True, slots=True)
class SaturationLimits:
    max_waiting: float | None = 5.0  # engine-queued requests (llm-d's default)
    max_kv_usage: float | None = 0.9  # fraction of KV blocks in use
    max_in_flight: int | None = None  # this router's requests on the backend
    max_pending: int | None = None  # this router's requests not yet at their first token
    stale_saturates: bool = False  # stale (or missing) metrics count as saturated

    def __post_init__(self) -> None:
        if self.max_kv_usage is not None and not 0 < self.max_kv_usage <= 1:
            raise ValueError(f"max_kv_usage must be in (0, 1], got {self.max_kv_usage}")
        if self.max_waiting is not None and self.max_waiting < 0:
            raise ValueError(f"max_waiting must be >= 0, got {self.max_waiting}")
        if self.max_in_flight is not None and self.max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {self.max_in_flight}")
        if self.max_pending is not None and self.max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {self.max_pending}")

    def reason(self, backend: LoadView) -> str | None:
        """Why ``backend`` is saturated ("in_flight", "pending", "waiting", "kv_usage",
        "stale"), or None."""
        if self.max_in_flight is not None and backend.in_flight >= self.max_in_flight:
            return "in_flight"
        if self.max_pending is not None and backend.pending >= self.max_pending:
            return "pending"
        engine = backend.engine
        if engine is None:
            went_stale = self.stale_saturates and backend.metrics_age_s is not None
            return "stale" if went_stale else None
        if self.max_waiting is not None and (engine.waiting or 0) > self.max_waiting:
            return "waiting"
        if self.max_kv_usage is not None and (engine.kv_usage or 0) >= self.max_kv_usage:
            return "kv_usage"
        return None

    def room(self, backend: LoadView) -> int:
        """Requests the backend can take before it saturates (0 when it is)."""
        if self.reason(backend) is not None:
            return 0
        rooms = [1 << 30]
        if self.max_pending is not None:
            rooms.append(self.max_pending - backend.pending)
        if self.max_in_flight is not None:
            rooms.append(self.max_in_flight - backend.in_flight)
        return max(0, min(rooms))


@dataclass(frozen=True, slots=True)
class FleetSaturation:
    limits: SaturationLimits

    def room(self, backends: Sequence[LoadView]) -> int:
        return sum(self.limits.room(b) for b in backends)

    def reason(self, backends: Sequence[LoadView]) -> str:
        """The most common reason among the saturated ones ("no_backend" when none)."""
        reasons = Counter(self.limits.reason(b) for b in backends)
        reasons.pop(None, None)
        if not reasons:
            return "no_backend"
        return reasons.most_common(1)[0][0] or "saturated"
