"""The index service over ZMQ: URL scheme and framing, shared by server and clients.

``zmq://host:port`` names the index server's ZMQ endpoint (``index.service.zmq_port``; URLs in
:mod:`kvstack.index.urls`); clients connect a DEALER socket to ``tcp://host:port``, the server
binds a ROUTER there.

A request is three frames (four with the cluster secret), a reply three frames::

    request:  [request_id, operation, body, auth]   operation: events | lookup | locate
    reply:    [request_id, status, body]            status: 200 | 400 | 401 | 403 | 413 | 429 | 500

``auth`` (:mod:`kvstack.index.auth`) signs the other three; an index with the secret refuses a
request without it (401).

Bodies are the msgpack messages of :mod:`kvstack.index.protocol`, as over HTTP: the operation's
request and reply, or :class:`~kvstack.index.protocol.ErrorReply` with status 400 (the request
is invalid: unknown operation, undecodable body, bad field) or 500 (the server failed). The
request id is opaque to the server and echoed back: a client matches replies to requests by it,
so several requests can be in flight on one socket and a reply arriving after its request timed
out is recognised and dropped. (A REQ socket works too: its empty delimiter frame serves as the
request id.)
"""

from __future__ import annotations

import msgspec

from kvstack.errors import IndexServiceError
from kvstack.index.protocol import ErrorReply

__all__ = [
    "BAD_REQUEST",
    "FAILED",
    "OK",
    "UNAUTHORIZED",
    "error_frames",
    "raise_for_status",
    "split_request",
]

OK, BAD_REQUEST, UNAUTHORIZED, FAILED = b"200", b"400", b"401", b"500"


def error_frames(request_id: bytes, status: bytes, message: str) -> list[bytes]:
    return [request_id, status, msgspec.msgpack.encode(ErrorReply(message))]


def split_request(frames: list[bytes]) -> tuple[bytes, str, bytes, bytes]:
    """``[request_id, operation, body, auth]`` (``auth`` empty when absent); raises
    ``ValueError`` when the count is wrong."""
    if len(frames) not in (3, 4):
        raise ValueError(
            f"expected 3 or 4 frames (request id, operation, body[, auth]), got {len(frames)}"
        )
    request_id, operation, body, *auth = frames
    return request_id, operation.decode("utf-8", "replace"), body, auth[0] if auth else b""


def raise_for_status(status: bytes, body: bytes) -> bytes:
    """The reply body when ``status`` is 200; else :class:`IndexServiceError` with the
    server's message."""
    if status == OK:
        return body
    try:
        message = msgspec.msgpack.decode(body, type=ErrorReply).error
    except msgspec.DecodeError:
        message = repr(bytes(body[:200]))
    code = status.decode("ascii", "replace")
    raise IndexServiceError(f"index service answered {code}: {message}", code)
