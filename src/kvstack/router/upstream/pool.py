"""Keep-alive connection pools to the backends, and the request the proxy sends on them.

``UpstreamPool.request`` takes an idle connection to the backend (or opens one within the
connect timeout), writes the request and returns the connection once the response head has
arrived; the caller reads the body and hands the connection back with ``release``. A reused
connection that the backend had already closed (its keep-alive timeout racing ours) fails
before any response byte: that request is resent once on a fresh connection, which is safe
because the backend never read it. Idle connections older than ``idle_timeout_s`` (below
uvicorn's 5 s default, which vLLM uses) are not reused.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
import time
from collections import deque
from collections.abc import Mapping
from urllib.parse import urlsplit

from kvstack.errors import UpstreamError
from kvstack.router.upstream.connection import ConnectionLostError, UpstreamConnection

__all__ = ["Deadline", "UpstreamPool", "build_request", "host_header"]

_MAX_IDLE_PER_BACKEND = 512


def build_request(
    path: str, host: str, headers: Mapping[str, str], body: bytes, method: str = "POST"
) -> bytes:
    """An HTTP/1.1 request (POST unless told). Header values come from the client's parsed
    request (the front end's parser rejects CR/LF in them) or from the router itself."""
    lines = [f"{method} {path} HTTP/1.1", f"host: {host}", f"content-length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class UpstreamPool:
    def __init__(self, connect_s: float, idle_timeout_s: float = 4.0) -> None:
        self._connect_s = connect_s
        self._idle_timeout_s = idle_timeout_s
        self._idle: dict[tuple[str, int, bool], deque[UpstreamConnection]] = {}
        self._tls: ssl.SSLContext | None = None

    async def request(
        self, base_url: str, raw: bytes, deadlines: tuple[Deadline, ...]
    ) -> UpstreamConnection:
        """Send ``raw``; return the connection with the response head read.

        Raises UpstreamError (connect), ConnectionLostError, or the TimeoutError a deadline
        aborts the connection with; a cancellation aborts the connection."""
        address = _address(base_url)
        conn, reused = await self._take(address, base_url)
        try:
            return await self._send(conn, raw, deadlines)
        except ConnectionLostError as exc:
            if not (reused and exc.before_response):
                raise
        conn = await self._connect(address, base_url)  # a stale keep-alive: once more, fresh
        return await self._send(conn, raw, deadlines)

    def release(self, base_url: str, conn: UpstreamConnection) -> None:
        """Hand back a connection whose response was read to the end (or drop it)."""
        if not conn.reusable:
            conn.abort(ConnectionLostError("not reusable", False))
            return
        idle = self._idle.setdefault(_address(base_url), deque())
        if len(idle) >= _MAX_IDLE_PER_BACKEND:
            conn.abort(ConnectionLostError("pool full", False))
            return
        conn.idle_since_s = time.monotonic()
        idle.append(conn)

    def close(self) -> None:
        for idle in self._idle.values():
            while idle:
                idle.pop().abort(ConnectionLostError("router closing", False))
        self._idle.clear()

    async def _send(
        self, conn: UpstreamConnection, raw: bytes, deadlines: tuple[Deadline, ...]
    ) -> UpstreamConnection:
        for deadline in deadlines:
            deadline.watch(conn)
        conn.send(raw)
        try:
            await conn.head()
        except asyncio.CancelledError:
            conn.abort(ConnectionLostError("request cancelled", False))
            raise
        return conn

    async def _take(
        self, address: tuple[str, int, bool], url: str
    ) -> tuple[UpstreamConnection, bool]:
        idle = self._idle.get(address)
        now = time.monotonic()
        while idle:
            conn = idle.pop()  # most recently used first: the least likely to be stale
            if not conn.closed and now - conn.idle_since_s < self._idle_timeout_s:
                return conn, True
            conn.abort(ConnectionLostError("idle too long", False))
        return await self._connect(address, url), False

    async def _connect(self, address: tuple[str, int, bool], url: str) -> UpstreamConnection:
        loop = asyncio.get_running_loop()
        host, port, tls = address
        if tls and self._tls is None:
            self._tls = ssl.create_default_context()
        ssl_context = self._tls if tls else None
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(UpstreamConnection, host, port, ssl=ssl_context),
                self._connect_s,
            )
        except TimeoutError:
            raise UpstreamError(f"connecting to backend {url} timed out", "connect") from None
        except ConnectionRefusedError:
            raise UpstreamError(f"connection refused to {url}", "connect") from None
        except OSError as exc:
            raise UpstreamError(f"cannot connect to backend {url}: {exc}", "connect") from None
        return conn


class Deadline:
    """A point in time after which the watched connection is aborted with ``TimeoutError``
    (a timer handle, far cheaper than a timeout context per request)."""

    __slots__ = ("_handle", "_loop", "at", "expired", "what")

    def __init__(self, seconds: float, what: str) -> None:
        self._loop = asyncio.get_running_loop()
        self.at = self._loop.time() + seconds
        self.what = what
        self._handle: asyncio.TimerHandle | None = None
        self.expired = False

    def watch(self, conn: UpstreamConnection) -> None:
        self.cancel()
        self._handle = self._loop.call_at(self.at, self._expire, conn)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def remaining_s(self) -> float:
        return self.at - self._loop.time()

    def _expire(self, conn: UpstreamConnection) -> None:
        self.expired = True
        conn.abort(TimeoutError(f"{self.what} timeout"))


def host_header(base_url: str) -> str:
    """The Host header for a backend URL (``host:port``)."""
    return _netloc(base_url)


@functools.lru_cache(maxsize=4096)
def _netloc(base_url: str) -> str:
    return urlsplit(base_url).netloc


@functools.lru_cache(maxsize=4096)  # parsed once per backend URL, not per request
def _address(base_url: str) -> tuple[str, int, bool]:
    parts = urlsplit(base_url)
    tls = parts.scheme == "https"
    return parts.hostname or "127.0.0.1", parts.port or (443 if tls else 80), tls
