"""ASGI plumbing the router needs: typed callables, headers, JSON, and errors in vLLM's shape.

Every error the router makes is vLLM's ``ErrorResponse``: ``{"error": {"message", "type",
"param", "code"}}`` with the HTTP status as the integer ``code`` and one of vLLM's ``type``
values (``error_type``); the router's own reason goes in the ``x-kvstack-error`` header.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from typing import Any

import msgspec

from kvstack.errors import RequestError

__all__ = [
    "ERROR_HEADER",
    "HOP_BY_HOP",
    "VLLM_ERROR_TYPES",
    "ASGIApp",
    "RawHeaders",
    "Receive",
    "Scope",
    "Send",
    "error_body",
    "error_type",
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
ERROR_HEADER = b"x-kvstack-error"

# vLLM's error types (vllm.entrypoints.serve.exception_handling): its named types where it has
# one for the status, else the status's phrase, as its HTTPException handler writes it. Spelt
# out rather than taken from http.HTTPStatus, whose phrases change between Python versions.
_TYPE_BY_STATUS = {
    400: "BadRequestError",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFoundError",
    405: "Method Not Allowed",
    408: "Request Timeout",
    409: "Conflict",
    413: "Request Entity Too Large",
    415: "Unsupported Media Type",
    422: "UnprocessableEntityError",
    429: "Too Many Requests",
    500: "InternalServerError",
    501: "NotImplementedError",
    502: "Bad Gateway",
    503: "ServiceUnavailableError",
    504: "Gateway Timeout",
}
VLLM_ERROR_TYPES = frozenset(
    {*_TYPE_BY_STATUS.values(), "Bad Request", "Not Found", "InvalidUserInput",
     "invalid_request_error"}
)  # fmt: skip


def error_type(status: int, kind: str | None = None) -> str:
    """vLLM's ``type`` for an error: ``kind`` when it is one of vLLM's, else the status's."""
    if kind in VLLM_ERROR_TYPES:
        return kind
    return _TYPE_BY_STATUS.get(status, "BadRequestError" if status < 500 else "InternalServerError")


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
    """The error as vLLM's ``ErrorResponse``."""
    return _encoder.encode(
        {
            "error": {
                "message": error.message,
                "type": error_type(error.status, error.kind),
                "param": error.param,
                "code": error.status,
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
    if error.code is not None:
        headers.append((ERROR_HEADER, error.code.encode("latin-1", "replace")))
    if error.retry_after_s is not None:
        headers.append((b"retry-after", b"%d" % max(1, math.ceil(error.retry_after_s))))
    await send_bytes(send, error.status, error_body(error), extra=headers)
