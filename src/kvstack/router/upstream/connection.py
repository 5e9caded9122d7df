"""One keep-alive HTTP/1.1 connection to a backend, for the proxy's hot path.

A bare ``asyncio.Protocol`` with httptools parsing the response, hand-written because it was
measured against the libraries (2-core development machine, when it replaced aiohttp on this
path): a POST and its answer cost ~8 µs of CPU this way against ~110 µs through aiohttp's
client, which had been the largest single cost of the router; httpx's pooled ``AsyncClient``
in the same place served 37 / 29 req/s at 8 / 64 connections (one sequential POST ~1.7 ms,
aiohttp ~0.17 ms), where aiohttp served 7,000 / 6,960 (see :mod:`kvstack.router.http.app`).
With it the whole router spends 155–185 µs of CPU per proxied request and sustains a median
5,900 req/s (``kvstack bench router``, ``docs/benchmarks.md``). The control plane's few
requests go through httpx (:mod:`kvstack.router.upstream.control`).

Protocol per request: ``send(raw)`` → ``await head()`` (status and raw headers) → ``await
read_chunk()`` until it returns ``b""`` (or ``await read_all()``). httptools undoes chunked
transfer coding, so chunks are the body bytes as the backend wrote them. ``abort(exc)`` fails
every waiter with ``exc`` and drops the connection (timeouts, cancellation): the backend sees
the disconnect and stops generating. Reading pauses while more than ``HIGH_WATER_BYTES`` of
body wait for a slow client.
"""

from __future__ import annotations

import asyncio
from collections import deque

import httptools

__all__ = ["ConnectionLostError", "UpstreamConnection"]

HIGH_WATER_BYTES = 1 << 20
RawHeaders = list[tuple[bytes, bytes]]


class ConnectionLostError(ConnectionError):
    """The backend closed the connection; ``before_response`` if it had sent nothing."""

    def __init__(self, message: str, before_response: bool) -> None:
        super().__init__(message)
        self.before_response = before_response


class UpstreamConnection(asyncio.Protocol):
    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._reset()
        self.closed = False
        self.idle_since_s = 0.0

    def _reset(self) -> None:
        self.status = 0
        self.headers: RawHeaders = []
        self._head: asyncio.Future[None] | None = None
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._wake: asyncio.Future[None] | None = None
        self._error: BaseException | None = None
        self._got_bytes = False
        self._until_eof = False  # neither content-length nor chunked: the body ends at close
        self._keep_alive = False  # read at the head: httptools forgets it once complete
        self.complete = False

    # -- the request side
    def send(self, raw: bytes) -> None:
        """Start a request (the previous one must be complete)."""
        self._reset()
        self._head = self._loop.create_future()
        assert self._transport is not None
        self._transport.write(raw)

    async def head(self) -> tuple[int, RawHeaders]:
        assert self._head is not None
        await self._head
        return self.status, self.headers

    async def read_chunk(self) -> bytes:
        """The next body bytes; ``b""`` at the end of the body."""
        while not self._chunks:
            if self._error is not None:
                raise self._error
            if self.complete:
                return b""
            self._wake = self._loop.create_future()
            await self._wake
        chunk = self._chunks.popleft()
        self._buffered -= len(chunk)
        if self._buffered < HIGH_WATER_BYTES and self._transport is not None:
            self._transport.resume_reading()
        return chunk

    async def read_all(self) -> bytes:
        parts = []
        while chunk := await self.read_chunk():
            parts.append(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    @property
    def has_buffered(self) -> bool:
        return bool(self._chunks)

    @property
    def reusable(self) -> bool:
        return self.complete and not self.closed and self._keep_alive

    def abort(self, exc: BaseException) -> None:
        """Fail the current request with ``exc`` and drop the connection."""
        self._fail(exc)
        if self._transport is not None and not self.closed:
            self._transport.abort()
        self.closed = True

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's class differs
        sock = transport.get_extra_info("socket")
        if sock is not None and hasattr(sock, "setsockopt"):
            import socket

            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self._got_bytes = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.abort(ConnectionLostError(f"malformed response from backend: {exc}", False))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._until_eof and not self.complete and self._error is None:
            self.complete = True
            self._wakeup()
        elif not self.complete:
            before = not self._got_bytes
            self._fail(ConnectionLostError("the backend closed the connection", before))

    # -- httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        if 100 <= self._parser.get_status_code() < 200:
            self.headers = []  # an interim answer (100 Continue): the real one follows
            return
        self.status = self._parser.get_status_code()
        self._keep_alive = self._parser.should_keep_alive()
        names = {name for name, _ in self.headers}
        self._until_eof = (
            b"content-length" not in names
            and b"transfer-encoding" not in names
            and self.status not in (204, 304)
        )
        if self._head is not None and not self._head.done():
            self._head.set_result(None)

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered >= HIGH_WATER_BYTES and self._transport is not None:
            self._transport.pause_reading()
        self._wakeup()

    def on_message_complete(self) -> None:
        if not self.status:
            return  # the end of an interim answer
        self.complete = True
        self._wakeup()

    def _wakeup(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        if self._error is None and not self.complete:
            self._error = exc
        if self._head is not None and not self._head.done():
            self._head.set_exception(exc)
            self._head.exception()  # retrieved: no "never retrieved" warning if nobody waits
        if self._wake is not None and not self._wake.done():
            self._wake.set_exception(exc)
            self._wake.exception()
