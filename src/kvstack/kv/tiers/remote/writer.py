"""A bounded background write queue for remote tiers: ``put`` never waits on the network.

``submit`` queues a chunk and returns at once; worker threads hand batches of queued chunks to
the tier's ``write_batch`` function (which pipelines them). When the queue holds ``max_chunks``
chunks or ``max_bytes`` bytes, new chunks are refused (the caller counts a dropped write): a slow
or dead remote costs memory up to that bound, never latency. Until a chunk is written, readers
can still get it from the queue (:meth:`queued_chunk`), so a write-through store is visible at
once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import NamedTuple

from kvstack.errors import ConfigError
from kvstack.kv.keys import ChunkKey
from kvstack.kv.tensors import torch

__all__ = ["BackgroundWriter", "WriteJob"]

log = logging.getLogger(__name__)


class WriteJob(NamedTuple):
    key: ChunkKey
    chunk: torch.Tensor


class BackgroundWriter:
    def __init__(
        self,
        name: str,
        write_batch: Callable[[list[WriteJob]], None],
        *,
        max_chunks: int = 64,
        max_bytes: int = 1 << 30,
        max_batch: int = 8,
        num_threads: int = 1,
    ) -> None:
        if max_chunks < 1 or max_bytes < 1 or max_batch < 1 or num_threads < 1:
            raise ConfigError(
                f"write queue limits must be >= 1 (chunks={max_chunks}, bytes={max_bytes}, "
                f"batch={max_batch}, threads={num_threads})"
            )
        self.name = name
        self.max_chunks = max_chunks
        self.max_bytes = max_bytes
        self.max_batch = max_batch
        self._write_batch = write_batch
        self._queue: OrderedDict[ChunkKey, torch.Tensor] = OrderedDict()
        self._in_flight: dict[ChunkKey, torch.Tensor] = {}
        self._queued_bytes = 0
        self._cond = threading.Condition()
        self._closed = False
        self._threads = [
            threading.Thread(target=self._loop, name=f"kvstack-{name}-writer{i}", daemon=True)
            for i in range(num_threads)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, key: ChunkKey, chunk: torch.Tensor) -> bool:
        """Queue ``chunk`` (kept by reference until written); False when full or closed."""
        num_bytes = chunk.numel() * chunk.element_size()
        with self._cond:
            if key in self._queue or key in self._in_flight:
                return True
            if self._closed or len(self._queue) + len(self._in_flight) >= self.max_chunks:
                return False
            if self._queued_bytes and self._queued_bytes + num_bytes > self.max_bytes:
                return False
            self._queue[key] = chunk
            self._queued_bytes += num_bytes
            self._cond.notify()
        return True

    def queued_chunk(self, key: ChunkKey) -> torch.Tensor | None:
        """The chunk if it is queued or being written, else None."""
        with self._cond:
            chunk = self._queue.get(key)
            return chunk if chunk is not None else self._in_flight.get(key)

    def discard(self, key: ChunkKey) -> bool:
        """Drop a queued (not yet in-flight) chunk; True if it was queued."""
        with self._cond:
            chunk = self._queue.pop(key, None)
            if chunk is None:
                return False
            self._queued_bytes -= chunk.numel() * chunk.element_size()
            self._cond.notify_all()
            return True

    @property
    def num_queued(self) -> int:
        with self._cond:
            return len(self._queue) + len(self._in_flight)

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until everything queued so far is written (or failed); False on timeout."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while self._queue or self._in_flight:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining)
        return True

    def close(self, timeout_s: float | None = 30.0) -> None:
        """Write what is queued (up to ``timeout_s``), then stop the threads. Idempotent."""
        self.flush(timeout_s)
        with self._cond:
            self._closed = True
            dropped = len(self._queue)
            self._queue.clear()
            self._queued_bytes = 0
            self._cond.notify_all()
        if dropped:
            log.warning("KV tier %s: %d queued writes dropped at close", self.name, dropped)
        for thread in self._threads:
            thread.join(timeout=timeout_s)

    def _take_batch(self) -> list[WriteJob] | None:
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            if not self._queue:
                return None
            batch: list[WriteJob] = []
            while self._queue and len(batch) < self.max_batch:
                key, chunk = self._queue.popitem(last=False)
                self._queued_bytes -= chunk.numel() * chunk.element_size()
                self._in_flight[key] = chunk
                batch.append(WriteJob(key, chunk))
            return batch

    def _loop(self) -> None:
        while (batch := self._take_batch()) is not None:
            try:
                self._write_batch(batch)
            except Exception:  # the writer thread must survive anything one batch does
                log.exception(
                    "KV tier %s: unexpected error writing %d chunks", self.name, len(batch)
                )
            finally:
                self._finish([job.key for job in batch])
                del batch  # release the chunks before waiting for more work

    def _finish(self, keys: list[ChunkKey]) -> None:
        with self._cond:
            for key in keys:
                self._in_flight.pop(key, None)
            self._cond.notify_all()
