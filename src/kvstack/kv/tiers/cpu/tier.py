"""``cpu://?size=8GiB&policy=lru&pin_memory=false`` — chunks in this process's DRAM.

Memory comes from one arena of ``size`` bytes (see :mod:`.arena`), so a full cache
stores at memcpy speed instead of paying page faults on fresh allocations. Eviction order comes
from a pluggable policy (``lru``, ``fifo``, ``s3fifo``).

Leases (pinning): ``get`` and ``borrow`` return a tensor whose storage holds a lease on the
entry; every view of it keeps the lease. While leased, an entry is never evicted and its memory
never reused; a leased entry that is removed disappears from the index at once and its memory
returns to the arena when the last view is gone. ``get_into`` holds a lease while it copies.

Eviction offers the evicted chunk to listeners (``TierEvent.chunk``, a leased view) before its
memory is reused, so the cache can demote it. Leased entries (and entries whose views a slower
tier's write queue still holds, in write-through) are not evictable; when nothing evictable is
left, a put fails soft (``False``, counted as dropped). With ``pin_memory=true`` (needs CUDA) the
arena is page-locked for fast host-to-device copies.
"""

from __future__ import annotations

import math
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from kvstack.errors import ConfigError
from kvstack.kv.keys import ChunkKey
from kvstack.kv.policy import make_policy
from kvstack.kv.tensors import torch
from kvstack.kv.tiers.base import Tier, TierEvent, TierStats, TierURL
from kvstack.kv.tiers.cpu.arena import Arena, extent_bytes
from kvstack.kv.tiers.metrics import TierMetrics
from kvstack.kv.trust import ChunkTrust
from kvstack.section import parse_size

__all__ = ["CPUTier"]

DEFAULT_SIZE = "1GiB"


@dataclass(eq=False)
class _Entry:
    offset: int
    num_bytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    leases: int = 0
    live: bool = True  # False once removed or evicted; memory returns when leases end


class CPUTier(Tier):
    scheme = "cpu"
    put_copies = True

    def __init__(
        self,
        capacity_bytes: int,
        policy: str = "lru",
        pin_memory: bool = False,
        name: str = "cpu",
    ) -> None:
        super().__init__(name)
        if capacity_bytes <= 0:
            raise ConfigError(f"cpu tier size must be > 0 bytes, got {capacity_bytes}")
        if pin_memory and not torch.cuda.is_available():
            raise ConfigError("cpu tier pin_memory=true needs CUDA, which is not available")
        self.capacity_bytes = capacity_bytes
        self._arena = Arena(capacity_bytes, pin_memory)
        self._policy = make_policy(policy)
        self._entries: dict[ChunkKey, _Entry] = {}
        self._reserved: dict[ChunkKey, _Entry] = {}  # puts being copied or prepared
        self._live_bytes = 0  # extents of published entries
        self._zombie_bytes = 0  # extents of removed entries that are still leased
        self._released: deque[_Entry] = deque()  # leases ended while the lock was busy
        self._lock = threading.Lock()
        self._closed = False
        self._metrics = TierMetrics(name, self._gauges)

    @classmethod
    def from_url(cls, url: TierURL, name: str = "cpu", trust: ChunkTrust | None = None) -> CPUTier:
        """``trust`` is kept for the peer server, which seals what it lends from this tier;
        reads of this process's own memory are not checked (see :mod:`kvstack.kv.seal`)."""
        size = parse_size(url.pop("size", DEFAULT_SIZE) or DEFAULT_SIZE, "cpu tier size")
        policy = url.pop("policy", "lru") or "lru"
        pin = (url.pop("pin_memory", "false") or "false").lower() in ("1", "true", "yes")
        url.reject_unknown()
        tier = cls(size, policy=policy, pin_memory=pin, name=name)
        tier.trust = trust or tier.trust
        return tier

    # -- reads -----------------------------------------------------------------------------
    def contains(self, key: ChunkKey) -> bool:
        return key in self._entries

    def contains_many(self, keys: Sequence[ChunkKey]) -> list[bool]:
        entries = self._entries
        return [k in entries for k in keys]

    def get(self, key: ChunkKey) -> torch.Tensor | None:
        start = time.perf_counter()
        with self._lock:
            self._drain()
            entry = self._entries.get(key)
            if entry is None:
                self._metrics.miss()
                return None
            self._policy.on_access(key)
            leased = self._lease(entry)
        self._metrics.hit(entry.num_bytes, time.perf_counter() - start)
        return leased

    def borrow(self, key: ChunkKey) -> torch.Tensor | None:
        with self._lock:
            entry = self._entries.get(key)
            return None if entry is None else self._lease(entry)

    def get_into(self, key: ChunkKey, out: torch.Tensor) -> bool:
        start = time.perf_counter()
        with self._lock:
            self._drain()
            entry = self._entries.get(key)
            if entry is None or entry.dtype != out.dtype or entry.shape != tuple(out.shape):
                self._metrics.miss()
                return False
            self._policy.on_access(key)
            entry.leases += 1
        try:
            out.copy_(self._tensor(entry))  # blocking: the memory is reusable right after
        finally:
            self._release(entry)
        self._metrics.hit(entry.num_bytes, time.perf_counter() - start)
        return True

    # -- writes ----------------------------------------------------------------------------
    def put(self, key: ChunkKey, chunk: torch.Tensor) -> bool:
        start = time.perf_counter()
        if key in self._entries or key in self._reserved:
            return True
        entry = self._reserve(key, chunk.dtype, tuple(chunk.shape))
        if entry is None:
            return key in self._entries or key in self._reserved
        ok = False
        try:
            self._tensor(entry).copy_(chunk)
            ok = True
        finally:
            self._finish(key, entry, ok)
        self._metrics.wrote(entry.num_bytes, time.perf_counter() - start)
        return True

    def prepare_put(
        self, key: ChunkKey, dtype: torch.dtype, shape: tuple[int, ...]
    ) -> torch.Tensor | None:
        if key in self._entries or key in self._reserved:
            return None
        entry = self._reserve(key, dtype, tuple(shape))
        return None if entry is None else self._tensor(entry)

    def complete_put(self, key: ChunkKey, ok: bool) -> bool:
        with self._lock:
            entry = self._reserved.get(key)
        if entry is None:
            return False
        published = self._finish(key, entry, ok)
        if published:
            self._metrics.wrote(entry.num_bytes, 0.0)
        return published

    def _reserve(self, key: ChunkKey, dtype: torch.dtype, shape: tuple[int, ...]) -> _Entry | None:
        """Reserve an extent for the chunk, evicting (and announcing evictions) as needed."""
        num_bytes = math.prod(shape) * dtype.itemsize
        need = extent_bytes(num_bytes)
        while True:
            with self._lock:
                self._drain()
                if self._closed or key in self._entries or key in self._reserved:
                    return None
                offset = self._arena.alloc(num_bytes)
                if offset is not None:
                    entry = _Entry(offset, num_bytes, dtype, shape)
                    self._reserved[key] = entry
                    return entry
                held_before = self._zombie_bytes
                victims = self._evict(need) if need <= self._reclaimable() else []
            if not victims:
                self._metrics.dropped()
                return None
            self._announce(victims)
            with self._lock:
                self._drain()
                kept = self._zombie_bytes > held_before
            if kept:  # listeners hold on to evicted chunks: evicting more would not help
                self._metrics.dropped()
                return None

    def _reclaimable(self) -> int:
        """Under the lock: bytes the arena could offer if every published entry went."""
        return self._arena.free_bytes + self._live_bytes

    def _evict(self, need: int) -> list[tuple[ChunkKey, torch.Tensor | None]]:
        """Under the lock: evict victims worth the shortfall (at least one, for fragmentation)."""
        victims: list[tuple[ChunkKey, torch.Tensor | None]] = []
        announced = 0  # bytes that return to the arena once listeners let go
        while not victims or self._arena.free_bytes + announced < need:
            victim = self._policy.evict(lambda k: self._entries[k].leases == 0)  # type: ignore[index]
            if victim is None:
                break
            key = ChunkKey(victim)  # type: ignore[arg-type]
            entry = self._entries.pop(key)
            view = self._lease(entry) if self._listeners else None  # offered for demotion
            self._retire(entry)
            announced += extent_bytes(entry.num_bytes) if view is not None else 0
            victims.append((key, view))
        return victims

    def _announce(self, victims: list[tuple[ChunkKey, torch.Tensor | None]]) -> None:
        """Outside the lock: tell listeners; their dropping the view frees the memory."""
        while victims:
            key, view = victims.pop(0)
            self._metrics.evicted()
            self._emit(TierEvent("removed", self.name, key, view, reason="evicted"))
            del view

    def _finish(self, key: ChunkKey, entry: _Entry, ok: bool) -> bool:
        with self._lock:
            self._reserved.pop(key, None)
            publish = ok and not self._closed
            if publish:
                self._entries[key] = entry
                self._live_bytes += extent_bytes(entry.num_bytes)
                self._policy.on_insert(key)
            else:
                self._arena.free(entry.offset, entry.num_bytes)
        if publish:
            self._emit(TierEvent("stored", self.name, key))
        return publish

    def remove(self, key: ChunkKey) -> bool:
        with self._lock:
            self._drain()
            entry = self._entries.pop(key, None)
            if entry is None:
                return False
            self._policy.on_remove(key)
            self._retire(entry)
        self._emit(TierEvent("removed", self.name, key, reason="removed"))
        return True

    # -- leases ----------------------------------------------------------------------------
    def _tensor(self, entry: _Entry) -> torch.Tensor:
        raw = self._arena.view(entry.offset, entry.num_bytes)
        return raw.view(entry.dtype).view(entry.shape)

    def _lease(self, entry: _Entry) -> torch.Tensor:
        """Under the lock: a tensor with its own storage whose last view ends the lease."""
        entry.leases += 1
        raw, holder = self._arena.owned_view(entry.offset, entry.num_bytes)
        weakref.finalize(holder, self._lease_ended, entry)
        return raw.view(entry.dtype).view(entry.shape)

    def _lease_ended(self, entry: _Entry) -> None:
        # May run inside any allocation (GC), even while this thread holds the lock: queue
        # the release and apply it now only if the lock is free.
        self._released.append(entry)
        if self._lock.acquire(blocking=False):
            try:
                self._drain()
            finally:
                self._lock.release()

    def _release(self, entry: _Entry) -> None:
        with self._lock:
            self._released.append(entry)
            self._drain()

    def _drain(self) -> None:
        """Under the lock: apply queued lease releases."""
        while self._released:
            entry = self._released.popleft()
            entry.leases -= 1
            if not entry.live and entry.leases == 0:
                self._zombie_bytes -= extent_bytes(entry.num_bytes)
                self._arena.free(entry.offset, entry.num_bytes)

    def _retire(self, entry: _Entry) -> None:
        """Under the lock: an entry left the index; free its memory now or when leases end."""
        entry.live = False
        self._live_bytes -= extent_bytes(entry.num_bytes)
        if entry.leases:
            self._zombie_bytes += extent_bytes(entry.num_bytes)
        else:
            self._arena.free(entry.offset, entry.num_bytes)

    # -- bookkeeping -----------------------------------------------------------------------
    def _gauges(self) -> tuple[int, int]:
        return len(self._entries), self._live_bytes + self._zombie_bytes

    def keys(self) -> Iterator[ChunkKey]:
        """The keys stored now (a snapshot), for full syncs with the cluster index."""
        with self._lock:
            return iter(list(self._entries))

    def stats(self) -> TierStats:
        with self._lock:
            self._drain()
            stats = self._metrics.snapshot(
                len(self._entries), self._live_bytes + self._zombie_bytes, self.capacity_bytes
            )
            stats.extra["leased_entries"] = float(
                sum(1 for e in self._entries.values() if e.leases)
            )
            stats.extra["leased_removed_bytes"] = float(self._zombie_bytes)
            stats.extra["reserved_entries"] = float(len(self._reserved))
            return stats

    def check_integrity(self) -> None:
        with self._lock:
            self._drain()
            assert self._policy.keys() == set(self._entries), "policy and entries disagree"
            live = sum(extent_bytes(e.num_bytes) for e in self._entries.values())
            reserved = sum(extent_bytes(e.num_bytes) for e in self._reserved.values())
            assert live == self._live_bytes, f"live bytes {self._live_bytes}, entries hold {live}"
            assert all(e.leases >= 0 for e in self._entries.values()), "negative lease count"
            assert self._zombie_bytes >= 0, f"negative leased-removed bytes {self._zombie_bytes}"
            self._arena.check(live + reserved + self._zombie_bytes)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for key, entry in list(self._entries.items()):
                self._policy.on_remove(key)
                self._retire(entry)
            self._entries.clear()
            self._arena.release()  # leased views keep their own memory alive
