"""The index backend: where engines announce their chunks and routers and peers ask about them.

Two implementations, picked by the URL's scheme (:func:`backend_name`), answer the same
messages (:mod:`kvstack.index.protocol`) with the same answers for the same events:

- ``service`` — ``http(s)://host:port`` or ``zmq://host:port``: kvstack's own index server
  (``kvstack index-server``; :class:`kvstack.index.client.IndexClient`). One process, state in
  its memory; the default on one host (``kvstack up``).
- ``valkey`` — ``redis://`` or ``rediss://``: the index kept in Valkey or Redis itself,
  standalone, behind Sentinel or as a Cluster (:mod:`kvstack.index.valkey`). Engines write and
  routers read it directly: no kvstack process in between, Valkey's replication, failover,
  ACLs and TLS.

Blocking clients (an engine's announcer, a ``peer://`` tier's locator, benchmarks) implement
:class:`IndexBackend`; the router's async lookups implement :class:`AsyncIndexBackend`. Every
failure to reach the index raises :class:`~kvstack.errors.IndexServiceError` (a timeout:
:class:`~kvstack.errors.IndexTimeoutError`), or ``httpx.HTTPError`` from the service over HTTP.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol
from urllib.parse import urlsplit

from kvstack.index.protocol import (
    AnnounceBatch,
    EventReply,
    LocateReply,
    LookupReply,
    LookupRequest,
)
from kvstack.index.urls import check_index_url
from kvstack.registry import Registry

if TYPE_CHECKING:
    from kvstack.security import ClusterKeys

__all__ = [
    "ASYNC_INDEX_BACKENDS",
    "INDEX_BACKENDS",
    "AsyncIndexBackend",
    "IndexBackend",
    "backend_name",
    "open_async_index",
    "open_index",
]

BACKEND_OF_SCHEME = {
    "http": "service",
    "https": "service",
    "zmq": "service",
    "redis": "valkey",
    "rediss": "valkey",
}


class IndexBackend(Protocol):
    """A blocking index client; safe to share between threads."""

    @property
    def url(self) -> str:
        """Where the index is, without credentials (fit for logs)."""
        ...

    def report(self, batch: AnnounceBatch) -> EventReply:
        """Apply an engine's report; the reply's ``resync`` asks for a full sync."""
        ...

    def lookup(self, request: LookupRequest) -> LookupReply:
        """Per engine and tier, and per shared store, the prompt's matched prefix."""
        ...

    def locate(self, keys: Sequence[bytes], exclude: str = "") -> LocateReply:
        """Which engines other than ``exclude`` lend each key from a local tier."""
        ...

    def close(self) -> None: ...


class AsyncIndexBackend(Protocol):
    """An index client for one event loop; concurrent lookups are fine."""

    @property
    def url(self) -> str: ...

    async def lookup(self, request: LookupRequest) -> LookupReply: ...

    async def aclose(self) -> None: ...


class IndexFactory(Protocol):
    def __call__(self, url: str, timeout_s: float, keys: ClusterKeys | None) -> IndexBackend: ...


class AsyncIndexFactory(Protocol):
    def __call__(
        self, url: str, timeout_s: float, keys: ClusterKeys | None
    ) -> AsyncIndexBackend: ...


INDEX_BACKENDS: Registry[IndexFactory] = Registry("index backend")
INDEX_BACKENDS.register("service", "kvstack.index.client:IndexClient")
INDEX_BACKENDS.register("valkey", "kvstack.index.valkey.client:ValkeyIndex")
ASYNC_INDEX_BACKENDS: Registry[AsyncIndexFactory] = Registry("index backend")
ASYNC_INDEX_BACKENDS.register("service", "kvstack.index.client:AsyncIndexClient")
ASYNC_INDEX_BACKENDS.register("valkey", "kvstack.index.valkey.client:AsyncValkeyIndex")


def backend_name(url: str) -> str:
    """``service`` or ``valkey``, from the URL's scheme (a bad URL raises ConfigError)."""
    return BACKEND_OF_SCHEME[urlsplit(check_index_url(url)).scheme]


def open_index(url: str, timeout_s: float = 2.0, keys: ClusterKeys | None = None) -> IndexBackend:
    """A blocking client of the index at ``url``; ``keys`` (the cluster secret's) authenticate
    it to the index server. Valkey authenticates with its own ACL (the URL's password) and TLS
    (``rediss://``), so the Valkey backend does not use them."""
    return INDEX_BACKENDS.get(backend_name(url))(url, timeout_s, keys)


def open_async_index(
    url: str, timeout_s: float = 0.5, keys: ClusterKeys | None = None
) -> AsyncIndexBackend:
    """An async client of the index at ``url`` (the router's lookups); ``keys`` as for
    :func:`open_index`."""
    return ASYNC_INDEX_BACKENDS.get(backend_name(url))(url, timeout_s, keys)
