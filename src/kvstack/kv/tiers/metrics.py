"""Prometheus metrics of the KV tiers, labelled by tier name.

Counters and latency histograms are updated as operations happen; the ``used_bytes`` and
``entries`` gauges are read from the tier when scraped (the most recently created tier of a
name reports them, and a garbage-collected tier reports zero).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import replace

from kvstack.kv.tiers.base import TierStats
from kvstack.metrics import counter, gauge, histogram

__all__ = ["TierMetrics"]

_HITS = counter("kvstack_kv_tier_hits_total", "Chunk reads served by the tier", ["tier"])
_MISSES = counter("kvstack_kv_tier_misses_total", "Chunk reads the tier could not serve", ["tier"])
_READ = counter("kvstack_kv_tier_read_bytes_total", "Bytes read from the tier", ["tier"])
_WRITTEN = counter("kvstack_kv_tier_written_bytes_total", "Bytes written to the tier", ["tier"])
_EVICTIONS = counter("kvstack_kv_tier_evictions_total", "Chunks evicted from the tier", ["tier"])
_CORRUPT = counter(
    "kvstack_kv_tier_corrupt_total", "Corrupt or truncated chunks detected and dropped", ["tier"]
)
_REJECTED = counter(
    "kvstack_kv_chunks_rejected_total",
    "Chunks read from a tier and refused before reaching an engine, by reason: mac (unsigned, "
    "another secret's, or a wrong MAC), checksum, size (declared sizes beyond the layout), format",
    ["tier", "reason"],
)
_DROPPED = counter(
    "kvstack_kv_tier_dropped_writes_total",
    "Writes not performed (queue full, disk full, I/O error)",
    ["tier"],
)
_ERRORS = counter("kvstack_kv_tier_errors_total", "Failed tier operations", ["tier", "op"])
_PUT_S = histogram("kvstack_kv_tier_put_seconds", "Latency of storing one chunk", ["tier"])
_GET_S = histogram("kvstack_kv_tier_get_seconds", "Latency of reading one chunk", ["tier"])
_USED = gauge(
    "kvstack_kv_tier_used_bytes", "Bytes held by the tier", ["tier"], multiprocess_mode="sum"
)
_ENTRIES = gauge(
    "kvstack_kv_tier_entries", "Chunks held by the tier", ["tier"], multiprocess_mode="sum"
)


Gauges = Callable[[], tuple[int, int]]  # () -> (entries, used bytes)


class TierMetrics:
    """Per-tier-instance counters, mirrored into the process-wide Prometheus series."""

    def __init__(self, tier: str, gauges: Gauges | None = None) -> None:
        self._tier = tier
        self._hits = _HITS.labels(tier)
        self._misses = _MISSES.labels(tier)
        self._read = _READ.labels(tier)
        self._written = _WRITTEN.labels(tier)
        self._evictions = _EVICTIONS.labels(tier)
        self._corrupt = _CORRUPT.labels(tier)
        self._dropped = _DROPPED.labels(tier)
        self.put_seconds = _PUT_S.labels(tier)
        self.get_seconds = _GET_S.labels(tier)
        self.used_bytes = _USED.labels(tier)
        self.entries = _ENTRIES.labels(tier)
        self.stats = TierStats(tier)
        self._watched = gauges is not None
        if gauges is not None:
            self._watch(gauges)

    def _watch(self, gauges: Gauges) -> None:
        # A bound method is held weakly so that the registry does not keep its tier alive.
        bound = hasattr(gauges, "__self__")
        ref: Callable[[], Gauges | None] = weakref.WeakMethod(gauges) if bound else lambda: gauges

        def read(index: int) -> float:
            fn = ref()
            return float(fn()[index]) if fn is not None else 0.0

        self.entries.set_function(lambda: read(0))
        self.used_bytes.set_function(lambda: read(1))

    def hit(self, num_bytes: int, seconds: float | None = None) -> None:
        self.stats.hits += 1
        self.stats.bytes_read += num_bytes
        self._hits.inc()
        self._read.inc(num_bytes)
        if seconds is not None:
            self.get_seconds.observe(seconds)

    def miss(self) -> None:
        self.stats.misses += 1
        self._misses.inc()

    def wrote(self, num_bytes: int, seconds: float | None = None) -> None:
        self.stats.bytes_written += num_bytes
        self._written.inc(num_bytes)
        if seconds is not None:
            self.put_seconds.observe(seconds)

    def evicted(self) -> None:
        self.stats.evictions += 1
        self._evictions.inc()

    def corrupt(self, reason: str = "format") -> None:
        """A chunk failed verification (``reason`` as in ChunkFormatError) and was dropped."""
        self.stats.corrupt += 1
        self._corrupt.inc()
        _REJECTED.labels(self._tier, reason).inc()

    def dropped(self) -> None:
        self.stats.dropped_writes += 1
        self._dropped.inc()

    def error(self, op: str) -> None:
        self.stats.errors += 1
        _ERRORS.labels(self._tier, op).inc()

    def snapshot(self, entries: int, used: int, capacity: int) -> TierStats:
        """A copy of the counters with the given sizes (and the gauges set, for tiers that
        did not pass a gauge function)."""
        if not self._watched:
            self.used_bytes.set(used)
            self.entries.set(entries)
        s = self.stats
        return replace(
            s, entries=entries, bytes_used=used, capacity_bytes=capacity, extra=dict(s.extra)
        )
