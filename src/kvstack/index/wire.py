"""The index service over ZMQ: URL scheme and framing, shared by server and clients.

``zmq://host:port`` names the index server's ZMQ endpoint (``index.service.zmq_port``); clients
connect a DEALER socket to ``tcp://host:port``, the server binds a ROUTER there.

A request is three frames, a reply three frames::

    request:  [request_id, operation, body]      operation: events | lookup | locate
    reply:    [request_id, status, body]         status: 200 | 400 | 500

Bodies are the msgpack messages of :mod:`kvstack.index.protocol`, as over HTTP: the operation's
request and reply, or :class:`~kvstack.index.protocol.ErrorReply` with status 400 (the request
is invalid: unknown operation, undecodable body, bad field) or 500 (the server failed). The
request id is opaque to the server and echoed back: a client matches replies to requests by it,
so several requests can be in flight on one socket and a reply arriving after its request timed
out is recognised and dropped. (A REQ socket works too: its empty delimiter frame serves as the
request id.)
"""

from __future__ import annotations

from urllib.parse import urlsplit

import msgspec

from kvstack.errors import ConfigError, IndexServiceError
from kvstack.index.protocol import ErrorReply

__all__ = [
    "BAD_REQUEST",
    "FAILED",
    "OK",
    "SCHEME",
    "check_index_url",
    "error_frames",
    "raise_for_status",
    "split_request",
    "tcp_address",
    "tcp_endpoint",
    "zmq_url",
]

SCHEME = "zmq"
OK, BAD_REQUEST, FAILED = b"200", b"400", b"500"
_NUM_FRAMES = 3


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"  # IPv6 hosts in brackets


def tcp_address(host: str, port: int) -> str:
    """The ZMQ endpoint a server binds (or a client connects to) for ``host`` and ``port``."""
    return f"tcp://{_host_port(host, port)}"


def zmq_url(host: str, port: int) -> str:
    """The ``zmq://`` URL clients are given for a server at ``host`` and ``port``."""
    return f"{SCHEME}://{_host_port(host, port)}"


def tcp_endpoint(url: str) -> str:
    """``zmq://host:port`` → ``tcp://host:port`` (IPv6 hosts keep their brackets)."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != SCHEME or not parts.hostname or port is None or parts.path.strip("/"):
        raise ConfigError(f"index ZMQ URL must look like zmq://host:port, got {url!r}")
    return tcp_address(parts.hostname, port)


def check_index_url(url: str) -> str:
    """An index server URL: ``http(s)://host:port`` or ``zmq://host:port``; raises
    :class:`ConfigError` naming the accepted forms otherwise."""
    scheme = urlsplit(url).scheme
    if scheme == SCHEME:
        tcp_endpoint(url)
    elif scheme not in ("http", "https") or not urlsplit(url).hostname:
        raise ConfigError(
            f"index URL must be http://host:port, https://host:port or zmq://host:port, got {url!r}"
        )
    return url


def error_frames(request_id: bytes, status: bytes, message: str) -> list[bytes]:
    return [request_id, status, msgspec.msgpack.encode(ErrorReply(message))]


def split_request(frames: list[bytes]) -> tuple[bytes, str, bytes]:
    """``[request_id, operation, body]``; raises ``ValueError`` when the count is wrong."""
    if len(frames) != _NUM_FRAMES:
        raise ValueError(
            f"expected {_NUM_FRAMES} frames (request id, operation, body), got {len(frames)}"
        )
    request_id, operation, body = frames
    return request_id, operation.decode("utf-8", "replace"), body


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
