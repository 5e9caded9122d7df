"""Counters of a :class:`~kvstack.kv.KVCache` and the :class:`CacheStats` it reports.

Each count is kept per cache (for ``stats()``) and mirrored into process-wide Prometheus
counters (for ``/metrics``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from kvstack.kv.tiers import TierStats
from kvstack.metrics import counter

__all__ = ["CacheCounters", "CacheStats"]

_PROMETHEUS = {
    "lookups": counter("kvstack_kv_lookups_total", "Token-level lookups"),
    "lookup_tokens": counter("kvstack_kv_lookup_tokens_total", "Prompt tokens looked up"),
    "hit_tokens": counter("kvstack_kv_lookup_hit_tokens_total", "Looked-up tokens found stored"),
    "stored_tokens": counter("kvstack_kv_stored_tokens_total", "Tokens whose chunks were stored"),
    "retrieved_tokens": counter("kvstack_kv_retrieved_tokens_total", "Tokens of KV retrieved"),
    "admission_rejected": counter(
        "kvstack_kv_admission_rejected_total", "Chunks not stored by admission"
    ),
}


@dataclass
class CacheStats:
    tiers: list[TierStats]
    lookups: int = 0
    lookup_tokens: int = 0
    hit_tokens: int = 0
    stored_tokens: int = 0
    retrieved_tokens: int = 0
    admission_rejected: int = 0
    tier_errors: int = 0  # tier calls that raised and were treated as misses
    by_tier: dict[str, TierStats] = field(default_factory=dict)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.lookup_tokens if self.lookup_tokens else 0.0


_COUNTED = tuple(_PROMETHEUS)


class CacheCounters:
    def __init__(self) -> None:
        self._values = dict.fromkeys(_COUNTED, 0)
        self._lock = threading.Lock()

    def add(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                self._values[name] += delta
        for name, delta in deltas.items():
            if delta:
                _PROMETHEUS[name].inc(delta)

    def snapshot(self, tiers: list[TierStats], tier_errors: int) -> CacheStats:
        with self._lock:
            values = dict(self._values)
        return CacheStats(
            tiers=tiers,
            tier_errors=tier_errors,
            by_tier={t.name: t for t in tiers},
            **values,
        )
