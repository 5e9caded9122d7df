"""Scrapes each backend's Prometheus ``/metrics`` on a short interval to correct the load view.

A failed scrape keeps the previous figures, which age; the pipeline ignores them once older
than ``stale_after_s`` and the age is exported per backend. Scrapes of all backends run
concurrently, so one slow backend does not delay the others' figures.
"""

from __future__ import annotations

import asyncio
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

    async def start(self) -> None:
        if self._config.enabled:
            self._task = asyncio.create_task(self._loop(), name="router-scrape")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def scrape_all(self) -> None:
        await asyncio.gather(*(self.scrape(s) for s in self._pool.states() if s.healthy))

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
            await self.scrape_all()
            await asyncio.sleep(self._config.interval_s)
