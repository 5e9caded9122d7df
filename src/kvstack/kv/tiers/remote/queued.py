"""QueuedRemoteTier: the base of remote tiers that write through a background queue (redis, s3).

What such a tier does the same way whatever its store, so that it exists once:

- ``put`` hands the chunk to a :class:`~kvstack.kv.tiers.writer.BackgroundWriter` and never
  waits on the network; an open breaker or a full queue drops the write (counted).
- Reads serve a chunk that is still queued from memory (a write-through store is visible at
  once) and ask the store for the rest: ``get`` / ``get_into`` / ``get_many_into`` call the
  subclass's ``_read(keys, outs)`` for what the queue does not have.
- ``remove`` cancels a queued write and deletes the stored copy. A write already in flight is
  undone when it lands (:meth:`_settle_writes`), so a removed chunk stays removed.

A subclass implements ``_read``, ``_contains_remote``, ``_delete_stored`` and its writes
(``_write_jobs``, which ends with ``_settle_writes``), and calls this ``__init__`` last, once
what its writer threads use exists.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import NamedTuple

from kvstack.kv.keys import ChunkKey
from kvstack.kv.tensors import torch
from kvstack.kv.tiers.base import Tier, TierEvent, TierStats
from kvstack.kv.tiers.metrics import TierMetrics
from kvstack.kv.tiers.remote.breaker import CircuitBreaker
from kvstack.kv.tiers.writer import BackgroundWriter, CancelOutcome, WriteJob
from kvstack.kv.trust import ChunkTrust

__all__ = ["QueuedRemoteTier", "WriteQueueLimits"]


class WriteQueueLimits(NamedTuple):
    max_chunks: int
    max_bytes: int
    max_batch: int
    num_threads: int = 1


class QueuedRemoteTier(Tier):
    shared = True

    def __init__(
        self,
        name: str,
        breaker: CircuitBreaker,
        limits: WriteQueueLimits,
        trust: ChunkTrust | None = None,
    ) -> None:
        super().__init__(name, trust)
        self._breaker = breaker
        self._metrics = TierMetrics(name)
        self._writer = BackgroundWriter(
            name,
            self._write_jobs,
            max_chunks=limits.max_chunks,
            max_bytes=limits.max_bytes,
            max_batch=limits.max_batch,
            num_threads=limits.num_threads,
        )

    # -- what a subclass provides ----------------------------------------------------------
    @abstractmethod
    def _read(
        self, keys: Sequence[ChunkKey], outs: Sequence[torch.Tensor | None]
    ) -> list[torch.Tensor | None]:
        """Read from the store into ``outs`` (a new tensor where None); counts hits and misses."""

    @abstractmethod
    def _contains_remote(self, keys: Sequence[ChunkKey]) -> list[bool]:
        """Whether the store has each key; shorter (even empty) when it could not answer."""

    @abstractmethod
    def _delete_stored(self, keys: Sequence[ChunkKey]) -> bool:
        """Delete the stored copies; whether any existed."""

    @abstractmethod
    def _write_jobs(self, jobs: list[WriteJob]) -> None:
        """On a writer thread: store the chunks, then :meth:`_settle_writes`."""

    def _known_stored(self, key: ChunkKey) -> bool:
        """Known to be stored without asking the store (a subclass may remember keys)."""
        return False

    # -- reads -----------------------------------------------------------------------------
    def contains(self, key: ChunkKey) -> bool:
        return self.contains_many([key])[0]

    def contains_many(self, keys: Sequence[ChunkKey]) -> list[bool]:
        found = [self._writer.pending(k) or self._known_stored(k) for k in keys]
        todo = [i for i, hit in enumerate(found) if not hit]
        answers = self._contains_remote([keys[i] for i in todo]) if todo else []
        for i, hit in zip(todo, answers, strict=False):
            found[i] = hit  # no answer (breaker open, failure): those keys stay misses
        return found

    def get(self, key: ChunkKey) -> torch.Tensor | None:
        queued = self._writer.queued_chunk(key)
        if queued is not None:
            self._metrics.hit(queued.numel() * queued.element_size())
            return queued
        return self._read([key], [None])[0]

    def get_into(self, key: ChunkKey, out: torch.Tensor) -> bool:
        return self.get_many_into([key], [out])[0]

    def get_many_into(self, keys: Sequence[ChunkKey], outs: Sequence[torch.Tensor]) -> list[bool]:
        loaded = [self._copy_queued(k, o) for k, o in zip(keys, outs, strict=True)]
        todo = [i for i, hit in enumerate(loaded) if not hit]
        got = self._read([keys[i] for i in todo], [outs[i] for i in todo]) if todo else []
        for i, chunk in zip(todo, got, strict=True):
            loaded[i] = chunk is not None
        return loaded

    def _copy_queued(self, key: ChunkKey, out: torch.Tensor) -> bool:
        queued = self._writer.queued_chunk(key)
        if queued is None or queued.dtype != out.dtype or queued.shape != out.shape:
            return False
        out.copy_(queued)
        self._metrics.hit(queued.numel() * queued.element_size())
        return True

    # -- writes ----------------------------------------------------------------------------
    def put(self, key: ChunkKey, chunk: torch.Tensor) -> bool:
        if self._breaker.state == "open" or not self._writer.submit(key, chunk):
            self._metrics.dropped()
            return False
        return True

    def _settle_writes(self, keys: Sequence[ChunkKey], stored: Sequence[bool]) -> None:
        """After a batch: announce what was stored, count what was not, and delete again what
        was removed while its write was in flight."""
        undo = []
        for key, ok in zip(keys, stored, strict=True):
            if not ok:
                self._metrics.dropped()
            elif self._writer.is_cancelled(key):
                undo.append(key)
            else:
                self._emit(TierEvent("stored", self.name, key))
        if undo:
            self._delete_stored(undo)

    def remove(self, key: ChunkKey) -> bool:
        queued = self._writer.cancel(key) is not CancelOutcome.ABSENT
        existed = self._delete_stored([key])
        if queued or existed:
            self._emit(TierEvent("removed", self.name, key, reason="removed"))
        return queued or existed

    # -- lifecycle -------------------------------------------------------------------------
    def flush(self, timeout_s: float | None = None) -> bool:
        return self._writer.flush(timeout_s)

    def drop_queued(self) -> int:
        return self._writer.drop_queued()

    def stats(self) -> TierStats:
        stats = self._metrics.snapshot(0, 0, 0)
        stats.extra["queued_writes"] = float(self._writer.num_queued)
        stats.extra["breaker_trips"] = float(self._breaker.trips)
        stats.extra["breaker_open"] = float(self._breaker.state != "closed")
        return stats
