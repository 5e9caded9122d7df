"""Clients of the index service: blocking (engines' announcers, ``peer://`` tiers, benchmarks)
and async (the router). Both speak msgpack; tokens travel as little-endian uint32 bytes, which
the server decodes without building a Python int per token."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import httpx
import msgspec
import numpy as np

from kvstack.index.protocol import (
    EventBatch,
    EventReply,
    LocateReply,
    LocateRequest,
    LookupReply,
    LookupRequest,
)

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


def _decode(response: httpx.Response, kind: type[R]) -> R:
    response.raise_for_status()
    return msgspec.msgpack.decode(response.content, type=kind)


class IndexClient:
    def __init__(self, url: str, timeout_s: float = 2.0) -> None:
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, timeout=timeout_s, headers=_HEADERS)

    def report(self, batch: EventBatch) -> EventReply:
        return _decode(
            self._http.post("/events", content=msgspec.msgpack.encode(batch)), EventReply
        )

    def lookup(self, request: LookupRequest) -> LookupReply:
        body = msgspec.msgpack.encode(request)
        return _decode(self._http.post("/lookup", content=body), LookupReply)

    def locate(self, keys: Sequence[bytes], exclude: str = "") -> LocateReply:
        body = msgspec.msgpack.encode(LocateRequest([bytes(k) for k in keys], exclude))
        return _decode(self._http.post("/locate", content=body), LocateReply)

    def close(self) -> None:
        self._http.close()


class AsyncIndexClient:
    def __init__(self, url: str, timeout_s: float = 0.5) -> None:
        self.url = url.rstrip("/")
        self._http = httpx.AsyncClient(base_url=self.url, timeout=timeout_s, headers=_HEADERS)

    async def lookup(self, request: LookupRequest) -> LookupReply:
        response = await self._http.post("/lookup", content=msgspec.msgpack.encode(request))
        return _decode(response, LookupReply)

    async def aclose(self) -> None:
        await self._http.aclose()
