"""Per-adapter metrics with bounded cardinality.

Adapters are named in labels only while they are among the ``top_k`` by decayed request count,
or pinned, or in canary; every other adapter is counted under ``other`` (and so are its tenant
and version). When an adapter drops out of the named set its series are removed, so the number
of series stays bounded however many adapters exist. Recent TTFTs are also kept in memory per
(adapter label, start) for exact p50/p95/p99 in the admin API and the benchmark.

Families: ``kvstack_lora_requests_total{adapter,residency}`` (hit rate per tier),
``kvstack_lora_load_seconds{adapter,phase}`` (fetch, verify, engine_load, total),
``kvstack_lora_load_failures_total{adapter,reason}``,
``kvstack_lora_evictions_total{adapter,from_tier,reason}``,
``kvstack_lora_fallbacks_total{adapter,action,reason}``,
``kvstack_lora_ttft_seconds{adapter,tenant,version,start}`` (start: hot, warm or cold),
``kvstack_lora_auto_rollbacks_total{adapter,reason}`` (a released version that failed
verification at load, taken out of service; rare, so the adapter is always named),
``kvstack_lora_invariant_violations_total{invariant}`` (pinned_eviction, wrong_version,
unverified_load — each must stay at zero).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client.metrics import MetricWrapperBase

from kvstack.metrics import counter, histogram

__all__ = ["OTHER", "LoRAMetrics", "TTFTSummary"]

OTHER = "other"
INVARIANTS = ("pinned_eviction", "wrong_version", "unverified_load")

_REQUESTS = counter(
    "kvstack_lora_requests_total",
    "Adapter requests by residency at arrival",
    ["adapter", "residency"],
)
_LOAD_S = histogram("kvstack_lora_load_seconds", "Adapter load time by phase", ["adapter", "phase"])
_FAILURES = counter(
    "kvstack_lora_load_failures_total", "Adapter load failures", ["adapter", "reason"]
)
_EVICTIONS = counter(
    "kvstack_lora_evictions_total",
    "Adapter demotions and drops",
    ["adapter", "from_tier", "reason"],
)
_FALLBACKS = counter(
    "kvstack_lora_fallbacks_total",
    "Requests served by the base model or refused",
    ["adapter", "action", "reason"],
)
_TTFT = histogram(
    "kvstack_lora_ttft_seconds",
    "Time to first token observed by the router",
    ["adapter", "tenant", "version", "start"],
)
_ROLLBACKS = counter(
    "kvstack_lora_auto_rollbacks_total",
    "Released versions taken out of service after failing verification at load",
    ["adapter", "reason"],
)
_INVARIANTS = counter("kvstack_lora_invariant_violations_total", "Must stay zero", ["invariant"])


@dataclass(frozen=True, slots=True)
class TTFTSummary:
    count: int
    p50_s: float
    p95_s: float
    p99_s: float


class LoRAMetrics:
    def __init__(self, top_k: int = 20, window: int = 2048, recompute_every: int = 256) -> None:
        self.top_k = top_k
        self.recompute_every = recompute_every
        self._counts: dict[str, float] = {}
        self._named: set[str] = set()
        self._since_recompute = 0
        self._series: dict[str, set[tuple[MetricWrapperBase, tuple[str, ...]]]] = {}
        self._ttft: dict[tuple[str, str], deque[float]] = {}
        self._window = window
        self.invariants = dict.fromkeys(INVARIANTS, 0)
        for name in INVARIANTS:
            _INVARIANTS.labels(name)  # export the zeros

    # -- labels ---------------------------------------------------------------------------

    def label(self, adapter_id: str, protected: bool = False) -> str:
        return adapter_id if protected or adapter_id in self._named else OTHER

    def _observe(self, adapter_id: str) -> None:
        self._counts[adapter_id] = self._counts.get(adapter_id, 0.0) + 1.0
        self._since_recompute += 1
        if len(self._named) < self.top_k and adapter_id not in self._named:
            self._named.add(adapter_id)
        elif self._since_recompute >= self.recompute_every:
            self._recompute()

    def _recompute(self) -> None:
        self._since_recompute = 0
        ranked = sorted(self._counts.items(), key=lambda kv: -kv[1])[: self.top_k]
        named = {a for a, _ in ranked}
        for gone in self._named - named:
            for metric, labels in self._series.pop(gone, set()):
                metric.remove(*labels)
        self._named = named
        # Halve the counts so the ranking follows current popularity; forget the negligible.
        self._counts = {a: c / 2.0 for a, c in self._counts.items() if c >= 1.0}

    def _emit(
        self, metric: MetricWrapperBase, adapter: str, labels: Sequence[str]
    ) -> MetricWrapperBase:
        if adapter != OTHER:
            self._series.setdefault(adapter, set()).add((metric, tuple(labels)))
        return metric.labels(*labels)

    # -- hooks ----------------------------------------------------------------------------

    def auto_rollback(self, adapter_id: str, reason: str) -> None:
        _ROLLBACKS.labels(adapter_id, reason).inc()

    def request(self, adapter_id: str, residency: str, protected: bool) -> None:
        self._observe(adapter_id)
        adapter = self.label(adapter_id, protected)
        self._emit(_REQUESTS, adapter, (adapter, residency)).inc()  # type: ignore[attr-defined]

    def load_phase(self, adapter_id: str, phase: str, seconds: float, protected: bool) -> None:
        adapter = self.label(adapter_id, protected)
        self._emit(_LOAD_S, adapter, (adapter, phase)).observe(seconds)  # type: ignore[attr-defined]

    def load_failure(self, adapter_id: str, reason: str, protected: bool) -> None:
        adapter = self.label(adapter_id, protected)
        self._emit(_FAILURES, adapter, (adapter, reason)).inc()  # type: ignore[attr-defined]

    def eviction(self, adapter_id: str, from_tier: str, reason: str, protected: bool) -> None:
        adapter = self.label(adapter_id, protected)
        self._emit(_EVICTIONS, adapter, (adapter, from_tier, reason)).inc()  # type: ignore[attr-defined]

    def fallback(self, adapter_id: str, action: str, reason: str, protected: bool) -> None:
        adapter = self.label(adapter_id, protected)
        self._emit(_FALLBACKS, adapter, (adapter, action, reason)).inc()  # type: ignore[attr-defined]

    def ttft(
        self,
        adapter_id: str,
        tenant: str,
        version: str,
        start: str,
        seconds: float,
        protected: bool,
    ) -> None:
        adapter = self.label(adapter_id, protected)
        named = adapter != OTHER
        labels = (adapter, tenant if named else OTHER, version if named else OTHER, start)
        self._emit(_TTFT, adapter, labels).observe(seconds)  # type: ignore[attr-defined]
        for key in ((adapter, start), ("*", start)):
            self._ttft.setdefault(key, deque(maxlen=self._window)).append(seconds)

    def violation(self, invariant: str) -> None:
        self.invariants[invariant] += 1
        _INVARIANTS.labels(invariant).inc()

    def ttft_summary(self, adapter: str = "*", start: str | None = None) -> TTFTSummary:
        """Exact quantiles of the recent window; ``adapter='*'`` is every adapter."""
        starts = [start] if start else ["hot", "warm", "cold"]
        values = sorted(v for s in starts for v in self._ttft.get((adapter, s), ()))
        if not values:
            return TTFTSummary(0, 0.0, 0.0, 0.0)

        def q(p: float) -> float:
            return values[min(len(values) - 1, int(p * len(values)))]

        return TTFTSummary(len(values), q(0.50), q(0.95), q(0.99))
