"""A bounded background write queue for the slow tiers (file, redis, s3): ``put`` never waits.

``submit`` queues a chunk and returns at once; ``num_threads`` worker threads hand batches of up
to ``max_batch`` queued chunks, in submission order, to the tier's ``write_batch`` function. The
writer holds at most ``max_chunks`` chunks (waiting or being written) and ``max_bytes`` bytes
waiting; beyond that ``submit`` returns False and the tier counts a dropped write: a slow or dead
disk or server costs memory up to that bound, never latency. One chunk larger than ``max_bytes``
still fits an empty queue.

Reads of what is not written yet: :meth:`queued_chunk` returns a chunk that is waiting or being
written, so a write-through store is visible at once. :meth:`cancel` drops a waiting chunk; one
being written is marked cancelled instead, and from then on it is invisible (``queued_chunk``,
``pending``) while :meth:`is_cancelled` tells the write callback and the tier's readers, until the
callback has returned, that its result must not count (the tier undoes what it wrote). A
``submit`` of that key while its write is in flight keeps the write (same key, same content).

``flush`` waits until everything submitted so far is written (or failed); ``close`` writes what
is queued (up to a timeout), then stops the threads.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import NamedTuple

from kvstack.errors import ConfigError
from kvstack.kv.keys import ChunkKey
from kvstack.kv.tensors import torch

__all__ = ["BackgroundWriter", "CancelOutcome", "QueueState", "WriteJob"]

log = logging.getLogger(__name__)


class WriteJob(NamedTuple):
    key: ChunkKey
    chunk: torch.Tensor


class QueueState(NamedTuple):
    waiting: int  # chunks not yet handed to the write function
    waiting_bytes: int
    writing: int  # chunks the write function has now


class CancelOutcome(enum.Enum):
    ABSENT = "absent"  # neither waiting nor being written
    DEQUEUED = "dequeued"  # was waiting: it will not be written
    WRITING = "writing"  # being written: marked cancelled, the write callback undoes it


def _num_bytes(chunk: torch.Tensor) -> int:
    return chunk.numel() * chunk.element_size()


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
        on_crash: Callable[[ChunkKey], None] | None = None,
    ) -> None:
        if min(max_chunks, max_bytes, max_batch, num_threads) < 1:
            raise ConfigError(
                f"write queue limits must be >= 1 (chunks={max_chunks}, bytes={max_bytes}, "
                f"batch={max_batch}, threads={num_threads})"
            )
        self.name = name
        self.max_chunks, self.max_bytes, self.max_batch = max_chunks, max_bytes, max_batch
        self._write_batch = write_batch
        self._on_crash = on_crash
        self._queue: OrderedDict[ChunkKey, torch.Tensor] = OrderedDict()  # waiting
        self._pending: dict[ChunkKey, torch.Tensor] = {}  # waiting or being written
        self._cancelled: set[ChunkKey] = set()  # cancelled while being written
        self._queued_bytes = 0
        self._closed = False
        self._cond = threading.Condition()
        self._threads = [
            threading.Thread(target=self._loop, name=f"kvstack-{name}-writer{i}", daemon=True)
            for i in range(num_threads)
        ]
        for thread in self._threads:
            thread.start()

    # -- the tier's side -------------------------------------------------------------------
    def submit(self, key: ChunkKey, chunk: torch.Tensor) -> bool:
        """Queue ``chunk`` (kept by reference until written); False when full or closed. A key
        already pending is accepted as it is."""
        num_bytes = _num_bytes(chunk)
        with self._cond:
            if self._closed:
                return False
            if key in self._pending:
                self._cancelled.discard(key)  # removed while being written: that write stands
                return True
            if len(self._pending) >= self.max_chunks:
                return False
            if self._queue and self._queued_bytes + num_bytes > self.max_bytes:
                return False
            self._queue[key] = chunk
            self._pending[key] = chunk
            self._queued_bytes += num_bytes
            self._cond.notify_all()  # all: flush() waits on the same condition
        return True

    # Read without the lock: two lookups under the GIL; a race with cancel() or a finished
    # write is the race any reader has with a concurrent remove or store.
    def pending(self, key: ChunkKey) -> bool:
        """Whether ``key`` is waiting or being written (and not cancelled)."""
        return key in self._pending and key not in self._cancelled

    def queued_chunk(self, key: ChunkKey) -> torch.Tensor | None:
        """The chunk if it is waiting or being written (and not cancelled), else None."""
        chunk = self._pending.get(key)
        return None if chunk is None or key in self._cancelled else chunk

    def is_cancelled(self, key: ChunkKey) -> bool:
        """Whether ``key`` was cancelled while being written; so until the write callback has
        returned (it undoes its write; until then readers must not trust what it wrote)."""
        return key in self._cancelled

    def cancel(self, key: ChunkKey) -> CancelOutcome:
        """Drop a waiting chunk, or mark one being written as cancelled."""
        with self._cond:
            if key not in self._pending:
                return CancelOutcome.ABSENT
            chunk = self._queue.pop(key, None)
            if chunk is None:
                self._cancelled.add(key)
                return CancelOutcome.WRITING
            del self._pending[key]
            self._queued_bytes -= _num_bytes(chunk)
            self._cond.notify_all()
            return CancelOutcome.DEQUEUED

    def drop_queued(self) -> int:
        """Forget every chunk still waiting (writes already started finish); how many."""
        with self._cond:
            return self._drop_queued_locked()

    def _drop_queued_locked(self) -> int:
        dropped = list(self._queue)
        for key in dropped:
            del self._pending[key]
        self._queue.clear()
        self._queued_bytes = 0
        self._cond.notify_all()
        return len(dropped)

    def state(self) -> QueueState:
        with self._cond:
            waiting = len(self._queue)
            return QueueState(waiting, self._queued_bytes, len(self._pending) - waiting)

    @property
    def num_queued(self) -> int:
        """Chunks waiting or being written."""
        with self._cond:
            return len(self._pending)

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until everything submitted so far is written (or failed); False on timeout."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while self._pending:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining)
        return True

    def close(self, timeout_s: float | None = 30.0) -> None:
        """Write what is queued (up to ``timeout_s``; None: all of it), then stop the threads.
        Idempotent."""
        self.flush(timeout_s)
        with self._cond:
            self._closed = True
            dropped = self._drop_queued_locked()
        if dropped:
            log.warning("KV tier %s: %d queued writes dropped at close", self.name, dropped)
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout_s)

    # -- the worker threads ----------------------------------------------------------------
    def _take_batch(self) -> list[WriteJob] | None:
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            if not self._queue:
                return None
            batch: list[WriteJob] = []
            while self._queue and len(batch) < self.max_batch:
                key, chunk = self._queue.popitem(last=False)
                self._queued_bytes -= _num_bytes(chunk)
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
                self._crashed(batch)
            finally:
                self._finish([job.key for job in batch])
                del batch  # release the chunks before waiting for more work

    def _crashed(self, batch: list[WriteJob]) -> None:
        if self._on_crash is not None:
            for job in batch:
                self._on_crash(job.key)

    def _finish(self, keys: list[ChunkKey]) -> None:
        with self._cond:
            for key in keys:
                self._pending.pop(key, None)
                self._cancelled.discard(key)
            self._cond.notify_all()
