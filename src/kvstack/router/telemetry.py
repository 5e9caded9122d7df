"""The router's Prometheus metrics (prefix ``kvstack_router_``) and cheap ways to record them.

Labelled children are cached per label tuple: a ``labels()`` lookup per request would cost more
than the rest of the bookkeeping. Per-backend gauges are refreshed when ``/metrics`` is read.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from prometheus_client import Counter, Gauge, Histogram

from kvstack.metrics import counter, gauge, histogram
from kvstack.router.fleet.backends import BackendState

__all__ = ["Telemetry"]

REQUESTS = counter(
    "kvstack_router_requests_total",
    "Requests answered, by client model name, backend and HTTP status",
    ["model", "backend", "status"],
)
DECISIONS = counter("kvstack_router_decisions_total", "Routing decisions by reason", ["reason"])
RETRIES = counter(
    "kvstack_router_retries_total", "Attempts retried on another backend, by failure", ["kind"]
)
UPSTREAM_ERRORS = counter(
    "kvstack_router_upstream_errors_total", "Backend failures by kind", ["backend", "kind"]
)
PANIC = counter(
    "kvstack_router_panic_routing_total",
    "Decisions among ejected backends because every candidate was ejected",
)
DISCONNECTS = counter(
    "kvstack_router_client_disconnects_total", "Clients gone before the answer ended"
)
MIDSTREAM = counter(
    "kvstack_router_stream_aborts_total", "Streams cut after bytes reached the client", ["kind"]
)
ADDED = histogram(
    "kvstack_router_added_latency_seconds",
    "Time the router adds: before the upstream request plus first upstream byte to client",
)
TTFT = histogram(
    "kvstack_router_ttft_seconds", "Time to first token seen by streaming clients", ["model"]
)
DURATION = histogram(
    "kvstack_router_request_duration_seconds", "Request duration seen by clients", ["model"]
)
IN_FLIGHT = gauge("kvstack_router_backend_in_flight", "Router in-flight requests", ["backend"])
PREFILL = gauge(
    "kvstack_router_backend_in_flight_prefill_tokens",
    "Prompt tokens sent and not yet past their first token",
    ["backend"],
)
HEALTHY = gauge("kvstack_router_backend_healthy", "1 healthy, 0 down, -1 unchecked", ["backend"])
EJECTED = gauge("kvstack_router_backend_ejected", "1 while passively ejected", ["backend"])
AGE = gauge(
    "kvstack_router_backend_metrics_age_seconds",
    "Age of the last scrape of the backend's /metrics (-1: never scraped)",
    ["backend"],
)
STALE = gauge(
    "kvstack_router_backend_metrics_stale", "1 when the last scrape is too old to use", ["backend"]
)
RUNNING = gauge("kvstack_router_backend_engine_running", "Scraped running requests", ["backend"])
WAITING = gauge("kvstack_router_backend_engine_waiting", "Scraped waiting requests", ["backend"])
KV = gauge("kvstack_router_backend_engine_kv_usage", "Scraped KV cache usage", ["backend"])
_BACKEND_GAUGES = (IN_FLIGHT, PREFILL, HEALTHY, EJECTED, AGE, STALE, RUNNING, WAITING, KV)


class Telemetry:
    def __init__(self) -> None:
        self._requests: dict[tuple[str, str, str], Counter] = {}
        self._decisions: dict[str, Counter] = {}
        self._ttft: dict[str, Histogram] = {}
        self._duration: dict[str, Histogram] = {}
        self._known_backends: set[str] = set()

    def request(self, model: str, backend: str, status: int, duration_s: float) -> None:
        key = (model, backend, str(status))
        child = self._requests.get(key)
        if child is None:
            child = self._requests[key] = REQUESTS.labels(*key)
        child.inc()
        hist = self._duration.get(model)
        if hist is None:
            hist = self._duration[model] = DURATION.labels(model)
        hist.observe(duration_s)

    def decision(self, reason: str) -> None:
        child = self._decisions.get(reason)
        if child is None:
            child = self._decisions[reason] = DECISIONS.labels(reason)
        child.inc()

    def ttft(self, model: str, seconds: float) -> None:
        hist = self._ttft.get(model)
        if hist is None:
            hist = self._ttft[model] = TTFT.labels(model)
        hist.observe(seconds)

    @staticmethod
    def added_latency(seconds: float) -> None:
        ADDED.observe(seconds)

    @staticmethod
    def retry(kind: str) -> None:
        RETRIES.labels(kind).inc()

    @staticmethod
    def upstream_error(backend: str, kind: str) -> None:
        UPSTREAM_ERRORS.labels(backend, kind).inc()

    @staticmethod
    def disconnect() -> None:
        DISCONNECTS.inc()

    @staticmethod
    def stream_abort(kind: str) -> None:
        MIDSTREAM.labels(kind).inc()

    def refresh_backends(self, states: Iterable[BackendState]) -> None:
        """Set the per-backend gauges; drop the series of backends that left the pool."""
        now_s = time.monotonic()
        seen: set[str] = set()
        for state in states:
            seen.add(state.id)
            _set_backend(state, now_s)
        for gone in self._known_backends - seen:
            for metric in _BACKEND_GAUGES:
                _remove(metric, gone)
        self._known_backends = seen


def _set_backend(state: BackendState, now_s: float) -> None:
    b = state.id
    IN_FLIGHT.labels(b).set(state.in_flight)
    PREFILL.labels(b).set(state.in_flight_prefill_tokens)
    HEALTHY.labels(b).set(-1 if state.healthy is None else int(state.healthy))
    EJECTED.labels(b).set(int(state.ejection.is_ejected(now_s)))
    age = state.metrics_age_s
    AGE.labels(b).set(-1.0 if age is None else age)
    engine = state.engine
    STALE.labels(b).set(int(engine is None))
    if engine is not None:
        RUNNING.labels(b).set(engine.running or 0.0)
        WAITING.labels(b).set(engine.waiting or 0.0)
        KV.labels(b).set(engine.kv_usage or 0.0)


def _remove(metric: Gauge, backend: str) -> None:
    try:
        metric.remove(backend)
    except KeyError:
        pass
