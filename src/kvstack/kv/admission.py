"""AdmissionThreshold: store a chunk only once it was requested ``threshold`` times.

Requests are counted per chunk key by :meth:`KVCache.lookup`, :meth:`KVCache.retrieve` and
explicit :meth:`KVCache.count_requests` calls (the connector counts once per engine request;
``contains_prefix`` has no side effects). The counts live in a bounded LRU map, so memory stays
fixed; a key that falls out of it starts again from zero. Threshold 1 admits everything and
tracks nothing.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

from kvstack.kv.keys import ChunkKey

__all__ = ["AdmissionThreshold"]

DEFAULT_TRACKED_KEYS = 1 << 20


class AdmissionThreshold:
    def __init__(self, threshold: int, max_tracked: int = DEFAULT_TRACKED_KEYS) -> None:
        if threshold < 1:
            raise ValueError(f"admission threshold must be >= 1, got {threshold}")
        if max_tracked < 1:
            raise ValueError(f"admission max_tracked must be >= 1, got {max_tracked}")
        self.threshold = threshold
        self.max_tracked = max_tracked
        self._counts: OrderedDict[ChunkKey, int] = OrderedDict()
        self._lock = threading.Lock()

    def record(self, keys: Sequence[ChunkKey]) -> None:
        """Count one request for each key."""
        if self.threshold <= 1:
            return
        with self._lock:
            for key in keys:
                self._counts[key] = self._counts.pop(key, 0) + 1
            while len(self._counts) > self.max_tracked:
                self._counts.popitem(last=False)

    def admit(self, keys: Sequence[ChunkKey]) -> list[bool]:
        """Which keys may be stored now (no side effects)."""
        if self.threshold <= 1:
            return [True] * len(keys)
        with self._lock:
            return [self._counts.get(k, 0) >= self.threshold for k in keys]

    def requests(self, key: ChunkKey) -> int:
        with self._lock:
            return self._counts.get(key, 0)
