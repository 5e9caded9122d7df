"""Active health checks and model catalogues.

Every ``interval_s`` each backend's health path is fetched; ``unhealthy_after`` failures in a
row take it down, ``healthy_after`` successes bring it back (an unhealthy backend keeps being
checked, so nothing stays down for good). A healthy backend's ``/v1/models`` is re-read every
``models_interval_s`` and at once when it comes back (an engine may restart with other
adapters). New backends are checked as soon as discovery adds them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

import msgspec

from kvstack.errors import UpstreamError
from kvstack.log import IncidentLogger
from kvstack.metrics import counter
from kvstack.router.fleet.backends import BackendPool, BackendState
from kvstack.router.fleet.config import HealthConfig
from kvstack.router.upstream.control import ControlClient

__all__ = ["HealthChecker"]

log = logging.getLogger(__name__)
incidents = IncidentLogger(log)
CHECKS = counter(
    "kvstack_router_health_checks_total", "Active health checks by result", ["backend", "result"]
)


class HealthChecker:
    def __init__(
        self,
        pool: BackendPool,
        client: ControlClient,
        config: HealthConfig,
        on_round: Callable[[], None] | None = None,
        after_round: Callable[[], None] | None = None,
    ) -> None:
        """``on_round`` runs in a thread after each round (it may block); ``after_round`` runs
        on the loop, after each round's checks and model reads (it must not block)."""
        self._pool = pool
        self._client = client
        self._config = config
        self._on_round = on_round
        self._after_round = after_round
        self._task: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._pool.on_added(self._check_soon)
        await self.check_all()
        self._task = asyncio.create_task(self._loop(), name="router-health")

    async def close(self) -> None:
        tasks = [t for t in (self._task, *self._pending) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def check_all(self) -> None:
        await asyncio.gather(*(self.check(s) for s in self._pool.states()))

    async def check(self, state: BackendState) -> None:
        """One health check, then the model list if it is due."""
        ok = await self._probe(state)
        changed = _apply(state, ok, self._config)
        if changed and ok:
            log.info("backend %s is healthy", state.id)
        elif changed:
            log.warning("backend %s is unhealthy: %s", state.id, state.last_error)
        if state.healthy and (changed or self._models_due(state)):
            await self._read_models(state)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._config.interval_s)
            await self.check_all()
            if self._after_round is not None:
                self._after_round()
            if self._on_round is not None:  # e.g. re-reading the API keys file: off the loop
                await asyncio.to_thread(self._on_round)

    def _check_soon(self, states: Sequence[BackendState]) -> None:
        for state in states:
            task = asyncio.get_running_loop().create_task(self.check(state))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    async def _probe(self, state: BackendState) -> bool:
        try:
            status, _ = await self._client.get(
                state.url + self._config.path, self._config.timeout_s
            )
        except UpstreamError as exc:
            state.last_error = str(exc)
            CHECKS.labels(state.id, exc.kind).inc()
            return False
        CHECKS.labels(state.id, "ok" if status == 200 else f"status_{status}").inc()
        if status != 200:
            state.last_error = f"health check answered {status}"
        return status == 200

    def _models_due(self, state: BackendState) -> bool:
        if state.backend.static_models is not None:
            return False
        read = state.models_read_at_s
        return read is None or time.monotonic() - read >= self._config.models_interval_s

    async def _read_models(self, state: BackendState) -> None:
        try:
            status, raw = await self._client.get(state.url + "/v1/models", self._config.timeout_s)
            entries = msgspec.json.decode(raw)["data"] if status == 200 else None
        except (UpstreamError, msgspec.DecodeError, KeyError, TypeError) as exc:
            incidents.warning(f"models:{state.id}", "cannot read models of %s: %s", state.id, exc)
            return
        if isinstance(entries, list):
            state.set_models([e for e in entries if isinstance(e, dict)], time.monotonic())


def _apply(state: BackendState, ok: bool, config: HealthConfig) -> bool:
    """Fold one check result into the state; True when ``healthy`` changed."""
    if ok:
        state.health_successes += 1
        state.health_failures = 0
        up = state.healthy is not True and (
            state.healthy is None or state.health_successes >= config.healthy_after
        )
        if up:
            state.healthy = True
        return up
    state.health_failures += 1
    state.health_successes = 0
    down = state.healthy is not False and (
        state.healthy is None or state.health_failures >= config.unhealthy_after
    )
    if down:
        state.healthy = False
    return down
