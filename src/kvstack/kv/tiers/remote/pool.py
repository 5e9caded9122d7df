"""SocketPool: idle connections to one server, reused across calls (Redis nodes, peer servers).

``with pool.connection() as conn:`` takes an idle connection or opens a new one with the pool's
``connect`` function. When the block ends normally the connection goes back to the pool (at most
``max_idle`` are kept, and none once the pool is closed); when it raises, the connection is
closed, since its position in the reply stream is unknown. ``close`` closes the idle connections
at once and each connection still in use when its block ends. Thread-safe; a connection is used
by one thread at a time.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Generic, Protocol, TypeVar

__all__ = ["Closeable", "SocketPool"]


class Closeable(Protocol):
    def close(self) -> None: ...


C = TypeVar("C", bound=Closeable)


class SocketPool(Generic[C]):
    def __init__(self, connect: Callable[[], C], max_idle: int = 8) -> None:
        self.max_idle = max_idle
        self._connect = connect
        self._idle: list[C] = []
        self._lock = threading.Lock()
        self._closed = False

    @contextlib.contextmanager
    def connection(self) -> Iterator[C]:
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            conn = self._connect()
        try:
            yield conn
        except BaseException:
            conn.close()
            raise
        with self._lock:
            keep = not self._closed and len(self._idle) < self.max_idle
            if keep:
                self._idle.append(conn)
        if not keep:
            conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
