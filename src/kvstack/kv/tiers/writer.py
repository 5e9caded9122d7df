"""A bounded background write queue: one thread writes items in submission order.

``submit`` never blocks: when the queue holds ``max_items`` items or ``max_bytes`` bytes it returns
False and the caller counts a dropped write. ``peek`` returns an item that is queued or being
written, so the tier can serve reads of what it has not written yet. ``flush`` waits until
everything submitted so far is written; ``close`` drains the queue and stops the thread. Slow tiers
(file, remote) use it so that ``KVCache.store`` never waits on I/O.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Generic, NamedTuple, TypeVar

from kvstack.kv.keys import ChunkKey

__all__ = ["BackgroundWriter", "QueueState"]

log = logging.getLogger(__name__)
T = TypeVar("T")


class QueueState(NamedTuple):
    items: int
    bytes: int


class BackgroundWriter(Generic[T]):
    def __init__(
        self,
        name: str,
        write: Callable[[ChunkKey, T], None],
        max_items: int,
        max_bytes: int,
        on_crash: Callable[[ChunkKey], None] | None = None,
    ) -> None:
        if max_items <= 0 or max_bytes <= 0:
            raise ValueError(f"queue bounds must be > 0, got {max_items} items, {max_bytes} bytes")
        self._write = write
        self._on_crash = on_crash
        self.max_items = max_items
        self.max_bytes = max_bytes
        self._queue: deque[tuple[ChunkKey, T, int]] = deque()
        self._pending: dict[ChunkKey, T] = {}  # queued or being written
        self._cancelled: set[ChunkKey] = set()  # cancelled while being written
        self._queued_bytes = 0
        self._outstanding = 0
        self._closed = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(
            target=self._loop, name=f"kvstack-{name}-writer", daemon=True
        )
        self._thread.start()

    def submit(self, key: ChunkKey, item: T, num_bytes: int) -> bool:
        """Queue ``item``; False if the queue is full or closed. Duplicates are accepted as-is."""
        with self._cond:
            if self._closed:
                return False
            if key in self._pending:
                # Being written but removed meanwhile: the write in flight stands again (the
                # same key is the same content).
                self._cancelled.discard(key)
                return True
            full = len(self._queue) >= self.max_items
            if full or (self._queue and self._queued_bytes + num_bytes > self.max_bytes):
                return False
            self._queue.append((key, item, num_bytes))
            self._pending[key] = item
            self._queued_bytes += num_bytes
            self._outstanding += 1
            self._cond.notify_all()
        return True

    def pending(self, key: ChunkKey) -> bool:
        """Whether ``key`` is queued or being written (and not cancelled)."""
        return key in self._pending and key not in self._cancelled

    def peek(self, key: ChunkKey) -> T | None:
        """The item for ``key`` if it is queued or being written (not cancelled), else None."""
        item = self._pending.get(key)
        return None if item is None or key in self._cancelled else item

    def cancel(self, key: ChunkKey) -> bool:
        """Drop a queued item; one being written is marked (see :meth:`is_cancelled`). True
        when it is being written: the write callback then undoes its write."""
        with self._cond:
            if key not in self._pending:
                return False
            for i, (queued, _, num_bytes) in enumerate(self._queue):
                if queued == key:
                    del self._queue[i]
                    self._queued_bytes -= num_bytes
                    del self._pending[key]
                    self._outstanding -= 1
                    self._cond.notify_all()
                    return False
            self._cancelled.add(key)
            return True

    def is_cancelled(self, key: ChunkKey) -> bool:
        """Whether ``key`` was cancelled while being written. It stays so until the write
        callback has returned: the callback undoes what it wrote, and until then readers must
        not mistake its file for a stored chunk."""
        return key in self._cancelled

    def state(self) -> QueueState:
        with self._cond:
            return QueueState(len(self._queue), self._queued_bytes)

    def flush(self, timeout_s: float | None = None) -> bool:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while self._outstanding:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining)
        return True

    def close(self) -> None:
        """Write what is queued, then stop the thread. Idempotent."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                key, item, num_bytes = self._queue.popleft()
                self._queued_bytes -= num_bytes
            try:
                self._write(key, item)
            except Exception:  # the writer thread must survive anything one item does
                log.exception("background writer: unexpected error writing chunk %s", key.hex())
                if self._on_crash is not None:
                    self._on_crash(key)
            finally:
                del item  # let go of the chunk's memory before waiting for more work
                with self._cond:
                    self._pending.pop(key, None)
                    self._cancelled.discard(key)
                    self._outstanding -= 1
                    self._cond.notify_all()
