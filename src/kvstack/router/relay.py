"""One attempt at one backend: send, wait for the first body byte, commit, relay the rest.

Nothing reaches the client before the first body byte has arrived from the backend. Until that
*commit point* every failure (connect error, timeout, a retryable 5xx, a dropped connection) is
raised as an :class:`UpstreamError` for a retry elsewhere (``open``). After it, bytes are
forwarded as they arrive (``deliver``) and a failure can only end the stream, with an SSE
``error`` event first (the ``openai`` client raises it as an APIError). Non-streaming answers
are read whole before the commit, so they are always retryable and go out in one write.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import aiohttp
import msgspec

from kvstack.errors import UpstreamError
from kvstack.router.responses import HOP_BY_HOP, RawHeaders, Send
from kvstack.router.upstream import UpstreamClient, as_upstream_error, timeout

__all__ = ["Exchange", "Opened", "Relay", "RetryableStatus", "sse_error_event"]

_CLIENT_ERRORS = (aiohttp.ClientError, OSError, TimeoutError)


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
    extra_headers: RawHeaders = field(default_factory=list)


@dataclass(slots=True)
class Opened:
    response: aiohttp.ClientResponse
    first: bytes  # the first body bytes (the whole body when done)
    done: bool


class RetryableStatus(UpstreamError):
    """A retryable 5xx answer, kept whole so it can be relayed if no retry is left."""

    def __init__(self, backend: str, status: int, body: bytes, headers: RawHeaders) -> None:
        super().__init__(f"backend {backend} answered {status}", "status", status)
        self.body = body
        self.headers = headers


def sse_error_event(message: str, kind: str = "upstream_error") -> bytes:
    error = {"error": {"message": message, "type": kind, "param": None, "code": None}}
    return b"data: " + msgspec.json.encode(error) + b"\n\n"


def forwardable_headers(resp: aiohttp.ClientResponse) -> RawHeaders:
    return [
        (k.lower(), v) for k, v in resp.raw_headers if k.decode("latin-1").lower() not in HOP_BY_HOP
    ]


class Relay:
    def __init__(
        self, client: UpstreamClient, first_byte_s: float, retry_statuses: frozenset[int]
    ) -> None:
        self._client = client
        self._first_byte_s = first_byte_s
        self._retry_statuses = retry_statuses

    async def open(
        self, url: str, body: bytes, headers: dict[str, str], backend: str, stream: bool
    ) -> Opened:
        """Send and wait for the first body byte (all of it unless streaming); may raise
        UpstreamError (RetryableStatus for a 5xx) — nothing has reached the client then."""
        resp: aiohttp.ClientResponse | None = None
        try:
            async with timeout(self._first_byte_s):
                resp = await self._client.post(url, body, headers)
                if resp.status in self._retry_statuses:
                    data = await resp.read()
                    raise RetryableStatus(backend, resp.status, data, forwardable_headers(resp))
                if stream and resp.status == 200:
                    first = await resp.content.readany()
                    return Opened(resp, first, resp.content.at_eof())
                return Opened(resp, await resp.read(), True)
        except RetryableStatus:
            _close(resp)
            raise
        except _CLIENT_ERRORS as exc:
            _close(resp)
            raise as_upstream_error(exc, backend) from None
        except BaseException:
            _close(resp)  # cancelled: drop the connection so the backend aborts the request
            raise

    async def deliver(self, opened: Opened, send: Send, exchange: Exchange) -> str:
        """Send the answer to the client; return "ok" or why the stream was cut."""
        resp = opened.response
        headers = forwardable_headers(resp) + exchange.extra_headers
        if opened.done:
            headers.append((b"content-length", b"%d" % len(opened.first)))
        exchange.committed = True
        exchange.status = resp.status
        await send({"type": "http.response.start", "status": resp.status, "headers": headers})
        exchange.client_first_byte_s = time.perf_counter()
        if opened.done:
            exchange.finished = True
            await send({"type": "http.response.body", "body": opened.first})
            resp.release()
            return "ok"
        return await self._stream(opened, send, exchange)

    async def _stream(self, opened: Opened, send: Send, exchange: Exchange) -> str:
        resp = opened.response
        outcome = "ok"
        chunk = opened.first
        try:
            while chunk:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                chunk = await resp.content.readany()
        except _CLIENT_ERRORS as exc:
            outcome = as_upstream_error(exc, exchange.backend).kind
            resp.close()
            if resp.content_type == "text/event-stream":
                message = f"backend {exchange.backend} failed mid-stream: {outcome}"
                await send(
                    {
                        "type": "http.response.body",
                        "body": sse_error_event(message),
                        "more_body": True,
                    }
                )
        except BaseException:
            resp.close()
            raise
        else:
            resp.release()
        exchange.finished = True
        await send({"type": "http.response.body", "body": b""})
        return outcome


def _close(resp: aiohttp.ClientResponse | None) -> None:
    if resp is not None:
        resp.close()
