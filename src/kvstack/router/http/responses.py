"""ASGI plumbing the router needs: typed callables, headers, JSON and OpenAI-style errors."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from typing import Any

import msgspec

from kvstack.errors import RequestError

__all__ = [
    "HOP_BY_HOP",
    "ASGIApp",
    "RawHeaders",
    "Receive",
    "Scope",
    "Send",
    "error_body",
    "header_dict",
    "read_body",
    "send_bytes",
    "send_error",
    "send_json",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
RawHeaders = list[tuple[bytes, bytes]]

# Headers that describe one connection, never forwarded (RFC 9110 §7.6.1), plus those the
# router recomputes.
HOP_BY_HOP = frozenset(
    {
        "connection", "keep-alive", "proxy-connection", "proxy-authenticate",
        "proxy-authorization", "te", "trailer", "transfer-encoding", "upgrade",
        "host", "content-length", "date", "server", "expect",
    }
)  # fmt: skip

_encoder = msgspec.json.Encoder()


def header_dict(raw: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """ASGI headers as a dict of lowercase names (latin-1, as HTTP/1.1 defines them)."""
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in raw}


async def read_body(receive: Receive, limit_bytes: int, declared: str | None) -> bytes:
    """The whole request body; a RequestError (413) as soon as it exceeds ``limit_bytes``."""
    if declared is not None and declared.isdigit() and int(declared) > limit_bytes:
        raise _too_large(int(declared), limit_bytes)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ConnectionResetError("client disconnected while sending the body")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit_bytes:
            raise _too_large(size, limit_bytes)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _too_large(size: int, limit_bytes: int) -> RequestError:
    return RequestError(
        f"the request body ({size} bytes or more) exceeds the limit of {limit_bytes} bytes",
        413,
        code="request_too_large",
    )


def error_body(error: RequestError) -> bytes:
    return _encoder.encode(
        {
            "error": {
                "message": error.message,
                "type": error.kind,
                "param": error.param,
                "code": error.code,
            }
        }
    )


async def send_bytes(
    send: Send,
    status: int,
    body: bytes,
    content_type: bytes = b"application/json",
    extra: RawHeaders | None = None,
) -> None:
    headers = [(b"content-type", content_type), (b"content-length", b"%d" % len(body))]
    if extra:
        headers.extend(extra)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def send_json(
    send: Send, status: int, payload: Mapping[str, Any], extra: RawHeaders | None = None
) -> None:
    await send_bytes(send, status, _encoder.encode(payload), extra=extra)


async def send_error(send: Send, error: RequestError, extra: RawHeaders | None = None) -> None:
    headers = list(extra or ())
    if error.retry_after_s is not None:
        headers.append((b"retry-after", b"%d" % max(1, math.ceil(error.retry_after_s))))
    await send_bytes(send, error.status, error_body(error), extra=headers)
