"""A bounded set of chunk keys known to be stored remotely (written or read by this process),
so ``contains`` can answer without a round trip. Content-addressed chunks never change, so the
only risk is a key removed elsewhere: ``contains`` may then say yes and ``get`` misses, which
the tier contract allows."""

from __future__ import annotations

import threading
from collections import OrderedDict

from kvstack.kv.keys import ChunkKey

__all__ = ["KnownKeys"]


class KnownKeys:
    def __init__(self, capacity: int = 1 << 20) -> None:
        self.capacity = capacity
        self._keys: OrderedDict[ChunkKey, None] = OrderedDict()
        self._lock = threading.Lock()

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._keys

    def add(self, key: ChunkKey) -> None:
        with self._lock:
            self._keys[key] = None
            self._keys.move_to_end(key)
            if len(self._keys) > self.capacity:
                self._keys.popitem(last=False)

    def discard(self, key: ChunkKey) -> None:
        with self._lock:
            self._keys.pop(key, None)
