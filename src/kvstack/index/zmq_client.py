"""Client transports for ``zmq://host:port`` index URLs (framing in :mod:`kvstack.index.wire`).

Both use a DEALER socket and tag each request with an id echoed by the server, so a timed-out
request leaves the socket usable: its reply, should it come later, carries an id nobody waits
for and is dropped. ``IMMEDIATE`` keeps requests from queueing for a server that is not
connected (they wait for the connection, within the timeout, instead of piling up and being
answered long after their caller gave up).

- :class:`ZmqTransport` (blocking) sends one request at a time, under a lock: callers on several
  threads take turns, as ZMQ sockets must not be shared between threads.
- :class:`AsyncZmqTransport` belongs to one event loop; concurrent calls share the socket and a
  reader task hands each reply to the call waiting for its id.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import threading
import time
from typing import TYPE_CHECKING, Any

import zmq
import zmq.asyncio

from kvstack.errors import IndexServiceError, IndexTimeoutError
from kvstack.index.auth import sign_frames
from kvstack.index.urls import tcp_endpoint
from kvstack.index.wire import raise_for_status

if TYPE_CHECKING:
    from kvstack.security import ClusterKeys

__all__ = ["AsyncZmqTransport", "ZmqTransport"]

log = logging.getLogger(__name__)
_REPLY_FRAMES = 3


def _dealer(context: zmq.Context[Any], url: str, timeout_s: float) -> Any:
    endpoint = tcp_endpoint(url)
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IMMEDIATE, 1)
    sock.setsockopt(zmq.SNDTIMEO, max(1, math.ceil(timeout_s * 1000)))
    sock.setsockopt(zmq.IPV6, int(endpoint.startswith("tcp://[")))
    sock.connect(endpoint)
    return sock


def _frames(
    keys: ClusterKeys | None, request_id: bytes, operation: str, body: bytes
) -> list[bytes]:
    """A request's frames, signed when this client has the cluster's keys."""
    op = operation.encode()
    if keys is None:
        return [request_id, op, body]
    return [request_id, op, body, sign_frames(keys, request_id, op, body)]


def _timeout(url: str, operation: str, timeout_s: float) -> IndexTimeoutError:
    return IndexTimeoutError(f"index {url} did not answer {operation} within {timeout_s:g} s")


class ZmqTransport:
    def __init__(self, url: str, timeout_s: float, keys: ClusterKeys | None = None) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self._keys = keys
        self._sock: zmq.Socket[bytes] = _dealer(zmq.Context.instance(), url, timeout_s)
        self._ids = itertools.count()
        self._lock = threading.Lock()

    def call(self, operation: str, body: bytes) -> bytes:
        """The reply body; raises :class:`IndexServiceError` (or its timeout subclass)."""
        with self._lock:
            deadline = time.monotonic() + self.timeout_s
            request_id = next(self._ids).to_bytes(8, "little")
            try:
                frames = _frames(self._keys, request_id, operation, body)
                self._sock.send_multipart(frames, copy=False)
            except zmq.Again:
                raise _timeout(self.url, operation, self.timeout_s) from None
            return raise_for_status(*self._receive(request_id, operation, deadline))

    def _receive(self, request_id: bytes, operation: str, deadline: float) -> tuple[bytes, bytes]:
        while (left_s := deadline - time.monotonic()) > 0:
            if not self._sock.poll(max(1, math.ceil(left_s * 1000)), zmq.POLLIN):
                break
            frames = self._sock.recv_multipart()
            if len(frames) == _REPLY_FRAMES and frames[0] == request_id:
                return frames[1], frames[2]
            # else: the late reply to a request that timed out
        raise _timeout(self.url, operation, self.timeout_s)

    def close(self) -> None:
        with self._lock:
            self._sock.close()


class AsyncZmqTransport:
    def __init__(self, url: str, timeout_s: float, keys: ClusterKeys | None = None) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self._keys = keys
        self._sock: zmq.asyncio.Socket = _dealer(zmq.asyncio.Context.instance(), url, timeout_s)
        self._ids = itertools.count()
        self._pending: dict[bytes, asyncio.Future[tuple[bytes, bytes]]] = {}
        self._reader: asyncio.Task[None] | None = None

    async def call(self, operation: str, body: bytes) -> bytes:
        """The reply body; raises :class:`IndexServiceError` (or its timeout subclass)."""
        request_id = next(self._ids).to_bytes(8, "little")
        reply = asyncio.get_running_loop().create_future()
        self._pending[request_id] = reply
        self._start_reader()
        try:
            frames = _frames(self._keys, request_id, operation, body)
            status, payload = await asyncio.wait_for(self._exchange(frames, reply), self.timeout_s)
        except asyncio.TimeoutError:
            raise _timeout(self.url, operation, self.timeout_s) from None
        finally:
            del self._pending[request_id]
        return raise_for_status(status, payload)

    async def _exchange(
        self, frames: list[bytes], reply: asyncio.Future[tuple[bytes, bytes]]
    ) -> tuple[bytes, bytes]:
        await self._sock.send_multipart(frames, copy=False)
        return await reply

    def _start_reader(self) -> None:
        if self._reader is None or self._reader.done():
            self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            while True:
                frames = await self._sock.recv_multipart()
                waiting = self._pending.get(frames[0]) if len(frames) == _REPLY_FRAMES else None
                if waiting is not None and not waiting.done():
                    waiting.set_result((frames[1], frames[2]))
        except zmq.ZMQError as exc:  # the socket failed: fail the calls waiting on it
            log.warning("index %s: ZMQ receive failed (%s)", self.url, exc)
            for waiting in self._pending.values():
                if not waiting.done():
                    waiting.set_exception(IndexServiceError(f"index {self.url}: {exc}", "zmq"))

    async def aclose(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        self._sock.close()
