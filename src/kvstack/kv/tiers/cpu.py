"""``cpu://?size=8GiB&policy=lru&pin_memory=false`` — chunks in this process's DRAM.

Memory comes from one arena of ``size`` bytes (see :mod:`kvstack.kv.arena`), so a full cache
stores at memcpy speed instead of paying page faults on fresh allocations. Eviction order comes
from a pluggable policy (``lru``, ``fifo``, ``s3fifo``).

Entries in use are leased: ``get`` returns a tensor whose lifetime holds a lease, and
``get_into`` holds one while it copies. A leased entry is pinned — never evicted, its memory
never reused — until the lease ends (the returned tensor object is garbage-collected). Keep the
returned tensor object alive for as long as you read it or views of it. With
``pin_memory=true`` (needs CUDA) the arena is page-locked for fast host-to-device copies.
"""

from __future__ import annotations

import threading
import time
import weakref
from dataclasses import dataclass

from kvstack.errors import ConfigError
from kvstack.kv.arena import Arena, _aligned
from kvstack.kv.keys import ChunkKey
from kvstack.kv.policy import make_policy
from kvstack.kv.tensors import torch
from kvstack.kv.tiers.base import Tier, TierEvent, TierStats, TierURL
from kvstack.kv.tiers.metrics import TierMetrics
from kvstack.section import parse_size

__all__ = ["CPUTier"]

DEFAULT_SIZE = "1GiB"


@dataclass(eq=False)
class _Entry:
    tensor: torch.Tensor  # typed view into the arena
    offset: int
    num_bytes: int
    leases: int = 0
    live: bool = True  # False once removed; memory returns to the arena when leases end


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
        self._pending: set[ChunkKey] = set()
        self._lock = threading.Lock()
        self._metrics = TierMetrics(name)

    @classmethod
    def from_url(cls, url: TierURL, name: str = "cpu") -> CPUTier:
        size = parse_size(url.pop("size", DEFAULT_SIZE) or DEFAULT_SIZE, "cpu tier size")
        policy = url.pop("policy", "lru") or "lru"
        pin = (url.pop("pin_memory", "false") or "false").lower() in ("1", "true", "yes")
        url.reject_unknown()
        return cls(size, policy=policy, pin_memory=pin, name=name)

    # -- reads -----------------------------------------------------------------------------
    def contains(self, key: ChunkKey) -> bool:
        return key in self._entries

    def contains_many(self, keys: list[ChunkKey]) -> list[bool]:  # type: ignore[override]
        entries = self._entries
        return [k in entries for k in keys]

    def get(self, key: ChunkKey) -> torch.Tensor | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self._metrics.miss()
                return None
            self._policy.on_access(key)
            leased = self._lease(entry)
        self._metrics.hit(entry.num_bytes)
        return leased

    def borrow(self, key: ChunkKey) -> torch.Tensor | None:
        with self._lock:
            entry = self._entries.get(key)
            return None if entry is None else self._lease(entry)

    def get_into(self, key: ChunkKey, out: torch.Tensor) -> bool:
        start = time.perf_counter()
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry.tensor.dtype != out.dtype or entry.tensor.shape != out.shape:
                self._metrics.miss()
                return False
            self._policy.on_access(key)
            entry.leases += 1
        try:
            out.copy_(entry.tensor, non_blocking=out.device.type != "cpu")
        finally:
            self._release(entry)
        self._metrics.hit(entry.num_bytes)
        self._metrics.get_seconds.observe(time.perf_counter() - start)
        return True

    def _lease(self, entry: _Entry) -> torch.Tensor:
        """Under the lock: a new tensor object whose lifetime pins ``entry``."""
        entry.leases += 1
        view = entry.tensor.view(entry.tensor.shape)
        weakref.finalize(view, self._release, entry)
        return view

    def _release(self, entry: _Entry) -> None:
        with self._lock:
            entry.leases -= 1
            if not entry.live and entry.leases == 0:
                self._arena.free(entry.offset, entry.num_bytes)

    # -- writes ----------------------------------------------------------------------------
    def put(self, key: ChunkKey, chunk: torch.Tensor) -> bool:
        start = time.perf_counter()
        num_bytes = chunk.numel() * chunk.element_size()
        with self._lock:
            if key in self._entries or key in self._pending:
                return True
            offset, victims = self._alloc(num_bytes)
            if offset is None:
                self._metrics.dropped()
                return False
            self._pending.add(key)
        self._announce_evictions(victims)
        try:
            tensor = self._arena.view(offset, num_bytes).view(chunk.dtype).view(chunk.shape)
            tensor.copy_(chunk)
        except BaseException:
            with self._lock:
                self._pending.discard(key)
                self._arena.free(offset, num_bytes)
            raise
        with self._lock:
            self._pending.discard(key)
            self._entries[key] = _Entry(tensor, offset, num_bytes)
            self._policy.on_insert(key)
        self._metrics.wrote(num_bytes)
        self._metrics.put_seconds.observe(time.perf_counter() - start)
        self._emit(TierEvent("stored", self.name, key))
        return True

    def _alloc(self, num_bytes: int) -> tuple[int | None, list[tuple[ChunkKey, _Entry]]]:
        """Under the lock: evict until an extent fits; its offset and the leased victims."""
        victims: list[tuple[ChunkKey, _Entry]] = []
        if _aligned(num_bytes) > self._arena.capacity_bytes:
            return None, victims
        while (offset := self._arena.alloc(num_bytes)) is None:
            victim = self._policy.evict(lambda k: self._entries[k].leases == 0)  # type: ignore[index]
            if victim is None:
                return None, victims  # everything left is leased; evicted victims stay evicted
            entry = self._entries.pop(victim)  # type: ignore[call-overload]
            entry.live = False
            entry.leases += 1  # held until the eviction has been announced (demotion)
            victims.append((victim, entry))  # type: ignore[arg-type]
        return offset, victims

    def _announce_evictions(self, victims: list[tuple[ChunkKey, _Entry]]) -> None:
        for key, entry in victims:
            self._metrics.evicted()
            with self._lock:
                chunk = self._lease(entry)
            self._emit(TierEvent("removed", self.name, key, chunk, reason="evicted"))
            del chunk
            self._release(entry)

    def remove(self, key: ChunkKey) -> bool:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry.leases:
                return False
            del self._entries[key]
            self._policy.on_remove(key)
            entry.live = False
            self._arena.free(entry.offset, entry.num_bytes)
        self._emit(TierEvent("removed", self.name, key, reason="removed"))
        return True

    # -- bookkeeping -----------------------------------------------------------------------
    def stats(self) -> TierStats:
        with self._lock:
            used = self._arena.capacity_bytes - self._arena.free_bytes
            return self._metrics.snapshot(len(self._entries), used, self.capacity_bytes)

    def check_integrity(self) -> None:
        with self._lock:
            assert not self._pending, f"pending puts left: {len(self._pending)}"
            assert self._policy.keys() == set(self._entries), "policy and entries disagree"
            leased = [e for e in self._entries.values() if e.leases]
            assert not leased, f"{len(leased)} entries still leased"
            self._arena.check(sum(_aligned(e.num_bytes) for e in self._entries.values()))

    def close(self) -> None:
        with self._lock:
            for key in list(self._entries):
                self._policy.on_remove(key)
            self._entries.clear()
