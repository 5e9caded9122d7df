"""Eviction policies: small strategy classes that only order keys; the tier owns the bytes.

A policy sees every insert, access and removal of the tier's keys and proposes victims. The tier
asks ``evict(can_evict)`` for one victim at a time and skips keys it cannot evict (pinned), so a
policy never needs to know about pins or sizes.

- ``lru``: least recently used first.
- ``fifo``: insertion order, accesses ignored.
- ``s3fifo``: S3-FIFO (Yang et al., SOSP'23): a small probationary FIFO (10% of entries), a main
  FIFO and a ghost set of recently evicted keys. One-hit wonders leave through the small queue
  without displacing the main queue, so a large scan does not flush the working set.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Hashable

from kvstack.registry import Registry

__all__ = ["POLICIES", "EvictionPolicy", "FIFOPolicy", "LRUPolicy", "S3FIFOPolicy", "make_policy"]

Key = Hashable


class EvictionPolicy(ABC):
    """Orders the keys of one tier for eviction. Not thread-safe: the tier holds its lock."""

    @abstractmethod
    def on_insert(self, key: Key) -> None:
        """A new key was stored (never called for a key already tracked)."""

    @abstractmethod
    def on_access(self, key: Key) -> None:
        """A tracked key was read."""

    @abstractmethod
    def on_remove(self, key: Key) -> None:
        """A tracked key was removed for a reason other than :meth:`evict` (no-op if unknown)."""

    @abstractmethod
    def evict(self, can_evict: Callable[[Key], bool]) -> Key | None:
        """Choose, stop tracking and return one victim for which ``can_evict`` is true, or None."""

    @abstractmethod
    def keys(self) -> set[Key]:
        """Every tracked key (for integrity checks)."""


class LRUPolicy(EvictionPolicy):
    def __init__(self) -> None:
        self._order: OrderedDict[Key, None] = OrderedDict()

    def on_insert(self, key: Key) -> None:
        self._order[key] = None

    def on_access(self, key: Key) -> None:
        if key in self._order:
            self._order.move_to_end(key)

    def on_remove(self, key: Key) -> None:
        self._order.pop(key, None)

    def evict(self, can_evict: Callable[[Key], bool]) -> Key | None:
        for key in self._order:
            if can_evict(key):
                del self._order[key]
                return key
        return None

    def keys(self) -> set[Key]:
        return set(self._order)


class FIFOPolicy(LRUPolicy):
    def on_access(self, key: Key) -> None:
        pass


class S3FIFOPolicy(EvictionPolicy):
    SMALL_FRACTION = 0.1
    MAX_FREQ = 3

    def __init__(self) -> None:
        self._small: OrderedDict[Key, None] = OrderedDict()
        self._main: OrderedDict[Key, None] = OrderedDict()
        self._ghost: OrderedDict[Key, None] = OrderedDict()
        self._freq: dict[Key, int] = {}

    def on_insert(self, key: Key) -> None:
        self._freq[key] = 0
        if key in self._ghost:  # evicted recently and wanted again: straight to main
            del self._ghost[key]
            self._main[key] = None
        else:
            self._small[key] = None

    def on_access(self, key: Key) -> None:
        if key in self._freq:
            self._freq[key] = min(self._freq[key] + 1, self.MAX_FREQ)

    def on_remove(self, key: Key) -> None:
        self._small.pop(key, None)
        self._main.pop(key, None)
        self._freq.pop(key, None)

    def evict(self, can_evict: Callable[[Key], bool]) -> Key | None:
        total = len(self._small) + len(self._main)
        # Bounded passes: each key is moved at most MAX_FREQ + 1 times before it is a candidate.
        for _ in range((self.MAX_FREQ + 2) * max(total, 1)):
            if not self._small and not self._main:
                return None
            if (self._small and len(self._small) >= self.SMALL_FRACTION * total) or not self._main:
                victim = self._evict_small(can_evict)
            else:
                victim = self._evict_main(can_evict)
            if victim is not None:
                return victim
        return self._fallback(can_evict)

    def _evict_small(self, can_evict: Callable[[Key], bool]) -> Key | None:
        key = next(iter(self._small))
        del self._small[key]
        if self._freq[key] > 0:  # seen again while probationary: promote
            self._freq[key] = 0
            self._main[key] = None
            return None
        if not can_evict(key):
            self._small[key] = None
            return None
        del self._freq[key]
        self._ghost[key] = None
        while len(self._ghost) > max(len(self._main), 16):
            self._ghost.popitem(last=False)
        return key

    def _evict_main(self, can_evict: Callable[[Key], bool]) -> Key | None:
        key = next(iter(self._main))
        del self._main[key]
        if self._freq[key] > 0 or not can_evict(key):
            self._freq[key] = max(self._freq[key] - 1, 0)
            self._main[key] = None
            return None
        del self._freq[key]
        return key

    def _fallback(self, can_evict: Callable[[Key], bool]) -> Key | None:
        for queue in (self._small, self._main):
            for key in queue:
                if can_evict(key):
                    self.on_remove(key)
                    return key
        return None

    def keys(self) -> set[Key]:
        return set(self._small) | set(self._main)


POLICIES: Registry[Callable[[], EvictionPolicy]] = Registry("eviction policy")
POLICIES.register("lru", LRUPolicy)
POLICIES.register("fifo", FIFOPolicy)
POLICIES.register("s3fifo", S3FIFOPolicy)


def make_policy(name: str) -> EvictionPolicy:
    """A new policy by name (``lru``, ``fifo``, ``s3fifo``); unknown names raise ConfigError."""
    return POLICIES.get(name)()
