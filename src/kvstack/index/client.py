"""Clients of the index service: blocking (engines' announcers, ``peer://`` tiers, benchmarks)
and async (the router). Both speak msgpack; tokens travel as little-endian uint32 bytes, which
the server decodes without building a Python int per token.

The URL picks the transport: ``http://host:port`` (or ``https://``) asks the HTTP routes,
``zmq://host:port`` the server's ZMQ endpoint (``index.service.zmq_port``; lower latency,
:mod:`kvstack.index.zmq_client`). Methods and answers are the same; a request the server refuses
raises :class:`~kvstack.errors.IndexServiceError` with the server's reason and status (401 for
a missing credential, 403 for a report for another instance, 413 above a size limit...), a
timeout ``httpx.TimeoutException`` or :class:`~kvstack.errors.IndexTimeoutError` (a
``TimeoutError``).

With the cluster's ``keys`` a client authenticates every call (:mod:`kvstack.index.auth`: the
bearer token over HTTP, signed frames over ZMQ); an index with the secret refuses calls without.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar
from urllib.parse import urlsplit

import httpx
import msgspec
import numpy as np

from kvstack.errors import IndexServiceError
from kvstack.index.auth import bearer_header
from kvstack.index.protocol import (
    AnnounceBatch,
    EventReply,
    LocateReply,
    LocateRequest,
    LookupReply,
    LookupRequest,
)
from kvstack.index.urls import SCHEME, check_index_url
from kvstack.index.zmq_client import AsyncZmqTransport, ZmqTransport

if TYPE_CHECKING:
    from kvstack.security import ClusterKeys

__all__ = ["AsyncIndexClient", "IndexClient", "lookup_request"]

R = TypeVar("R")
_HEADERS = {"content-type": "application/msgpack"}


def lookup_request(
    model: str,
    tokens: Sequence[int] | Any = None,
    chunk_hashes: Sequence[bytes] | None = None,
    salt: str = "",
    adapter: str = "",
    **overrides: Any,
) -> LookupRequest:
    """A lookup for ``tokens`` (any int sequence or array) or for chunk keys."""
    packed = None if tokens is None else np.asarray(tokens, dtype="<u4").tobytes()
    hashes = None if chunk_hashes is None else [bytes(k).hex() for k in chunk_hashes]
    return LookupRequest(
        model=model, tokens_u32=packed, chunk_hashes=hashes, salt=salt, adapter=adapter, **overrides
    )


class _Transport(Protocol):
    def call(self, operation: str, body: bytes) -> bytes: ...

    def close(self) -> None: ...


class _AsyncTransport(Protocol):
    async def call(self, operation: str, body: bytes) -> bytes: ...

    async def aclose(self) -> None: ...


def _content(response: httpx.Response) -> bytes:
    """The body of a 2xx answer; else IndexServiceError with the server's reason."""
    if response.is_success:
        return response.content
    try:
        reason = str(response.json().get("error", ""))
    except ValueError:
        reason = response.text[:200]
    raise IndexServiceError(
        f"index {response.request.url} answered {response.status_code}: {reason}",
        str(response.status_code),
    )


def _headers(keys: ClusterKeys | None) -> dict[str, str]:
    return _HEADERS if keys is None else {**_HEADERS, "authorization": bearer_header(keys)}


class _HttpTransport:
    def __init__(self, url: str, timeout_s: float, keys: ClusterKeys | None) -> None:
        self._http = httpx.Client(base_url=url, timeout=timeout_s, headers=_headers(keys))

    def call(self, operation: str, body: bytes) -> bytes:
        return _content(self._http.post(f"/{operation}", content=body))

    def close(self) -> None:
        self._http.close()


class _AsyncHttpTransport:
    def __init__(self, url: str, timeout_s: float, keys: ClusterKeys | None) -> None:
        self._http = httpx.AsyncClient(base_url=url, timeout=timeout_s, headers=_headers(keys))

    async def call(self, operation: str, body: bytes) -> bytes:
        return _content(await self._http.post(f"/{operation}", content=body))

    async def aclose(self) -> None:
        await self._http.aclose()


def _is_zmq(url: str) -> bool:
    return urlsplit(check_index_url(url)).scheme == SCHEME


class IndexClient:
    """Blocking; safe to share between threads."""

    def __init__(self, url: str, timeout_s: float = 2.0, keys: ClusterKeys | None = None) -> None:
        self.url = url.rstrip("/")
        self.keys = keys
        self._transport: _Transport
        if _is_zmq(self.url):
            self._transport = ZmqTransport(self.url, timeout_s, keys)
        else:
            self._transport = _HttpTransport(self.url, timeout_s, keys)

    def _ask(self, operation: str, message: Any, kind: type[R]) -> R:
        body = self._transport.call(operation, msgspec.msgpack.encode(message))
        return msgspec.msgpack.decode(body, type=kind)

    def report(self, batch: AnnounceBatch) -> EventReply:
        return self._ask("events", batch, EventReply)

    def lookup(self, request: LookupRequest) -> LookupReply:
        return self._ask("lookup", request, LookupReply)

    def locate(self, keys: Sequence[bytes], exclude: str = "") -> LocateReply:
        return self._ask("locate", LocateRequest([bytes(k) for k in keys], exclude), LocateReply)

    def close(self) -> None:
        self._transport.close()


class AsyncIndexClient:
    """For one event loop; concurrent lookups are fine."""

    def __init__(self, url: str, timeout_s: float = 0.5, keys: ClusterKeys | None = None) -> None:
        self.url = url.rstrip("/")
        self._transport: _AsyncTransport
        if _is_zmq(self.url):
            self._transport = AsyncZmqTransport(self.url, timeout_s, keys)
        else:
            self._transport = _AsyncHttpTransport(self.url, timeout_s, keys)

    async def lookup(self, request: LookupRequest) -> LookupReply:
        body = await self._transport.call("lookup", msgspec.msgpack.encode(request))
        return msgspec.msgpack.decode(body, type=LookupReply)

    async def aclose(self) -> None:
        await self._transport.aclose()
