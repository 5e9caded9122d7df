"""One attempt at one backend: send, wait for the first body byte, commit, relay the rest.

Nothing reaches the client before the first body byte has arrived from the backend. Until that
*commit point* every failure (connect error, first-byte timeout, a retryable 5xx, a dropped
connection) is raised as an :class:`UpstreamError` for a retry elsewhere (``open``). After it,
bytes are forwarded as they arrive (``deliver``) and a failure can only end the stream, with an
SSE ``error`` event first (the ``openai`` client raises it as an APIError). Non-streaming
answers are read whole before the commit, so they are always retryable and go out in one write.
A cancellation (the client left) aborts the upstream connection, so the backend stops too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import msgspec

from kvstack.errors import UpstreamError
from kvstack.router.http.responses import HOP_BY_HOP, RawHeaders, Send, error_type
from kvstack.router.upstream.connection import ConnectionLostError, UpstreamConnection
from kvstack.router.upstream.pool import Deadline, UpstreamPool, build_request, host_header

__all__ = ["Exchange", "Opened", "Relay", "RetryableStatus", "sse_error_event"]

_FAILURES = (ConnectionLostError, OSError, TimeoutError)
_HOP_BY_HOP_BYTES = frozenset(h.encode() for h in HOP_BY_HOP)
# The router sends its own x-request-id (the one it forwarded): the backend's echo is dropped
# so that a client sees the header once.
_NOT_FORWARDED = _HOP_BY_HOP_BYTES | {b"x-request-id"}


@dataclass(slots=True)
class Exchange:
    """Per-request progress shared by the app, the proxy and the relay."""

    committed: bool = False  # the response head went to the client
    finished: bool = False  # nothing more will be sent
    client_gone: bool = False  # the client disconnected (the handler was cancelled)
    status: int = 0
    backend: str = "none"
    attempts: int = 0
    upstream_sent_s: float = 0.0  # perf_counter when the last attempt was sent
    upstream_first_byte_s: float = 0.0
    client_first_byte_s: float = 0.0
    streamed: bool = False  # the answer went out in several writes (a stream)
    extra_headers: RawHeaders = field(default_factory=list)


@dataclass(slots=True)
class Opened:
    conn: UpstreamConnection
    base_url: str
    first: bytes  # the first body bytes (the whole body when done)
    done: bool


class RetryableStatus(UpstreamError):
    """A retryable 5xx answer, kept whole so it can be relayed if no retry is left."""

    def __init__(self, backend: str, status: int, body: bytes, headers: RawHeaders) -> None:
        super().__init__(f"backend {backend} answered {status}", "status", status)
        self.body = body
        self.headers = headers


def sse_error_event(message: str, status: int = 502) -> bytes:
    """A stream's last event when the backend failed after the commit: vLLM's error shape."""
    error = {"error": {"message": message, "type": error_type(status), "param": None,
                       "code": status}}  # fmt: skip
    return b"data: " + msgspec.json.encode(error) + b"\n\n"


def forwardable(headers: RawHeaders) -> RawHeaders:
    return [(k, v) for k, v in headers if k not in _NOT_FORWARDED]


def as_upstream_error(exc: BaseException, backend: str) -> UpstreamError:
    if isinstance(exc, UpstreamError):
        return exc
    if isinstance(exc, TimeoutError):
        return UpstreamError(f"backend {backend}: {exc}", "timeout", 504)
    if isinstance(exc, ConnectionLostError):
        return UpstreamError(f"backend {backend}: {exc}", "disconnect")
    return UpstreamError(f"backend {backend} failed: {exc}", "connect")


class Relay:
    def __init__(
        self, pool: UpstreamPool, first_byte_s: float, retry_statuses: frozenset[int]
    ) -> None:
        self._pool = pool
        self._first_byte_s = first_byte_s
        self._retry_statuses = retry_statuses

    async def open(
        self,
        base_url: str,
        path: str,
        headers: dict[str, str],
        body: bytes,
        backend: str,
        stream: bool,
        total: Deadline,
        method: str = "POST",
    ) -> Opened:
        """Send and wait for the first body byte (all of it unless streaming); may raise
        UpstreamError (RetryableStatus for a 5xx): nothing has reached the client then."""
        raw = build_request(path, host_header(base_url), headers, body, method)
        first_byte = Deadline(self._first_byte_s, "first-byte")
        conn: UpstreamConnection | None = None
        try:
            conn = await self._pool.request(base_url, raw, (first_byte, total))
            if conn.status in self._retry_statuses:
                data = await conn.read_all()
                raise RetryableStatus(backend, conn.status, data, forwardable(conn.headers))
            if stream and conn.status == 200:
                first = await conn.read_chunk()
                return Opened(conn, base_url, first, conn.complete and not conn.has_buffered)
            return Opened(conn, base_url, await conn.read_all(), True)
        except RetryableStatus:
            self._finish(conn, base_url, total)
            raise
        except _FAILURES as exc:
            if conn is not None:
                conn.abort(ConnectionLostError("attempt failed", False))
            raise as_upstream_error(exc, backend) from None
        except BaseException:
            if conn is not None:  # cancelled: the backend must see the disconnect
                conn.abort(ConnectionLostError("request cancelled", False))
            raise
        finally:
            first_byte.cancel()

    async def fetch(
        self,
        base_url: str,
        path: str,
        headers: dict[str, str],
        body: bytes,
        backend: str,
        deadline: Deadline,
    ) -> tuple[int, bytes]:
        """A whole non-streamed answer for the router itself (PD's prefill step): never
        relayed to the client. UpstreamError (RetryableStatus for a 5xx) as :meth:`open`."""
        opened = await self.open(base_url, path, headers, body, backend, False, deadline)
        self._finish(opened.conn, base_url, deadline)
        return opened.conn.status, opened.first

    async def deliver(self, opened: Opened, send: Send, ex: Exchange, total: Deadline) -> str:
        """Send the answer to the client; return "ok" or why the stream was cut."""
        conn = opened.conn
        headers = forwardable(conn.headers) + ex.extra_headers
        if opened.done:
            headers.append((b"content-length", b"%d" % len(opened.first)))
        ex.committed = True
        ex.status = conn.status
        await send({"type": "http.response.start", "status": conn.status, "headers": headers})
        ex.client_first_byte_s = time.perf_counter()
        if opened.done:
            self._finish(conn, opened.base_url, total)
            ex.finished = True
            await send({"type": "http.response.body", "body": opened.first})
            return "ok"
        ex.streamed = True
        return await self._stream(opened, send, ex, total)

    async def _stream(self, opened: Opened, send: Send, ex: Exchange, total: Deadline) -> str:
        conn = opened.conn
        outcome = "ok"
        chunk = opened.first
        try:
            while chunk:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                chunk = await conn.read_chunk()
        except _FAILURES as exc:
            outcome = as_upstream_error(exc, ex.backend).kind
            if _is_event_stream(conn.headers):
                message = f"backend {ex.backend} failed mid-stream ({outcome}): {exc}"
                event = sse_error_event(message)
                await send({"type": "http.response.body", "body": event, "more_body": True})
        except BaseException:
            conn.abort(ConnectionLostError("request cancelled", False))
            raise
        self._finish(conn, opened.base_url, total)
        ex.finished = True
        await send({"type": "http.response.body", "body": b""})
        return outcome

    def _finish(self, conn: UpstreamConnection | None, base_url: str, total: Deadline) -> None:
        """Stop the request's timers on ``conn``, then pool it (or drop it if not reusable)."""
        total.cancel()
        if conn is not None:
            self._pool.release(base_url, conn)


def _is_event_stream(headers: RawHeaders) -> bool:
    return any(k == b"content-type" and v.startswith(b"text/event-stream") for k, v in headers)
