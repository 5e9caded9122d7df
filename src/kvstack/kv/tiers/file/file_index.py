"""The file tier's index: which chunk files this process knows of, their sizes, their eviction
order and the byte budget.

A write first reserves its bytes (:meth:`FileIndex.reserve`, which picks eviction victims for the
caller to delete), then commits the key once the file is in place or releases the reservation
if the write failed. Thread-safe; knows nothing of files or I/O.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from kvstack.kv.keys import ChunkKey
from kvstack.kv.policy import make_policy

__all__ = ["FileIndex"]


class FileIndex:
    def __init__(self, capacity_bytes: int, policy: str) -> None:
        self.capacity_bytes = capacity_bytes
        self._sizes: dict[ChunkKey, int] = {}  # key -> file size in bytes
        self._policy = make_policy(policy)
        self._used = 0  # indexed sizes plus reservations of writes in progress
        self._lock = threading.Lock()

    def __contains__(self, key: object) -> bool:
        return key in self._sizes

    def seen(self, key: ChunkKey, size: int) -> None:
        """Count an access to ``key``, indexing it with ``size`` if it is not indexed yet (at
        start, when the directory is scanned)."""
        with self._lock:
            if key in self._sizes:
                self._policy.on_access(key)
                return
            self._sizes[key] = size
            self._policy.on_insert(key)
            self._used += size

    def adopt(self, key: ChunkKey, probe: Callable[[], int | None]) -> bool:
        """Whether ``key`` is indexed, or adopted now: ``probe()`` gives the size of its file
        (written by another process sharing the directory) or None. The probe runs under the
        lock, so it cannot race with an eviction that deletes the file."""
        with self._lock:
            if key in self._sizes:
                self._policy.on_access(key)
                return True
            size = probe()
            if size is None:
                return False
            self._sizes[key] = size
            self._policy.on_insert(key)
            self._used += size
            return True

    def forget(self, key: ChunkKey) -> bool:
        """Drop ``key``; False if it was not indexed."""
        with self._lock:
            size = self._sizes.pop(key, None)
            if size is None:
                return False
            self._policy.on_remove(key)
            self._used -= size
            return True

    def reserve(self, size: int, delete: Callable[[ChunkKey], None]) -> tuple[bool, list[ChunkKey]]:
        """Make room for ``size`` bytes and reserve them; whether that worked, and the keys
        evicted for it. ``delete(key)`` removes a victim's file under the lock (so a concurrent
        :meth:`adopt` never indexes a file that is about to go)."""
        victims: list[ChunkKey] = []
        with self._lock:
            while self._used + size > self.capacity_bytes:
                victim = self._policy.evict(lambda _k: True)
                if victim is None:
                    break
                key = ChunkKey(victim)  # type: ignore[arg-type]
                self._used -= self._sizes.pop(key)
                delete(key)
                victims.append(key)
            fits = self._used + size <= self.capacity_bytes
            if fits:
                self._used += size
            return fits, victims

    def release(self, size: int) -> None:
        """Give back a reservation whose write did not happen."""
        with self._lock:
            self._used -= size

    def commit(
        self,
        key: ChunkKey,
        size: int,
        cancelled: Callable[[], bool],
        delete: Callable[[ChunkKey], None],
    ) -> bool:
        """Index a written file of ``size`` reserved bytes; False if ``cancelled()`` says it was
        removed while being written: then the reservation is released, an entry adopted
        meanwhile dropped, and ``delete(key)`` removes the file. Both run under the index lock,
        so they are ordered with removals and adoptions, which take the lock too."""
        with self._lock:
            if cancelled():
                self._used -= size
                adopted = self._sizes.pop(key, None)
                if adopted is not None:
                    self._policy.on_remove(key)
                    self._used -= adopted
                delete(key)
                return False
            if key in self._sizes:  # adopted meanwhile: the reservation is not needed
                self._used -= size
                return True
            self._sizes[key] = size
            self._policy.on_insert(key)
            return True

    def locked(self) -> threading.Lock:
        """The index lock, for callers that must order an action with :meth:`commit`."""
        return self._lock

    def usage(self) -> tuple[int, int]:
        """(entries, used bytes)."""
        return len(self._sizes), self._used

    def snapshot(self) -> dict[ChunkKey, int]:
        with self._lock:
            return dict(self._sizes)

    def check(self) -> None:
        """Raise AssertionError if sizes, budget and policy disagree (call when no write runs)."""
        with self._lock:
            assert sum(self._sizes.values()) == self._used, "used bytes != sum of indexed sizes"
            assert self._used <= self.capacity_bytes, "over capacity"
            assert self._policy.keys() == set(self._sizes), "policy and index disagree"
