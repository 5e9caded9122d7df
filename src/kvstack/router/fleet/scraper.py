"""Scrapes each backend's Prometheus ``/metrics`` on a short interval to correct the load view.

A failed scrape keeps the previous figures, which age; the pipeline ignores them once older
than ``stale_after_s`` and the age is exported per backend.

Each backend is scraped once per interval at its own phase: the interval is cut into one slot
per backend and each slot starts one scrape without waiting for it, so a slow backend never
delays the others' figures. Starting them all at once made a burst: parsing 16 engines'
metrics took the event loop for about 25 ms twice a second, and the requests that arrived
meanwhile (about 5% of them) waited behind it, which was the router's and the endpoint
picker's decision p99 (``kvstack bench epp``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time

from kvstack.errors import UpstreamError
from kvstack.log import IncidentLogger
from kvstack.metrics import counter
from kvstack.router.fleet.backends import BackendPool, BackendState
from kvstack.router.fleet.config import ScrapeConfig
from kvstack.router.fleet.engine_metrics import parse_engine_metrics
from kvstack.router.upstream.control import ControlClient

__all__ = ["MetricsScraper"]

log = logging.getLogger(__name__)
incidents = IncidentLogger(log)
SCRAPE_ERRORS = counter(
    "kvstack_router_scrape_errors_total", "Failed scrapes of backend metrics", ["backend"]
)


class MetricsScraper:
    def __init__(self, pool: BackendPool, client: ControlClient, config: ScrapeConfig) -> None:
        self._pool = pool
        self._client = client
        self._config = config
        self._task: asyncio.Task[None] | None = None
        self._inflight: dict[str, asyncio.Task[None]] = {}

    async def start(self) -> None:
        if self._config.enabled:
            self._task = asyncio.create_task(self._loop(), name="router-scrape")

    async def close(self) -> None:
        tasks = [t for t in (self._task, *self._inflight.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def scrape(self, state: BackendState) -> None:
        try:
            status, raw = await self._client.get(
                state.url + self._config.path, self._config.timeout_s
            )
            if status != 200:
                raise UpstreamError(f"{state.id} answered {status} on {self._config.path}")
        except UpstreamError as exc:
            SCRAPE_ERRORS.labels(state.id).inc()
            incidents.warning(f"scrape:{state.id}", "cannot scrape %s: %s", state.id, exc)
            return
        text = raw.decode("utf-8", "replace")
        state.set_engine_metrics(parse_engine_metrics(text, time.monotonic()))

    async def _loop(self) -> None:
        while True:
            states = [s for s in self._pool.states() if s.healthy]
            if not states:
                await asyncio.sleep(self._config.interval_s)
                continue
            slot_s = self._config.interval_s / len(states)
            for state in states:
                self._start(state)
                await asyncio.sleep(slot_s)

    def _start(self, state: BackendState) -> None:
        """One scrape of ``state`` in the background; none while its last one still runs."""
        running = self._inflight.get(state.id)
        if running is not None and not running.done():
            return
        task = asyncio.create_task(self.scrape(state), name=f"router-scrape-{state.id}")
        self._inflight[state.id] = task
        task.add_done_callback(functools.partial(self._forget, state.id))

    def _forget(self, key: str, task: asyncio.Task[None]) -> None:
        if self._inflight.get(key) is task:
            del self._inflight[key]
