"""``ValkeyIndex`` (blocking: announcers, peer locators, benchmarks) and ``AsyncValkeyIndex``
(the router's lookups): the ``valkey`` index backend (:mod:`kvstack.index.backend`).

Both take the index URL (:mod:`.url`) and a default timeout. A client connects on first use
and again after a failure; under Sentinel it follows the primary through failovers. Writers
run the index's upkeep (expiry of silent engines, cleanup of their entries) from ``report``
every ``maintain_s``, so a fleet needs no process of its own beside Valkey.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from kvstack.index.protocol import (
    AnnounceBatch,
    EventReply,
    LocateReply,
    LocateRequest,
    LookupReply,
    LookupRequest,
)
from kvstack.index.valkey.connect import (
    FAILURES,
    connect,
    connect_async,
    drive,
    drive_ahead,
    drive_ahead_async,
    drive_async,
    index_error,
    run_async,
    run_sync,
)
from kvstack.index.valkey.layout import KeyLayout
from kvstack.index.valkey.reads import Command, Flow, IndexReader
from kvstack.index.valkey.url import parse_valkey_url
from kvstack.index.valkey.writes import IndexWriter
from kvstack.log import IncidentLogger

if TYPE_CHECKING:
    from kvstack.security import ClusterKeys

__all__ = ["AsyncValkeyIndex", "ValkeyIndex"]

log = logging.getLogger(__name__)
T = TypeVar("T")


class ValkeyIndex:
    """Blocking; safe to share between threads."""

    def __init__(self, url: str, timeout_s: float = 2.0, keys: ClusterKeys | None = None) -> None:
        del keys  # Valkey's ACL and TLS authenticate its clients (see index.backend)
        self.options = parse_valkey_url(url, timeout_s)
        self.url = self.options.display
        layout = KeyLayout(self.options.prefix, self.options.buckets, self.options.cluster)
        self._reader = IndexReader(layout, self.options)
        self._writer = IndexWriter(layout, self.options)
        self._client: Any = None
        self._lock = threading.Lock()
        self._next_upkeep = 0.0
        self._incidents = IncidentLogger(log)

    def _connection(self) -> Any:
        with self._lock:
            if self._client is None:
                self._client = connect(self.options)
            return self._client

    def _run(self, commands: list[Command]) -> list[Any]:
        return run_sync(self._connection(), commands)

    def _drive(self, flow: Flow[T]) -> T:
        try:
            return drive(flow, self._run)
        except FAILURES as exc:
            raise index_error(exc, self.url) from None

    def _read(self, make_flow: Callable[[], Flow[T]]) -> T:
        """A lookup or locate: on one connection, sending ahead, unless ``send_ahead=0`` (always
        in a cluster), which sends each round trip as one redis-py pipeline."""
        if not self.options.send_ahead:
            return self._drive(make_flow())
        try:
            return drive_ahead(make_flow, self._connection())
        except FAILURES as exc:
            raise index_error(exc, self.url) from None

    def report(self, batch: AnnounceBatch) -> EventReply:
        reply = self._drive(self._writer.report(batch))
        if time.monotonic() >= self._next_upkeep:
            self._next_upkeep = time.monotonic() + self.options.maintain_s
            self.maintain()
        return reply

    def maintain(self) -> list[str]:
        """Expire silent engines and clean up after them (if no other writer is at it); the
        engines forgotten. Failures are logged, not raised: upkeep is retried later."""
        try:
            gone = self._drive(self._writer.maintain())
        except Exception as exc:  # housekeeping must never fail a report
            self._incidents.warning("upkeep", "valkey index upkeep failed: %s", exc)
            return []
        for instance in gone:
            log.warning(
                "valkey index: engine %s silent for %.0f s; forgotten",
                instance,
                self.options.instance_ttl_s,
            )
        return gone

    def lookup(self, request: LookupRequest) -> LookupReply:
        return self._read(lambda: self._reader.lookup(request))

    def locate(self, keys: Sequence[bytes], exclude: str = "") -> LocateReply:
        request = LocateRequest([bytes(k) for k in keys], exclude)
        return self._read(lambda: self._reader.locate(request))

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()


class AsyncValkeyIndex:
    """For one event loop; concurrent lookups are fine."""

    def __init__(self, url: str, timeout_s: float = 0.5, keys: ClusterKeys | None = None) -> None:
        del keys  # Valkey's ACL and TLS authenticate its clients (see index.backend)
        self.options = parse_valkey_url(url, timeout_s)
        self.url = self.options.display
        layout = KeyLayout(self.options.prefix, self.options.buckets, self.options.cluster)
        self._reader = IndexReader(layout, self.options)
        self._client: Any = None

    async def _run(self, commands: list[Command]) -> list[Any]:
        if self._client is None:
            self._client = connect_async(self.options)
        return await run_async(self._client, commands)

    async def lookup(self, request: LookupRequest) -> LookupReply:
        try:
            if not self.options.send_ahead:
                return await drive_async(self._reader.lookup(request), self._run)
            if self._client is None:
                self._client = connect_async(self.options)
            return await drive_ahead_async(lambda: self._reader.lookup(request), self._client)
        except FAILURES as exc:
            raise index_error(exc, self.url) from None

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()
