"""Per-adapter request statistics on one engine: a decayed request rate (the ``qps_30m`` fact),
the last request time, and errors since the last load. Kept after an adapter goes cold (like a
ghost list), so an adapter that returns is recognised as popular; idle entries are pruned."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["AdapterStats", "StatsTable"]


@dataclass(slots=True)
class AdapterStats:
    decayed_count: float = 0.0
    updated_at: float = 0.0
    last_request_at: float = 0.0
    loaded_at: float = 0.0
    requests_since_load: int = 0
    errors_since_load: int = 0
    load_s: dict[str, float] = field(default_factory=dict)  # last load time by starting tier

    def rate(self, now: float, window_s: float) -> float:
        """Requests per second with an exponential decay of time constant ``window_s``."""
        return self._decayed(now, window_s) / window_s

    def on_request(self, now: float, window_s: float) -> None:
        self.decayed_count = self._decayed(now, window_s) + 1.0
        self.updated_at = self.last_request_at = now

    def on_result(self, ok: bool) -> None:
        self.requests_since_load += 1
        self.errors_since_load += 0 if ok else 1

    def on_load(self, now: float) -> None:
        """Loaded (or materialised) now: idle time counts from here, errors start over."""
        self.loaded_at = now
        self.requests_since_load = self.errors_since_load = 0

    def error_rate(self) -> float:
        return (
            self.errors_since_load / self.requests_since_load if self.requests_since_load else 0.0
        )

    def idle_minutes(self, now: float) -> float:
        """Minutes since the last request or load, whichever is later (inf: neither yet)."""
        last = max(self.last_request_at, self.loaded_at)
        return math.inf if last == 0.0 else (now - last) / 60.0

    def _decayed(self, now: float, window_s: float) -> float:
        if self.decayed_count == 0.0:
            return 0.0
        return self.decayed_count * math.exp(-max(0.0, now - self.updated_at) / window_s)


class StatsTable:
    """Stats by engine-side adapter name (``adapter@version``), pruned of entries that decayed
    to nothing; :meth:`adapter_rate` sums an adapter's versions."""

    def __init__(self, window_s: float, max_entries: int = 100_000) -> None:
        self.window_s = window_s
        self.max_entries = max_entries
        self._stats: dict[str, AdapterStats] = {}
        self._versions: dict[str, set[str]] = {}  # adapter id -> its names with stats

    def get(self, name: str) -> AdapterStats:
        stats = self._stats.get(name)
        if stats is None:
            if len(self._stats) >= self.max_entries:
                self._prune()
            stats = self._stats[name] = AdapterStats()
            self._versions.setdefault(_adapter_of(name), set()).add(name)
        return stats

    def peek(self, name: str) -> AdapterStats | None:
        return self._stats.get(name)

    def adapter_rate(self, adapter_id: str, now: float, window_s: float) -> float:
        """The decayed request rate of every version of ``adapter_id`` together: popularity
        belongs to the adapter, and a version published a minute ago inherits it."""
        names = self._versions.get(adapter_id, ())
        return sum(self._stats[n].rate(now, window_s) for n in names)

    def _prune(self) -> None:
        ranked = sorted(self._stats.items(), key=lambda kv: kv[1].decayed_count)
        for name, _ in ranked[: max(1, len(ranked) // 10)]:
            del self._stats[name]
            adapter_id = _adapter_of(name)
            names = self._versions[adapter_id]
            names.discard(name)
            if not names:
                del self._versions[adapter_id]


def _adapter_of(name: str) -> str:
    return name.rpartition("@")[0] or name
