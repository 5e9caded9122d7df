"""``EventStreams``: one KV event subscription per backend that has an event source, following
the pool as backends come and go.

A backend's source: ``events.sources[name or URL]``, else ``tcp://<its host>:<events.port>``
when a port is configured; with ``replay_port_offset``, the replay socket is at the event port
plus that offset.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from urllib.parse import urlsplit

from kvstack.router.fleet.backends import BackendView
from kvstack.router.prefix.subscriber import EventSink, EventStream
from kvstack.router.scheduling.config import EventsConfig

__all__ = ["EventStreams", "event_endpoint", "replay_endpoint"]

log = logging.getLogger(__name__)


def event_endpoint(config: EventsConfig, backend: BackendView) -> str | None:
    source = config.sources.get(backend.id) or config.sources.get(backend.url)
    if source:
        return source
    if config.port is not None:
        host = urlsplit(backend.url).hostname
        return f"tcp://{host}:{config.port}" if host else None
    return None


def replay_endpoint(config: EventsConfig, endpoint: str) -> str | None:
    """The replay socket next to an event endpoint (``tcp://host:port + offset``)."""
    if config.replay_port_offset is None or endpoint.startswith("bind+"):
        return None
    base, _, port = endpoint.rpartition(":")
    if not port.isdigit():
        return None
    return f"{base.replace('*', '127.0.0.1')}:{int(port) + config.replay_port_offset}"


class EventStreams:
    def __init__(self, config: EventsConfig, sink: EventSink) -> None:
        self.config = config
        self._sink = sink
        self._streams: dict[str, tuple[EventStream, asyncio.Task[None]]] = {}
        self._known: set[str] = set()

    def __contains__(self, backend_id: object) -> bool:
        return backend_id in self._streams

    def stream(self, backend_id: str) -> EventStream | None:
        entry = self._streams.get(backend_id)
        return None if entry is None else entry[0]

    def reconcile(self, backends: Sequence[BackendView]) -> list[str]:
        """Subscribe to new backends, drop the streams of those gone; returns the ids gone."""
        current = {b.id for b in backends}
        gone = sorted(self._known - current)
        for backend_id in gone:
            self._stop(backend_id)
        for backend in backends:
            endpoint = event_endpoint(self.config, backend)
            if endpoint is not None and backend.id not in self._streams:
                self._start(backend.id, endpoint)
        self._known = current
        return gone

    def _start(self, backend_id: str, endpoint: str) -> None:
        stream = EventStream(
            backend_id,
            endpoint,
            self._sink,
            replay_endpoint(self.config, endpoint),
            self.config.topic,
        )
        task = asyncio.create_task(stream.run(), name=f"kv-events:{backend_id}")
        self._streams[backend_id] = (stream, task)
        log.info("subscribed to %s's KV events at %s", backend_id, endpoint)

    def _stop(self, backend_id: str) -> None:
        entry = self._streams.pop(backend_id, None)
        if entry is not None:
            entry[1].cancel()

    async def close(self) -> None:
        tasks = [task for _, task in self._streams.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._streams.clear()
