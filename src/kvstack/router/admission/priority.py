"""``priority`` admission: criticality, a saturation detector, bounded queues, shedding.

A request's priority is ``critical``, ``standard`` or ``sheddable``: the ``x-kvstack-priority``
header, else its model's, else its tenant's (config), else the default. Admission then:

- ``critical`` goes at once, always: the router never holds or sheds it;
- otherwise, if the model's candidate backends have room (:class:`FleetSaturation`: engine
  queue, KV usage, requests awaiting their first token, metric staleness) and nobody of the
  same or a higher priority is waiting, it goes at once;
- else it waits in its priority's bounded FIFO queue, or is shed with 429 and ``Retry-After``
  when that queue is full (``sheddable`` queues hold nothing by default: shed at once) or when
  it has waited ``timeout_s``.

Waiting requests are released highest priority first as room appears (a request reaching its
first token or ending, or every ``tick_s`` for scraped changes). The backend is chosen only
after release — late binding. A released request counts against the room until it is
dispatched, so a release never overshoots.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from kvstack.errors import ConfigError, NoBackendError, RequestError
from kvstack.metrics import counter, gauge, histogram
from kvstack.router.admission.base import Admission
from kvstack.router.admission.config import PRIORITIES, PriorityConfig
from kvstack.router.admission.permit import Permit
from kvstack.router.fleet.backends import BackendView
from kvstack.router.fleet.saturation import FleetSaturation
from kvstack.router.request import RoutingRequest
from kvstack.router.scheduling.pipeline import eligible_backends
from kvstack.router.scheduling.plugins.base import PluginContext

__all__ = ["PriorityAdmission"]

SHED = counter(
    "kvstack_router_shed_total", "Requests shed with 429, by priority and reason",
    ["priority", "reason"],
)  # fmt: skip
QUEUED = gauge("kvstack_router_queue_depth", "Requests held by admission", ["priority"])
WAIT = histogram(
    "kvstack_router_queue_wait_seconds", "Time requests were held by admission", ["priority"]
)
ADMITTED = counter(
    "kvstack_router_admitted_total", "Requests admitted, by priority and path", ["priority", "path"]
)


@dataclass(eq=False)
class _Permit:
    admission: PriorityAdmission
    target: str
    counted: bool  # released from a queue: counts against the room until dispatched
    released: bool = False

    def dispatched(self) -> None:
        if self.counted:
            self.counted = False
            self.admission._granted[self.target] -= 1

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.dispatched()
            self.admission._wake.set()


@dataclass(eq=False)
class _Waiter:
    request: RoutingRequest
    priority: str
    future: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    since_s: float = field(default_factory=time.monotonic)


class PriorityAdmission(Admission):
    name = "priority"

    def __init__(self, context: PluginContext, **args: Any) -> None:
        super().__init__(context)
        try:
            self.config = PriorityConfig.model_validate(args)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
            )
            raise ConfigError(f"admission 'priority': {problems}") from None
        scraping = context.config.scrape.enabled if context.config is not None else True
        self.saturation = FleetSaturation(self.config.saturation.limits(scraping))
        self._queues: dict[str, deque[_Waiter]] = {p: deque() for p in PRIORITIES[1:]}
        self._granted: Counter[str] = Counter()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._release_loop(), name="priority-admission")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    # -- admission -------------------------------------------------------------------------
    def priority_of(self, request: RoutingRequest) -> str:
        asked = request.priority
        if asked is not None:
            if asked not in PRIORITIES:
                raise RequestError(
                    f"x-kvstack-priority {asked!r} is not one of {', '.join(PRIORITIES)}",
                    param="x-kvstack-priority",
                    code="invalid_priority",
                )
            return asked
        by_model = self.config.models.get(request.model) or self.config.models.get(request.target)
        by_tenant = self.config.tenants.get(request.tenant) if request.tenant else None
        return by_model or by_tenant or self.config.default

    async def admit(self, request: RoutingRequest) -> Permit:
        priority = self.priority_of(request)
        if priority == "critical":
            return self._permit(request, priority, "direct", counted=False)
        if not self._waiting_ahead(priority) and self._room(request.target) > 0:
            return self._permit(request, priority, "direct", counted=False)
        limits = self.config.queue(priority)
        queue = self._queues[priority]
        if len(queue) >= limits.max_queued:
            raise self._shed(request, priority, self._why(request.target))
        waiter = _Waiter(request, priority)
        queue.append(waiter)
        QUEUED.labels(priority).set(len(queue))
        self._wake.set()
        try:
            await asyncio.wait_for(asyncio.shield(waiter.future), limits.timeout_s)
        except TimeoutError:
            raise self._shed(request, priority, "queue_timeout") from None
        finally:
            self._forget(waiter)
        WAIT.labels(priority).observe(time.monotonic() - waiter.since_s)
        return self._permit(request, priority, "queued", counted=True)

    def _permit(self, request: RoutingRequest, priority: str, path: str, counted: bool) -> Permit:
        ADMITTED.labels(priority, path).inc()
        return _Permit(self, request.target, counted)

    def _shed(self, request: RoutingRequest, priority: str, reason: str) -> RequestError:
        SHED.labels(priority, reason).inc()
        return RequestError(
            f"the backends serving {request.target!r} are saturated ({reason}); "
            f"{priority} requests are shed, retry later",
            429,
            code="overloaded",
            kind="rate_limit_error",
            retry_after_s=self.config.retry_after_s,
        )

    def _forget(self, waiter: _Waiter) -> None:
        queue = self._queues[waiter.priority]
        with contextlib.suppress(ValueError):
            queue.remove(waiter)
        if not waiter.future.done():
            waiter.future.cancel()
        QUEUED.labels(waiter.priority).set(len(queue))

    # -- room ------------------------------------------------------------------------------
    def _candidates(self, target: str) -> Sequence[BackendView]:
        pool = self.context.pool
        if pool is None:
            return []
        try:
            return eligible_backends(pool.states(), target)
        except NoBackendError:  # let the proxy answer 503 with its reason
            return []

    def _room(self, target: str) -> int:
        candidates = self._candidates(target)
        if not candidates:
            return 1  # nothing to protect; the proxy reports what is wrong
        return self.saturation.room(candidates) - self._granted[target]

    def _why(self, target: str) -> str:
        return self.saturation.reason(self._candidates(target))

    def _waiting_ahead(self, priority: str) -> bool:
        rank = PRIORITIES.index(priority)
        return any(self._queues[p] for p in PRIORITIES[1 : rank + 1])

    # -- release ---------------------------------------------------------------------------
    async def _release_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.config.tick_s)
            self._wake.clear()
            self.release_waiting()

    def release_waiting(self) -> None:
        """Release waiting requests, highest priority first, while their targets have room;
        a lower priority waits while a higher one still does."""
        for priority in PRIORITIES[1:]:
            queue = self._queues[priority]
            while queue:
                waiter = queue[0]
                if waiter.future.done():
                    queue.popleft()
                    continue
                if self._room(waiter.request.target) <= 0:
                    break
                queue.popleft()
                self._granted[waiter.request.target] += 1
                waiter.future.set_result(None)
            QUEUED.labels(priority).set(len(queue))
            if queue:
                return

    # -- RequestObserver: room changes -----------------------------------------------------
    def on_dispatch(self, request: RoutingRequest, backend: BackendView) -> None:
        permit = request.state.permit  # the proxy keeps what admit returned there
        if isinstance(permit, _Permit):
            permit.dispatched()

    def on_first_token(self, request: RoutingRequest, backend: BackendView, ttft_s: float) -> None:
        self._wake.set()

    def on_finish(self, request: RoutingRequest, backend: BackendView, outcome: str) -> None:
        self._wake.set()
