"""Backends: who they are (from discovery), what they serve, and their live state.

``Backend`` is the identity discovery produces. ``BackendState`` is the router's live record of
one backend: health (active checks), ejection (passive), served models (its ``/v1/models``),
router-side load (:mod:`kvstack.router.fleet.load`) and the last scraped engine metrics. Plugins see
it through the read-only :class:`BackendView` protocol. ``BackendPool`` applies discovery
snapshots: new backends start unchecked and are checked at once, removed ones leave the pool
while their in-flight requests finish on the state object they hold.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvstack.router.fleet.config import EjectionConfig
from kvstack.router.fleet.ejection import EjectionState
from kvstack.router.fleet.engine_metrics import ScrapedMetrics
from kvstack.router.fleet.load import LoadCounters

__all__ = ["Backend", "BackendPool", "BackendState", "BackendView"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Backend:
    id: str
    url: str
    role: str = "both"  # both | prefill | decode
    labels: Mapping[str, str] = field(default_factory=dict)
    static_models: frozenset[str] | None = None  # None: read from /v1/models


class BackendView(Protocol):
    """What plugins may read about a backend (never write)."""

    @property
    def id(self) -> str: ...
    @property
    def url(self) -> str: ...
    @property
    def backend(self) -> Backend: ...
    @property
    def models(self) -> frozenset[str]:
        """Every model name it serves, LoRA adapters included."""

    @property
    def adapters(self) -> Mapping[str, str]:
        """The LoRA adapters among ``models``, each with its base model."""

    @property
    def in_flight(self) -> int: ...
    @property
    def in_flight_prefill_tokens(self) -> int: ...
    @property
    def pending(self) -> int:
        """Router requests sent and not yet at their first token."""

    @property
    def engine(self) -> ScrapedMetrics | None:
        """The last scrape if it is fresh, else None."""

    @property
    def estimated_requests(self) -> float:
        """Router in-flight plus engine requests this router did not send (fresh scrape)."""

    @property
    def metrics_age_s(self) -> float | None: ...


class BackendState:
    """The live record of one backend; mutated only by the router's own components."""

    def __init__(self, backend: Backend, stale_after_s: float = 2.0) -> None:
        self.backend = backend
        self.stale_after_s = stale_after_s
        self.healthy: bool | None = None  # None: not checked yet
        self.health_failures = 0
        self.health_successes = 0
        self.last_error = ""
        self.ejection = EjectionState()
        self.load = LoadCounters()
        self.model_entries: list[dict[str, Any]] = []
        self.models_read_at_s: float | None = None
        self._models: frozenset[str] = backend.static_models or frozenset()
        self._adapters: dict[str, str] = {}
        self._scrape: ScrapedMetrics | None = None
        self._external_requests = 0.0

    # -- BackendView
    @property
    def id(self) -> str:
        return self.backend.id

    @property
    def url(self) -> str:
        return self.backend.url

    @property
    def models(self) -> frozenset[str]:
        return self._models

    @property
    def adapters(self) -> Mapping[str, str]:
        return self._adapters

    @property
    def in_flight(self) -> int:
        return self.load.in_flight

    @property
    def in_flight_prefill_tokens(self) -> int:
        return self.load.in_flight_prefill_tokens

    @property
    def pending(self) -> int:
        return self.load.pending

    @property
    def engine(self) -> ScrapedMetrics | None:
        scrape = self._scrape
        if scrape is None or time.monotonic() - scrape.scraped_at_s > self.stale_after_s:
            return None
        return scrape

    @property
    def estimated_requests(self) -> float:
        external = self._external_requests if self.engine is not None else 0.0
        return self.load.in_flight + external

    @property
    def metrics_age_s(self) -> float | None:
        return None if self._scrape is None else time.monotonic() - self._scrape.scraped_at_s

    # -- updates
    @property
    def reachable(self) -> bool:
        """Not failing its active health checks (an unchecked backend counts as reachable)."""
        return self.healthy is not False

    def usable(self, now_s: float) -> bool:
        """Reachable and not ejected: the backends routing prefers."""
        return self.healthy is not False and not self.ejection.is_ejected(now_s)

    def set_engine_metrics(self, metrics: ScrapedMetrics) -> None:
        self._scrape = metrics
        # What the engine holds beyond what this router sent: other routers, direct clients.
        self._external_requests = max(0.0, metrics.num_requests - self.load.in_flight)

    def set_models(self, entries: list[dict[str, Any]], now_s: float) -> None:
        self.model_entries = entries
        self.models_read_at_s = now_s
        # vLLM lists an adapter with its base model as ``parent`` (a base model has none).
        self._adapters = {
            str(e["id"]): str(e["parent"]) for e in entries if "id" in e and e.get("parent")
        }
        if self.backend.static_models is None:
            self._models = frozenset(str(e["id"]) for e in entries if "id" in e)

    def record_failure(self, config: EjectionConfig, reason: str) -> float | None:
        """A failure on real traffic; returns the ejection lease if it ejected the backend."""
        self.last_error = reason
        lease_s = self.ejection.record_failure(config, time.monotonic())
        if lease_s is not None:
            log.warning("ejecting backend %s for %.1f s after %s", self.id, lease_s, reason)
        return lease_s

    def __repr__(self) -> str:
        return f"BackendState({self.id!r}, healthy={self.healthy}, in_flight={self.in_flight})"


class BackendPool:
    """The current set of backends, replaced wholesale by each discovery snapshot."""

    def __init__(self, stale_after_s: float = 2.0) -> None:
        self._stale_after_s = stale_after_s
        self._states: dict[str, BackendState] = {}
        self._listeners: list[Callable[[Sequence[BackendState]], None]] = []

    def on_added(self, listener: Callable[[Sequence[BackendState]], None]) -> None:
        """Call ``listener`` with the states of newly added backends (health checks them)."""
        self._listeners.append(listener)

    def apply(self, backends: Iterable[Backend]) -> tuple[list[str], list[str]]:
        """Make the pool equal to ``backends``; return the ids added and removed."""
        wanted = {b.id: b for b in backends}
        removed = [i for i in self._states if i not in wanted]
        for backend_id in removed:
            del self._states[backend_id]
        added: list[BackendState] = []
        for backend_id, backend in wanted.items():
            current = self._states.get(backend_id)
            if current is not None and current.backend == backend:
                continue
            state = BackendState(backend, self._stale_after_s)
            if current is not None:  # same id, new address or labels: keep its counters
                state.load = current.load
            self._states[backend_id] = state
            added.append(state)
        if added or removed:
            log.info("backends: +%s -%s", [s.id for s in added], removed)
        for listener in self._listeners:
            if added:
                listener(added)
        return [s.id for s in added], removed

    def states(self) -> list[BackendState]:
        return list(self._states.values())

    def get(self, backend_id: str) -> BackendState | None:
        return self._states.get(backend_id)

    def usable(self) -> list[BackendState]:
        now_s = time.monotonic()
        return [s for s in self._states.values() if s.usable(now_s)]

    def reachable(self) -> list[BackendState]:
        return [s for s in self._states.values() if s.reachable]

    def __len__(self) -> int:
        return len(self._states)
